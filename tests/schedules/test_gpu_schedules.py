"""The GPU schedules (compiler/schedules/gpu.py) on whole fused groups, checked on the llvm target: lowering gives
every GPU-bound stage its own thread loops, which a CPU runs serially with the GPU's result (contract point 0), so
each template's kernels run natively against the numpy reference executor, in their fallback config and in other
valid configs of their space, and their loop IR shows the structure the template promises (thread-bound loops,
shared tiles, cross-thread reductions) within the target's limits."""

import json
import math
import re

import numpy as np
import pytest

from compiler.build import build
from compiler.compute import group_to_te
from compiler.errors import TargetError
from compiler.graph.ir import Graph, Node, TensorType
from compiler.graph.ops.conv import winograd_weight
from compiler.graph.reference import run_reference
from compiler.passes.fuse_ops import _body as fuse_body
from compiler.passes.pipeline import optimize
from compiler.schedules.gpu import fallback, schedule_group
from compiler.schedules.space import ConfigSpace
from compiler.target import Target
from compiler.tir.gpu import split_launches
from compiler.tir.nodes import Allocate, For, ForKind, Store, walk_stmts
from tests.model_checks import assert_close_in_range

RNG = np.random.default_rng(0)
GPU_TARGETS = ["webgpu", "opencl", "cuda"]


def compile_and_run(graph: Graph, feeds: dict, target: str, config=None, device: str = "llvm"):
    """Fuse `graph` (ONNX layouts: GPU targets keep NCHW), schedule each group for the GPU `target` (with `config`,
    a function of the group's space giving knob values, or the fallback), build it for `device` (llvm: serially)
    and run the kernels in order; (outputs, [(kernel, space)])."""
    fused = optimize(graph, target=None)
    env = {v: feeds[v.name] for v in fused.inputs}
    env.update(fused.params)
    kernels = []
    for node in fused.nodes:
        group = group_to_te(node)
        space = ConfigSpace()
        schedule = schedule_group(group, Target.parse(target), space)
        if config is not None:
            schedule = schedule_group(group, Target.parse(target), ConfigSpace(config(space)))
        kernel = build(schedule, group.inputs + group.outputs, target=device, name=group.name)
        outputs = [np.zeros(v.type.shape, v.type.dtype) for v in node.outputs]
        kernel(*[np.array(env[v], copy=True) for v in node.inputs], *outputs)
        env.update(zip(node.outputs, outputs))
        kernels.append((kernel, space))
    return {v.name: env[v] for v in fused.outputs}, kernels


def check(graph: Graph, feeds: dict, target: str = "webgpu", config=None, device: str = "llvm"):
    expected = run_reference(graph, feeds)
    actual, kernels = compile_and_run(graph, feeds, target, config, device)
    for name, value in expected.items():
        assert_close_in_range(actual[name], value, err_msg=name)
    for kernel, _ in kernels:
        for part in split_launches(kernel.func):
            assert_within_limits(part, Target.parse(target))
    return kernels


def assert_within_limits(func, target: Target) -> None:
    """Every store sits under a thread-bound loop, no tag's loops exceed the block's limits, and the shared buffers
    fit the device: what lower_gpu checks, read here from the loop IR of one launch."""
    extents: dict[str, int] = {}
    shared = 0
    for stmt in walk_stmts(func.body):
        if isinstance(stmt, For) and stmt.kind == ForKind.THREAD_BINDING:
            extents[stmt.thread_tag] = max(extents.get(stmt.thread_tag, 0), stmt.extent.value)
        if isinstance(stmt, Allocate) and stmt.buffer.scope == "shared":
            shared += stmt.buffer.size * np.dtype(stmt.buffer.dtype).itemsize
    stores = any(isinstance(stmt, Store) for stmt in walk_stmts(func.body))
    assert extents or not stores, f"kernel {func.name} has no thread-bound loop"
    threads = math.prod(extents.get(f"threadIdx.{axis}", 1) for axis in "xyz")
    assert threads <= target.device.max_threads, (func.name, extents)
    for index, axis in enumerate("xyz"):
        assert extents.get(f"threadIdx.{axis}", 1) <= target.device.max_block[index], (func.name, extents)
        assert extents.get(f"blockIdx.{axis}", 1) <= target.device.max_grid[index], (func.name, extents)
    assert shared <= target.device.shared_bytes, (func.name, shared)


def some_valid_configs(count: int):
    """A config function picking, per group, a spread of `count` valid configs of its space (by call order)."""
    calls = iter(range(count))

    def pick(space: ConfigSpace):
        valid = list(space.valid_configs())
        index = next(calls, 0)
        return valid[(index * 7919) % len(valid)].to_json() if valid else {}

    return pick


def param(graph: Graph, shape, positive: bool = False):
    array = RNG.standard_normal(shape).astype(np.float32)
    return graph.add_param("p", np.abs(array) + 0.5 if positive else array)


