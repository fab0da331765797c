"""tir/gpu.py: launch dimensions, guards and refusals on hand-written thread-bound schedules. Each lowered kernel
also runs serially on the llvm target against numpy, the semantics GPU lowering must keep."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_schedules import injective, matmul_shared, random_inputs, root_stages, serial_shared_copy, two_extents

import compiler
import compiler.te as te
from compiler.build import build_func
from compiler.errors import GpuKernelError
from compiler.target import Target
from compiler.te.expr import Const, Var
from compiler.tir.gpu import lower_gpu, split_launches
from compiler.tir.lower import lower
from compiler.tir.nodes import Allocate, Barrier, Buffer, For, ForKind, IfThen, Load, PrimFunc, Seq, Store, walk_stmts
from compiler.tir.printer import format_func

RNG = np.random.default_rng(5)


def gpu_func(case, target="opencl"):
    schedule, args, reference = case
    return lower_gpu(lower(schedule, args, "f"), Target.parse(target)), args, reference


def check_serially(func, args, reference):
    arrays = random_inputs(args, RNG)
    build_func(func, "llvm")(*arrays)
    np.testing.assert_allclose(arrays[-1], reference(*arrays[:-1]), rtol=1e-5, atol=1e-5)


def test_injective_launch_and_guard():
    func, args, reference = gpu_func(injective(1000, 64))
    assert func.attrs["launch"] == {"grid": [16, 1, 1], "block": [64, 1, 1]}
    assert "if (((i.outer*64) + i.inner) < 1000)" in format_func(func)
    check_serially(func, args, reference)


def test_a_scalar_kernel_runs_as_one_thread():
    """A 0-d result computed at run time (a dynamic quantization's scale from two reductions' results) has no axis to
    bind: it is one thread, not a refusal. A kernel with an unbound loop is still refused (test_refusals)."""
    a = te.placeholder((), name="A")
    b = te.placeholder((), name="B")
    c = te.compute((), lambda: (a[()] - b[()]) / 255.0, name="C")
    schedule = te.create_schedule(c.op)
    func = lower_gpu(lower(schedule, [a, b, c], "f"), Target.parse("opencl"))
    assert func.attrs["launch"] == {"grid": [1, 1, 1], "block": [1, 1, 1]}
    check_serially(func, [a, b, c], lambda x, y: (x - y) / np.float32(255.0))


def test_matmul_shared_tiles():
    func, args, reference = gpu_func(matmul_shared(32, tile=16, threads=8))
    assert func.attrs["launch"] == {"grid": [2, 2, 1], "block": [8, 8, 1]}
    stmts = list(walk_stmts(func.body))
    assert sum(isinstance(s, Barrier) for s in stmts) == 3
    assert {s.buffer.name: s.buffer.scope for s in stmts if isinstance(s, Allocate)} == {
        "C.local": "local",
        "A.shared": "shared",
        "B.shared": "shared",
    }
    # every loop spans its tag's launch extent, so no guard was needed
    assert not any(isinstance(s, IfThen) for s in stmts)
    check_serially(func, args, reference)


def test_two_stages_with_different_thread_extents():
    func, args, reference = gpu_func(two_extents(256))
    assert func.attrs["launch"] == {"grid": [4, 1, 1], "block": [64, 1, 1]}
    expected = """
func f(A: float32[256], C: float32[128]) {
  for (i.outer: int32, 0, 4) thread_binding(blockIdx.x) {
    allocate B: float32[64] shared {
      barrier(shared)
      for (i: int32, 0, 64) thread_binding(threadIdx.x) {
        B[i] = A[(i.outer*64) + i]*2.0f
      }
      barrier(shared)
      for (i.inner: int32, 0, 64) thread_binding(threadIdx.x) {
        if (i.inner < 32) {
          C[(i.outer*32) + i.inner] = B[i.inner*2] + B[(i.inner*2) + 1]
        }
      }
    }
  }
}
"""
    assert format_func(func) == expected.strip()
    check_serially(func, args, reference)


def test_work_outside_thread_loops_runs_on_thread_zero():
    func, args, reference = gpu_func(serial_shared_copy(8))
    expected = """
