"""The dense/batch_matmul template's search knobs (compiler/schedules/cpu/dense.py): unroll_k, the parallel axis,
B's packed panels and a ragged row's vector-multiple tiles. Each point of the space built and run computes what
numpy does; the fallback is the template's old code, but for AVX-512's k loop unrolled by 4 (the digests of
tests/tune/test_fallback_schedules.py, and the zoo's MatMuls below)."""

import hashlib

import numpy as np
import pytest

from compiler import zoo
from compiler.build import build
from compiler.compute import group_to_te
from compiler.frontend.onnx import load_onnx
from compiler.graph.ir import Graph, TensorType
from compiler.passes import pipeline
from compiler.passes.alter_layout import alter_layout
from compiler.passes.pipeline import optimize
from compiler.passes.winograd import winograd
from compiler.schedules.cpu import fallback, schedule_group
from compiler.schedules.space import ConfigSpace
from compiler.target import Target
from compiler.tir.lower import lower
from compiler.tir.printer import format_func

RNG = np.random.default_rng(3)
NEW_KNOBS = {"unroll_k", "parallel", "pack_b", "tile_order"}
# the space-only tests below state AVX-512's tiles, so they ask for it whatever this host has (nothing runs)
AVX512 = "llvm -mattr=+avx512f"

# sha256 of the loop IR of the dense-template groups of bert_tiny and vit_tiny, by vector width in bytes, recorded
# from the template before unroll_k, parallel and pack_b existed (main at 96a0f67, after its whole-vector
# column tiles and 77-row blocks of 7); the 16-byte ones since wasm's blocks were sized for V8's registers (4 x 8,
# 77 rows in 7 x 4); the 64-byte ones since AVX-512's blocks are three vectors wide with the k loop unrolled by 4;
# vit_tiny's since a ragged row's MatMul takes the tile order and parallel loop of every other (SPACE_VERSION 9);
# the 32-byte ones since AVX2 packs B's panel once per column tile, the column tiles in parallel, and vit_tiny's
# again for its attention's 7 x 8 blocks taking 11 rows (_fill_block), and again for its 77 rows taking 6-row tiles
# and a 5-row last one where 77's divisor 7 made 7 x 16 blocks, beyond 16 registers (SPACE_VERSION 10); all since
# their MatMuls by param weights are MatMulPackeds (SPACE_VERSION 12): the digests are of their attention's MatMuls
# alone, whose code is byte for byte what it was
DENSE_DIGESTS = {
    ("bert_tiny", 64): "6989ae70e9092aa1c372d652079f8081ab3a4c677385004375f9b5d98cd50696",
    ("bert_tiny", 32): "f3a5c06df7f7fe55c291c813c88693807ba4ad65b25475a0ac4c1e4fddb4f5ce",
    ("bert_tiny", 16): "52e8c2ecdccc81d02bbb7e1858d4d07fc514205514e218af213ecca338691e59",
    ("vit_tiny", 64): "5abc68932d027d010421ab5bb85ec8c3898a1d28e44945dae08e6a770135620d",
    ("vit_tiny", 32): "0932e6cc64fb2cfdc39c7bb3ef0018399cf02711292af67f4e49799a78227953",
    ("vit_tiny", 16): "d368961599d6d119e01710f4f2b9ecac5d6e925c8f27db27261b27120880fcf5",
}


@pytest.mark.parametrize("target", ["llvm", "llvm -mattr=-avx512f", "wasm"])
@pytest.mark.parametrize("name", ["bert_tiny", "vit_tiny"])
def test_the_fallback_builds_the_old_dense_code(name, target, monkeypatch):
    """Their attention's MatMuls, as the dense template makes them when fuse_attention leaves them (a block of more
    than its MAX_KEYS keys, or one whose scores something else reads)."""
    monkeypatch.setitem(pipeline.LAYOUT_PASSES, "cpu", [alter_layout, winograd])
    target = Target.parse(target)
    unroll_k = fallback("dense", target)["unroll_k"]
    texts = []
    for node in optimize(load_onnx(zoo.build_model(name)), target=target).nodes:
        group = group_to_te(node)
        space = ConfigSpace()
        schedule = schedule_group(group, target, space)
        if space.template == "dense":
            if "pack_b" in space.knobs:
                # a panel is packed only when the column tiles are the parallel tasks
                packs = space.fallback["parallel"].val == "outer" and fallback("dense", target)["pack_b"]
                assert space.fallback["pack_b"].val == packs and space.fallback["unroll_k"].size[-1] <= unroll_k
            texts.append(format_func(lower(schedule, [*group.inputs, *group.outputs], "kernel")))
    digest = hashlib.sha256("\n\n".join(texts).encode()).hexdigest()
    assert digest == DENSE_DIGESTS[(name, target.vector_bytes)]