def single_input(shape):
    graph = Graph()
    x = graph.add_input("x", TensorType(shape, "float32"))
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    return graph, x, feeds


def conv_graph(x_shape, w_shape, attrs, epilogue: str = "none"):
    graph, x, feeds = single_input(x_shape)
    (y,) = graph.add_node("Conv", [x, param(graph, w_shape), param(graph, (w_shape[0],))], attrs)
    if epilogue == "scale_shift_relu":
        (y,) = graph.add_node("Mul", [y, param(graph, (w_shape[0], 1, 1))])
        (y,) = graph.add_node("Add", [y, param(graph, (w_shape[0], 1, 1))])
        (y,) = graph.add_node("Relu", [y])
    elif epilogue == "relu6":
        (y,) = graph.add_node("Clip", [y], {"min": np.float32(0.0), "max": np.float32(6.0)})
    graph.outputs = [y]
    return graph, feeds


def winograd_graph(x_shape, filters: int, tile: int, pads, epilogue: str = "none"):
    """A ConvWinograd node (as the GPU targets' winograd pass makes it) and its epilogue: "residual_relu" adds the
    input and applies ReLU (filters must equal the channels); "two_outputs" returns the conv and its ReLU."""
    graph, x, feeds = single_input(x_shape)
    weight = RNG.standard_normal((filters, x_shape[1], 3, 3)).astype(np.float32)
    u = graph.add_param("u", winograd_weight(weight, tile))
    (y,) = graph.add_node("ConvWinograd", [x, u, param(graph, (filters,))], {"tile": tile, "pads": pads})
    outputs = [y]
    if epilogue == "residual_relu":
        (y,) = graph.add_node("Add", [y, x])
        outputs = list(graph.add_node("Relu", [y]))
    elif epilogue == "two_outputs":
        outputs += graph.add_node("Relu", [y])
    graph.outputs = outputs
    return graph, feeds


def tir_of(kernels) -> str:
    (kernel, _), *_ = kernels
    return kernel.source("tir")


