"""WGSL codegen and the WebGPU runtime on lavapipe: hand-written TE GPU schedules, checked against numpy and math."""

import math

import numpy as np
import pytest

import compiler.te as te
from compiler.codegen.wgsl import Layout, WGSLError, generate_wgsl, model_shader
from compiler.errors import PlatformError
from compiler.runtime import ArgSpec
from compiler.runtime import webgpu as webgpu_runtime
from compiler.tir.lower import lower
from compiler.tir.nodes import For, ForKind, walk_stmts

RNG = np.random.default_rng(0)


def with_launch(func):
    """The launch tir/gpu.py's lower_gpu sets: each tag's extent is the largest of its loops'."""
    grid, block = [1, 1, 1], [1, 1, 1]
    for stmt in walk_stmts(func.body):
        if isinstance(stmt, For) and stmt.kind == ForKind.THREAD_BINDING:
            family, axis = stmt.thread_tag.split(".")
            dims = grid if family == "blockIdx" else block
            dims["xyz".index(axis)] = max(dims["xyz".index(axis)], int(stmt.extent.value))
    func.attrs = {"launch": {"grid": grid, "block": block}}
    return func


def run(schedule, args, inputs, layout=None, name="kernel"):
    func = with_launch(lower(schedule, list(args), name))
    module = generate_wgsl([(func, name, layout or Layout.separate(len(args)))])
    kernels = webgpu_runtime.WebGPUKernels(module.code, [entry.as_json() for entry in module.entries])
    call = kernels.function(name, [ArgSpec(buffer.name, buffer.shape, buffer.dtype) for buffer in func.params])
    outputs = [np.zeros(tuple(tensor.shape), tensor.dtype) for tensor in args[len(inputs) :]]
    call(*inputs, *outputs)
    return outputs[0] if len(outputs) == 1 else outputs


def bound_elementwise(shape, body, dtype="float32", threads=64):
    a = te.placeholder(shape, dtype, name="A")
    b = te.compute(shape, lambda *i: body(a[i]), name="B")
    s = te.create_schedule(b.op)
    fused = s[b].fuse(*s[b].op.axis)
    bx, tx = s[b].split(fused, threads)
    s[b].bind(bx, te.thread_axis("blockIdx.x"))
    s[b].bind(tx, te.thread_axis("threadIdx.x"))
    return s, [a, b]


def test_elementwise_with_a_guarded_tail():
    s, args = bound_elementwise((37, 19), lambda x: x * 2.0 + 1.0)
    x = RNG.standard_normal((37, 19)).astype("float32")
    np.testing.assert_allclose(run(s, args, [x]), x * 2 + 1, rtol=1e-6)


def test_a_transpose_divides_its_fused_index_with_wgsl_operators():
    a = te.placeholder((7, 6), name="A")
    b = te.compute((6, 7), lambda i, j: a[j, i], name="B")
    s = te.create_schedule(b.op)
    s[b].bind(s[b].fuse(*s[b].op.axis), te.thread_axis("threadIdx.x"))
    x = RNG.standard_normal((7, 6)).astype("float32")
    np.testing.assert_array_equal(run(s, [a, b], [x]), x.T)
    # the fused index is never negative, so its floor division and modulo are WGSL's / and %
    code = generate_wgsl([(with_launch(lower(s, [a, b], "k")), "k", Layout.separate(2))]).code
    assert "tessel_floor" not in code and "% 7i" in code


