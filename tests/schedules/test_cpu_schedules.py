"""The default CPU schedules (compiler/schedules/cpu/) on whole fused groups: results against the numpy reference
executor natively and in wasmtime, and the loop structure they promise (epilogue at the anchor's tile, parallel and
vectorized loops) read from the kernel's loop IR."""

import itertools
import re

import numpy as np
import pytest

from compiler.build import build
from compiler.compute import group_to_te
from compiler.graph.ir import Graph, TensorType
from compiler.graph.reference import run_reference
from compiler.passes import winograd
from compiler.passes.alter_layout import channel_block
from compiler.passes.pipeline import optimize
from compiler.schedules.cpu import (
    DEFAULTS,
    divisor_at_most,
    fallback,
    lanes,
    schedule_group,
    tile_or_tail,
    vector_factor,
    vector_registers,
)
from compiler.schedules.space import ConfigSpace
from compiler.target import Target
from compiler.te.expr import Const
from compiler.te.tensor import children, substitute
from compiler.tir.nodes import For, ForKind, Prefetch, Stmt
from compiler.tir.simplify import simplify
from tests.model_checks import assert_close_in_range

TARGETS = ["llvm", "wasm"]
RNG = np.random.default_rng(0)


def compile_and_run(graph: Graph, feeds: dict, target: str = "llvm", config: dict | None = None, packed=False):
    """Optimise and fuse `graph` (with the target's layout pass when `packed`), build each group as one kernel (with
    the knob values of `config` where its template has those knobs), run them in order; (outputs, kernels)."""
    target = Target.parse(target)
    fused = optimize(graph, target=target if packed else None)
    env = {v: feeds[v.name] for v in fused.inputs}
    env.update(fused.params)
    kernels = []
    for node in fused.nodes:
        group = group_to_te(node)
        cfg = ConfigSpace(config)
        schedule = schedule_group(group, target, cfg)
        if cfg.misfits():
            schedule = schedule_group(group, target)
        kernel = build(schedule, group.inputs + group.outputs, target=target, name=group.name)
        outputs = [np.zeros(v.type.shape, v.type.dtype) for v in node.outputs]
        kernel(*[np.array(env[v], copy=True) for v in node.inputs], *outputs)
        env.update(zip(node.outputs, outputs))
        kernels.append(kernel)
    return {v.name: env[v] for v in fused.outputs}, kernels


def check(graph: Graph, feeds: dict, target: str, config: dict | None = None, packed: bool = False):
    expected = run_reference(graph, feeds)
    actual, kernels = compile_and_run(graph, feeds, target, config, packed)
    for name, value in expected.items():
        assert_close_in_range(actual[name], value, err_msg=name)
    return kernels


def param(graph: Graph, shape, positive: bool = False):
    array = RNG.standard_normal(shape).astype(np.float32)
    return graph.add_param("p", np.abs(array) + 0.5 if positive else array)


@pytest.fixture
def direct_convs(monkeypatch):
    """The direct blocked conv template for every conv: its 3x3 stride-1 convs of 32 channels or more would
    otherwise go to Winograd (compiler/passes/winograd.py)."""
    monkeypatch.setattr(winograd, "MIN_CHANNELS", {})


def conv_graph(x_shape, w_shape, attrs, epilogue: str, bias: bool = True):
    graph = Graph()
    x = graph.add_input("x", TensorType(x_shape, "float32"))
    operands = [x, param(graph, w_shape)] + ([param(graph, (w_shape[0],))] if bias else [])
    (y,) = graph.add_node("Conv", operands, attrs)
    channels = (w_shape[0],)
    if epilogue == "bn_relu6":
        bn = [param(graph, channels), param(graph, channels), param(graph, channels), param(graph, channels, True)]
        (y,) = graph.add_node("BatchNormalization", [y, *bn])
        (y,) = graph.add_node("Clip", [y], {"min": np.float32(0.0), "max": np.float32(6.0)})
    elif epilogue == "residual_relu":
        residual = graph.add_input("residual", TensorType(y.type.shape, "float32"))
        (y,) = graph.add_node("Add", [y, residual])
        (y,) = graph.add_node("Relu", [y])
    elif epilogue == "silu":
        (gate,) = graph.add_node("Sigmoid", [y])
        (y,) = graph.add_node("Mul", [y, gate])
    elif epilogue == "scale_shift_relu":
        (y,) = graph.add_node("Mul", [y, param(graph, (w_shape[0], 1, 1))])
        (y,) = graph.add_node("Add", [y, param(graph, (w_shape[0], 1, 1))])
        (y,) = graph.add_node("Relu", [y])
    graph.outputs = [y]
    feeds = {v.name: RNG.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs}
    return graph, feeds


def anchor_kernel(kernels):
    (kernel,) = kernels
    return kernel.source("tir")


def assert_tile_epilogue(tir: str, anchor: str) -> None:
    """The anchor accumulates into a local tile allocated inside the parallel loop, and the output store reads that
    tile: no global buffer of the anchor's whole output sits between it and its epilogue."""
    assert re.search(rf"allocate {anchor}: float32\[[^\]]*\] local", tir), tir
    assert not re.search(rf"allocate {anchor}: .* global", tir), tir
    assert tir.index(") parallel {") < tir.index(f"allocate {anchor}:"), tir
    assert ") vectorized {" in tir


@pytest.mark.parametrize("target", TARGETS)
def test_conv_folded_batchnorm_relu6_is_one_tiled_kernel(target):
    graph, feeds = conv_graph((1, 8, 10, 12), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}, "bn_relu6", bias=False)
    tir = anchor_kernel(check(graph, feeds, target))
    assert_tile_epilogue(tir, "conv")
    assert "allocate pad:" in tir


@pytest.mark.parametrize("target", TARGETS)
def test_conv_silu_is_one_tiled_kernel(target):
    """x * sigmoid(x) reads the conv's output twice; both reads come from the register tile."""
    graph, feeds = conv_graph((1, 8, 10, 12), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}, "silu")
    assert_tile_epilogue(anchor_kernel(check(graph, feeds, target)), "conv")