func f(A: float32[8, 8], B: float32[8, 8], C: float32[8, 8]) {
  for (i.outer: int32, 0, 2) thread_binding(blockIdx.x) {
    for (j: int32, 0, 8) {
      allocate A.shared: float32[4, 8] shared {
        barrier(shared)
        for (threadIdx.x.once: int32, 0, 4) thread_binding(threadIdx.x) {
          if (threadIdx.x.once == 0) {
            for (ax0: int32, 0, 4) {
              for (ax1: int32, 0, 8) {
                A.shared[(ax0*8) + ax1] = A[(i.outer*32) + (ax0*8) + ax1]
              }
            }
          }
        }
        barrier(shared)
        for (i.inner: int32, 0, 4) thread_binding(threadIdx.x) {
          C[(i.outer*32) + (i.inner*8) + j] = 0.0f
          for (k: int32, 0, 8) {
            C[(i.outer*32) + (i.inner*8) + j] = C[(i.outer*32) + (i.inner*8) + j] + (A.shared[(i.inner*8) + k]*B[(k*8) + j])
          }
        }
      }
    }
  }
}
"""
    assert format_func(func) == expected.strip()
    assert func.attrs["launch"] == {"grid": [2, 1, 1], "block": [4, 1, 1]}
    check_serially(func, args, reference)


def test_store_outside_one_grid_axis_runs_once():
    """Stage B is bound to threadIdx.x only, C to threadIdx.x and .y: B's stores run where threadIdx.y == 0."""
    a = te.placeholder((8,), name="A")
    b = te.compute((8,), lambda i: a[i] + 1.0, name="B")
    c = te.compute((4, 8), lambda i, j: b[j] * i, name="C")
    s = te.create_schedule(c.op)
    s[b].set_scope("shared")
    block = te.thread_axis("blockIdx.x")
    outer, _ = s[c].split(c.op.axis[0], nparts=1)
    s[c].bind(outer, block)
    s[c].bind(s[c].leaf_iter_vars[1], te.thread_axis("threadIdx.y"))
    s[c].bind(c.op.axis[1], te.thread_axis("threadIdx.x"))
    s[b].compute_at(s[c], outer)
    s[b].bind(b.op.axis[0], te.thread_axis("threadIdx.x"))
    func = lower_gpu(lower(s, [a, c], "f"), Target.parse("cuda"))
    assert func.attrs["launch"] == {"grid": [1, 1, 1], "block": [8, 4, 1]}
    assert "if (threadIdx.y.once == 0)" in format_func(func)
    check_serially(func, [a, c], lambda x: np.arange(4, dtype="float32")[:, None] * (x + 1)[None, :])


def cpu_schedule():
    a = te.placeholder((16,), name="A")
    b = te.compute((16,), lambda i: a[i] * 2.0, name="B")
    return te.create_schedule(b.op), [a, b]


@pytest.mark.parametrize(
    "case, target, words",
    [
        (lambda: (*cpu_schedule(), None), "opencl", ["kernel f", "no thread-bound loop", "schedules/gpu.py"]),
        (lambda: injective(4096, 1024), "opencl", ["threadIdx.x has extent 1024", "device's 256"]),
        (lambda: injective(4096, 1024), "webgpu", ["threadIdx.x has extent 1024", "device's 256"]),
        (lambda: matmul_shared(64, tile=32, threads=32), "opencl", ["32 x 32 x 1 = 1024 threads", "device's 256"]),
        (lambda: matmul_shared(256, tile=128, threads=8, k_tile=32), "webgpu", ["32768 bytes", "16384"]),
        (lambda: matmul_shared(32, threads=8, copy_threads=16), "cuda", ["barrier", "depends on the thread"]),
    ],
)
def test_refusals(case, target, words):
    schedule, args, _ = case()
    with pytest.raises(GpuKernelError) as error:
        lower_gpu(lower(schedule, args, "f"), Target.parse(target))
    for word in words:
        assert word in str(error.value)
    assert str(target) in str(error.value)


def test_dtype_the_device_lacks():
    a = te.placeholder((64,), dtype="float64", name="A")
    b = te.compute((64,), lambda i: a[i] * 2.0, name="B")
    s = te.create_schedule(b.op)
    s[b].bind(s[b].split(b.op.axis[0], 32)[1], te.thread_axis("threadIdx.x"))
    func = lower(s, [a, b], "f")
    with pytest.raises(GpuKernelError, match="buffer A holds float64, which webgpu has not"):
        lower_gpu(func, Target.parse("webgpu"))
    assert lower_gpu(func, Target.parse("opencl")).attrs["launch"]["block"] == [32, 1, 1]


