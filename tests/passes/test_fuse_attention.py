"""fuse_attention: softmax(Q Kt [* scale] [+ mask]) [NaN guard] V becomes one Attention node; blocks whose
intermediates something else reads, or whose softmax is over another axis, stay as they are; the reference executor
(the unaltered graph is the oracle) gives the same outputs, and the compiled Attention kernel matches it."""

import numpy as np
import pytest

from compiler.build import build
from compiler.compute import group_to_te
from compiler.graph.ir import Graph, TensorType
from compiler.graph.reference import run_reference
from compiler.passes.fuse_attention import MAX_KEYS, fuse_attention
from compiler.passes.pipeline import optimize
from compiler.schedules.cpu import schedule_group
from compiler.schedules.space import ConfigSpace
from compiler.target import Target
from tests.model_checks import assert_close_in_range
from tests.schedules.test_cpu_schedules import compile_and_run

RNG = np.random.default_rng(17)


def attention_graph(shape=(1, 2, 5, 7, 8), scale="mul", mask=None, guard=False, extra_reader=False, axis=-1):
    """Q (batch, heads, M, D) @ Kt (batch, heads, D, N), scaled, masked, softmax, optionally guarded, @ V (.., N, D);
    `shape` is (batch, heads, M, N, D)."""
    batch, heads, rows, keys, depth = shape
    graph = Graph()
    q = graph.add_input("q", TensorType((batch, heads, rows, depth), "float32"))
    kt = graph.add_input("kt", TensorType((batch, heads, depth, keys), "float32"))
    v = graph.add_input("v", TensorType((batch, heads, keys, depth), "float32"))
    (scores,) = graph.add_node("MatMul", [q, kt])
    if scale == "mul":
        (scores,) = graph.add_node("Mul", [graph.add_param("scale", np.array(0.125, np.float32)), scores])
    elif scale == "div":
        (scores,) = graph.add_node("Div", [scores, graph.add_param("root", np.array(8.0, np.float32))])
    outputs = []
    if extra_reader:
        outputs.append(scores)
    if mask is not None:
        (scores,) = graph.add_node("Add", [scores, graph.add_input("mask", TensorType(mask, "float32"))])
    (weights,) = graph.add_node("Softmax", [scores], {"axis": axis})
    if guard:
        (nan,) = graph.add_node("IsNaN", [weights])
        (weights,) = graph.add_node("Where", [nan, graph.add_param("zero", np.array(0.0, np.float32)), weights])
    (out,) = graph.add_node("MatMul", [weights, v])
    graph.outputs = [out, *outputs]
    return graph


def feeds_for(graph: Graph, masked_row: bool = False) -> dict:
    feeds = {value.name: RNG.standard_normal(value.type.shape).astype(np.float32) for value in graph.inputs}
    if "mask" in feeds:
        feeds["mask"] = np.where(RNG.random(feeds["mask"].shape) < 0.3, -np.inf, 0).astype(np.float32)
        if masked_row:
            feeds["mask"][..., 0, :] = -np.inf
    return feeds


