"""fuse_ops: groups follow TVM's pattern rules; every node of the result is a verified "fused" group."""

import numpy as np
import pytest

from compiler.graph.ir import Graph, Node, TensorType, Value
from compiler.passes.fold_batchnorm import fold_batchnorm
from compiler.passes.fuse_ops import fuse_ops, group_summary

RNG = np.random.default_rng(11)
IMAGE = TensorType((1, 4, 6, 6), "float32")


def conv(graph: Graph, x: Value, name: str, group: int = 1) -> Value:
    channels = x.type.shape[1]
    weight = graph.add_param(f"{name}_w", RNG.standard_normal((channels, channels // group, 3, 3)).astype(np.float32))
    (out,) = graph.add_node("Conv", [x, weight], {"group": group, "pads": (1, 1, 1, 1)}, name=name)
    return out


def channel_param(graph: Graph, name: str) -> Value:
    return graph.add_param(name, RNG.standard_normal((4, 1, 1)).astype(np.float32))


def add_group(graph: Graph, name: str, inputs: list[Value], pattern: str, anchor: str, build) -> list[Value]:
    """Append a fused node whose body `build(body, *body_inputs)` writes; returns its outer outputs."""
    body = Graph(name=name)
    body.outputs = build(body, *(body.add_input(v.name, v.type) for v in inputs))
    outputs = [Value(graph.fresh_name(v.name), v.type) for v in body.outputs]
    graph.nodes.append(Node("fused", inputs, outputs, {"body": body, "pattern": pattern, "anchor": anchor}, name))
    return outputs


def fuse_checked(graph: Graph, assert_same_results) -> Graph:
    text = str(graph)
    fused = fuse_ops(graph)
    assert str(graph) == text, "the pass changed its input graph"
    fused.verify()
    assert all(node.op == "fused" for node in fused.nodes)
    assert fused.outputs == graph.outputs
    assert_same_results(graph, fused)
    return fused


def test_seed_depthwise_scale_shift_relu_is_one_group(assert_same_structure, assert_same_results):
    def before():
        graph = Graph()
        x = graph.add_input("x", IMAGE)
        depthwise = conv(graph, x, "depthwise", group=4)
        (scaled,) = graph.add_node("Mul", [depthwise, channel_param(graph, "scale")])
        (shifted,) = graph.add_node("Add", [scaled, channel_param(graph, "shift")])
        graph.outputs = graph.add_node("Relu", [shifted])
        return graph

    def expected():
        graph = Graph()
        x = graph.add_input("x", IMAGE)
        weight = graph.add_param("depthwise_w", np.zeros((4, 1, 3, 3), np.float32))
        scale, shift = channel_param(graph, "scale"), channel_param(graph, "shift")

        def body(b, x, weight, scale, shift):
            (depthwise,) = b.add_node("Conv", [x, weight], {"group": 4, "pads": (1, 1, 1, 1)}, name="depthwise")
            (scaled,) = b.add_node("Mul", [depthwise, scale])
            (shifted,) = b.add_node("Add", [scaled, shift])
            return b.add_node("Relu", [shifted])

        name = "fused_0_conv_mul_add_relu"
        graph.outputs = add_group(graph, name, [x, weight, scale, shift], "OUT_EWISE_FUSABLE", "Conv", body)
        return graph

    fused = fuse_checked(before(), assert_same_results)
    assert_same_structure(fused, expected())
    assert group_summary(fused) == [("fused_0_conv_mul_add_relu", "OUT_EWISE_FUSABLE", ["Conv", "Mul", "Add", "Relu"])]


def test_conv_batchnorm_relu_is_one_group_after_folding(assert_same_results):
    graph = Graph()
    x = graph.add_input("x", IMAGE)
    stats = [np.abs(RNG.standard_normal(4)).astype(np.float32) + 0.5 for _ in range(4)]
    params = [graph.add_param(name, a) for name, a in zip(("gamma", "beta", "mean", "variance"), stats)]
    (normalized,) = graph.add_node("BatchNormalization", [conv(graph, x, "conv"), *params])
    graph.outputs = graph.add_node("Relu", [normalized])
    fused = fuse_ops(fold_batchnorm(graph))
    fused.verify()
    assert group_summary(fused) == [("fused_0_conv_relu", "OUT_EWISE_FUSABLE", ["Conv", "Relu"])]
    assert_same_results(graph, fused, atol=1e-5)


def test_residual_add_joins_the_later_conv(assert_same_results):
    graph = Graph()
    x = graph.add_input("x", IMAGE)
    first, second = conv(graph, x, "first"), conv(graph, x, "second")
    (total,) = graph.add_node("Add", [first, second])
    graph.outputs = graph.add_node("Relu", [total])
    fused = fuse_checked(graph, assert_same_results)
    assert group_summary(fused) == [
        ("fused_0_conv", "OUT_EWISE_FUSABLE", ["Conv"]),
        ("fused_1_conv_add_relu", "OUT_EWISE_FUSABLE", ["Conv", "Add", "Relu"]),
    ]
    assert fused.nodes[1].inputs[:2] == [x, graph.nodes[1].inputs[1]], "the later conv anchors the Add"
    assert fused.nodes[1].inputs[2] is first


def test_resnet_block(assert_same_results):
    graph = Graph()
    x = graph.add_input("x", IMAGE)
    (hidden,) = graph.add_node("Relu", [conv(graph, x, "first")])
    (total,) = graph.add_node("Add", [conv(graph, hidden, "second"), x])
    graph.outputs = graph.add_node("Relu", [total])
    fused = fuse_checked(graph, assert_same_results)
    assert [members for _, _, members in group_summary(fused)] == [["Conv", "Relu"], ["Conv", "Add", "Relu"]]


def test_anchors_never_share_a_group(assert_same_results):
    graph = Graph()
    x = graph.add_input("x", IMAGE)
    (pooled,) = graph.add_node("MaxPool", [conv(graph, conv(graph, x, "first"), "second")], {"kernel_shape": (2, 2)})
    graph.outputs = graph.add_node("Relu", [pooled])
    fused = fuse_checked(graph, assert_same_results)
    assert [members for _, _, members in group_summary(fused)] == [["Conv"], ["Conv"], ["MaxPool", "Relu"]]


def test_softmax_stands_alone(assert_same_results):
    graph = Graph()
    x = graph.add_input("x", TensorType((2, 5), "float32"))
    (exp,) = graph.add_node("Exp", [x])
    (softmax,) = graph.add_node("Softmax", [exp])
    graph.outputs = graph.add_node("Neg", [softmax])
    fused = fuse_checked(graph, assert_same_results)
    assert group_summary(fused) == [
        ("fused_0_exp", "ELEMWISE", ["Exp"]),
        ("fused_1_softmax", "OPAQUE", ["Softmax"]),
        ("fused_2_neg", "ELEMWISE", ["Neg"]),
    ]
    assert [node.attrs["anchor"] for node in fused.nodes] == ["", "Softmax", ""]


def test_reduction_absorbs_its_elementwise_producer_and_epilogue(assert_same_structure, assert_same_results):
    def before():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 5), "float32"))
        (exp,) = graph.add_node("Exp", [x])
        (mean,) = graph.add_node("ReduceMean", [exp], {"axes": (1,)})
        graph.outputs = graph.add_node("Sqrt", [mean])
        return graph

    def expected():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 5), "float32"))

        def body(b, x):
            (exp,) = b.add_node("Exp", [x])
            (mean,) = b.add_node("ReduceMean", [exp], {"axes": (1,)})
            return b.add_node("Sqrt", [mean])

        graph.outputs = add_group(graph, "fused_0_exp_reducemean_sqrt", [x], "REDUCE", "ReduceMean", body)
        return graph

    assert_same_structure(fuse_checked(before(), assert_same_results), expected())