@pytest.mark.parametrize("target", TARGETS)
def test_conv_residual_add_relu(target):
    graph, feeds = conv_graph((1, 4, 9, 9), (8, 4, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "residual_relu")
    assert_tile_epilogue(anchor_kernel(check(graph, feeds, target)), "conv")


def conv_updates(tir: str, anchor: str = "conv") -> list[str]:
    """The lines of the loop IR that accumulate into the anchor's tile."""
    return [line for line in tir.splitlines() if re.search(rf"^\s*{anchor}\[.*\] = {anchor}\[.*\] \+", line)]


@pytest.mark.parametrize("target", TARGETS)
def test_depthwise_scale_shift_relu_is_one_kernel_without_a_padded_copy(target):
    """The seeds' depthwise_conv2d -> scale_shift -> relu at a reduced size. Its padding is read in place: the row
    tiles and column tiles are partitioned, so the interior tiles read the input with no test at all and only the
    border tiles keep the padding's select."""
    graph, feeds = conv_graph((1, 16, 20, 96), (16, 1, 3, 3), {"group": 16, "pads": [1, 1, 1, 1]}, "scale_shift_relu")
    tir = anchor_kernel(check(graph, feeds, target))
    assert_tile_epilogue(tir, "conv")
    assert "allocate pad" not in tir
    updates = conv_updates(tir)
    assert any("select(" not in line and "x[" in line for line in updates), tir
    assert any("select(" in line for line in updates), tir
    # the row tiles: the first, the interior from 1, the last
    assert re.search(r"for \(ax2\.outer: int32, 1, \d+\) \{", tir), tir


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("config", "pad"),
    [
        # the 2 + 2 padded rows one tile of 2 output rows reads, made right before the taps read them
        ({"padding": "rows"}, "float32[1, 1, 4, 26]"),
        # or one channel's whole padded plane
        ({"padding": "plane"}, "float32[1, 1, 26, 26]"),
    ],
)
def test_depthwise_unpartitioned_pads_inside_the_channel_loop(target, config, pad):
    graph, feeds = conv_graph((1, 32, 24, 24), (32, 1, 3, 3), {"group": 32, "pads": [1, 1, 1, 1]}, "scale_shift_relu")
    tir = anchor_kernel(check(graph, feeds, target, config))
    assert_tile_epilogue(tir, "conv")
    assert tir.index(") parallel {") < tir.index(f"allocate pad: {pad} local"), tir


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", [(1, 3, 7, 9), (2, 5, 33, 47), (1, 4, 1, 40)])
@pytest.mark.parametrize("strides", [[1, 1], [2, 2]])
@pytest.mark.parametrize("multiplier", [1, 2])
def test_partitioned_depthwise_on_odd_shapes(target, shape, strides, multiplier):
    """Borders wider than a tile, tiles that do not divide the plane, one row, strides, two filters per channel:
    the partitioned kernel against the reference executor."""
    channels = shape[1]
    attrs = {"group": channels, "pads": [1, 2, 2, 1], "strides": strides}
    graph, feeds = conv_graph(shape, (channels * multiplier, 1, 3, 3), attrs, "scale_shift_relu")
    check(graph, feeds, target)


@pytest.mark.parametrize("target", TARGETS)
def test_depthwise_padded_copy_is_made_at_the_root(target):
    graph, feeds = conv_graph((1, 4, 12, 12), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}, "none")
    tir = anchor_kernel(check(graph, feeds, target, {"padding": "copy"}))
    assert tir.index("allocate pad: float32[1, 4, 14, 14] global") < tir.index(") parallel {"), tir


def test_depthwise_padding_choices_follow_the_plane():
    """A channel's padded plane is copied into a local buffer only when it is small enough for one."""
    spaces = {}
    for size in (12, 200):
        graph, _ = conv_graph((1, 4, size, size), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}, "none")
        (node,) = optimize(graph).nodes
        spaces[size] = ConfigSpace()
        schedule_group(group_to_te(node), Target.parse("llvm"), spaces[size])
    assert spaces[12].knobs["padding"].choices == ("in_place", "copy", "rows", "plane")
    assert spaces[200].knobs["padding"].choices == ("in_place", "copy", "rows")
    assert spaces[12]["padding"].val == spaces[200]["padding"].val == "in_place"


@pytest.mark.parametrize("target", TARGETS)
def test_pointwise_conv_with_extents_no_tile_divides(target):
    graph, feeds = conv_graph((1, 6, 7, 13), (11, 6, 1, 1), {}, "none")
    assert_tile_epilogue(anchor_kernel(check(graph, feeds, target)), "conv")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [
        # audio_conv1d's first conv at a fifth of its length: one input channel, a long kernel, stride 4
        ((1, 1, 3200), (48, 1, 79), {"pads": [39, 39], "strides": [4]}),
        ((1, 12, 45), (20, 12, 3), {"pads": [2, 2], "dilations": [2]}),
        ((2, 8, 37), (16, 8, 3), {"pads": [1, 1], "strides": [2]}),
        ((1, 8, 30), (12, 4, 5), {"pads": [2, 2], "group": 2}),
    ],
)
def test_conv1d_is_register_blocked_with_a_vector_tail(target, x_shape, w_shape, attrs):
    """A 1-D conv gets the tile_oc x tile_ow register tile; an output length no vector tile divides ends in a
    shorter vector loop, not a guard in the vector body."""
    graph, feeds = conv_graph(x_shape, w_shape, attrs, "bn_relu6")
    tir = anchor_kernel(check(graph, feeds, target))
    assert_tile_epilogue(tir, "conv")
    updates = conv_updates(tir)
    tile_oc = fallback("conv1d", Target.parse(target))["tile_oc"]
    assert any(f"(ax1: int32, 0, {divisor_at_most(w_shape[0], tile_oc)}) unrolled" in line for line in tir.splitlines())
    assert updates and not re.search(r"vectorized \{\n\s*if", tir), tir


@pytest.mark.parametrize("target", TARGETS)
def test_gemm_relu_is_register_blocked(target):
    graph = Graph()
    x = graph.add_input("x", TensorType((5, 24), "float32"))
    (y,) = graph.add_node("Gemm", [x, param(graph, (40, 24)), param(graph, (40,))], {"transB": 1})
    (y,) = graph.add_node("Relu", [y])
    graph.outputs = [y]
    tir = anchor_kernel(check(graph, {"x": RNG.standard_normal((5, 24)).astype(np.float32)}, target))
    assert_tile_epilogue(tir, "dense")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [((1, 16, 24), (24, 64)), ((2, 3, 8, 16), (2, 3, 16, 32)), ((3, 8, 16), (1, 16, 32))],
)
def test_batched_matmul_is_register_blocked(target, a_shape, b_shape):
    """A MatMul with batch axes (a transformer's projections and attention) gets the dense template: tiles of
    the last two axes accumulated in a local register block inside one parallel loop over batch x tiles."""
    graph = Graph()
    a = graph.add_input("a", TensorType(a_shape, "float32"))
    b = graph.add_input("b", TensorType(b_shape, "float32"))
    graph.outputs = list(graph.add_node("MatMul", [a, b]))
    feeds = {"a": RNG.standard_normal(a_shape).astype(np.float32), "b": RNG.standard_normal(b_shape).astype(np.float32)}
    tir = anchor_kernel(check(graph, feeds, target))
    assert re.search(r"allocate batch_matmul(\.local)?: float32\[[^\]]*\] local", tir), tir
    assert tir.index(") parallel {") < tir.index("allocate batch_matmul"), tir
    assert ") vectorized {" in tir


def gelu(graph: Graph, y, form: str):
    """GELU as torch's exporter writes it: erf (x * 0.5 * (1 + erf(x / sqrt 2))) or tanh's approximation."""

    def scalar(value: float):
        return graph.add_param("c", np.array(value, np.float32))

    if form == "erf":
        (scaled,) = graph.add_node("Div", [y, scalar(np.sqrt(2.0))])
        (inner,) = graph.add_node("Erf", [scaled])
    else:
        (cube,) = graph.add_node("Mul", [y, y])
        (cube,) = graph.add_node("Mul", [cube, y])
        (cube,) = graph.add_node("Mul", [cube, scalar(0.044715)])
        (inner,) = graph.add_node("Add", [y, cube])
        (inner,) = graph.add_node("Mul", [inner, scalar(np.sqrt(2.0 / np.pi))])
        (inner,) = graph.add_node("Tanh", [inner])
    (inner,) = graph.add_node("Add", [inner, scalar(1.0)])
    (y,) = graph.add_node("Mul", [y, inner])
    (y,) = graph.add_node("Mul", [y, scalar(0.5)])
    return y