# -- templates ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", GPU_TARGETS)
@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [
        ((1, 8, 10, 12), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
        ((1, 4, 9, 9), (6, 4, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
        ((2, 8, 5, 7), (12, 4, 1, 1), {"group": 2}),
        ((1, 6, 30), (10, 6, 5), {"pads": [2, 2]}),
    ],
)
def test_conv_keeps_its_epilogue_in_the_thread_tile(target, x_shape, w_shape, attrs):
    graph, feeds = conv_graph(x_shape, w_shape, attrs, "relu6")
    kernels = check(graph, feeds, target)
    tir = tir_of(kernels)
    assert len(kernels) == 1
    assert re.search(r"allocate conv: float32\[[^\]]*\] local", tir), tir
    assert "thread_binding(threadIdx.x)" in tir


WINOGRAD_CASES = {
    # F(4, 3) on whole tiles, the output transform's epilogue a residual add and ReLU
    "f4_residual": ((1, 16, 12, 12), 16, 4, [1, 1, 1, 1], "residual_relu"),
    # F(2, 3), two images, uneven pads: the last row and column of tiles reach past the 9 x 8 output
    "f2_past_the_output": ((2, 8, 9, 7), 12, 2, [1, 0, 1, 2], "none"),
    # F(4, 3) past a 7 x 7 output, the conv and its ReLU both outputs
    "f4_two_outputs": ((1, 8, 7, 7), 8, 4, [1, 1, 1, 1], "two_outputs"),
}


@pytest.mark.parametrize("target", GPU_TARGETS)
@pytest.mark.parametrize("case", WINOGRAD_CASES)
def test_winograd_conv_is_three_launches_with_each_tile_in_registers(target, case):
    """The input transform, the batched matmuls and the output transform with the epilogue, each a launch; a
    transform thread holds its tile (alpha x alpha values, and B^T d or A^T M) in registers. A second output that
    reads the conv's output comes after it (a launch, or a barrier where the grid is one block)."""
    x_shape, filters, tile, pads, epilogue = WINOGRAD_CASES[case]
    graph, feeds = winograd_graph(x_shape, filters, tile, pads, epilogue)
    kernels = check(graph, feeds, target)
    ((kernel, space),) = kernels
    assert space.template == "winograd"
    alpha = tile + 2
    tir = tir_of(kernels)
    assert f"allocate winograd_rows: float32[{alpha}, {alpha}, 1, 1] local" in tir, tir
    assert f"allocate winograd_columns: float32[{tile}, {alpha}, 1, 1] local" in tir, tir
    launches = len(split_launches(kernel.func))
    assert launches == 3 if epilogue in ("none", "residual_relu") else launches >= 3


@pytest.mark.parametrize("target", GPU_TARGETS)
def test_winograd_read_by_two_outputs_gets_a_launch_of_its_own(target):
    """fuse_ops ends a group at a conv read twice unless the reads meet again inside it, so no compiled model has a
    Winograd group whose two outputs both inline the conv; the template still takes one made by hand: A^T M then
    goes to memory in a launch of its own (not each output's registers), and both outputs read it there."""
    graph, feeds = winograd_graph((1, 8, 7, 7), 8, 2, [1, 1, 1, 1])
    (y,) = graph.outputs
    graph.outputs = [*graph.add_node("Relu", [y]), *graph.add_node("Sigmoid", [y])]
    expected = run_reference(graph, feeds)
    (conv_group,) = optimize(winograd_graph((1, 8, 7, 7), 8, 2, [1, 1, 1, 1])[0], target=None).nodes
    produced = {v for member in graph.nodes for v in member.outputs}
    external = list(dict.fromkeys(v for member in graph.nodes for v in member.inputs if v not in produced))
    attrs = {**conv_group.attrs, "body": fuse_body("two_readers", graph.nodes, external, graph.outputs)}
    group = group_to_te(Node("fused", external, list(graph.outputs), attrs, "two_readers"))
    schedule = schedule_group(group, Target.parse(target), ConfigSpace())
    kernel = build(schedule, group.inputs + group.outputs, target="llvm", name=group.name)
    env = {**{v: feeds[v.name] for v in graph.inputs}, **graph.params}
    outputs = [np.zeros(v.type.shape, v.type.dtype) for v in graph.outputs]
    kernel(*[np.array(env[v], copy=True) for v in external], *outputs)
    for value, actual in zip(graph.outputs, outputs):
        np.testing.assert_allclose(actual, expected[value.name], rtol=1e-4, atol=1e-5, err_msg=value.name)
    tir = kernel.source("tir")
    assert re.search(r"allocate winograd_columns: float32\[[^\]]*\] global", tir), tir  # not a thread's registers
    # the input transform, the matmuls, A^T M, then the outputs (one launch here: they share a grid)
    assert len(split_launches(kernel.func)) == 4


@pytest.mark.parametrize("target", GPU_TARGETS)
def test_winograd_in_other_configs(target):
    graph, feeds = winograd_graph(*WINOGRAD_CASES["f2_past_the_output"])
    for round_ in range(3):
        check(graph, feeds, target, some_valid_configs(round_ + 1))


@pytest.mark.parametrize("target", GPU_TARGETS)
def test_conv_in_other_configs(target):
    graph, feeds = conv_graph((1, 8, 11, 13), (12, 8, 3, 3), {"pads": [1, 0, 1, 2]}, "relu6")
    for round_ in range(3):
        check(graph, feeds, target, some_valid_configs(round_ + 1))


def test_depthwise_is_the_seeds_schedule_with_its_epilogue():
    """depthwise_conv2d -> scale_shift -> relu is one kernel; the input tile (its padding read in place) and the
    filter sit in shared memory, filled by the block's threads between barriers, each thread computes 2 x 2
    outputs in registers (opencl's fallback; webgpu's reads global memory, below)."""
    graph, feeds = conv_graph((1, 16, 32, 32), (16, 1, 3, 3), {"group": 16, "pads": [1, 1, 1, 1]}, "scale_shift_relu")
    kernels = check(graph, feeds, "opencl")
    tir = tir_of(kernels)
    assert len(kernels) == 1
    assert re.search(r"allocate pad\.shared: float32\[1, 1, 34, 34\] shared", tir), tir
    assert re.search(r"allocate p\w*\.shared: float32\[1, 1, 3, 3\] shared", tir), tir
    assert re.search(r"allocate conv: float32\[1, 1, 2, 2\] local", tir), tir
    assert tir.count("barrier") >= 2
    (_, space), *_ = kernels
    assert (space["num_thread_y"].val, space["num_thread_x"].val) == (16, 16)


@pytest.mark.parametrize(
    "config",
    [
        {"num_thread_y": 4, "num_thread_x": 32, "blocking_h": 32, "blocking_w": 32},
        {"num_thread_y": 8, "num_thread_x": 8, "vthread_y": 1, "vthread_x": 2},
        {"num_thread_y": 2, "num_thread_x": 4, "vthread_y": 2, "vthread_x": 4, "blocking_h": 16, "blocking_w": 32},
    ],
)
def test_depthwise_thread_and_vthread_choices(config):
    graph, feeds = conv_graph((1, 8, 32, 64), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}, "scale_shift_relu")
    kernels = check(graph, feeds, config=lambda space: config)
    (_, space), *_ = kernels
    assert space.config(config).valid
    if config.get("vthread_x", 1) > 1:
        assert "unrolled" in tir_of(kernels)


@pytest.mark.parametrize("target", GPU_TARGETS)
@pytest.mark.parametrize("shape", [(1, 3, 7, 9), (2, 5, 33, 47)])
@pytest.mark.parametrize("strides", [[1, 1], [2, 2]])
@pytest.mark.parametrize("multiplier", [1, 2])
def test_depthwise_on_odd_shapes(target, shape, strides, multiplier):
    channels = shape[1]
    attrs = {"group": channels, "pads": [1, 2, 2, 1], "strides": strides}
    graph, feeds = conv_graph(shape, (channels * multiplier, 1, 3, 3), attrs, "scale_shift_relu")
    check(graph, feeds, target)
    check(graph, feeds, target, some_valid_configs(2))


def test_depthwise_space_is_kept_within_the_device():
    """Configs whose threads or shared tile exceed the target are filtered out: WebGPU allows 256 threads per
    workgroup, CUDA 1024."""
    graph, _ = conv_graph((1, 4, 96, 96), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]})
    (node,) = optimize(graph).nodes
    limits = {}
    for target in ("webgpu", "cuda"):
        space = ConfigSpace()
        schedule_group(group_to_te(node), Target.parse(target), space)
        limits[target] = max(c["num_thread_y"].val * c["num_thread_x"].val for c in space.valid_configs())
    assert limits == {"webgpu": 256, "cuda": 1024}