def test_reduction_leaves_a_shared_producer(assert_same_results):
    graph = Graph()
    x = graph.add_input("x", TensorType((2, 5), "float32"))
    (exp,) = graph.add_node("Exp", [x])
    (mean,) = graph.add_node("ReduceMean", [exp], {"axes": (1,)})
    graph.outputs = [mean, *graph.add_node("Neg", [exp])]
    fused = fuse_checked(graph, assert_same_results)
    assert group_summary(fused) == [
        ("fused_0_exp_neg", "ELEMWISE", ["Exp", "Neg"]),
        ("fused_1_reducemean", "REDUCE", ["ReduceMean"]),
    ]


def test_group_with_several_outputs(assert_same_structure, assert_same_results):
    def before():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 5), "float32"))
        (relu,) = graph.add_node("Relu", [x])
        (exp,) = graph.add_node("Exp", [relu])
        graph.outputs = [exp, *graph.add_node("Softmax", [relu])]
        return graph

    def expected():
        graph = Graph()
        x = graph.add_input("x", TensorType((2, 5), "float32"))

        def body(b, x):
            (relu,) = b.add_node("Relu", [x])
            return [relu, *b.add_node("Exp", [relu])]

        relu, exp = add_group(graph, "fused_0_relu_exp", [x], "ELEMWISE", "", body)

        def alone(b, relu):
            return b.add_node("Softmax", [relu])

        graph.outputs = [exp, *add_group(graph, "fused_1_softmax", [relu], "OPAQUE", "Softmax", alone)]
        return graph

    fused = fuse_checked(before(), assert_same_results)
    assert_same_structure(fused, expected())
    assert len(fused.nodes[0].outputs) == 2