@pytest.mark.parametrize("target", [*TARGETS, "llvm -mattr=-avx512f"])
@pytest.mark.parametrize(
    ("a_shape", "columns", "epilogue"),
    [
        ((1, 13, 48), 100, "bias_gelu_erf"),
        ((1, 13, 48), 100, "bias_gelu_tanh"),
        ((2, 7, 32), 64, "bias_residual"),
        ((9, 40), 24, "scale"),
        ((11, 1, 24), 40, "bias"),
    ],
)
def test_matmul_by_a_param_weight_is_one_packed_kernel_with_its_epilogue(target, a_shape, columns, epilogue):
    """A projection of a transformer: the MatMul by a param weight reads B in panels packed at compile time, and its
    bias, GELU (either form), residual add or scale are the same kernel's epilogue, stored from the register block;
    13 rows and 100 columns leave a shorter last row tile and a last panel past N, each a piece of its own, so no
    test is left inside the vector loops. A sequence-first A (tokens, 1, K), as torch's MultiheadAttention exports
    its projections, tiles its tokens as the rows."""
    graph = Graph()
    x = graph.add_input("x", TensorType(a_shape, "float32"))
    (y,) = graph.add_node("MatMul", [x, param(graph, (a_shape[-1], columns))])
    if epilogue.startswith("bias"):
        (y,) = graph.add_node("Add", [y, param(graph, (columns,))])
    if epilogue.startswith("bias_gelu"):
        y = gelu(graph, y, epilogue.rsplit("_", 1)[1])
    elif epilogue == "bias_residual":
        residual = graph.add_input("residual", TensorType(y.type.shape, "float32"))
        (y,) = graph.add_node("Add", [y, residual])
    elif epilogue == "scale":
        (y,) = graph.add_node("Mul", [y, graph.add_param("s", np.array(0.125, np.float32))])
    graph.outputs = [y]
    feeds = {v.name: RNG.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs}
    tir = anchor_kernel(check(graph, feeds, target, packed=True))
    assert_tile_epilogue(tir, "dense_packed")
    extent = next(size for size in reversed(a_shape[:-1]) if size > 1)
    rows = tile_or_tail(extent, fallback("dense_packed", Target.parse(target))["tile_m"], least=1.0)
    assert re.search(rf"allocate dense_packed: float32\[({rows}, 1|(1, )?{rows}), \d+\] local", tir), tir
    assert not re.search(r"(unrolled|vectorized) \{\n\s*if", tir), tir


def ragged_tile(target: Target, rows: int, columns: int) -> int:
    """The column tile of a row no whole vectors divide, in a block of `rows`: the fallback's tile_n, a vector less
    while the block's accumulators, the vectors of B and A's broadcast do not fit the vector registers, then the
    largest power of two or multiple of one to four vectors up to it and to the row."""
    width, tile = lanes(target, "float32"), fallback("dense", target)["tile_n"]
    while tile > width and rows * -(-tile // width) + -(-tile // width) + 1 > vector_registers(target):
        tile -= width
    sizes = {1 << shift for shift in range(columns.bit_length())} | {width * count for count in range(1, 5)}
    return max(size for size in sizes if size <= min(tile, columns))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("a_shape", "b_shape"), [((1, 3, 11, 8), (1, 3, 8, 21)), ((2, 13, 16), (16, 77))])
def test_matmul_whose_row_no_vector_divides_ends_in_one_shorter_vector(target, a_shape, b_shape):
    """Attention at 77 tokens: the column tiles are powers of two or whole vectors and their loop is partitioned (a
    parallel one branches its task on it), so only the last tile is shorter, and it is still one vector loop, not a
    guard per lane."""
    graph = Graph()
    a = graph.add_input("a", TensorType(a_shape, "float32"))
    b = graph.add_input("b", TensorType(b_shape, "float32"))
    graph.outputs = list(graph.add_node("MatMul", [a, b]))
    feeds = {"a": RNG.standard_normal(a_shape).astype(np.float32), "b": RNG.standard_normal(b_shape).astype(np.float32)}
    tir = anchor_kernel(check(graph, feeds, target))
    rows = re.search(r"allocate batch_matmul(?:\.local)?: float32\[(?:\d+, )*(\d+), \d+\] local", tir).group(1)
    tile = ragged_tile(Target.parse(target), int(rows), b_shape[-1])
    tail = b_shape[-1] % tile
    assert re.search(rf"\(ax[\w.]*: int32, 0, {tail}\) vectorized", tir), tir
    assert not re.search(r"vectorized \{\n\s*if", tir), tir


@pytest.mark.parametrize("target", TARGETS)
def test_matmul_tiles_are_whole_vectors_and_rows_take_a_divisor_above_the_tile(target):
    """200 columns: the divisors near the tile (10 in 4 lanes, 25 in 16) are not whole vectors, so the columns are
    tiled like a ragged row; 77 rows: AVX-512's and wasm's blocks take 7 rows (a divisor near their 8 and 4), AVX2's
    6 of a balanced tiling (7 x 16 would not fit its registers), then 11: its 200 columns take one vector, and 6 x 8
    holds 6 accumulators of the fallback's 12 (_fill_block)."""
    graph = Graph()
    a = graph.add_input("a", TensorType((1, 77, 200), "float32"))
    graph.outputs = list(graph.add_node("MatMul", [a, param(graph, (200, 200))]))
    tir = anchor_kernel(check(graph, {"a": RNG.standard_normal((1, 77, 200)).astype(np.float32)}, target))
    width = Target.parse(target).vector_bytes // 4
    extents = [int(size) for size in re.findall(r"\(ax[\w.]*: int32, 0, (\d+)\) vectorized", tir)]
    assert extents and all(size % width == 0 or size < width for size in extents), tir  # a tail: one short vector
    rows = 11 if width == 8 else 7
    assert re.search(rf"allocate batch_matmul(\.local)?: float32\[1, {rows}, \d+\] local", tir), tir


@pytest.mark.parametrize("target", ["llvm", "llvm -mattr=-avx512f", "wasm"])
def test_matmul_rows_no_divisor_suits_end_in_a_shorter_row_tile(target):
    """77 rows of whole-vector columns (576) on AVX2: 77's divisor 7 above its 6 rows would make a 7 x 16 block, 17
    registers, so the block takes the rows in a balanced tiling with a shorter last tile (12 x 6 + 5), and only that
    tile's loops are shorter: no test of a row or column is left in the vector loops. AVX-512 takes 7 in 7 x 48 (32
    registers), wasm 7 x 4 (its blocks keep their accumulators by narrowing the columns)."""
    graph = Graph()
    a = graph.add_input("a", TensorType((1, 77, 48), "float32"))
    graph.outputs = list(graph.add_node("MatMul", [a, param(graph, (48, 576))]))
    tir = anchor_kernel(check(graph, {"a": RNG.standard_normal((1, 77, 48)).astype(np.float32)}, target))
    rows, tail, columns = {16: (7, None, 4), 32: (6, 5, 16), 64: (7, None, 48)}[Target.parse(target).vector_bytes]
    assert re.search(rf"allocate batch_matmul(\.local)?: float32\[1, {rows}, {columns}\] local", tir), tir
    if tail is not None:
        assert re.search(rf"\(ax[\w.]*: int32, 0, {tail}\) unrolled", tir), tir
    assert not re.search(r"(unrolled|vectorized) \{\n\s*if", tir), tir


def hottest_loop(assembly: str) -> list[str]:
    """The instructions of the assembly's loop (a label and the backward jump to it) with the most multiply-adds."""
    lines = assembly.splitlines()
    labels = {line[:-1]: number for number, line in enumerate(lines) if re.fullmatch(r"\.LBB\w+:", line)}
    loops = []
    for number, line in enumerate(lines):
        jump = re.fullmatch(r"\s+j\w+\s+(\.LBB\w+)", line)
        if jump and labels.get(jump.group(1), number) < number:
            body = [text.split()[0] for text in lines[labels[jump.group(1)] : number + 1] if text.startswith("\t")]
            loops.append([op for op in body if not op.startswith(".")])
    return max(loops, key=lambda body: sum(op.startswith("vfmadd") for op in body))