@pytest.mark.parametrize("target", GPU_TARGETS)
@pytest.mark.parametrize(("a_shape", "b_shape"), [((37, 24), (24, 40)), ((2, 3, 17, 32), (2, 3, 32, 9))])
def test_matmul_tiles_in_shared_memory(target, a_shape, b_shape):
    graph = Graph()
    a = graph.add_input("a", TensorType(a_shape, "float32"))
    b = graph.add_input("b", TensorType(b_shape, "float32"))
    (y,) = graph.add_node("MatMul", [a, b])
    graph.outputs = list(graph.add_node("Relu", [y]))
    feeds = {"a": RNG.standard_normal(a_shape).astype(np.float32), "b": RNG.standard_normal(b_shape).astype(np.float32)}
    kernels = check(graph, feeds, target)
    tir = tir_of(kernels)
    # webgpu's fallback reads A and B from global memory (TARGET_DEFAULTS); its space still has the shared tiles
    assert tir.count("] shared {") == 2 * fallback("dense", Target.parse(target))["shared"], tir
    assert re.search(r"allocate (dense|batch_matmul): float32\[[^\]]*\] local", tir), tir
    check(graph, feeds, target, some_valid_configs(3))
    for knob in ("shared", "cache"):
        check(
            graph,
            feeds,
            target,
            lambda space, knob=knob: {**space.fallback.to_json(), knob: 1 - space.fallback[knob].val},
        )
    check(graph, feeds, target, lambda space: {**space.fallback.to_json(), "shared": 1, "cache": 1})


def test_webgpu_dense_fallback_loads_each_k_steps_operands_into_registers_once():
    """webgpu's dense fallback (no shared tile) copies the A column and B row of its register tile for each step of k
    into local arrays, so its 16 multiply-adds read registers (SwiftShader: bert_tiny's pipelines 788 -> 662 ms, its
    run 115 -> 78 ms, docs/gpu.md); opencl's fallback keeps its shared tiles without the copy."""
    graph = Graph()
    a = graph.add_input("a", TensorType((77, 200), "float32"))
    (y,) = graph.add_node("MatMul", [a, param(graph, (200, 200))])
    graph.outputs = [y]
    feeds = {"a": RNG.standard_normal((77, 200)).astype(np.float32)}
    tir = tir_of(check(graph, feeds, "webgpu"))
    assert re.search(r"allocate a\.local: float32\[4, 1\] local", tir), tir
    assert re.search(r"allocate p\w*\.local: float32\[1, 4\] local", tir), tir
    assert ".local" not in tir_of(check(graph, feeds, "opencl")).replace("dense.local", "")


def test_webgpu_caches_a_conv_tiles_operands_unless_the_conv_is_grouped():
    """webgpu's conv fallback loads each reduction step's inputs and weights of the 4-column tile into registers; a
    grouped conv's channel tile may cross a group's end, so its space has no cache."""
    plain, feeds = conv_graph((1, 8, 10, 12), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}, "relu6")
    tir = tir_of(check(plain, feeds, "webgpu"))
    assert re.search(r"allocate pad\.local: float32\[1, 1, 1, 4\] local", tir), tir
    grouped, feeds = conv_graph((2, 8, 5, 7), (12, 4, 1, 1), {"group": 2}, "relu6")
    kernels = check(grouped, feeds, "webgpu")
    assert ".local" not in tir_of(kernels)
    (_, space), *_ = kernels
    assert list(space.knobs["cache"].choices) == [0]


def test_webgpu_fallbacks_have_no_shared_tiles_or_barriers():
    """On WebGPU the depthwise and matmul fallbacks keep their thread tiles but read global memory: the measured
    adapters (SwiftShader, lavapipe) pay more for a barrier than a CPU cache does for the reads (docs/gpu.md)."""
    graph, feeds = conv_graph((1, 16, 32, 32), (16, 1, 3, 3), {"group": 16, "pads": [1, 1, 1, 1]}, "scale_shift_relu")
    tir = tir_of(check(graph, feeds, "webgpu"))
    assert "shared" not in tir and "barrier" not in tir, tir
    assert re.search(r"allocate conv: float32\[1, 1, 2, 2\] local", tir), tir