def test_anchor_output_that_is_a_graph_output_is_kept(assert_same_results):
    graph = Graph()
    x = graph.add_input("x", IMAGE)
    features = conv(graph, x, "conv")
    graph.outputs = [*graph.add_node("Relu", [features]), features]
    fused = fuse_checked(graph, assert_same_results)
    assert group_summary(fused) == [("fused_0_conv_relu", "OUT_EWISE_FUSABLE", ["Conv", "Relu"])]
    assert fused.nodes[0].outputs == [features, graph.outputs[0]]


def test_broadcast_that_widens_the_anchor_output_is_not_absorbed(assert_same_results):
    graph = Graph()
    x = graph.add_input("x", IMAGE)
    wide = graph.add_input("wide", TensorType((2, 4, 6, 6), "float32"))
    graph.outputs = graph.add_node("Add", [conv(graph, x, "conv"), wide])
    fused = fuse_checked(graph, assert_same_results)
    assert [members for _, _, members in group_summary(fused)] == [["Conv"], ["Add"]]


def test_injective_ops_fuse_with_each_other_but_not_into_an_anchor(assert_same_results):
    graph = Graph()
    x = graph.add_input("x", IMAGE)
    (moved,) = graph.add_node("Transpose", [conv(graph, x, "conv")], {"perm": (0, 2, 3, 1)})
    (flat,) = graph.add_node("Reshape", [moved], {"shape": (36, 4)})
    graph.outputs = graph.add_node("Relu", [flat])
    fused = fuse_checked(graph, assert_same_results)
    assert group_summary(fused) == [
        ("fused_0_conv", "OUT_EWISE_FUSABLE", ["Conv"]),
        ("fused_1_transpose_reshape_relu", "INJECTIVE", ["Transpose", "Reshape", "Relu"]),
    ]


def test_elementwise_branches_merge_into_one_group(assert_same_results):
    graph = Graph()
    x = graph.add_input("x", TensorType((3, 4), "float32"))
    (relu,) = graph.add_node("Relu", [x])
    (sigmoid,) = graph.add_node("Sigmoid", [x])
    graph.outputs = graph.add_node("Add", [relu, sigmoid])
    fused = fuse_checked(graph, assert_same_results)
    assert group_summary(fused) == [("fused_0_relu_sigmoid_add", "BROADCAST", ["Relu", "Sigmoid", "Add"])]
    assert fused.nodes[0].inputs == [x]


def test_no_group_closes_a_cycle_through_another(assert_same_results):
    graph = Graph()
    x = graph.add_input("x", IMAGE)
    (relu,) = graph.add_node("Relu", [x])
    features = conv(graph, relu, "conv")
    (total,) = graph.add_node("Add", [relu, features])
    graph.outputs = [total, *graph.add_node("Sigmoid", [features])]
    fused = fuse_checked(graph, assert_same_results)
    assert [members for _, _, members in group_summary(fused)] == [["Relu"], ["Conv"], ["Add"], ["Sigmoid"]]


def test_anchor_epilogue_wins_over_a_later_injective_group(assert_same_results):
    graph = Graph()
    x = graph.add_input("x", IMAGE)
    features = conv(graph, x, "conv")
    (moved,) = graph.add_node("Transpose", [x], {"perm": (0, 1, 3, 2)})
    graph.outputs = graph.add_node("Add", [features, moved])
    fused = fuse_checked(graph, assert_same_results)
    assert group_summary(fused) == [
        ("fused_0_transpose", "INJECTIVE", ["Transpose"]),
        ("fused_1_conv_add", "OUT_EWISE_FUSABLE", ["Conv", "Add"]),
    ]


def test_silu_after_a_conv_closes_a_diamond_into_its_group(assert_same_results):
    """x * sigmoid(x) on a conv's output: both readers of x end up in the conv's group, so x stays inside it."""
    graph = Graph()
    x = graph.add_input("x", IMAGE)
    features = conv(graph, x, "conv")
    (gate,) = graph.add_node("Sigmoid", [features])
    graph.outputs = graph.add_node("Mul", [features, gate])
    fused = fuse_checked(graph, assert_same_results)
    assert group_summary(fused) == [("fused_0_conv_sigmoid_mul", "OUT_EWISE_FUSABLE", ["Conv", "Sigmoid", "Mul"])]
    assert fused.nodes[0].outputs == graph.outputs