def test_a_matmul_k_loop_makes_one_step_per_iteration():
    """LLVM may fully unroll a short constant loop (the 11 rows of a filled AVX2 block) but unrolls no loop partly
    (codegen/llvm/): it had unrolled the k loop around that block by 2, and the two steps' multiply-adds took a
    register copy each."""
    graph = Graph()
    a = graph.add_input("a", TensorType((1, 77, 200), "float32"))
    graph.outputs = list(graph.add_node("MatMul", [a, param(graph, (200, 200))]))
    (kernel,) = check(graph, {"a": RNG.standard_normal((1, 77, 200)).astype(np.float32)}, "llvm -mattr=-avx512f")
    loop = hottest_loop(kernel.source("asm"))
    assert sum(op.startswith("vfmadd") for op in loop) == 11, loop


@pytest.mark.usefixtures("direct_convs")
def test_blocked_conv_inner_loop_computes_no_addresses():
    """Natively an index is computed in 64 bits (codegen/llvm/, index), so the AVX2 blocked conv's inner loop is
    its broadcasts, weight loads and multiply-adds and the loop's step: in 32 bits it also did a lea and a sign
    extension per weight load (32 of each per 64 multiply-adds)."""
    graph, feeds = conv_graph((1, 32, 12, 12), (32, 32, 3, 3), {"pads": [1, 1, 1, 1]}, "")
    kernels = check(then_pointwise_conv(graph), feeds, "llvm -mattr=-avx512f", {"padding": "copy"}, packed=True)
    conv = next(kernel for kernel in kernels if "allocate conv:" in kernel.source("tir"))
    loop = hottest_loop(conv.source("asm"))
    assert loop.count("vfmadd231ps") >= 8, loop
    assert not {"movslq", "leal", "cltq"} & set(loop), loop


@pytest.mark.parametrize("target", ["llvm", "llvm -mattr=-avx512f"])
@pytest.mark.parametrize(("rows", "depth", "columns"), [(77, 200, 700), (77, 9, 59)])
def test_ragged_matmul_columns_keep_a_wide_tile_while_it_fits_the_registers(target, rows, depth, columns):
    """700 columns in 16 lanes have no whole-vector divisor: the column tile stays the fallback's tile_n (two
    vectors on AVX-512, with a 28-column last tile), halved only while the block of accumulators, the vectors of B
    and A's broadcast do not fit the vector registers, not until the tail fits one vector; the tail's odd-width
    vectors are codegen's to cut into registers. 59 columns: a prime. The block's rows: 7 on AVX-512, a divisor
    of 77; 6 on AVX2, where none is near its 6 (test_matmul_rows_no_divisor_suits_end_in_a_shorter_row_tile)."""
    graph = Graph()
    a = graph.add_input("a", TensorType((1, rows, depth), "float32"))
    bias = param(graph, (columns,))
    graph.outputs = list(graph.add_node("Add", [*graph.add_node("MatMul", [a, param(graph, (depth, columns))]), bias]))
    tir = anchor_kernel(check(graph, {"a": RNG.standard_normal((1, rows, depth)).astype(np.float32)}, target))
    block_rows = {32: 6, 64: 7}[Target.parse(target).vector_bytes]
    tile = ragged_tile(Target.parse(target), block_rows, columns)
    block = rf"allocate batch_matmul(\.local)?: float32\[1, {block_rows}, {tile}\] local"
    assert re.search(block, tir), tir
    assert re.search(rf"\(ax[\w.]*: int32, 0, {columns % tile}\) vectorized", tir), tir


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("w_shape", "attrs"),
    [((12, 4, 3, 3), {"group": 3, "dilations": [2, 2], "pads": [2, 2, 2, 2]}), ((6, 1, 7, 7), {"group": 6})],
)
def test_nchw_conv_rows_no_whole_vectors_divide_take_vector_tiles(target, w_shape, attrs):
    """66 output columns: their divisors near the tile (11, 3) are not whole vectors, so the grouped and depthwise
    NCHW templates tile the row in whole vectors and one shorter last tile, not in 11- or 3-lane vectors."""
    pads = attrs.get("pads", [3, 3, 3, 3])
    graph, feeds = conv_graph((1, 12 if attrs["group"] == 3 else 6, 9, 66), w_shape, {**attrs, "pads": pads}, "")
    tir = anchor_kernel(check(graph, feeds, target))
    width = Target.parse(target).vector_bytes // 4
    conv = tir[tir.index("allocate conv") :]  # the conv's loops (a padded copy before it has loops of its own)
    extents = [int(size) for size in re.findall(r"\(ax[\w.]*: int32, 0, (\d+)\) vectorized", conv)]
    assert extents and all(size % width == 0 or size == 66 % width for size in extents), (extents, tir)


def blocked_conv_kernel(kernels) -> str:
    """The loop IR of the first kernel that computes an NCHW[x]c convolution."""
    return next(source for source in (kernel.source("tir") for kernel in kernels) if "allocate conv:" in source)


# a prefetch hint, its loop over lines or one line (natively a blocked conv prefetches its next filter tile)
PREFETCH = r"(\s*for \([\w.]+\.line: int32, 0, \d+\) \{\n\s*prefetch\(.*\)\n\s*\}\n|\s*prefetch\(.*\)\n)"


def then_pointwise_conv(graph: Graph) -> Graph:
    """`graph` with a 1x1 conv after its output: a lone conv stays NCHW, a chain of two is blocked."""
    (y,) = graph.outputs
    channels = y.type.shape[1]
    graph.outputs = graph.add_node("Conv", [y, param(graph, (channels, channels, 1, 1))])
    return graph


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("strides", [[1, 1], [2, 2]])
def test_blocked_conv_keeps_filter_vectors_in_registers(target, strides):
    graph, feeds = conv_graph((1, 8, 9, 12), (16, 8, 3, 3), {"pads": [1, 1, 1, 1], "strides": strides}, "residual_relu")
    tir = blocked_conv_kernel(check(then_pointwise_conv(graph), feeds, target, packed=True))
    assert_tile_epilogue(tir, "conv")
    match = re.search(r"allocate conv: float32\[1, (\d+), 1, (\d+), (\d+)\] local", tir)
    assert match, tir
    assert target != "wasm" or (int(match[1]), int(match[3])) == (2, 8)
    # every tap: the tile's filter blocks and columns unrolled, each a multiply-add over a block's contiguous filters
    # (the window's loops between, when the taps knob puts them inside the input channels); the blocks' loop inside
    # the columns' where the target's fallback unrolls the columns outside (unroll_outer)
    blocks = r"(\s*for \(outer: int32, 0, 2\) unrolled \{\n)"
    columns_outer = fallback("conv2d_nchwc", Target.parse(target))["unroll_outer"] == "columns"
    assert re.search(
        rf"for \(rci: .*\n(\s*for \(r[01]: .*\n|{PREFETCH})*{'' if columns_outer else blocks + '?'}"
        rf"\s*for \(column(?:_\d+)?: int32, 0, \d+\) unrolled \{{\n{blocks if columns_outer else ''}"
        r"\s*for \(inner: .* vectorized",
        tir,
    ), tir
    if fallback("conv2d_nchwc", Target.parse(target))["padding"] == "copy":
        # the padded copy (13 columns with stride 2, whose last output never reads the 14th): parallel over rows,
        # each row's columns partitioned so the interior ones test no column
        assert re.search(r"allocate pad: float32\[1, 1, 11, 1[34], 8\] global", tir), tir
        assert re.search(r"for \(n\.c\.row\.fused: int32, 0, 11\) parallel \{", tir), tir
        assert re.search(r"for \(column: int32, 1, 12\) \{", tir), tir
    else:
        # the padding read in place: a task branches on its row, and the only tests left in the channel loop are
        # of an unrolled column and the window's column (a loop of kw that LLVM unrolls) against the border
        assert "allocate pad" not in tir, tir
        assert re.search(r"parallel \{\n\s*(let [\w.]+\.piece: int32 = .*\n\s*)?if \(", tir), tir
        tests = re.findall(r"select\(([^,]*), x\[", tir)
        assert tests and all(set(re.findall(r"[a-z][\w.]*", test)) <= {"column", "r1"} for test in tests), tests