@pytest.mark.parametrize(
    ("kernel", "webgpu_unrolled"), [((3, 3), ["r0", "r1"]), ((7, 7), ["r1"]), ((5, 5), ["r1"]), ((3, 31), [])]
)
def test_webgpu_depthwise_unrolls_at_most_its_budget_of_taps(kernel, webgpu_unrolled):
    """A depthwise thread's 2 x 2 outputs over the taps: webgpu unrolls whole tap axes from the innermost while the
    unrolled multiply-adds stay within its unroll_steps (64; SwiftShader's pipeline creation grows with unrolled
    code, docs/gpu.md), so a 3x3 is unrolled, a 7x7 or 5x5 only along its row and a 3x31 not at all; opencl unrolls
    every tap. Every choice of the knob gives the reference's results."""
    pads = [kernel[0] // 2, kernel[1] // 2] * 2
    graph, feeds = conv_graph((1, 4, 32, 32), (4, 1, *kernel), {"group": 4, "pads": pads}, "scale_shift_relu")
    for target, unrolled in (("webgpu", webgpu_unrolled), ("opencl", ["r0", "r1"])):
        kernels = check(graph, feeds, target)
        tir = tir_of(kernels)
        assert sorted(re.findall(r"for \((r[01]): int32, 0, \d+\) unrolled", tir)) == unrolled, tir
        assert len(re.findall(r"for \((r[01]): int32, 0, \d+\) \{", tir)) == 2 - len(unrolled), tir
    (_, space), *_ = kernels
    for count in space.knobs["unroll_taps"].choices:
        check(graph, feeds, "webgpu", lambda space, count=count: {**space.fallback.to_json(), "unroll_taps": count})


@pytest.mark.parametrize(
    ("columns", "webgpu_block", "opencl_block"), [(200, 8, 64), (700, 4, 64), (13, 1, 16), (192, 64, 64)]
)
def test_webgpu_dense_fallback_blocks_divide_the_columns(columns, webgpu_block, opencl_block):
    """Without shared tiles (webgpu), the dense fallback's block of columns is the widest power of two up to 64 that
    divides the column count, so no multiply-add is guarded (odd_transformer, docs/gpu.md); opencl's shared-tile
    fallback keeps its 64 columns (fewer only where the columns are fewer)."""
    for target, block in (("webgpu", webgpu_block), ("opencl", opencl_block)):
        graph = Graph()
        x = graph.add_input("x", TensorType((9, 40), "float32"))
        graph.outputs = list(graph.add_node("MatMul", [x, param(graph, (40, columns))], {}))
        feeds = {"x": RNG.standard_normal((9, 40)).astype(np.float32)}
        ((_, space),) = check(graph, feeds, target)
        _, threads, registers = space.fallback["tile_x"].size
        assert (threads * registers, registers) == (block, min(4, block)), (target, columns, threads, registers)


def test_gemm_with_transposed_b_and_bias():
    """A Gemm with B transposed (N, K) sums interleaved partial products first (compiler/compute/dense.py)."""
    graph, x, feeds = single_input((4, 24))
    (y,) = graph.add_node("Gemm", [x, param(graph, (40, 24)), param(graph, (40,))], {"transB": 1})
    graph.outputs = list(graph.add_node("Relu", [y]))
    tir = tir_of(check(graph, feeds))
    # the compute's interleaved partial sums are made per output in registers, never through global memory
    assert re.search(r"allocate dense_partial: float32\[[^\]]*\] local", tir), tir


@pytest.mark.parametrize("target", GPU_TARGETS)
@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ("AveragePool", {"kernel_shape": [2, 2], "strides": [2, 2]}),
        ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 0}),
        ("GlobalAveragePool", {}),
    ],
)
def test_pools(target, op, attrs):
    graph, x, feeds = single_input((1, 5, 11, 13))
    graph.outputs = list(graph.add_node(op, [x], attrs))
    check(graph, feeds, target)


@pytest.mark.parametrize("target", GPU_TARGETS)
@pytest.mark.parametrize("shape", [(3, 77), (2, 4, 300), (1000,)])
def test_softmax_shares_each_row_among_the_block(target, shape):
    """Softmax's max and sum are made per block in shared memory, each as a cross-thread reduction (the threads'
    partial results, then one combine), the row's outputs by the threads: the fallback on opencl and cuda,
    cross_thread 1 on webgpu (whose fallback makes a row per thread, below)."""
    graph, x, feeds = single_input(shape)
    graph.outputs = list(graph.add_node("Softmax", [x], {"axis": -1}))
    kernels = check(graph, feeds, target, lambda space: {**space.fallback.to_json(), "cross_thread": 1})
    tir = tir_of(kernels)
    assert len(kernels) == 1
    assert re.search(r"allocate \S+\.rf: float32\[\d+[^\]]*\] shared", tir), tir
    assert "blockIdx.x" in tir