def test_global_intermediate_refused():
    a = te.placeholder((64,), name="A")
    b = te.compute((64,), lambda i: a[i] * 2.0, name="B")
    c = te.compute((64,), lambda i: b[i] + 1.0, name="C")
    s = te.create_schedule(c.op)
    for stage in (s[b], s[c]):
        stage.bind(stage.op.axis[0], te.thread_axis("threadIdx.x"))
    with pytest.raises(GpuKernelError, match="allocates the global buffer B"):
        lower_gpu(lower(s, [a, c], "f"), Target.parse("opencl"))


def test_local_buffer_spread_over_threads_refused():
    out = Buffer("out", (32,), "float32")
    scratch = Buffer("scratch", (32,), "float32", "local")
    i, j = Var("i"), Var("j")
    one = Const(1.0, "float32")
    fill = For(i, Const(0, "int32"), Const(32, "int32"), ForKind.THREAD_BINDING, Store(scratch, i, one), "threadIdx.x")
    use = For(j, Const(0, "int32"), Const(32, "int32"), ForKind.SERIAL, Store(out, j, Load(scratch, j)))
    func = PrimFunc("f", [out], Allocate(scratch, Seq((fill, use))))
    with pytest.raises(GpuKernelError, match="local buffer scratch is private to one thread"):
        lower_gpu(func, Target.parse("cuda"))


def test_cpu_target_refused():
    schedule, args, _ = injective(64, 32)
    with pytest.raises(GpuKernelError, match="needs a GPU target"):
        lower_gpu(lower(schedule, args, "f"), Target.parse("llvm"))


def test_root_stages_reading_each_other_split_into_launches():
    schedule, args, reference = root_stages()
    func = lower(schedule, args, "f")
    parts = split_launches(func)
    assert [part.name for part in parts] == ["f_part0", "f_part1"]
    assert [buffer.name for buffer in parts[0].params] == ["A", "C", "B"]  # B, allocated by the kernel, is workspace
    source, out, workspace = (
        RNG.standard_normal(256).astype("float32"),
        np.zeros(256, "float32"),
        np.zeros(256, "float32"),
    )
    for part in parts:
        build_func(lower_gpu(part, Target.parse("opencl")), "llvm")(source, out, workspace)
    np.testing.assert_allclose(out, reference(source), rtol=1e-6)


def test_independent_root_stages_stay_one_launch():
    a = te.placeholder((64,), name="A")
    b = te.compute((64,), lambda i: a[i] * 2.0, name="B")
    c = te.compute((64,), lambda i: a[i] + 1.0, name="C")
    s = te.create_schedule([b.op, c.op])
    for stage in (s[b], s[c]):
        stage.bind(stage.op.axis[0], te.thread_axis("threadIdx.x"))
    func = lower(s, [a, b, c], "f")
    assert split_launches(func) == [func]


def test_stages_of_one_block_get_a_barrier_instead_of_a_launch():
    """A whole-tensor sum (64 lanes in shared memory, then one combine) that 64 threads of a second root stage read:
    both run in block 0 only, so a barrier orders them and the kernel stays one launch, the sum its workspace."""
    a = te.placeholder((256,), name="A")
    k = te.reduce_axis((0, 256), name="k")
    total = te.compute((), lambda: te.sum(a[k], axis=k), name="total")
    scaled = te.compute((64,), lambda i: total[()] * i.astype("float32"), name="scaled")
    s = te.create_schedule(scaled.op)
    partial = s.rfactor(total, 64)
    s[partial].set_scope("shared")
    s[partial].bind(s[partial].op.axis[0], te.thread_axis("threadIdx.x"))
    s[scaled].bind(scaled.op.axis[0], te.thread_axis("threadIdx.x"))
    func = lower(s, [a, scaled], "f")
    (part,) = split_launches(func)
    assert [buffer.name for buffer in part.params] == ["A", "scaled", "total"]
    # the combine and its initialisation run on thread 0 in order; the scaling threads wait for them
    assert sum(isinstance(stmt, Barrier) and stmt.scope == "global" for stmt in walk_stmts(part.body)) == 1
    gpu = lower_gpu(part, Target.parse("opencl"))
    assert gpu.attrs["launch"] == {"grid": [1, 1, 1], "block": [64, 1, 1]}
    source, out, workspace = (
        RNG.standard_normal(256).astype("float32"),
        np.zeros(64, "float32"),
        np.zeros((), "float32"),
    )
    build_func(gpu, "llvm")(source, out, workspace)
    np.testing.assert_allclose(out, source.sum() * np.arange(64), rtol=1e-4, atol=1e-4)
    kernel = compiler.build(s, [a, scaled], target="opencl")
    on_device = np.zeros(64, "float32")
    kernel(source, on_device)
    np.testing.assert_allclose(on_device, out, rtol=1e-5, atol=1e-5)