@pytest.mark.parametrize("target", TARGETS)
def test_strided_pointwise_blocked_conv_reads_its_input_in_place(target):
    """A blocked 1x1 conv of stride 2 on an even plane (a ResNet shortcut) never reads the input's last row and
    column: that is a crop, not padding, so the conv reads its input where it lies, with no cropped copy of it first.
    (An NCHW conv of stride 2 keeps its copy: it splits the columns by phase, so its vectors load contiguous runs.)"""
    graph, feeds = conv_graph((1, 16, 10, 14), (32, 16, 1, 1), {"strides": [2, 2]}, "residual_relu")
    tir = blocked_conv_kernel(check(then_pointwise_conv(graph), feeds, target, packed=True))
    assert "allocate pad" not in tir, tir


def blocked_depthwise(target: str, stride: int, width: int, config: dict | None = None) -> str:
    """The loop IR of a blocked depthwise conv (after a conv that makes the layout blocked), checked against the
    reference executor."""
    graph, feeds = conv_graph((1, 3, 10, width), (16, 3, 3, 3), {"pads": [1, 1, 1, 1]}, "none")
    (y,) = graph.outputs
    attrs = {"group": 16, "pads": [1, 1, 1, 1], "strides": [stride, stride]}
    (y,) = graph.add_node("Conv", [y, param(graph, (16, 1, 3, 3)), param(graph, (16,))], attrs)
    graph.outputs = graph.add_node("Clip", [y], {"min": np.float32(0.0), "max": np.float32(6.0)})
    kernels = check(graph, feeds, target, config, packed=True)
    depthwise = [kernel.source("tir") for kernel in kernels if "allocate conv:" in kernel.source("tir")][1]
    assert re.search(
        r"for \(r1: .*\n\s*for \(column(?:_\d+)?: int32, 0, \d+\) unrolled \{\n\s*for \(inner: .* vectorized", depthwise
    )
    return depthwise


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("stride", [1, 2])
def test_blocked_depthwise_reads_its_padding_in_place(target, stride):
    """The column tiles are partitioned: the interior ones test only the row, the first and last also the column;
    no padded copy is made."""
    depthwise = blocked_depthwise(target, stride, 60)
    assert "allocate pad" not in depthwise
    assert re.search(r"for \(ax3\.outer: int32, 1, \d+\) \{", depthwise), depthwise
    tests = [line.count(">=") + line.count("<") for line in conv_updates(depthwise)]
    assert len(set(tests)) > 1, depthwise


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("stride", [1, 2])
def test_blocked_depthwise_unpartitioned_pads(target, stride):
    # strided, the 3 padded rows an output row reads are made inside its task (5 x 3 rows instead of 12 at once)
    depthwise = blocked_depthwise(target, stride, 14, {"padding": "rows" if stride == 2 else "copy"})
    pad = re.search(r"allocate pad: float32\[([\d, ]+)\] (local|global)", depthwise)
    assert pad, depthwise
    if stride == 2:
        assert (pad[1], pad[2]) == (f"1, 1, 3, 15, {channel_block(Target.parse(target))}", "local"), depthwise
        assert depthwise.index(") parallel {") < depthwise.index("allocate pad:"), depthwise
    else:
        assert pad[2] == "global" and depthwise.index("allocate pad:") < depthwise.index(") parallel {"), depthwise


@pytest.mark.parametrize("target", TARGETS)
def test_blocked_max_pool_keeps_a_register_tile_and_reads_its_padding_in_place(target):
    """A 7x7 stem conv then a max pool, as resnet18 starts: the pool (NCHW[x]c) accumulates a tile of columns in a
    local buffer over the unrolled taps, and its column tiles are partitioned instead of padding the input."""
    graph, feeds = conv_graph((1, 3, 32, 64), (16, 3, 7, 7), {"pads": [3, 3, 3, 3]}, "none")
    (y,) = graph.outputs
    graph.outputs = graph.add_node("MaxPool", [y], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})
    kernels = check(graph, feeds, target, packed=True)
    (pool,) = [kernel.source("tir") for kernel in kernels if "max_pool" in kernel.source("tir")]
    assert re.search(r"allocate max_pool\.local: float32\[1, 1, 1, \d+, \d+\] local", pool), pool
    assert re.search(r"for \(r0: int32, 0, 3\) unrolled", pool), pool
    assert re.search(r"for \(column\.outer: int32, 1, \d+\) \{", pool), pool
    assert "allocate pad" not in pool