def test_a_diamond_whose_anchor_output_has_a_third_elementwise_reader_closes_at_the_last(assert_same_results):
    """silu + x: the Add reads the conv's output too, and it is elementwise, so the region of Sigmoid, Mul and Add
    closes at the Add and every reader of x joins the conv's group."""
    graph = Graph()
    x = graph.add_input("x", IMAGE)
    features = conv(graph, x, "conv")
    (gate,) = graph.add_node("Sigmoid", [features])
    (silu,) = graph.add_node("Mul", [features, gate])
    graph.outputs = graph.add_node("Add", [silu, features])
    fused = fuse_checked(graph, assert_same_results)
    assert [members for _, _, members in group_summary(fused)] == [["Conv", "Sigmoid", "Mul", "Add"]]


def test_gelu_after_a_matmul_closes_a_diamond_of_several_steps(assert_same_results):
    """GELU as exporters decompose it, x * 0.5 * (1 + erf(x / sqrt 2)): Div, Erf and Add join the MatMul's group one by
    one, then the Mul that reads x again."""
    graph = Graph()
    x = graph.add_input("x", TensorType((4, 8), "float32"))
    (y,) = graph.add_node("MatMul", [x, graph.add_param("w", RNG.standard_normal((8, 8)).astype(np.float32))])
    (scaled,) = graph.add_node("Div", [y, graph.add_param("root2", np.array(np.sqrt(2), np.float32))])
    (erf,) = graph.add_node("Erf", [scaled])
    (shifted,) = graph.add_node("Add", [erf, graph.add_param("one", np.array(1, np.float32))])
    (doubled,) = graph.add_node("Mul", [y, shifted])
    graph.outputs = graph.add_node("Mul", [doubled, graph.add_param("half", np.array(0.5, np.float32))])
    fused = fuse_checked(graph, assert_same_results)
    assert [members for _, _, members in group_summary(fused)] == [["MatMul", "Div", "Erf", "Add", "Mul", "Mul"]]


@pytest.mark.parametrize("leak", ["output", "conv", "reduction"])
def test_a_diamond_that_does_not_close_stays_apart(leak, assert_same_results):
    """The region after the conv is read from outside before it closes (a graph output, a second conv, a reduction):
    the conv's output must reach memory, so the region stays a group of its own."""
    graph = Graph()
    x = graph.add_input("x", IMAGE)
    features = conv(graph, x, "conv")
    (gate,) = graph.add_node("Sigmoid", [features])
    outputs = list(graph.add_node("Mul", [features, gate]))
    if leak == "output":
        outputs.append(gate)
    elif leak == "conv":
        outputs.append(conv(graph, gate, "second"))
    else:
        outputs += graph.add_node("ReduceMean", [gate], {"axes": (2, 3)})
    graph.outputs = outputs
    fused = fuse_checked(graph, assert_same_results)
    assert ["Conv"] in [members for _, _, members in group_summary(fused)]


def test_a_conv_takes_in_the_layout_transform_only_it_reads(assert_same_results):
    """The image's conversion into NCHW[x]c joins the first blocked conv (its padded copy reads NCHW in place:
    mobilenet_v2 loses a 0.061 ms kernel); one that two ops read, or that follows a Concat, keeps its group."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 4, 6, 6), "float32"))
    weight = graph.add_param("w", RNG.standard_normal((1, 4, 3, 3, 4)).astype(np.float32))
    blocked = {"src": "NCHW", "dst": "NCHW4c"}
    (image,) = graph.add_node("LayoutTransform", [x], blocked)
    (y,) = graph.add_node("ConvNCHWc", [image, weight], {"pads": (1, 1, 1, 1)})
    (y,) = graph.add_node("Relu", [y])
    (plain,) = graph.add_node("LayoutTransform", [y], {"src": "NCHW4c", "dst": "NCHW"})
    (joined,) = graph.add_node("Concat", [plain, x], {"axis": 1})
    (shared,) = graph.add_node("LayoutTransform", [joined], {"src": "NCHW", "dst": "NCHW4c"})
    wide = graph.add_param("v", RNG.standard_normal((1, 8, 1, 1, 4)).astype(np.float32))
    (first,) = graph.add_node("ConvNCHWc", [shared, wide])
    (second,) = graph.add_node("MaxPoolNCHWc", [shared], {"kernel_shape": (2, 2)})
    graph.outputs = [first, second]
    fused = fuse_checked(graph, assert_same_results)
    assert [ops for _, _, ops in group_summary(fused)] == [
        ["LayoutTransform", "ConvNCHWc", "Relu"],
        ["LayoutTransform", "Concat", "LayoutTransform"],
        ["ConvNCHWc"],
        ["MaxPoolNCHWc"],
    ]