def row_norm_graph(op: str, shape):
    graph, x, feeds = single_input(shape)
    if op == "Softmax":
        graph.outputs = list(graph.add_node("Softmax", [x], {"axis": -1}))
    else:
        width = shape[-1]
        graph.outputs = list(graph.add_node(op, [x, param(graph, (width,)), param(graph, (width,))], {}))
    return graph, feeds


@pytest.mark.parametrize(
    ("op", "shape"), [("Softmax", (5, 77, 77)), ("Softmax", (2, 4, 300)), ("LayerNormalization", (1, 77, 200))]
)
def test_webgpu_rows_are_reduced_one_per_thread_without_barriers(op, shape):
    """webgpu's fallback (serial_row 4096) gives each thread a row: its max and sum (mean and variance) in registers,
    the exponentials recomputed where read, no shared memory and no barrier, one kernel. SwiftShader took 240-340
    ms to create each barrier kernel's pipeline (docs/gpu.md). opencl's fallback still shares each row."""
    graph, feeds = row_norm_graph(op, shape)
    kernels = check(graph, feeds, "webgpu")
    tir = tir_of(kernels)
    assert len(kernels) == 1
    assert "shared" not in tir and "barrier" not in tir, tir
    assert kernels[0][1].fallback["cross_thread"].val == 0
    assert "shared" in tir_of(check(graph, feeds, "opencl"))


@pytest.mark.parametrize("target", GPU_TARGETS)
@pytest.mark.parametrize("cross_thread", [0, 1])
@pytest.mark.parametrize(("op", "shape"), [("Softmax", (3, 7, 45)), ("LayerNormalization", (2, 9, 33))])
def test_row_reductions_either_way_on_every_target(target, cross_thread, op, shape):
    graph, feeds = row_norm_graph(op, shape)
    check(graph, feeds, target, lambda space: {**space.fallback.to_json(), "cross_thread": cross_thread})


@pytest.mark.parametrize("target", GPU_TARGETS)
def test_layer_norm(target):
    graph, x, feeds = single_input((1, 7, 64))
    graph.outputs = list(graph.add_node("LayerNormalization", [x, param(graph, (64,)), param(graph, (64,))], {}))
    check(graph, feeds, target)


@pytest.mark.parametrize("cross_thread", [0, 1])
@pytest.mark.parametrize(
    ("shape", "attrs"),
    [((3, 5, 200), {"axes": [2]}), ((64, 33), {"axes": [1]}), ((40, 50), {"axes": [0], "keepdims": 0})],
)
def test_reductions_per_thread_or_across_threads(cross_thread, shape, attrs):
    graph, x, feeds = single_input(shape)
    graph.outputs = list(graph.add_node("ReduceMean", [x], attrs))
    kernels = check(graph, feeds, config=lambda space: {"cross_thread": cross_thread})
    assert (".rf" in tir_of(kernels)) == bool(cross_thread)


def test_a_reduction_to_a_scalar_is_shared_by_one_block():
    graph, x, feeds = single_input((6, 50))
    graph.outputs = list(graph.add_node("ReduceSum", [x], {"keepdims": 0}))
    assert re.search(r"allocate \S+\.rf: float32\[256\] shared", tir_of(check(graph, feeds)))


@pytest.mark.parametrize(
    ("op", "inputs", "attrs"),
    [
        ("Transpose", [(2, 3, 4, 5)], {"perm": [0, 2, 3, 1]}),
        ("Concat", [(2, 3, 4), (2, 5, 4)], {"axis": 1}),
        ("Resize", [(1, 3, 5, 7)], {"mode": "nearest", "scales": np.array([1.0, 1.0, 2.0, 2.0], np.float32)}),
        ("Pad", [(1, 3, 5, 7)], {"pads": np.array([0, 0, 1, 2, 0, 0, 3, 1], np.int64)}),
        ("Tanh", [(70000,)], {}),
    ],
)
def test_injective_ops(op, inputs, attrs):
    graph = Graph()
    values = [graph.add_input(f"x{k}", TensorType(shape, "float32")) for k, shape in enumerate(inputs)]
    graph.outputs = list(graph.add_node(op, values, attrs))
    feeds = {f"x{k}": RNG.standard_normal(shape).astype(np.float32) for k, shape in enumerate(inputs)}
    check(graph, feeds)


def test_gather_of_embeddings():
    graph = Graph()
    indices = graph.add_input("indices", TensorType((2, 5), "int64"))
    graph.outputs = list(graph.add_node("Gather", [param(graph, (30, 8)), indices], {"axis": 0}))
    check(graph, {"indices": RNG.integers(0, 30, (2, 5)).astype(np.int64)})


def test_a_cpu_target_is_refused():
    graph, x, _ = single_input((4, 4))
    graph.outputs = list(graph.add_node("Relu", [x]))
    (node,) = optimize(graph).nodes
    with pytest.raises(TargetError, match="not llvm"):
        schedule_group(group_to_te(node), Target.parse("llvm"))