@pytest.mark.parametrize("target", TARGETS)
def test_blocked_conv_over_a_prime_width_keeps_a_full_tile_and_a_short_tail(target):
    """31 columns (SqueezeNet after a ceil_mode pool): the only divisor below the tile's limit is 1, so the tiles are
    balanced, the last shorter (AVX-512's one filter block of 16 channels: 16 + 15; wasm's two blocks: 4 x 7 + 3;
    AVX2's two blocks: 5 x 6 + 1),
    the tile loop partitioned so the full tiles test nothing and the tail's loops are short (0.31 -> 0.08 ms for a
    16 -> 64 3x3 conv)."""
    graph, feeds = conv_graph((1, 8, 3, 31), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}, "residual_relu")
    tir = blocked_conv_kernel(check(then_pointwise_conv(graph), feeds, target, packed=True))
    match = re.search(r"allocate conv: float32\[1, \d+, 1, (\d+), \d+\] local", tir)
    assert match, tir
    tile = int(match[1])
    assert fallback("conv2d_nchwc", Target.parse(target))["tile_ow"] <= tile < 31, tir
    tail = 31 - tile * (31 // tile)
    assert re.search(rf"for \(column(?:_\d+)?: int32, 0, {tail}\) unrolled", tir), tir
    assert re.search(rf"for \(column(?:_\d+)?: int32, 0, {tile}\) unrolled", tir), tir
    assert not re.search(r"if \(column", tir), tir


@pytest.mark.parametrize(
    "target, tile",
    [
        ("llvm", (2, 7) if Target.parse("llvm").vector_bytes == 64 else (2, 4)),
        ("wasm", (2, 7)),
        ("llvm -mattr=-avx512f", (2, 4)),
    ],
)
def test_blocked_conv_over_a_short_row_takes_more_filter_blocks_that_fit(target, tile):
    """7 columns (a 7 x 7 feature map) are under AVX-512's 8-column tile and wasm's: the tile takes 2 filter blocks,
    so it keeps about as many accumulators as the fallback's full tile. AVX2's 2 x 6 tile finds no divisor of 7 near
    6 columns, so it takes 4 + 3; its 16 registers could not hold 2 x 7 accumulators with the blocks' weights and a
    broadcast input (the host, "llvm", is either)."""
    graph, feeds = conv_graph((1, 32, 7, 7), (32, 32, 3, 3), {"pads": [1, 1, 1, 1]}, "residual_relu")
    tir = blocked_conv_kernel(check(then_pointwise_conv(graph), feeds, target, packed=True))
    assert re.search(rf"allocate conv: float32\[1, {tile[0]}, 1, {tile[1]}, \d+\] local", tir), tir


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("width", [32, 31])
def test_conversion_back_to_nchw_writes_rows_of_a_channel(target, width):
    """NCHW[x]c -> NCHW: parallel over (batch, channel block, row), each channel of the block a vector loop over its
    row's columns (a tail of 31 in its own partitioned piece), no division of a fused index per element."""
    graph, feeds = conv_graph((1, 8, 3, width), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}, "residual_relu")
    kernels = check(then_pointwise_conv(graph), feeds, target, packed=True)
    (tir,) = [kernel.source("tir") for kernel in kernels if "nchw[" in kernel.source("tir")]
    assert re.search(r"for \(n\.c\.outer\.h\.fused: int32, 0, \d+\) parallel \{\n\s*for \(c\.inner: ", tir), tir
    assert re.search(r"for \(w\.inner: int32, 0, \d+\) vectorized", tir), tir


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("channels", "width"), [(32, 13), (24, 7), (60, 9)])
def test_conversion_into_blocks_runs_by_rows(target, channels, width):
    """NCHW -> NCHW[x]c on its own (an input two blocked convs read): parallel over (batch, channel block, row), a
    serial loop over the row's columns, each column's block one vector, no division of a fused index per vector;
    a channel count no block divides is padded with zeros."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, channels, 5, width), "float32"))
    branches = []
    for _ in range(2):
        (y,) = graph.add_node("Conv", [x, param(graph, (16, channels, 1, 1))])
        (y,) = graph.add_node("Conv", [y, param(graph, (16, 16, 1, 1))])
        branches.append(y)
    graph.outputs = graph.add_node("Add", branches)
    feeds = {"x": RNG.standard_normal((1, channels, 5, width)).astype(np.float32)}
    kernels = check(graph, feeds, target, packed=True)
    (tir,) = [kernel.source("tir") for kernel in kernels if ", nchwc: float32" in kernel.source("tir").split("\n")[0]]
    assert re.search(r"for \(n\.outer\.h\.fused: int32, 0, \d+\) parallel \{\n\s*for \(w: int32", tir), tir
    assert re.search(r"for \(inner\.inner: int32, 0, \d+\) vectorized", tir), tir


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
        ("MaxPool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
        ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 1], "count_include_pad": 1}),
        ("AveragePool", {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ],
)
def test_nchw_pool_pads_its_rows_in_its_task_and_keeps_a_register_tile(target, op, attrs):
    """An NCHW pool: the padded rows an output row reads made inside its task, their interior columns copied
    without a clamp; the taps unrolled around a vector tile of output columns (strided columns read as runs)."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 3, 13, 76), "float32"))
    graph.outputs = graph.add_node(op, [x], attrs)
    feeds = {"x": RNG.standard_normal((1, 3, 13, 76)).astype(np.float32)}
    (kernel,) = check(graph, feeds, target)
    tir = kernel.source("tir")
    assert re.search(r"for \(r0: int32, 0, [23]\) unrolled", tir), tir
    assert re.search(r"allocate (max_pool\.local|pool_sum): float32\[1, 1, 1, \d+\] local", tir), tir
    if "pads" in attrs or attrs.get("ceil_mode"):
        assert tir.index(") parallel {") < tir.index("allocate pad:"), tir
        # the padded row's column vectors partitioned: the interior ones (after the first, with a left pad) test nothing
        assert re.search(r"for \(ax3\.outer: int32, [01], \d+\) \{", tir), tir


def test_blocked_conv_tile_knob():
    graph, feeds = conv_graph((1, 8, 8, 8), (8, 8, 3, 3), {"pads": [1, 1, 1, 1]}, "bn_relu6", bias=False)
    config = {"tile_ow": 2}
    tir = blocked_conv_kernel(check(then_pointwise_conv(graph), feeds, "wasm", config, packed=True))
    assert "allocate conv: float32[1, 1, 1, 2, 8] local" in tir


@pytest.mark.parametrize("target", TARGETS)
def test_blocked_conv_taps_knob_moves_the_window_inside_the_input_channels(target):
    graph, feeds = conv_graph((1, 8, 8, 8), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}, "residual_relu")
    # with the padded copy (in place, the border rows' and columns' tap loops are partitioned)
    config = {"taps": "inner", "padding": "copy"}
    tir = blocked_conv_kernel(check(then_pointwise_conv(graph), feeds, target, config, packed=True))
    assert re.search(
        rf"for \(rci: int32, 0, \d+\) \{{\n{PREFETCH}?\s*for \(r0: int32, 0, 3\) \{{\n{PREFETCH}?"
        rf"\s*for \(r1: int32, 0, 3\)",
        tir,
    ), tir


def test_config_knobs_set_the_tile():
    graph, feeds = conv_graph((1, 4, 8, 8), (8, 4, 3, 3), {"pads": [1, 1, 1, 1]}, "residual_relu")
    tir = anchor_kernel(check(graph, feeds, "llvm", {"tile_oc": 2, "tile_ow": 4}))
    assert "allocate conv: float32[1, 2, 1, 4] local" in tir


@pytest.mark.parametrize("target", TARGETS)
def test_softmax_rows_run_in_parallel_with_local_statistics(target):
    """Each row's max, exponentials and sum are local buffers inside the parallel row loop; exp(x - max) is made
    once per element (a stash stage), not once for the sum and again for the output."""
    graph = Graph()
    x = graph.add_input("x", TensorType((6, 32), "float32"))
    graph.outputs = list(graph.add_node("Softmax", [x]))
    tir = anchor_kernel(check(graph, {"x": RNG.standard_normal((6, 32)).astype(np.float32) * 5}, target))
    assert re.search(r"allocate softmax_max: float32\[1, 1\] local", tir)
    assert re.search(r"allocate softmax_exp: float32\[1, 32\] local", tir)
    assert tir.index(") parallel {") < tir.index("allocate softmax_max")
    assert tir.count("exp(") == 1
    assert ") vectorized {" in tir