def matmul_node(a_shape, b_shape, transpose_b: bool = False):
    """A MatMul (+Relu) of an input by a weight, or (transpose_b) of two inputs, the second transposed on its last
    two axes first, as attention's Q K^T is."""
    graph = Graph()
    a = graph.add_input("a", TensorType(a_shape, "float32"))
    if transpose_b:
        b = graph.add_input("b", TensorType(b_shape, "float32"))
        perm = [*range(len(b_shape) - 2), len(b_shape) - 1, len(b_shape) - 2]
        (b,) = graph.add_node("Transpose", [b], {"perm": perm})
    else:
        b = graph.add_param("b", RNG.standard_normal(b_shape).astype(np.float32))
    (y,) = graph.add_node("MatMul", [a, b])
    (y,) = graph.add_node("Relu", [y])
    graph.outputs = [y]
    nodes = optimize(graph).nodes
    return graph, nodes[-1]


def configs_to_try(space: ConfigSpace, count: int):
    """Configs spread over the valid space, with every value of the new knobs among them."""
    valid = list(space.valid_configs())
    picked = valid[:: max(1, len(valid) // count)]
    for knob in NEW_KNOBS & set(space.knobs):
        for value in range(len(space.knobs[knob].choices)):
            picked += [config for config in valid if config.choices[knob] == value][:2]
    return list(dict.fromkeys(picked))


CASES = {
    # 40 columns: ragged on AVX-512 and AVX2 (no multiple of 16 or 8 lanes), whole vectors in wasm
    "dense": ((21, 24), (24, 40), False),
    "batch_matmul": ((2, 3, 13, 16), (2, 3, 16, 20), False),
    "attention_scores": ((1, 3, 11, 8), (1, 3, 11, 8), True),
}


@pytest.mark.parametrize("target", ["llvm", "wasm"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_new_knob_computes_the_matmul(case, target):
    a_shape, b_shape, transpose_b = CASES[case]
    graph, node = matmul_node(a_shape, b_shape, transpose_b)
    space = ConfigSpace()
    schedule_group(group_to_te(node), Target.parse(target), space)
    assert space.template == "dense" and {"unroll_k", "pack_b"} <= set(space.knobs)
    a = RNG.standard_normal(a_shape).astype(np.float32)
    b = RNG.standard_normal(b_shape).astype(np.float32) if transpose_b else next(iter(graph.params.values()))
    b_t = np.swapaxes(b, -1, -2)
    expected = np.maximum(a @ (b_t if transpose_b else b), 0)
    # the group reads B as given, or (when the Transpose is a group of its own) transposed
    (b_value,) = [value for value in node.inputs if value.name != "a"]
    operand = np.ascontiguousarray(b if tuple(b_value.type.shape) == b.shape else b_t)
    tried = configs_to_try(space, 6)
    assert {config["pack_b"].val for config in tried} == {0, 1}
    for config in tried:
        group = group_to_te(node)
        kernel = build(
            schedule_group(group, Target.parse(target), config.to_json()), [*group.inputs, *group.outputs], target
        )
        y = np.full(expected.shape, np.nan, np.float32)
        kernel(*[a if value.name == "a" else operand for value in node.inputs], y)
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4, err_msg=str(config.to_json()))


def test_ragged_rows_tile_by_vector_multiples():
    """77 columns on AVX-512: powers of two and 1-4 vectors of 16 lanes, every one with a guarded last tile, in
    either tile order and either parallel loop (the partition of the loop over column tiles follows it)."""
    _, node = matmul_node((7, 8), (8, 77))
    space = ConfigSpace()
    schedule_group(group_to_te(node), Target.parse(AVX512), space)
    sizes = {choice[-1] for choice in space.knobs["tile_n"].choices}
    assert sizes == {1, 2, 4, 8, 16, 32, 48, 64}
    assert len(space.knobs["tile_order"].choices) == 2 and space.knobs["parallel"].choices == ("tiles", "outer")


def test_parallel_outer_with_columns_outermost_packs_once_per_column_tile():
    """pack_b with the column tiles outermost and only they parallel: the panel is made outside the row tiles."""
    _, node = matmul_node((32, 16), (16, 64))
    space = ConfigSpace()
    schedule_group(group_to_te(node), Target.parse(AVX512), space)
    config = next(
        config
        for config in space.valid_configs()
        if config["pack_b"].val
        and config["parallel"].val == "outer"
        and config["tile_order"].perm == (1, 0)
        and config["tile_m"].size[-1] == 8
        and config["tile_n"].size[-1] == 32
    )
    group = group_to_te(node)
    text = format_func(
        lower(schedule_group(group, Target.parse(AVX512), config.to_json()), [*group.inputs, *group.outputs], "k")
    )
    # inside the parallel loop over the 2 column tiles, the panel is copied, then the 4 row tiles read it
    parallel, copy, rows = (
        text.index(part) for part in ("0, 2) parallel", "b.local[(ax0*32)", "(ax0.outer: int32, 0, 4)")
    )
    assert parallel < copy < rows


@pytest.mark.parametrize(("columns", "packs"), [(512, True), (48, False)])
def test_avx2_fallback_packs_b_only_with_column_tiles_enough_for_the_threads(columns, packs):
    """AVX2's fallback makes the column tiles the parallel tasks and packs B's panel once per tile, while there are
    OUTER_TASKS of them (512 columns: 32 tiles of 16); 48 columns make 3 tasks, so every tile is a task, unpacked."""
    _, node = matmul_node((64, 32), (32, columns))
    space = ConfigSpace()
    schedule_group(group_to_te(node), Target.parse("llvm -mattr=-avx512f"), space)
    assert space.fallback["parallel"].val == ("outer" if packs else "tiles")
    assert space.fallback["pack_b"].val == packs


def test_a_block_starved_of_accumulators_takes_more_rows_rolled():
    """33 rows x 520 columns on AVX2: 8 columns divide 520 and 16 do not, and 33's divisor up to 6 rows is 3, so the
    block held 3 of the fallback's 12 accumulators; it takes 11 rows (11 x 8 and B's vector and a broadcast fit 16
    registers), its rows a loop. On AVX-512 the block is as wide as before and the rows stay 11 (33 by at most 8)."""
    _, node = matmul_node((33, 100), (100, 520))
    for target, (rows, columns, unrolled) in {"llvm -mattr=-avx512f": (11, 8, 0), AVX512: (11, 32, 1)}.items():
        space = ConfigSpace()
        schedule_group(group_to_te(node), Target.parse(target), space)
        fallback_config = space.fallback
        assert fallback_config["tile_m"].size[-1] == rows and fallback_config["tile_n"].size[-1] == columns, target
        assert fallback_config["unroll_m"].val == unrolled, target


def packed_node(a_shape, b_shape, target):
    """A MatMul (+Relu) of an input by a param weight through the target's layout pass: a MatMulPacked group."""
    graph = Graph()
    a = graph.add_input("a", TensorType(a_shape, "float32"))
    (y,) = graph.add_node("MatMul", [a, graph.add_param("b", RNG.standard_normal(b_shape).astype(np.float32))])
    (y,) = graph.add_node("Relu", [y])
    graph.outputs = [y]
    fused = optimize(graph, target=Target.parse(target))
    (node,) = fused.nodes
    return graph, fused, node


@pytest.mark.parametrize("target", ["llvm", "llvm -mattr=-avx512f", "wasm"])
@pytest.mark.parametrize(("a_shape", "b_shape"), [((1, 13, 24), (24, 100)), ((2, 6, 16), (16, 64))])
def test_every_packed_dense_config_computes_the_matmul(a_shape, b_shape, target):
    """The MatMulPacked template's space (compiler/schedules/cpu/dense.py, schedule_dense_packed): rows, the k loop's unrolling, the
    tile order and the parallel loop, each value among the configs built and run; 13 rows and 100 columns leave a
    shorter last row tile and a last panel past N."""
    graph, fused, node = packed_node(a_shape, b_shape, target)
    space = ConfigSpace()
    schedule_group(group_to_te(node), Target.parse(target), space)
    assert space.template == "dense_packed"
    assert set(space.knobs) == {"tile_m", "unroll_m", "tile_order", "parallel", "unroll_k"}
    a = RNG.standard_normal(a_shape).astype(np.float32)
    expected = np.maximum(a @ next(iter(graph.params.values())), 0)
    valid = list(space.valid_configs())
    tried = valid[:: max(1, len(valid) // 6)]
    for knob in ("unroll_m", "tile_order", "parallel", "unroll_k"):
        for value in range(len(space.knobs[knob].choices)):
            tried += [config for config in valid if config.choices[knob] == value][:1]
    for config in dict.fromkeys(tried):
        group = group_to_te(node)
        kernel = build(
            schedule_group(group, Target.parse(target), config.to_json()), [*group.inputs, *group.outputs], target
        )
        y = np.full(expected.shape, np.nan, np.float32)
        kernel(a, fused.params[node.inputs[1]], y)
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4, err_msg=str(config.to_json()))


@pytest.mark.parametrize(("target", "rows", "most"), [(AVX512, 6, 6), ("llvm -mattr=-avx512f", 6, 6), ("wasm", 4, 14)])
def test_packed_dense_rows_fill_the_registers_around_one_panel(target, rows, most):
    """The fallback block is tile_m rows by one panel (AVX-512: 6 x 64 columns, 24 accumulators; AVX2 6 x 16; wasm
    4 x 8); the search may take rows while the block, the panel's vectors and a broadcast fit the registers."""
    _, _, node = packed_node((1, 128, 64), (64, 512), target)
    space = ConfigSpace()
    schedule_group(group_to_te(node), Target.parse(target), space)
    assert space.fallback["tile_m"].size[-1] == rows
    assert max(choice[-1] for choice in space.knobs["tile_m"].choices) == most