@pytest.mark.parametrize("name", ["mlp", "digits", "dwconv_block"])
def test_zoo_models_match_the_reference(name):
    """Whole small models, every group on its GPU template, run serially; tests/tune builds the rest of the zoo."""
    from compiler import zoo
    from compiler.frontend.onnx import load_onnx

    graph = load_onnx(zoo.build_model(name))
    feeds = {v.name: RNG.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs}
    check(graph, feeds)


def test_tasks_of_a_gpu_target_use_the_gpu_templates_and_their_records(tmp_path):
    """compiler/tune/task.py picks the schedule family by the target: a webgpu task is the seeds' depthwise template
    with its knobs and gpu.py's space version, and a record's config for it builds that config."""
    from compiler import zoo
    from compiler.schedules import gpu
    from compiler.tune.records import load_records
    from compiler.tune.task import extract_tasks, schedule_node

    (task,) = extract_tasks(zoo.build_model("dwconv_block"), "webgpu")
    assert task.template == "depthwise_conv2d"
    assert task.to_json()["space_version"] == gpu.SPACE_VERSION
    assert {"blocking_h", "blocking_w", "num_thread_y", "num_thread_x", "vthread_y", "vthread_x"} <= set(
        task.space.knobs
    )
    record = {"num_thread_y": 4, "num_thread_x": 32}
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps({"task": task.to_json(), "config": record, "seconds": 1e-5}) + "\n")
    records = load_records(path)
    assert records == {task.key: record}
    _, _, cfg = schedule_node(task.node, Target.parse("webgpu"), records)
    assert (cfg["num_thread_y"].val, cfg["num_thread_x"].val) == (4, 32)


def _runtime_cases():
    """A graph per template, small, for the real GPU runtimes."""
    cases = {}
    cases["conv"] = conv_graph((1, 8, 10, 12), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}, "relu6")
    cases["depthwise"] = conv_graph(
        (1, 4, 32, 32), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}, "scale_shift_relu"
    )
    graph, x, feeds = single_input((37, 24))
    (y,) = graph.add_node("MatMul", [x, param(graph, (24, 40))])
    graph.outputs = [y]
    cases["matmul"] = graph, feeds
    graph, x, feeds = single_input((3, 300))
    graph.outputs = list(graph.add_node("Softmax", [x], {"axis": -1}))
    cases["softmax"] = graph, feeds
    graph, x, feeds = single_input((1, 5, 11, 13))
    graph.outputs = list(
        graph.add_node("MaxPool", [x], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})
    )
    cases["pool"] = graph, feeds
    graph, x, feeds = single_input((6, 500))
    graph.outputs = list(graph.add_node("ReduceMean", [x], {"axes": [1]}))
    cases["mean"] = graph, feeds
    cases["layer_norm"] = row_norm_graph("LayerNormalization", (2, 9, 200))
    for name in ("f4_residual", "f4_two_outputs"):
        cases[f"winograd_{name}"] = winograd_graph(*WINOGRAD_CASES[name])
    return cases


RUNTIME_CASES = _runtime_cases()


@pytest.mark.parametrize("target", ["opencl", "webgpu"])
@pytest.mark.parametrize("case", RUNTIME_CASES)
def test_templates_on_pocl_and_lavapipe(case, target):
    """Each template's kernel through the OpenCL or WGSL codegen and lower_gpu, run on PoCL or lavapipe: barriers,
    shared tiles and cross-thread reductions as a device runs them, against the reference executor."""
    graph, feeds = RUNTIME_CASES[case]
    check(graph, feeds, target, device=target)


@pytest.mark.parametrize("target", ["opencl", "webgpu"])
@pytest.mark.parametrize("cross_thread", [0, 1])
@pytest.mark.parametrize("case", ["softmax", "mean", "layer_norm"])
def test_row_reductions_either_way_on_pocl_and_lavapipe(case, cross_thread, target):
    """A row per thread (webgpu's fallback) and a row per block (opencl's) on both real runtimes."""
    graph, feeds = RUNTIME_CASES[case]
    check(graph, feeds, target, lambda space: {**space.fallback.to_json(), "cross_thread": cross_thread}, target)


def test_blocks_beyond_the_grid_spill_into_the_next_grid_axis():
    """A device whose grid x holds 4 blocks: 1000 elements in blocks of 32 need 32 blocks, so blockIdx.x takes 4 and
    blockIdx.y the rest, the last blocks guarded; the result is unchanged."""
    import dataclasses

    webgpu = Target.parse("webgpu")
    small = dataclasses.replace(webgpu, device=dataclasses.replace(webgpu.device, max_grid=(4, 65535, 65535)))
    graph, x, feeds = single_input((1000,))
    graph.outputs = list(graph.add_node("Relu", [x]))
    kernels = check(graph, feeds, small, config=lambda space: {"num_thread": 32})
    tir = tir_of(kernels)
    assert re.search(r"0, 8\) thread_binding\(blockIdx\.y\)", tir), tir
    assert re.search(r"0, 4\) thread_binding\(blockIdx\.x\)", tir), tir