@pytest.mark.parametrize(
    ("scale", "mask", "guard"),
    [("mul", None, False), ("div", (1, 1, 1, 7), False), ("none", (1, 2, 5, 7), True), ("mul", (5, 7), True)],
)
def test_attention_blocks_become_one_node(scale, mask, guard):
    graph = attention_graph(scale=scale, mask=mask, guard=guard)
    fused = fuse_attention(graph, Target.parse("llvm"))
    (node,) = fused.nodes
    assert node.op == "Attention" and node.outputs == graph.outputs
    assert node.attrs == {"scale": 0.125 if scale != "none" else 1.0, "nan_to_zero": int(guard)}
    assert len(node.inputs) == (4 if mask else 3)
    feeds = feeds_for(graph, masked_row=guard)
    expected, actual = run_reference(graph, feeds), run_reference(fused, feeds)
    np.testing.assert_allclose(actual[graph.outputs[0].name], expected[graph.outputs[0].name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "variant",
    ["scores read elsewhere", "softmax over another axis", "too many keys"],
)
def test_blocks_the_kernel_cannot_take_whole_stay_apart(variant):
    if variant == "scores read elsewhere":
        graph = attention_graph(extra_reader=True)
    elif variant == "softmax over another axis":
        graph = attention_graph(shape=(1, 2, 7, 7, 8), axis=2)
    else:
        graph = attention_graph(shape=(1, 1, 2, MAX_KEYS + 1, 4))
    fused = fuse_attention(graph, Target.parse("llvm"))
    assert "Attention" not in [node.op for node in fused.nodes]


def test_gpu_targets_keep_the_ops():
    fused = optimize(attention_graph(), fuse=False, target=Target.parse("webgpu"))
    assert "Attention" not in [node.op for node in fused.nodes]


@pytest.mark.parametrize("target", ["llvm", "llvm -mattr=-avx512f", "wasm"])
@pytest.mark.parametrize(
    ("shape", "mask", "guard"),
    [((1, 2, 13, 37, 24), (1, 1, 1, 37), True), ((2, 3, 6, 16, 64), None, False), ((1, 1, 1, 5, 3), (1, 5), False)],
)
def test_the_attention_kernel_matches_the_reference(target, shape, mask, guard):
    """Odd row, key and depth counts (a shorter last row tile, key tile and column tile), masks broadcast over heads
    and rows, a fully masked row (zeros behind the guard), one query row."""
    graph = attention_graph(shape=shape, mask=mask, guard=guard)
    feeds = feeds_for(graph, masked_row=guard)
    expected = run_reference(graph, feeds)
    actual, kernels = compile_and_run(graph, feeds, target, packed=True)
    assert len(kernels) == 1 and "attention_scores" in kernels[0].source("tir")
    for name, value in expected.items():
        assert np.isfinite(actual[name]).all()
        assert_close_in_range(actual[name], value, err_msg=name)


@pytest.mark.parametrize("target", ["llvm", "wasm"])
def test_every_attention_config_computes_the_block(target):
    """The template's space (compiler/schedules/cpu/attention.py): query rows per task, the scores' key tile, the
    output's column tile and the partial vectors of the row maxima and sums, a spread of configs built and run."""
    graph = attention_graph(shape=(1, 2, 9, 40, 24), mask=(1, 1, 1, 40), guard=True)
    feeds = feeds_for(graph)
    expected = run_reference(graph, feeds)[graph.outputs[0].name]
    (node,) = optimize(graph, target=Target.parse(target)).nodes
    space = ConfigSpace()
    schedule_group(group_to_te(node), Target.parse(target), space)
    assert space.template == "attention"
    assert {"tile_m", "tile_n", "tile_d", "row_vectors"} <= set(space.knobs)
    valid = list(space.valid_configs())
    for config in valid[:: max(1, len(valid) // 8)]:
        group = group_to_te(node)
        kernel = build(
            schedule_group(group, Target.parse(target), config.to_json()), [*group.inputs, *group.outputs], target
        )
        out = np.full(expected.shape, np.nan, np.float32)
        kernel(*[feeds[value.name] for value in node.inputs], out)
        assert_close_in_range(out, expected, err_msg=str(config.to_json()))


def swin_graph(windows=4, heads=3, tokens=9, depth=8, shifted=True):
    """Swin's window attention as torchvision writes it: scores + a relative position bias (heads, N, N), then, in a
    shifted block, viewed per window (1, windows, heads, N, N) + the shifted-window mask (1, windows, 1, N, N) and
    viewed back, softmax, @ V."""
    graph = Graph()
    q = graph.add_input("q", TensorType((windows, heads, tokens, depth), "float32"))
    kt = graph.add_input("kt", TensorType((windows, heads, depth, tokens), "float32"))
    v = graph.add_input("v", TensorType((windows, heads, tokens, depth), "float32"))
    (scores,) = graph.add_node("MatMul", [q, kt])
    bias = graph.add_param("bias", RNG.standard_normal((1, heads, tokens, tokens)).astype(np.float32))
    (scores,) = graph.add_node("Add", [scores, bias])
    if shifted:
        (scores,) = graph.add_node("Reshape", [scores], {"shape": (1, windows, heads, tokens, tokens)})
        mask = np.where(RNG.random((1, windows, 1, tokens, tokens)) < 0.3, -100.0, 0.0).astype(np.float32)
        (scores,) = graph.add_node("Add", [graph.add_param("shift_mask", mask), scores])
        (scores,) = graph.add_node("Reshape", [scores], {"shape": (-1, heads, tokens, tokens)})
    (weights,) = graph.add_node("Softmax", [scores], {"axis": -1})
    (out,) = graph.add_node("MatMul", [weights, v])
    graph.outputs = [out]
    return graph


@pytest.mark.parametrize("shifted", [True, False])
def test_swin_bias_and_shifted_window_mask_become_one_mask(shifted):
    """The bias and the window mask, with the reshapes between them, merge into one constant mask of the scores'
    shape, so Swin's shifted blocks are Attention nodes too; the result is the graph's (up to the order of the two
    additions)."""
    graph = swin_graph(shifted=shifted)
    fused = fuse_attention(graph, Target.parse("llvm"))
    (node,) = [node for node in fused.nodes if node.op != "Reshape"]
    assert node.op == "Attention" and len(node.inputs) == 4
    mask = node.inputs[3]
    assert fused.params[mask].shape == ((4, 3, 9, 9) if shifted else (1, 3, 9, 9))
    feeds = feeds_for(graph)
    expected, actual = run_reference(graph, feeds), run_reference(fused, feeds)
    name = graph.outputs[0].name
    np.testing.assert_allclose(actual[name], expected[name], rtol=1e-5, atol=1e-6)
    outputs, _ = compile_and_run(graph, feeds, "llvm", packed=True)
    assert_close_in_range(outputs[name], expected[name])


def test_a_mask_chain_past_the_folding_limit_is_left_alone(monkeypatch):
    monkeypatch.setattr("compiler.passes.fuse_attention.worth_folding", lambda inputs, outputs: False)
    fused = fuse_attention(swin_graph(), Target.parse("llvm"))
    assert [node.op for node in fused.nodes].count("Softmax") == 1