@pytest.mark.parametrize("target", TARGETS)
def test_attention_softmax_over_77_scores_runs_in_whole_vectors_and_a_tail(target):
    """77 attention scores per row (a sequence length no vector divides): whole vectors and one shorter tail, for
    the exponentials and the output, not vectors of 11 lanes (77's divisor)."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 2, 5, 77), "float32"))
    graph.outputs = list(graph.add_node("Softmax", [x], {"axis": -1}))
    tir = anchor_kernel(check(graph, {"x": RNG.standard_normal((1, 2, 5, 77)).astype(np.float32) * 5}, target))
    width = 16 if target == "llvm" and Target.parse("llvm").vector_bytes == 64 else 8 if target == "llvm" else 4
    vectors = re.findall(r"for \(ax3\.inner(?:_\d+)?: int32, 0, (\d+)\) vectorized", tir)
    assert sorted(set(map(int, vectors))) == [77 % width, width], tir
    assert tir.count("exp(") == 2  # the whole vectors' piece and the tail's


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "op, columns", [("Softmax", 77), ("Softmax", 128), ("LayerNormalization", 77), ("Softmax", 20)]
)
def test_row_reductions_run_in_vectors_of_partial_results(target, op, columns):
    """A softmax's max and sum and a layer norm's moments, made per row inside the row loop, reduce the row in
    vectors of partial results (rfactor; the masked tail in its own piece) and then combine the lanes; a row under
    two vectors keeps its scalar loop."""
    graph = Graph()
    shape = (1, 3, 5, columns)
    x = graph.add_input("x", TensorType(shape, "float32"))
    inputs = [x]
    if op == "LayerNormalization":
        inputs += [graph.add_param(name, RNG.standard_normal(columns).astype(np.float32)) for name in ("g", "b")]
    graph.outputs = list(graph.add_node(op, inputs, {"axis": -1}))[:1]
    tir = anchor_kernel(check(graph, {"x": RNG.standard_normal(shape).astype(np.float32) * 5}, target))
    width = lanes(Target.parse(target), "float32")
    factor = width * min(fallback("row_reduce", Target.parse(target))["partial_vectors"], columns // (2 * width))
    if factor:
        # two reductions per row, each over vectors of `factor` partials
        assert len(re.findall(rf"allocate \w+\.rf: float32\[{factor}, 1, 1, 1, 1\] local", tir)) == 2, tir
        assert len(re.findall(rf"for \(\w+\.lane: int32, 0, {factor}\) vectorized", tir)) >= 2, tir
        assert tir.index(") parallel {") < tir.index(".rf: float32")
    else:
        assert ".rf" not in tir, tir


@pytest.mark.parametrize("target", TARGETS)
def test_pool_then_elementwise_with_odd_shapes(target):
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 3, 11, 13), "float32"))
    (y,) = graph.add_node("MaxPool", [x], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})
    (y,) = graph.add_node("Sigmoid", [y])
    graph.outputs = [y]
    check(graph, {"x": RNG.standard_normal((1, 3, 11, 13)).astype(np.float32)}, target)


def test_elementwise_group_is_parallel_and_vectorized():
    graph = Graph()
    x = graph.add_input("x", TensorType((4, 64), "float32"))
    (y,) = graph.add_node("Add", [x, param(graph, (64,))])
    (y,) = graph.add_node("Relu", [y])
    graph.outputs = [y]
    tir = anchor_kernel(check(graph, {"x": RNG.standard_normal((4, 64)).astype(np.float32)}, "llvm"))
    assert ") parallel {" in tir and ") vectorized {" in tir


def test_split_factors_divide_their_extents():
    assert divisor_at_most(112, 16) == 16
    assert divisor_at_most(7, 16) == 7
    assert divisor_at_most(13, 8) == 1
    assert vector_factor(64, 16) == 16
    assert vector_factor(24, 16) == 12
    assert vector_factor(7, 8) == 7
    assert vector_factor(13, 8) == 1


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "pads", "inner"),
    [
        ((1, 32, 7, 7), (32, 32, 3, 3), 1, True),  # a 7-column row in tiles of 4 and 3
        ((1, 32, 14, 14), (32, 32, 3, 3), 1, True),  # 5 + 5 + 4
        ((1, 32, 24, 24), (32, 32, 3, 3), 1, False),  # tiles of 6: their body spilled with the taps inside
        ((1, 32, 14, 14), (32, 32, 5, 5), 2, False),  # a 5 x 5 window
        ((1, 32, 56, 56), (32, 32, 3, 3), 1, False),  # a long row
    ],
)
@pytest.mark.usefixtures("direct_convs")
def test_avx2_blocked_conv_puts_the_taps_inside_the_channels_on_a_short_row(x_shape, w_shape, pads, inner):
    """AVX2's fallback (`small_row_taps`): a row of at most SMALL_ROW columns, tiled by at most SMALL_ROW_TILE, with a
    window of at most 3 x 3 takes the window's loops inside the loop over a block's input channels."""
    graph, feeds = conv_graph(x_shape, w_shape, {"pads": [pads] * 4}, "")
    kernels = check(then_pointwise_conv(graph), feeds, "llvm -mattr=-avx512f", {"padding": "copy"}, packed=True)
    tir = blocked_conv_kernel(kernels)
    conv = tir[tir.index("allocate conv:") :]
    assert (conv.index("for (rci:") < conv.index("for (r0:")) == inner, tir


def test_fallbacks_overlay_defaults():
    assert fallback("conv2d") == DEFAULTS["conv2d"]
    assert fallback("conv2d_nchwc", Target.parse("wasm")) == {
        **DEFAULTS["conv2d_nchwc"],
        "tile_ow": 7,
        "tile_blocks": 2,
        "taps": "inner",
        "pointwise_tile_ow": 4,
        "pointwise_tile_blocks": 1,
        "padding": "copy",
    }
    assert fallback("conv2d_nchwc", Target.parse("llvm -mcpu=haswell -mattr=-avx512f")) == {
        **DEFAULTS["conv2d_nchwc"],
        "tile_ow": 6,
        "tile_blocks": 2,
        "unroll_outer": "columns",
        "padding": "copy",
        "small_row_taps": "inner",
    }
    assert fallback("conv2d_nchwc", Target.parse("llvm -mcpu=znver4 -mattr=+avx512f"))["unroll_outer"] == "blocks"
    # AVX2 has its own dense block (16 registers of 8 floats); AVX-512 three vectors wide, its k loop unrolled by 4
    assert fallback("dense", Target.parse("llvm -mcpu=haswell -mattr=-avx512f"))["tile_m"] == 6
    avx512 = fallback("dense", Target.parse("llvm -mcpu=znver4 -mattr=+avx512f"))
    assert avx512 == {**DEFAULTS["dense"], "tile_n": 48, "unroll_k": 4}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "op, attrs, shape",
    [
        ("GlobalAveragePool", {}, (1, 64, 14, 14)),
        ("GlobalMaxPool", {}, (2, 5, 13, 13)),
        ("ReduceMean", {"axes": [2, 3], "keepdims": 1}, (1, 6, 16, 16)),
        ("GlobalAveragePool", {}, (1, 8, 7, 7)),
        ("GlobalAveragePool", {}, (1, 4, 3, 3)),
    ],
)
def test_nchw_global_pool_sums_its_plane_in_vectors_of_partial_sums(target, op, attrs, shape):
    """A global pool over a contiguous NCHW plane: vectors of partial sums (rfactor) over whole vectors of the plane,
    then one masked tail, added up per channel; a plane shorter than two vectors keeps the scalar loop."""
    graph = Graph()
    x = graph.add_input("x", TensorType(shape, "float32"))
    graph.outputs = graph.add_node(op, [x], attrs)
    (kernel,) = check(graph, feeds={"x": RNG.standard_normal(shape).astype(np.float32)}, target=target)
    tir = kernel.source("tir")
    width, plane = lanes(Target.parse(target), "float32"), shape[2] * shape[3]
    factor = width * min(fallback("plane_reduce", Target.parse(target))["partial_vectors"], plane // (2 * width))
    if factor:
        assert re.search(rf"allocate \w+\.rf: float32\[{factor}, 1, 1, 1, 1\] local", tir), tir
        assert re.search(rf"for \(\w+\.lane: int32, 0, {factor}\) vectorized", tir), tir
    else:
        assert ".rf" not in tir, tir


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape, factor", [((1, 8, 6, 20), 2), ((2, 3, 5, 16), 2), ((1, 4, 3, 8), 4)])
def test_nearest_resize_by_an_integer_factor_loads_runs_it_repeats(target, shape, factor):
    """Nearest Resize by an integer factor (asymmetric, floor: torch's nn.Upsample), scheduled by output rows: a vector
    of output columns reads one contiguous run of its input row, each element shuffled out `factor` times, instead
    of a load per lane."""
    graph = Graph()
    x = graph.add_input("x", TensorType(shape, "float32"))
    scales = np.array([1, 1, factor, factor], np.float32)
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    graph.outputs = graph.add_node("Resize", [x], {"scales": scales, **attrs})
    (kernel,) = check(graph, {"x": RNG.standard_normal(shape).astype(np.float32)}, target)
    tir = kernel.source("tir")
    # parallel over output rows, each a serial loop of vectors: no division of a fused index per vector
    rows = shape[0] * shape[1] * shape[2] * factor
    assert re.search(rf"for \(ax0\.ax1\.ax2\.fused: int32, 0, {rows}\) parallel", tir), tir
    (vector,) = re.findall(r"for \([\w.]+: int32, 0, (\d+)\) vectorized", tir)
    loads = re.findall(r"load (<\d+ x float>|float),", kernel.source("ll"))
    # a vector of n lanes repeats n / factor elements: one load of them (a scalar one for a single element)
    assert set(loads) == {f"<{int(vector) // factor} x float>" if int(vector) > factor else "float"}, loads


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("attrs", "blend"),
    [
        ({"mode": "linear", "scales": (1.0, 1.0, 2.0, 2.0)}, "float32"),  # half_pixel, unet_small's upsampling
        ({"mode": "linear", "scales": (1.0, 1.0, 3.0, 2.0), "coordinate_transformation_mode": "asymmetric"}, "float32"),
        ({"mode": "linear", "sizes": (1, 24, 8, 11)}, "float64"),  # not an integer factor: float64 positions
        ({"mode": "nearest", "scales": (1.0, 1.0, 2.0, 2.0)}, None),  # half_pixel, round_prefer_floor
    ],
)
def test_blocked_resize_runs_by_rows_and_blends_integer_factors_in_float32(target, attrs, blend):
    """A Resize of a blocked value (24 channels on odd 5 x 7 planes): parallel over (batch, channel block, output
    row), a serial loop over the row's columns, each a vector of the block; a linear integer upscale blends in
    float32, as onnxruntime does, anything else keeps its float64 positions."""
    graph, feeds = conv_graph((1, 8, 5, 7), (24, 8, 3, 3), {"pads": [1, 1, 1, 1]}, "scale_shift_relu")
    (resized,) = graph.add_node("Resize", [graph.outputs[0]], attrs)
    graph.outputs = [resized]
    kernels = check(then_pointwise_conv(graph), feeds, target, packed=True)
    (tir,) = [kernel.source("tir") for kernel in kernels if "resize[" in kernel.source("tir")]
    assert re.search(r"for \(ax0\.ax1\.ax2\.fused: int32, 0, \d+\) parallel \{\n\s*for \(ax3: int32, 0, \d+\) \{", tir)
    if blend is not None:
        assert ("float64" in tir) == (blend == "float64"), tir


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "attrs",
    [
        {"strides": [2, 2]},  # unet_small's 2x2 upsampling: one tap per output
        {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},  # 3x3: taps of each column's phase
        {"strides": [1, 2], "dilations": [2, 1], "pads": [0, 1, 2, 0]},
    ],
)
def test_blocked_conv_transpose_keeps_a_register_tile_of_columns(target, attrs):
    """A ConvTranspose of a blocked value (odd 5 x 7 planes, 16 -> 24 channels): parallel over (batch, filter block,
    output row), a local tile of output columns x the filter block, its columns unrolled inside the loops over the
    input channels and taps, the bias added as the tile is stored."""
    graph, feeds = conv_graph((1, 8, 5, 7), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}, "scale_shift_relu")
    kernel = [2, 2] if attrs == {"strides": [2, 2]} else [3, 3]
    weight, bias = param(graph, (16, 24, *kernel)), param(graph, (24,))
    (up,) = graph.add_node("ConvTranspose", [graph.outputs[0], weight, bias], {"kernel_shape": kernel, **attrs})
    graph.outputs = [up]
    kernels = check(then_pointwise_conv(graph), feeds, target, packed=True)
    (tir,) = [kernel.source("tir") for kernel in kernels if "allocate conv_transpose" in kernel.source("tir")]
    assert_tile_epilogue(tir, "conv_transpose")
    assert re.search(r"for \(column: int32, 0, \d+\) unrolled \{\n\s*for \(inner: int32, 0, \d+\) vectorized", tir), tir


@pytest.mark.parametrize("target", TARGETS)
def test_blocked_concat_reads_each_input_in_its_own_piece(target):
    """A Concat of blocked values on channels, with a batch norm and ReLU fused after it (a DenseNet block):
    parallel over rows, the loop over channel blocks cut at each input's blocks, so every piece reads its one
    input with no select, rather than testing every input's range and loading from all of them per vector."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 8, 6, 7), "float32"))
    (a,) = graph.add_node("Conv", [x, param(graph, (16, 8, 3, 3))], {"pads": [1, 1, 1, 1]})
    (b,) = graph.add_node("Conv", [a, param(graph, (32, 16, 1, 1))])
    (joined,) = graph.add_node("Concat", [a, b], {"axis": 1})
    channels = (48,)
    bn = [param(graph, channels), param(graph, channels), param(graph, channels), param(graph, channels, True)]
    (y,) = graph.add_node("Relu", [*graph.add_node("BatchNormalization", [joined, *bn])])
    graph.outputs = graph.add_node("Conv", [y, param(graph, (16, 48, 1, 1))])
    kernels = check(graph, {"x": RNG.standard_normal((1, 8, 6, 7)).astype(np.float32)}, target, packed=True)
    (tir,) = [kernel.source("tir") for kernel in kernels if "concat" in kernel.source("tir").split("\n")[0]]
    assert "select" not in tir, tir
    assert re.search(r"for \(ax0\.ax2\.fused: int32, 0, 6\) parallel", tir), tir


def prefetched_lines(func, line_bytes: int = 64) -> dict[int, set[int]]:
    """Per iteration of `func`'s parallel loop, the cache lines of the buffer its prefetches name (every loop
    around each prefetch enumerated, its element index evaluated)."""
    found: dict[int, set[int]] = {}

    def visit(stmt, loops):
        if isinstance(stmt, Prefetch):
            parallel = next(loop for loop in loops if loop.kind == ForKind.PARALLEL)
            ranges = [range(int(loop.min.value), int(loop.min.value + loop.extent.value)) for loop in loops]
            for values in itertools.product(*ranges):
                index = simplify(
                    substitute(stmt.element.index, {loop.var: Const(v, "int32") for loop, v in zip(loops, values)})
                )
                task = values[loops.index(parallel)]
                found.setdefault(task, set()).add(int(index.value) * 4 // line_bytes)
            return
        for child in children(stmt, (Stmt,)):
            visit(child, loops + [stmt] if isinstance(stmt, For) else loops)

    visit(func.body, [])
    return found


def test_blocked_conv_prefetches_the_next_filter_tile():
    """With `prefetch`, each task (a filter tile's output row) prefetches a share of the next tile's filters: the
    tasks of the first tile name the lines of the second and no others, and all tasks together every line after
    the first tile, none outside the weights."""
    graph, feeds = conv_graph((1, 32, 5, 6), (64, 32, 3, 3), {"pads": [1, 1, 1, 1]}, "residual_relu")
    # with the padded copy, so that the tasks' body is one nest (in place, it branches on the row)
    kernels = check(then_pointwise_conv(graph), feeds, "llvm", {"prefetch": 1, "padding": "copy"}, packed=True)
    conv = next(kernel for kernel in kernels if "allocate conv:" in kernel.source("tir"))
    lines = prefetched_lines(conv.func)
    weight_lines = 64 * 32 * 3 * 3 * 4 // 64
    everything = set().union(*lines.values())
    first = min(lines[0])
    assert 0 < first and everything == set(range(first, weight_lines)), sorted(everything)
    rows = 5  # the tasks of one filter tile are its output rows
    assert set().union(*(lines[task] for task in range(rows))) == set(range(first, 2 * first))