def test_a_softmax_row_too_long_for_shared_memory_is_recomputed():
    """8192 floats are 32 KB, beyond WebGPU's 16 KB of workgroup memory: the exponentials are not held per row but
    recomputed by the sum and by the output, and the kernel stays within the device."""
    graph, x, feeds = single_input((2, 8192))
    graph.outputs = list(graph.add_node("Softmax", [x], {"axis": -1}))
    tir = tir_of(check(graph, feeds))
    assert not re.search(r"allocate \w+: float32\[1, 8192\] shared", tir), tir


def test_an_empty_tensor_schedules():
    """A Slice past the end gives a tensor with a zero dimension (ONNX node tests have eight such cases): its loops
    split over one thread (not zero), so it schedules and lowers; the simplifier then drops the loops of no
    iterations, leaving an empty kernel (which lower_gpu refuses today as a kernel without thread loops)."""
    graph, x, feeds = single_input((4, 6))
    attrs = {"starts": np.array([10], np.int64), "ends": np.array([12], np.int64), "axes": np.array([0], np.int64)}
    graph.outputs = list(graph.add_node("Slice", [x], attrs))
    assert graph.outputs[0].type.shape == (0, 6)
    (kernel, _), *_ = check(graph, feeds)
    assert not any(isinstance(stmt, Store) for stmt in walk_stmts(kernel.func.body))


@pytest.mark.parametrize("name", ["squeezenet", "bert_tiny", "unet_small"])
def test_zoo_kernels_pass_lower_gpu_for_every_gpu_target(name):
    """Every group of these models (convs, pools, concat; dense, layer norm, softmax; resize, ConvTranspose), on its
    GPU template, lowered and put through lower_gpu for webgpu, opencl and
    cuda: within each device's threads, grid and shared memory. WebGPU refuses only what its dtypes forbid (bert_tiny's
    int64 Gather indices, unet_small's float64 Resize coordinates), never a schedule's limits."""
    from compiler import zoo
    from compiler.errors import GpuKernelError
    from compiler.frontend.onnx import load_onnx
    from compiler.tir.gpu import lower_gpu
    from compiler.tir.lower import lower

    for target in map(Target.parse, GPU_TARGETS):
        for node in optimize(load_onnx(zoo.build_model(name)), target=target).nodes:
            group = group_to_te(node)
            func = lower(schedule_group(group, target), group.inputs + group.outputs, group.name)
            try:
                for part in split_launches(func):  # a Winograd conv's three
                    lower_gpu(part, target)
            except GpuKernelError as error:
                assert target == "webgpu" and ("int64" in str(error) or "float64" in str(error)), error


def test_an_output_other_stages_read_is_recomputed_so_the_kernel_is_one_launch():
    """bert_tiny's layer norm group stores x - mean (an output) and squares it for the variance: the variance reads a
    recomputed copy, not the stored output, so tir/gpu.py need not split the kernel into two launches."""
    from compiler.tir.gpu import split_launches
    from compiler.tir.lower import lower

    graph = Graph()
    x = graph.add_input("x", TensorType((1, 8, 32), "float32"))
    mean = graph.add_input("mean", TensorType((1, 8, 1), "float32"))
    (centred,) = graph.add_node("Sub", [x, mean])
    (square,) = graph.add_node("Mul", [centred, centred])
    (variance,) = graph.add_node("ReduceMean", [square], {"axes": [-1]})
    (root,) = graph.add_node("Sqrt", [variance])
    graph.outputs = [centred, root]
    feeds = {
        "x": RNG.standard_normal((1, 8, 32)).astype(np.float32),
        "mean": RNG.standard_normal((1, 8, 1)).astype(np.float32),
    }
    (kernel, _), *_ = check(graph, feeds, "opencl", device="opencl")
    (node,) = optimize(graph, target=Target.parse("opencl")).nodes
    group = group_to_te(node)
    func = lower(schedule_group(group, Target.parse("opencl")), group.inputs + group.outputs, group.name)
    assert len(split_launches(func)) == 1


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("case", RUNTIME_CASES)
def test_templates_compile_for_cuda_with_nvrtc(case, arch):
    """No CUDA device here: each template's kernels go through the CUDA codegen and lower_gpu and compile to a cubin
    with NVRTC (the `gpu`-marked model tests run them where a device is)."""
    graph, _ = RUNTIME_CASES[case]
    target = Target.parse(f"cuda -arch={arch}")
    for node in optimize(graph, target=target).nodes:
        group = group_to_te(node)
        kernel = build(schedule_group(group, target), group.inputs + group.outputs, target=target, name=group.name)
        assert kernel.runtime.cubin[:4] == b"\x7fELF"