def test_matmul_with_shared_and_local_caches():
    a = te.placeholder((64, 48), name="A")
    b = te.placeholder((48, 40), name="B")
    k = te.reduce_axis((0, 48), name="k")
    c = te.compute((64, 40), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    s = te.create_schedule(c.op)
    a_shared, b_shared = s.cache_read(a, "shared", [c]), s.cache_read(b, "shared", [c])
    c_local = s.cache_write(c, "local")
    i, j = s[c].op.axis
    bx, ty = s[c].split(i, 16)
    by, tx = s[c].split(j, 16)
    s[c].reorder(bx, by, ty, tx)
    for axis, tag in ((bx, "blockIdx.y"), (by, "blockIdx.x"), (ty, "threadIdx.y"), (tx, "threadIdx.x")):
        s[c].bind(axis, te.thread_axis(tag))
    s[c_local].compute_at(s[c], tx)
    ko, _ = s[c_local].split(s[c_local].op.reduce_axis[0], 8)
    for cache in (a_shared, b_shared):
        s[cache].compute_at(s[c_local], ko)
        s[cache].bind(s[cache].op.axis[0], te.thread_axis("threadIdx.y"))
    x, y = RNG.standard_normal((64, 48)).astype("float32"), RNG.standard_normal((48, 40)).astype("float32")
    func = with_launch(lower(s, [a, b, c], "mm"))
    code = generate_wgsl([(func, "mm", Layout.separate(3))]).code
    assert "var<workgroup>" in code and "workgroupBarrier();" in code and "@workgroup_size(16, 16, 1)" in code
    assert "var<storage, read> entry_mm_region_0" in code and "var<storage, read_write> entry_mm_region_2" in code
    np.testing.assert_allclose(run(s, [a, b, c], [x, y]), x.astype(np.float64) @ y, rtol=1e-4, atol=1e-4)


def test_an_unrolled_register_tile_indexes_its_array_with_literals():
    """Each thread accumulates a 3 x 4 tile (a tail row guarded); the unrolled loops print once per iteration, so
    the tile's indices are constants the shader compiler can keep in registers, and the results stay numpy's."""
    a = te.placeholder((22, 17), name="A")
    b = te.placeholder((17, 24), name="B")
    k = te.reduce_axis((0, 17), name="k")
    c = te.compute((22, 24), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    s = te.create_schedule(c.op)
    c_local = s.cache_write(c, "local")
    i, j = s[c].op.axis
    ty, ri = s[c].split(i, 3)
    tx, rj = s[c].split(j, 4)
    s[c].reorder(ty, tx, ri, rj)
    s[c].bind(ty, te.thread_axis("threadIdx.y"))
    s[c].bind(tx, te.thread_axis("threadIdx.x"))
    s[c].unroll(ri)
    s[c].unroll(rj)
    s[c_local].compute_at(s[c], tx)
    li, lj = s[c_local].op.axis
    s[c_local].reorder(s[c_local].op.reduce_axis[0], li, lj)
    s[c_local].unroll(li)
    s[c_local].unroll(lj)
    code = generate_wgsl([(with_launch(lower(s, [a, b, c], "tile")), "tile", Layout.separate(3))]).code
    assert "_C_local[11i]" in code and code.count("for (") == 1  # only the reduction stays a loop
    x, y = RNG.standard_normal((22, 17)).astype("float32"), RNG.standard_normal((17, 24)).astype("float32")
    np.testing.assert_allclose(run(s, [a, b, c], [x, y]), x.astype(np.float64) @ y, rtol=1e-4, atol=1e-4)


MATH = {
    "exp": (lambda x: te.exp(x), np.exp, 1e-5),
    "log": (lambda x: te.log(te.abs(x) + 1e-3), lambda x: np.log(np.abs(x) + np.float32(1e-3)), 1e-5),
    "tanh": (lambda x: te.tanh(x), np.tanh, 1e-5),
    "sigmoid": (lambda x: te.sigmoid(x), lambda x: 1 / (1 + np.exp(-x.astype(np.float64))), 1e-5),
    "erf": (lambda x: te.erf(x), np.vectorize(math.erf), 1e-5),
    "sqrt": (lambda x: te.sqrt(te.abs(x)), lambda x: np.sqrt(np.abs(x)), 1e-6),
    "round": (lambda x: te.round(x * 2.0), lambda x: np.round(x * 2), 0),
}


@pytest.mark.parametrize("name", sorted(MATH))
def test_math_functions_match_numpy(name):
    body, reference, rtol = MATH[name]
    x = np.concatenate([RNG.standard_normal(500) * 3, [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 12.0, -12.0, 40.0, -40.0]])
    x = x.astype("float32")
    s, args = bound_elementwise(x.shape, body)
    np.testing.assert_allclose(run(s, args, [x]), reference(x), rtol=rtol, atol=1e-6)


def test_pow_keeps_the_sign_of_a_negative_base_and_integer_exponent():
    a = te.placeholder((6,), name="A")
    b = te.placeholder((6,), name="B")
    c = te.compute((6,), lambda i: te.pow(a[i], b[i]), name="C")
    s = te.create_schedule(c.op)
    s[c].bind(s[c].op.axis[0], te.thread_axis("threadIdx.x"))
    x = np.array([-2.0, -2.0, 2.0, 3.0, -1.5, 0.0], "float32")
    y = np.array([3.0, 2.0, 0.5, 0.0, 0.5, 2.0], "float32")
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(run(s, [a, b, c], [x, y]), np.power(x, y), rtol=1e-5)


def test_integer_floor_division_and_modulo_round_down():
    a = te.placeholder((8,), "int32", name="A")
    b = te.placeholder((8,), "int32", name="B")
    c = te.compute((8,), lambda i: a[i] // b[i] * 100 + a[i] % b[i], name="C")
    s = te.create_schedule(c.op)
    s[c].bind(s[c].op.axis[0], te.thread_axis("threadIdx.x"))
    x = np.array([7, -7, 7, -7, 0, 5, -1, 9], "int32")
    y = np.array([2, 2, -2, -2, 3, 5, 4, -4], "int32")
    np.testing.assert_array_equal(run(s, [a, b, c], [x, y]), x // y * 100 + x % y)


def test_infinite_constants_and_mixed_dtypes_in_one_region():
    a = te.placeholder((16,), name="A")
    b = te.compute((16,), lambda i: te.select(a[i] > 0.0, a[i], -math.inf), name="B")
    c = te.compute((16,), lambda i: (a[i] * 4.0).astype("int32"), name="C")
    s = te.create_schedule([b.op, c.op])
    for tensor in (b, c):
        s[tensor].bind(s[tensor].op.axis[0], te.thread_axis("threadIdx.x"))
    x = RNG.standard_normal(16).astype("float32")
    # A, B and C share one region: a u32 array that the float and int32 tensors read and write through bitcasts
    got_b, got_c = run(s, [a, b, c], [x], Layout((0, 0, 0), offsets=True))
    np.testing.assert_array_equal(got_b, np.where(x > 0, x, -np.inf))
    np.testing.assert_array_equal(got_c, (x * 4).astype("int32"))


def test_a_kernel_with_more_tensors_than_storage_bindings_binds_regions():
    inputs = [te.placeholder((32,), name=f"A{n}") for n in range(9)]
    out = te.compute((32,), lambda i: sum((tensor[i] * float(n + 1) for n, tensor in enumerate(inputs)), 0.0))
    s = te.create_schedule(out.op)
    s[out].bind(s[out].op.axis[0], te.thread_axis("threadIdx.x"))
    arrays = [RNG.standard_normal(32).astype("float32") for _ in inputs]
    layout = Layout.for_kernel(lower(s, [*inputs, out], "k"), max_buffers=8)
    assert layout == Layout((0,) * 9 + (1,), offsets=True)
    got = run(s, [*inputs, out], arrays, layout)
    np.testing.assert_allclose(got, sum(array * (n + 1) for n, array in enumerate(arrays)), rtol=1e-5, atol=1e-5)


def test_int64_storage_is_refused_naming_the_dtype_and_target():
    s, args = bound_elementwise((8,), lambda x: x + 1, dtype="int64")
    func = with_launch(lower(s, args, "k"))
    with pytest.raises(WGSLError, match="int64.*webgpu"):
        generate_wgsl([(func, "k", Layout.separate(2))])


def test_a_kernel_without_launch_dimensions_is_refused():
    s, args = bound_elementwise((8,), lambda x: x + 1.0)
    with pytest.raises(WGSLError, match="launch"):
        generate_wgsl([(lower(s, args, "k"), "k", Layout.separate(2))])


def test_no_adapter_names_what_to_install(monkeypatch):
    import wgpu

    monkeypatch.setattr(webgpu_runtime, "_device", None)
    monkeypatch.setattr(wgpu.gpu, "request_adapter_sync", lambda **options: None)
    with pytest.raises(PlatformError, match="mesa-vulkan-drivers"):
        webgpu_runtime.device()


def scaled_kernel(name, size, scale):
    a = te.placeholder((size,), name="X")
    b = te.compute((size,), lambda i: a[i] * scale + 1.0, name="Y")
    s = te.create_schedule(b.op)
    bx, tx = s[b].split(b.op.axis[0], 32)
    s[b].bind(bx, te.thread_axis("blockIdx.x"))
    s[b].bind(tx, te.thread_axis("threadIdx.x"))
    return with_launch(lower(s, [a, b], name))


def test_a_model_runs_its_dispatch_list_over_regions_with_offsets():
    """input -> arena[256:] -> arena[0:] (read and written in one region) -> output, the same kernel three times."""
    size = 64
    func = scaled_kernel("kernel_0", size, 2.0)
    nbytes = size * 4

    def dispatch(call, source, destination):
        bindings = [
            {"region": region, "index": index, "offset": offset, "bytes": nbytes, "dtype": "float32"}
            for region, index, offset in (source, destination)
        ]
        return {"kernel": "kernel_0", "call": call, "bindings": bindings, **func.attrs["launch"]}

    dispatches = [
        dispatch(0, ("input", 0, 0), ("arena", 0, 256)),
        dispatch(1, ("arena", 0, 256), ("arena", 0, 0)),
        dispatch(2, ("arena", 0, 0), ("output", 0, 0)),
    ]
    module, completed = model_shader([func], dispatches)
    assert [dispatch["entry"] for dispatch in completed] == ["entry_kernel_0", "entry_kernel_0_1", "entry_kernel_0"]
    assert completed[1]["element_offsets"] == [64, 0] and completed[1]["regions"] == [{"region": "arena", "index": 0}]
    assert [region["access"] for region in module.entries[1].regions] == ["read_write"]
    spec = ArgSpec("x", (size,), "float32")
    model = webgpu_runtime.WebGPUModel(
        module.code, [entry.as_json() for entry in module.entries], completed, b"", 512, [spec], [spec]
    )
    x = RNG.standard_normal(size).astype("float32")
    for _ in range(2):
        (got,) = model.run([x])
        np.testing.assert_allclose(got, ((x * 2 + 1) * 2 + 1) * 2 + 1, rtol=1e-6)


def test_names_that_are_wgsl_keywords_or_builtins_still_compile():
    a = te.placeholder((8,), name="filter")
    b = te.compute((8,), lambda i: te.exp(a[i]) + 1.0, name="max")
    s = te.create_schedule(b.op)
    s[b].bind(s[b].op.axis[0], te.thread_axis("threadIdx.x"))
    x = RNG.standard_normal(8).astype("float32")
    np.testing.assert_allclose(run(s, [a, b], [x], name="fn"), np.exp(x) + 1, rtol=1e-5)


def test_math_of_constants_is_folded_so_a_non_finite_result_compiles():
    a = te.placeholder((4,), name="A")
    b = te.compute((4,), lambda i: te.maximum(a[i], te.log(te.const(0.0))) + te.exp(te.const(1.0)), name="B")
    s = te.create_schedule(b.op)
    s[b].bind(s[b].op.axis[0], te.thread_axis("threadIdx.x"))
    x = RNG.standard_normal(4).astype("float32")
    np.testing.assert_allclose(run(s, [a, b], [x]), x + np.exp(np.float32(1)), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16"])
def test_narrow_integers_live_in_word_lanes_and_wrap_like_numpy(dtype):
    """Adjacent bytes of one word are written by different invocations at once: the lanes are set atomically."""
    a = te.placeholder((37,), dtype, name="A")
    b = te.placeholder((37,), dtype, name="B")
    c = te.compute((37,), lambda i: a[i] * b[i] + a[i], name="C")
    s = te.create_schedule(c.op)
    s[c].bind(s[c].op.axis[0], te.thread_axis("threadIdx.x"))
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max, 37, endpoint=True).astype(dtype)
    y = RNG.integers(info.min, info.max, 37, endpoint=True).astype(dtype)
    code = generate_wgsl([(with_launch(lower(s, [a, b, c], "k")), "k", Layout.separate(3))]).code
    assert "array<atomic<u32>>" in code and "atomicOr" in code
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(run(s, [a, b, c], [x, y]), x * y + x)


def test_bool_tensors_are_read_and_written_as_bytes():
    a = te.placeholder((45,), name="A")
    mask = te.compute((45,), lambda i: a[i] > 0.0, name="Mask")
    s = te.create_schedule(mask.op)
    s[mask].bind(s[mask].op.axis[0], te.thread_axis("threadIdx.x"))
    x = RNG.standard_normal(45).astype("float32")
    np.testing.assert_array_equal(run(s, [a, mask], [x]), x > 0)

    flags = te.placeholder((45,), "bool", name="Flags")
    picked = te.compute((45,), lambda i: te.select(flags[i], a[i], -a[i]), name="Picked")
    s = te.create_schedule(picked.op)
    s[picked].bind(s[picked].op.axis[0], te.thread_axis("threadIdx.x"))
    chosen = RNG.random(45) < 0.5
    np.testing.assert_array_equal(run(s, [flags, a, picked], [chosen, x]), np.where(chosen, x, -x))


def test_nan_tests_bool_reductions_and_narrow_modulo():
    from compiler.te.expr import Compare

    a = te.placeholder((6,), name="A")
    flags = te.placeholder((6, 3), "bool", name="Flags")
    small = te.placeholder((6,), "int8", name="Small")
    k = te.reduce_axis((0, 3), name="k")
    nan = te.compute((6,), lambda i: Compare("ne", a[i], a[i]), name="IsNaN")
    every = te.compute((6,), lambda i: te.min(flags[i, k], axis=k), name="Every")
    modulo = te.compute((6,), lambda i: small[i] % -3, name="Modulo")
    s = te.create_schedule([nan.op, every.op, modulo.op])
    for tensor in (nan, every, modulo):
        s[tensor].bind(s[tensor].op.axis[0], te.thread_axis("threadIdx.x"))
    x = np.array([1.0, np.nan, -np.inf, 0.0, np.nan, 3.0], "float32")
    chosen = RNG.random((6, 3)) < 0.7
    narrow = np.array([-7, 7, -128, 127, 0, 5], "int8")
    got = run(s, [a, flags, small, nan, every, modulo], [x, chosen, narrow])
    np.testing.assert_array_equal(got[0], np.isnan(x))
    np.testing.assert_array_equal(got[1], chosen.all(axis=1))
    np.testing.assert_array_equal(got[2], narrow % np.int8(-3))