def test_a_kernel_with_nothing_to_compute_launches_one_idle_thread():
    a = te.placeholder((0, 4), name="A")
    b = te.compute((0, 4), lambda i, j: a[i, j] + 1.0, name="B")
    s = te.create_schedule(b.op)
    func = lower_gpu(lower(s, [a, b], "f"), Target.parse("opencl"))
    assert func.attrs["launch"] == {"grid": [1, 1, 1], "block": [1, 1, 1]}


def test_a_stage_over_blocks_that_the_rest_does_not_read_shares_their_launch():
    """A root stage over 4 blocks, then a whole-tensor sum in block 0 that does not read it: one launch."""
    a = te.placeholder((256,), name="A")
    doubled = te.compute((256,), lambda i: a[i] * 2.0, name="doubled")
    k = te.reduce_axis((0, 256), name="k")
    total = te.compute((), lambda: te.sum(a[k], axis=k), name="total")
    s = te.create_schedule([doubled.op, total.op])
    block, thread = s[doubled].split(doubled.op.axis[0], 64)
    s[doubled].bind(block, te.thread_axis("blockIdx.x"))
    s[doubled].bind(thread, te.thread_axis("threadIdx.x"))
    partial = s.rfactor(total, 64)
    s[partial].set_scope("shared")
    s[partial].bind(s[partial].op.axis[0], te.thread_axis("threadIdx.x"))
    func = lower(s, [a, doubled, total], "f")
    assert split_launches(func) == [func]
    kernel = compiler.build(s, [a, doubled, total], target="opencl")
    source, out, out_total = (
        RNG.standard_normal(256).astype("float32"),
        np.zeros(256, "float32"),
        np.zeros((), "float32"),
    )
    kernel(source, out, out_total)
    np.testing.assert_allclose(out, source * 2, rtol=1e-6)
    np.testing.assert_allclose(out_total, source.sum(), rtol=1e-4, atol=1e-4)


def _two_winograd_convs():
    """x -> 3x3 conv -> ReLU -> 3x3 conv + x -> ReLU: two Winograd convs of one shape whose epilogues differ."""
    from onnx import TensorProto, helper, numpy_helper

    weights = [(RNG.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32) for _ in range(2)]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Conv", ["b", "w1"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "x"], ["d"]),
        helper.make_node("Relu", ["d"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "two_convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 24, 24])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, f"w{index}") for index, weight in enumerate(weights)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("target", ["opencl", "webgpu"])
def test_launches_with_the_same_code_are_one_function_binding_only_what_they_touch(target, tmp_path):
    """share_launches: the two convs' input transforms and matmuls are one function each, their output transforms
    (ReLU; add and ReLU) two; each dispatch binds only the buffers its function reads or writes; the model still
    matches onnxruntime on PoCL or lavapipe, also from its exported bundle, whose checks refuse a dispatch naming no
    kernel of the model."""
    import json

    import onnxruntime as ort

    from compiler.bundle import BundleError

    model = _two_winograd_convs()
    module = compiler.compile_model(model, target=target)
    dispatches = module.manifest["dispatches"]
    assert [dispatch["call"] for dispatch in dispatches] == [0, 0, 0, 1, 1, 1]
    kernels = [dispatch["kernel"] for dispatch in dispatches]
    assert kernels[:2] == kernels[3:5] and kernels[2] != kernels[5]
    # the input transform reads x and writes the transformed tiles; the matmuls read them and the filters
    assert [len(dispatch["bindings"]) for dispatch in dispatches[:2]] == [2, 3]
    x = RNG.standard_normal((1, 32, 24, 24)).astype(np.float32)
    (expected,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(module.run({"x": x})["y"], expected, rtol=1e-4, atol=1e-4)
    path = module.export(tmp_path / "bundle")
    np.testing.assert_array_equal(compiler.load_module(path).run({"x": x})["y"], module.run({"x": x})["y"])
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["dispatches"][1]["kernel"] = "kernel_9_part1"
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="no launch of the model's kernels"):
        compiler.load_module(path)
