"""alter_layout: convolution chains move to NCHW[x]c with packed weights; LayoutTransform only where the layout
changes; the reference executor (the unaltered graph is the oracle) gives the same outputs."""

import numpy as np
import pytest

from compiler.errors import ShapeError
from compiler.graph.ir import Graph, TensorType
from compiler.graph.ops.conv import block_channels, unblock_channels
from compiler.graph.ops.dense import pack_dense_weight, unpack_dense_weight
from compiler.graph.registry import get_op
from compiler.passes.alter_layout import alter_layout, channel_block, pack_weight
from compiler.passes.eliminate_dead import eliminate_dead
from compiler.passes.pipeline import optimize
from compiler.target import Target

RNG = np.random.default_rng(5)
WASM_BLOCK = 8


def param(graph: Graph, shape, name="p"):
    return graph.add_param(name, RNG.standard_normal(shape).astype(np.float32))


def ops(graph: Graph) -> list[str]:
    return [node.op for node in graph.nodes]


def test_channel_block_per_target():
    assert channel_block(Target.parse("wasm")) == WASM_BLOCK
    assert channel_block(Target.parse("llvm -mtriple=aarch64-linux-gnu")) == 8
    assert channel_block(Target.parse("llvm -mcpu=haswell -mattr=-avx512f")) == 8


def test_block_and_pack_layouts():
    x = RNG.standard_normal((2, 16, 3, 5))
    blocked = block_channels(x, 8)
    assert blocked.shape == (2, 2, 3, 5, 8)
    np.testing.assert_array_equal(blocked[1, 1, 2, 3, 5], x[1, 13, 2, 3])
    np.testing.assert_array_equal(unblock_channels(blocked), x)
    weight = RNG.standard_normal((8, 3, 3, 3))
    packed = pack_weight(weight, 4)
    for filter_index in range(8):
        np.testing.assert_array_equal(packed[filter_index // 4, ..., filter_index % 4], weight[filter_index])


def chain() -> Graph:
    """conv(3 -> 16) -> relu -> depthwise -> scale-shift -> conv(16 -> 8) + residual-free add of a param -> pool."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 3, 10, 9), "float32"))
    (y,) = graph.add_node("Conv", [x, param(graph, (16, 3, 3, 3)), param(graph, (16,))], {"pads": (1, 1, 1, 1)})
    (y,) = graph.add_node("Relu", [y])
    attrs = {"group": 16, "pads": (1, 0, 1, 2), "strides": (2, 1)}
    (d,) = graph.add_node("Conv", [y, param(graph, (16, 1, 3, 3))], attrs)
    (d,) = graph.add_node("Mul", [d, param(graph, (16, 1, 1))])
    (d,) = graph.add_node("Add", [d, param(graph, (1, 16, 1, 1))])
    (z,) = graph.add_node("Conv", [d, param(graph, (8, 16, 1, 1))])
    (z,) = graph.add_node("Clip", [z], {"min": np.float32(0.0), "max": np.float32(6.0)})
    (p,) = graph.add_node("GlobalAveragePool", [z])
    graph.outputs = [p, d]
    return graph


def test_chain_is_blocked_between_two_conversions(assert_same_results):
    graph = chain()
    text = str(graph)
    altered = eliminate_dead(alter_layout(graph, Target.parse("wasm")))
    assert str(graph) == text, "the pass changed its input graph"
    assert ops(altered) == [
        "LayoutTransform",  # the 3-channel image as one block of 3
        "ConvNCHWc",
        "Relu",
        "ConvNCHWc",  # depthwise, its input already blocked
        "Mul",
        "Add",
        "ConvNCHWc",
        "Clip",
        "ReduceMean",  # the global pool, blocked: a mean over the spatial axes
        "LayoutTransform",  # the pooled graph output, back to NCHW
        "LayoutTransform",  # the second graph output, in NCHW
    ]
    transforms = [node.attrs for node in altered.nodes if node.op == "LayoutTransform"]
    assert transforms == [
        {"src": "NCHW", "dst": "NCHW3c"},
        {"src": "NCHW8c", "dst": "NCHW"},
        {"src": "NCHW8c", "dst": "NCHW"},
    ]
    assert [v.name for v in altered.outputs] == [v.name for v in graph.outputs]
    shapes = {tuple(v.type.shape) for v in altered.params}
    assert {(2, 3, 3, 3, 8), (2, 1, 3, 3, 8), (1, 16, 1, 1, 8), (2, 1, 1, 8)} <= shapes
    assert_same_results(graph, altered, rtol=1e-5, atol=1e-5)


def test_unblockable_convs_stay_nchw():
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 16, 6, 6), "float32"))
    (y,) = graph.add_node("Conv", [x, param(graph, (16, 16, 1, 1))])
    (y,) = graph.add_node("Conv", [y, param(graph, (16, 16, 1, 1))])
    (odd,) = graph.add_node("Conv", [y, param(graph, (6, 16, 1, 1))])  # 6 filters: neither 8 nor 4 divides
    (grouped,) = graph.add_node("Conv", [y, param(graph, (8, 8, 1, 1))], {"group": 2})
    w = graph.add_input("w", TensorType((8, 16, 1, 1), "float32"))
    (unknown,) = graph.add_node("Conv", [y, w])  # weight not a param
    graph.outputs = [odd, grouped, unknown]
    altered = alter_layout(graph, Target.parse("wasm"))
    assert ops(altered) == ["LayoutTransform", "ConvNCHWc", "ConvNCHWc", "LayoutTransform", "Conv", "Conv", "Conv"]


def test_a_depthwise_conv_whose_channels_no_block_divides_stays_nchw():
    # 27 channels: no block of 8 or 4 fits them, so the depthwise conv has no block at all (it used to divide by it)
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 27, 9, 9), "float32"))
    (y,) = graph.add_node("Conv", [x, param(graph, (27, 1, 7, 7))], {"group": 27, "pads": (3, 3, 3, 3)})
    graph.outputs = graph.add_node("Conv", [y, param(graph, (27, 27, 1, 1))])
    assert ops(alter_layout(graph, Target.parse("wasm"))) == ["Conv", "Conv"]


def test_channels_the_block_misses_take_half_of_it(assert_same_results):
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 8, 5, 5), "float32"))
    (y,) = graph.add_node("Conv", [x, param(graph, (12, 8, 3, 3))], {"pads": (1, 1, 1, 1)})
    (y,) = graph.add_node("Relu", [y])
    graph.outputs = graph.add_node("Conv", [y, param(graph, (8, 12, 1, 1))])
    altered = alter_layout(graph, Target.parse("wasm"))
    assert ops(altered) == ["LayoutTransform", "ConvNCHWc", "Relu", "ConvNCHWc", "LayoutTransform"]
    assert [tuple(node.outputs[0].type.shape) for node in altered.nodes[1:4]] == [(1, 3, 5, 5, 4)] * 2 + [
        (1, 1, 5, 5, 8)
    ]
    assert_same_results(graph, altered, rtol=1e-5, atol=1e-5)


def test_isolated_convs_stay_nchw():
    """Each conv alone between conversions (a softmax over channels has no blocked form), a lone depthwise one too."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 8, 6, 6), "float32"))
    (y,) = graph.add_node("Conv", [x, param(graph, (8, 8, 3, 3))], {"pads": (1, 1, 1, 1)})
    (y,) = graph.add_node("Relu", [y])
    (y,) = graph.add_node("Softmax", [y], {"axis": 1})
    (y,) = graph.add_node("Conv", [y, param(graph, (8, 1, 3, 3))], {"group": 8, "pads": (1, 1, 1, 1)})
    (y,) = graph.add_node("Conv", [y, param(graph, (8, 4, 1, 1))], {"group": 2})
    graph.outputs = [y]
    assert ops(alter_layout(graph, Target.parse("wasm"))) == ["Conv", "Relu", "Softmax", "Conv", "Conv"]


def test_convs_linked_through_a_pool_are_blocked(assert_same_results):
    """Small convs are no longer isolated when a blocked pool joins them (the digits model: 0.009 -> 0.006 ms)."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 8, 6, 6), "float32"))
    (y,) = graph.add_node("Conv", [x, param(graph, (8, 8, 3, 3))], {"pads": (1, 1, 1, 1)})
    (y,) = graph.add_node("Relu", [y])
    (y,) = graph.add_node("MaxPool", [y], {"kernel_shape": (2, 2), "strides": (2, 2)})
    (y,) = graph.add_node("Conv", [y, param(graph, (8, 1, 3, 3))], {"group": 8, "pads": (1, 1, 1, 1)})
    graph.outputs = [y]
    altered = alter_layout(graph, Target.parse("wasm"))
    assert ops(altered) == ["LayoutTransform", "ConvNCHWc", "Relu", "MaxPoolNCHWc", "ConvNCHWc", "LayoutTransform"]
    assert_same_results(graph, altered, rtol=1e-5, atol=1e-5)


def test_an_isolated_conv_with_enough_work_is_blocked():
    """A stem conv like resnet18's: 7x7 over an image, its result read by a pool."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 3, 64, 64), "float32"))
    (y,) = graph.add_node("Conv", [x, param(graph, (32, 3, 7, 7))], {"pads": (3, 3, 3, 3)})
    graph.outputs = graph.add_node("MaxPool", [y], {"kernel_shape": (2, 2), "strides": (2, 2)})
    assert ops(alter_layout(graph, Target.parse("wasm"))) == [
        "LayoutTransform",
        "ConvNCHWc",
        "MaxPoolNCHWc",
        "LayoutTransform",
    ]


def test_max_pool_after_a_blocked_conv_stays_blocked(assert_same_results):
    """resnet18's stem: conv, relu, max pool, then the first block's convs."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 3, 48, 48), "float32"))
    (y,) = graph.add_node("Conv", [x, param(graph, (16, 3, 7, 7))], {"pads": (3, 3, 3, 3)})
    (y,) = graph.add_node("Relu", [y])
    attrs = {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}
    (y,) = graph.add_node("MaxPool", [y], attrs)
    (y,) = graph.add_node("Add", [y, param(graph, (1, 16, 1, 1))])
    (y,) = graph.add_node("Conv", [y, param(graph, (16, 16, 1, 1))])
    (y,) = graph.add_node("Relu", [y])
    graph.outputs = graph.add_node("Conv", [y, param(graph, (8, 16, 1, 1))])
    altered = alter_layout(graph, Target.parse("wasm"))
    assert ops(altered) == [
        "LayoutTransform",
        "ConvNCHWc",
        "Relu",
        "MaxPoolNCHWc",
        "Add",
        "ConvNCHWc",
        "Relu",
        "ConvNCHWc",
        "LayoutTransform",
    ]
    assert altered.nodes[3].attrs == attrs
    assert_same_results(graph, altered, rtol=1e-5, atol=1e-5)


def test_elementwise_follows_only_blocked_values(assert_same_results):
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 8, 4, 4), "float32"))
    other = graph.add_input("other", TensorType((1, 8, 4, 4), "float32"))
    (y,) = graph.add_node("Relu", [other])  # nothing blocked yet: stays
    (z,) = graph.add_node("Conv", [x, param(graph, (8, 8, 1, 1))])
    (z,) = graph.add_node("Add", [z, y])  # the plain operand is converted to join
    (z,) = graph.add_node("Conv", [z, param(graph, (8, 8, 1, 1))])
    (z,) = graph.add_node("Mul", [z, param(graph, (4, 1))])  # a non-channel param: back to NCHW
    graph.outputs = [z]
    altered = alter_layout(graph, Target.parse("wasm"))
    expected = ["Relu", "LayoutTransform", "ConvNCHWc", "LayoutTransform", "Add", "ConvNCHWc", "LayoutTransform", "Mul"]
    assert ops(altered) == expected
    assert_same_results(graph, altered, rtol=1e-5, atol=1e-5)


def test_pipeline_alters_layout_only_for_a_target():
    assert "ConvNCHWc" not in ops(optimize(chain(), fuse=False))
    altered = optimize(chain(), fuse=False, target=Target.parse("wasm"))
    assert ops(altered).count("ConvNCHWc") == 3
    assert all(value.type.shape[-1] in (8, 16) or len(value.type.shape) < 5 for value in altered.params), (
        "an unpacked weight was not pruned"
    )
    assert not any(len(value.type.shape) == 4 and value.type.shape[2:] == (3, 3) for value in altered.params)


@pytest.mark.parametrize("target", ["webgpu", "opencl", "cuda"])
def test_gpu_targets_keep_the_onnx_layout(target):
    """The chain that CPU targets block (test_pipeline_alters_layout_only_for_a_target) stays NCHW."""
    optimized = optimize(chain(), fuse=False, target=Target.parse(target))
    assert ops(optimized) == ops(optimize(chain(), fuse=False))
    assert "LayoutTransform" not in ops(optimized) and "ConvNCHWc" not in ops(optimized)


def test_layout_ops_reject_bad_shapes():
    transform = get_op("LayoutTransform")
    x = TensorType((1, 12, 4, 4), "float32")
    with pytest.raises(ShapeError, match="divisible by 8"):
        transform.infer([x], {"src": "NCHW", "dst": "NCHW8c"})
    with pytest.raises(ShapeError, match="NCHW<x>c"):
        transform.infer([x], {"src": "NCHW", "dst": "NHWC"})
    (padded,) = transform.infer([x], {"src": "NCHW", "dst": "NCHW8c", "channels": 12})
    assert padded.shape == (1, 2, 4, 4, 8)
    with pytest.raises(ShapeError, match="last block"):
        transform.infer([padded], {"src": "NCHW8c", "dst": "NCHW", "channels": 8})
    conv = get_op("ConvNCHWc")
    blocked = TensorType((1, 2, 4, 4, 8), "float32")
    with pytest.raises(ShapeError, match="depthwise"):
        conv.infer([blocked, TensorType((2, 4, 3, 3, 8), "float32")], {"group": 4})
    with pytest.raises(ShapeError, match="packed"):
        conv.infer([blocked, TensorType((16, 16, 3, 3), "float32")], {})
    with pytest.raises(ShapeError, match="NCHW"):
        get_op("MaxPoolNCHWc").infer([TensorType((1, 16, 4, 4), "float32")], {"kernel_shape": (2, 2)})
    with pytest.raises(ShapeError, match="divide the block"):
        get_op("ChannelShuffleNCHWc").infer([blocked], {"groups": 3})


@pytest.mark.parametrize(
    ("target", "lanes"),
    [
        ("wasm", 4),
        ("llvm -mtriple=aarch64-linux-gnu", 4),
        ("llvm -mcpu=haswell -mattr=-avx512f", 8),
        ("llvm -mcpu=znver4 -mattr=+avx512f", 16),
    ],
)
def test_transposed_gemm_sums_one_vector_of_partial_products(target, lanes, assert_same_results):
    """A single-row Gemm with transB gets the target's float32 vector width as split_lanes; one without keeps its
    attrs; the compiled result is checked against onnxruntime in tests/test_model_build.py (mlp)."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 64), "float32"))
    (y,) = graph.add_node("Gemm", [x, param(graph, (32, 64), "w"), param(graph, (32,), "b")], {"transB": 1})
    (z,) = graph.add_node("Gemm", [y, param(graph, (32, 8), "v")])
    graph.outputs = [z]
    altered = alter_layout(graph, Target.parse(target))
    first, second = altered.nodes
    assert first.attrs == {"transB": 1, "split_lanes": lanes}
    assert second.attrs == {}
    assert_same_results(graph, altered)


@pytest.mark.parametrize(
    ("target", "panel"),
    [("wasm", 8), ("llvm -mcpu=haswell -mattr=-avx512f", 16), ("llvm -mcpu=znver4 -mattr=+avx512f", 64)],
)
def test_matmuls_by_param_weights_read_panels_packed_at_compile_time(target, panel, assert_same_results):
    """A MatMul of several rows by a param (K, N), and a Gemm of that kind (transB, its C an Add after it), become
    MatMulPackeds over the weight packed once into panels of the target's column tile, N padded with zero columns;
    two readers of one weight share its packing; a single row, a Gemm with alpha or transA, and a MatMul by a computed
    B keep their ops."""
    graph = Graph()
    rng = np.random.default_rng(1)  # not the module's RNG: the other tests' weights stay as they were

    def param(graph: Graph, shape, name):
        return graph.add_param(name, rng.standard_normal(shape).astype(np.float32))

    x = graph.add_input("x", TensorType((1, 5, 24), "float32"))
    tied = param(graph, (24, 100), "w")
    (y,) = graph.add_node("MatMul", [x, tied])
    (y2,) = graph.add_node("MatMul", [x, tied])
    (flat,) = graph.add_node("Reshape", [y], {"shape": (5, 100)})
    (z,) = graph.add_node("Gemm", [flat, param(graph, (30, 100), "g"), param(graph, (30,), "c")], {"transB": 1})
    (scaled,) = graph.add_node("Gemm", [z, param(graph, (30, 7), "s")], {"alpha": 0.5})
    row = graph.add_input("row", TensorType((1, 24), "float32"))
    (single,) = graph.add_node("MatMul", [row, param(graph, (24, 9), "r")])
    (computed,) = graph.add_node("MatMul", [x, graph.add_input("b", TensorType((24, 3), "float32"))])
    graph.outputs = [y2, scaled, single, computed]
    altered = eliminate_dead(alter_layout(graph, Target.parse(target)))
    assert ops(altered) == [
        "MatMulPacked",
        "MatMulPacked",
        "Reshape",
        "MatMulPacked",
        "Add",
        "Gemm",
        "MatMul",
        "MatMul",
    ]
    first, second, _, gemm, *_ = altered.nodes
    assert first.inputs[1] is second.inputs[1]
    assert altered.params[first.inputs[1]].shape == (-(-100 // panel), 24, panel)
    assert first.attrs == {"columns": 100} and gemm.attrs == {"columns": 30}
    assert altered.params[gemm.inputs[1]].shape == (-(-30 // panel), 100, min(panel, 32))
    assert_same_results(graph, altered, rtol=1e-4, atol=1e-5)


def test_packed_dense_weights_round_trip():
    weight = np.arange(7 * 21, dtype=np.float32).reshape(7, 21)
    packed = pack_dense_weight(weight, 8)
    assert packed.shape == (3, 7, 8)
    np.testing.assert_array_equal(packed[2, :, 5:], 0)
    np.testing.assert_array_equal(unpack_dense_weight(packed, 21), weight)


def test_matmul_packed_rejects_weights_it_cannot_read():
    op = get_op("MatMulPacked")
    a = TensorType((4, 24), "float32")
    with pytest.raises(ShapeError, match="packed"):
        op.infer([a, TensorType((24, 8), "float32")], {"columns": 8})
    with pytest.raises(ShapeError, match="columns=17"):
        op.infer([a, TensorType((2, 24, 8), "float32")], {"columns": 17})
    assert op.infer([a, TensorType((3, 24, 8), "float32")], {"columns": 17})[0].shape == (4, 17)


@pytest.mark.parametrize("target", ["webgpu", "opencl", "cuda"])
def test_gpu_targets_keep_one_sum_per_dense_output(target):
    """GPU templates split a dense's K over threads: a transposed-B Gemm gets split_lanes 1, so no split-K partial
    sums become a root stage that other blocks read."""
    graph = Graph()
    x = graph.add_input("x", TensorType((2, 64), "float32"))
    (y,) = graph.add_node("Gemm", [x, param(graph, (32, 64), "w"), param(graph, (32,), "b")], {"transB": 1})
    graph.outputs = [y]
    (node,) = optimize(graph, fuse=False, target=Target.parse(target)).nodes
    assert node.attrs == {"transB": 1, "split_lanes": 1}


# -- ops that carry the blocked layout through: each rule as the ops it leaves, and the reference executor's results


def conv(graph: Graph, x, filters: int, kernel: int = 1, relu: bool = True, **attrs):
    channels = x.type.shape[1] // attrs.get("group", 1)
    pads = {"pads": (kernel // 2,) * 4} if kernel > 1 else {}
    (y,) = graph.add_node("Conv", [x, param(graph, (filters, channels, kernel, kernel))], {**pads, **attrs})
    if relu:
        (y,) = graph.add_node("Relu", [y])
    return y


def test_fire_module_concat_stays_blocked(assert_same_results):
    """SqueezeNet's fire module: squeeze, two expand branches, their Concat on channels, the next squeeze."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 16, 7, 7), "float32"))
    squeezed = conv(graph, x, 8)
    (joined,) = graph.add_node("Concat", [conv(graph, squeezed, 16), conv(graph, squeezed, 16, 3)], {"axis": 1})
    graph.outputs = [conv(graph, joined, 8)]
    altered = alter_layout(graph, Target.parse("wasm"))
    assert ops(altered) == [
        "LayoutTransform",
        *["ConvNCHWc", "Relu"] * 3,
        "Concat",
        "ConvNCHWc",
        "Relu",
        "LayoutTransform",
    ]
    concat = altered.nodes[7]
    assert concat.attrs == {"axis": 1} and concat.outputs[0].type.shape == (1, 4, 7, 7, 8)
    assert_same_results(graph, altered, rtol=1e-5, atol=1e-5)


def test_concat_joins_a_plain_input_and_falls_back_off_the_block(assert_same_results):
    """A plain input whose channels fill whole blocks is converted to join; a part of 6 channels (or inputs
    blocked with different x: 16 channels in 8s, 12 in 4s) makes the Concat run in NCHW, its blocked inputs
    converted back."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 8, 5, 5), "float32"))
    side = graph.add_input("side", TensorType((1, 8, 5, 5), "float32"))
    odd = graph.add_input("odd", TensorType((1, 6, 5, 5), "float32"))
    a = conv(graph, x, 16)
    (joined,) = graph.add_node("Concat", [a, side], {"axis": -3})
    (mixed,) = graph.add_node("Concat", [conv(graph, joined, 16), odd], {"axis": 1})
    (blocks,) = graph.add_node("Concat", [conv(graph, joined, 16), conv(graph, joined, 12)], {"axis": 1})
    graph.outputs = [conv(graph, mixed, 8), conv(graph, blocks, 8)]
    altered = alter_layout(graph, Target.parse("wasm"))
    assert ops(altered) == [
        "LayoutTransform",
        "ConvNCHWc",
        "Relu",
        "LayoutTransform",  # side joins the blocked concat
        "Concat",
        "ConvNCHWc",
        "Relu",
        "LayoutTransform",  # back to NCHW for the concat with 6 channels
        "Concat",
        "ConvNCHWc",
        "Relu",
        "ConvNCHWc",
        "Relu",
        "LayoutTransform",
        "LayoutTransform",  # x = 8 and x = 4 parts: in NCHW
        "Concat",
        *["Conv", "Relu"] * 2,  # each reads a plain concat: isolated, and too small to pay for conversions
    ]
    assert_same_results(graph, altered, rtol=1e-5, atol=1e-5)


def test_split_and_slice_on_whole_blocks_stay_blocked(assert_same_results):
    """ShuffleNet's channel split and a Slice of channels: whole blocks stay blocked (the spatial axes sliced as
    they were, any positive step); a part of 4 channels with x = 8 goes through NCHW."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 8, 6, 6), "float32"))
    y = conv(graph, x, 32)
    left, right = graph.add_node("Split", [y], {"axis": 1, "split": (16, 16), "_outputs": 2})
    attrs = {"starts": (8, 1), "ends": (16, 100), "axes": (1, -1), "steps": (1, 2)}
    (sliced,) = graph.add_node("Slice", [right], attrs)
    small, rest = graph.add_node("Split", [left], {"axis": 1, "split": (4, 12), "_outputs": 2})
    graph.outputs = [conv(graph, left, 8), conv(graph, sliced, 8), conv(graph, small, 8), rest]
    altered = alter_layout(graph, Target.parse("wasm"))
    assert ops(altered) == [
        "LayoutTransform",
        "ConvNCHWc",
        "Relu",
        "Split",
        "Slice",
        "LayoutTransform",  # back to NCHW for the split into 4 + 12
        "Split",
        *["ConvNCHWc", "Relu"] * 2,
        "Conv",  # reads the plain split: isolated, and small
        "Relu",
        "LayoutTransform",
        "LayoutTransform",
    ]
    split, sliced_node = altered.nodes[3:5]
    assert split.attrs == {"axis": 1, "split": (2, 2), "_outputs": 2}
    assert sliced_node.attrs == {"starts": (1, 1), "ends": (2, 6), "axes": (1, 3), "steps": (1, 2)}
    assert sliced_node.outputs[0].type.shape == (1, 1, 6, 3, 8)
    assert_same_results(graph, altered, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("MaxPool", {"kernel_shape": (3, 3), "strides": (2, 2), "ceil_mode": 1}),
        ("AveragePool", {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1), "ceil_mode": 1}),
        ("AveragePool", {"kernel_shape": (2, 3), "pads": (0, 1, 1, 1), "count_include_pad": 1}),
    ],
)
def test_every_pool_of_a_blocked_value_stays_blocked(op, attrs, assert_same_results):
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 8, 9, 9), "float32"))
    (y,) = graph.add_node(op, [conv(graph, x, 16, 3)], attrs)
    graph.outputs = [conv(graph, y, 8)]
    altered = alter_layout(graph, Target.parse("wasm"))
    assert ops(altered) == [
        "LayoutTransform",
        "ConvNCHWc",
        "Relu",
        f"{op}NCHWc",
        "ConvNCHWc",
        "Relu",
        "LayoutTransform",
    ]
    assert altered.nodes[3].attrs == attrs
    assert_same_results(graph, altered, rtol=1e-5, atol=1e-5)


def test_squeeze_excite_stays_blocked(assert_same_results):
    """MobileNetV3's SE block: a global pool, two 1x1 convs on (N, C, 1, 1), a gate, and the scale of the block's
    input by it, which broadcasts (N, C/x, 1, 1, x) against (N, C/x, H, W, x); then a residual Add."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 8, 6, 6), "float32"))
    y = conv(graph, x, 16, 3)
    (pooled,) = graph.add_node("GlobalAveragePool", [y])
    (gate,) = graph.add_node("HardSigmoid", [conv(graph, conv(graph, pooled, 8), 16, relu=False)])
    (scaled,) = graph.add_node("Mul", [y, gate])
    (peak,) = graph.add_node("GlobalMaxPool", [scaled])
    (total,) = graph.add_node("Add", [conv(graph, scaled, 16, relu=False), y])
    graph.outputs = [total, peak]
    altered = alter_layout(graph, Target.parse("wasm"))
    assert ops(altered) == [
        "LayoutTransform",
        "ConvNCHWc",
        "Relu",
        "ReduceMean",
        "ConvNCHWc",
        "Relu",
        "ConvNCHWc",
        "HardSigmoid",
        "Mul",
        "ReduceMax",
        "ConvNCHWc",
        "Add",
        "LayoutTransform",
        "LayoutTransform",
    ]
    assert altered.nodes[3].attrs == {"axes": (2, 3), "keepdims": 1}
    assert altered.nodes[8].outputs[0].type.shape == (1, 2, 6, 6, 8)
    assert_same_results(graph, altered, rtol=1e-5, atol=1e-5)


def test_pad_and_resize_of_a_blocked_value_stay_blocked(assert_same_results):
    """Spatial Pad and Resize (a U-Net's or YOLO neck's upsampling) act on axes 2 and 3 of the blocked tensor; a
    Pad of channels or a Resize with a roi goes through NCHW."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 8, 5, 6), "float32"))
    y = conv(graph, x, 16, 3)
    (padded,) = graph.add_node("Pad", [y], {"pads": (0, 0, 1, 0, 0, 0, 2, 1), "mode": "reflect"})
    (near,) = graph.add_node("Resize", [y], {"scales": (1.0, 1.0, 2.0, 2.0), "mode": "nearest"})
    attrs = {"sizes": (1, 16, 7, 9), "mode": "linear", "coordinate_transformation_mode": "align_corners"}
    (linear,) = graph.add_node("Resize", [y], attrs)
    (channels,) = graph.add_node("Pad", [y], {"pads": (0, 8, 0, 0, 0, 0, 0, 0)})
    graph.outputs = [conv(graph, value, 8) for value in (padded, near, linear, channels)]
    altered = alter_layout(graph, Target.parse("wasm"))
    assert ops(altered) == [
        "LayoutTransform",
        "ConvNCHWc",
        "Relu",
        "Pad",
        "Resize",
        "Resize",
        "LayoutTransform",  # the channel Pad reads NCHW
        "Pad",
        *["ConvNCHWc", "Relu"] * 3,
        "Conv",
        "Relu",
        *["LayoutTransform"] * 3,
    ]
    pad_node, near_node, linear_node = altered.nodes[3:6]
    assert pad_node.attrs == {"pads": (0, 0, 1, 0, 0, 0, 0, 2, 1, 0), "mode": "reflect"}
    assert near_node.attrs == {"mode": "nearest", "scales": (2.0, 2.0), "axes": (2, 3)}
    assert linear_node.attrs["sizes"] == (7, 9) and linear_node.outputs[0].type.shape == (1, 2, 7, 9, 8)
    assert_same_results(graph, altered, rtol=1e-5, atol=1e-5)


def test_conv_transpose_of_a_blocked_value_stays_blocked(assert_same_results):
    """A U-Net's upsampling: a 2x2 stride-2 ConvTranspose (weight (C, M, kh, kw) packed as (M / x, C, kh, kw, x))
    and its skip Concat; a grouped one goes through NCHW."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 8, 4, 5), "float32"))
    y = conv(graph, x, 16, 3)
    (up,) = graph.add_node("ConvTranspose", [y, param(graph, (16, 8, 2, 2)), param(graph, (8,))], {"strides": (2, 2)})
    (skip,) = graph.add_node("Resize", [conv(graph, x, 8)], {"scales": (1.0, 1.0, 2.0, 2.0)})
    (joined,) = graph.add_node("Concat", [up, skip], {"axis": 1})
    (grouped,) = graph.add_node("ConvTranspose", [y, param(graph, (16, 1, 3, 3))], {"group": 16})
    graph.outputs = [conv(graph, joined, 8), grouped]
    altered = alter_layout(graph, Target.parse("wasm"))
    assert ops(altered) == [
        "LayoutTransform",
        "ConvNCHWc",
        "Relu",
        "ConvTransposeNCHWc",
        "ConvNCHWc",
        "Relu",
        "Resize",
        "Concat",
        "LayoutTransform",
        "ConvTranspose",
        "ConvNCHWc",
        "Relu",
        "LayoutTransform",
    ]
    assert altered.nodes[3].inputs[1].type.shape == (1, 16, 2, 2, 8)
    assert_same_results(graph, altered, rtol=1e-5, atol=1e-5)


def test_groups_of_whole_blocks_are_blocked(assert_same_results):
    """ResNeXt/RegNet's grouped 3x3 conv: 32 channels in 2 groups of 16 are blocks of 8 (wasm), its 1x1 convs around
    it too; 4 groups of 4 channels would split a block, so that conv stays NCHW."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 16, 6, 6), "float32"))
    y = conv(graph, x, 32)
    y = conv(graph, y, 32, 3, group=2)
    small = conv(graph, y, 16, 3, group=8)
    graph.outputs = [conv(graph, y, 16), small]
    altered = alter_layout(graph, Target.parse("wasm"))
    assert ops(altered) == [
        "LayoutTransform",
        *["ConvNCHWc", "Relu"] * 2,
        "LayoutTransform",
        "Conv",
        "Relu",
        "ConvNCHWc",
        "Relu",
        "LayoutTransform",
    ]
    assert altered.nodes[3].attrs["group"] == 2 and altered.nodes[3].inputs[1].type.shape == (4, 16, 3, 3, 8)
    assert_same_results(graph, altered, rtol=1e-5, atol=1e-5)


def test_channels_short_of_a_whole_block_are_padded(assert_same_results):
    """63 channels (a 1000-class head's shape, x = 8): 8 blocks, the last channel's filters and bias zeros; ops
    that follow read the padding as it is, a conversion back keeps the 63, and a Div (0 / 0 in the padding) reads
    NCHW."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 8, 5, 5), "float32"))
    (y,) = graph.add_node("Conv", [conv(graph, x, 16), param(graph, (63, 16, 1, 1)), param(graph, (63,))])
    (y,) = graph.add_node("Relu", [y])
    (pooled,) = graph.add_node("MaxPool", [y], {"kernel_shape": (2, 2)})
    (divided,) = graph.add_node("Div", [y, y])
    (mean,) = graph.add_node("GlobalAveragePool", [conv(graph, pooled, 8)])
    graph.outputs = [mean, divided]
    altered = alter_layout(graph, Target.parse("wasm"))
    assert ops(altered) == [
        "LayoutTransform",
        "ConvNCHWc",
        "Relu",
        "ConvNCHWc",
        "Relu",
        "MaxPoolNCHWc",
        "LayoutTransform",
        "Div",
        "ConvNCHWc",
        "Relu",
        "ReduceMean",
        "LayoutTransform",
    ]
    head = altered.nodes[3]
    assert head.outputs[0].type.shape == (1, 8, 5, 5, 8)
    assert [value.type.shape for value in head.inputs[1:]] == [(8, 16, 1, 1, 8), (64,)]
    assert altered.nodes[6].attrs == {"src": "NCHW8c", "dst": "NCHW", "channels": 63}
    assert_same_results(graph, altered, rtol=1e-5, atol=1e-5)


def test_one_dimensional_convs_are_blocked_as_rows_of_height_one(assert_same_results):
    """An audio net's Conv1d chain: (N, C, W) values are blocked as (N, C / x, 1, W, x), the convs and pools
    become 2-D ones over that row (kernel (1, k), pads (0, b, 0, e)), the global pool a mean over it."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 1, 64), "float32"))
    attrs = {"kernel_shape": (9,), "strides": (2,), "pads": (4, 3)}
    (y,) = graph.add_node("Conv", [x, param(graph, (16, 1, 9)), param(graph, (16,))], attrs)
    (y,) = graph.add_node("Relu", [y])
    (y,) = graph.add_node("MaxPool", [y], {"kernel_shape": (3,), "strides": (2,), "ceil_mode": 1})
    (y,) = graph.add_node("Mul", [y, param(graph, (16, 1))])
    (y,) = graph.add_node("Conv", [y, param(graph, (8, 16, 3))], {"dilations": (2,), "pads": (2, 2)})
    (pooled,) = graph.add_node("GlobalAveragePool", [y])
    graph.outputs = [pooled, y]
    altered = alter_layout(graph, Target.parse("wasm"))
    assert ops(altered) == [
        "LayoutTransform",
        "ConvNCHWc",
        "Relu",
        "MaxPoolNCHWc",
        "Mul",
        "ConvNCHWc",
        "ReduceMean",
        "LayoutTransform",
        "LayoutTransform",
    ]
    first, conv = altered.nodes[1], altered.nodes[5]
    assert first.inputs[0].type.shape == (1, 1, 1, 64, 1) and first.outputs[0].type.shape == (1, 2, 1, 32, 8)
    assert first.attrs == {"kernel_shape": (1, 9), "strides": (1, 2), "pads": (0, 4, 0, 3)}
    assert conv.attrs == {"dilations": (1, 2), "pads": (0, 2, 0, 2)}
    assert altered.nodes[0].attrs["src"] == "NCW" and altered.nodes[-1].attrs["dst"] == "NCW"
    assert_same_results(graph, altered, rtol=1e-5, atol=1e-5)


def test_depthwise_channels_short_of_a_whole_block_are_padded(assert_same_results):
    """A depthwise conv over 63 channels (x = 8) stays blocked between the blocked convs around it: 64 channels, its
    group the padded count, the 64th filter and bias zeros."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 8, 7, 9), "float32"))
    (y,) = graph.add_node("Conv", [conv(graph, x, 16), param(graph, (63, 16, 1, 1)), param(graph, (63,))])
    attrs = {"group": 63, "pads": (2, 2, 2, 2), "strides": (2, 2)}
    (y,) = graph.add_node("Conv", [y, param(graph, (63, 1, 5, 5)), param(graph, (63,))], attrs)
    (y,) = graph.add_node("HardSwish", [y])
    graph.outputs = [conv(graph, y, 8)]
    altered = alter_layout(graph, Target.parse("wasm"))
    assert ops(altered) == ["LayoutTransform", *["ConvNCHWc", "Relu"], "ConvNCHWc", "ConvNCHWc", "HardSwish"] + [
        "ConvNCHWc",
        "Relu",
        "LayoutTransform",
    ]
    depthwise = altered.nodes[4]
    assert depthwise.attrs["group"] == 64
    assert [value.type.shape for value in depthwise.inputs[1:]] == [(8, 1, 5, 5, 8), (64,)]
    assert_same_results(graph, altered, rtol=1e-5, atol=1e-5)


def shuffle(graph: Graph, x, groups: int):
    """ShuffleNet's channel shuffle as torch exports it: Reshape to (N, g, C / g, H, W), swap g and C / g, Reshape
    back."""
    batch, channels, *spatial = x.type.shape
    (y,) = graph.add_node("Reshape", [x], {"shape": (batch, groups, channels // groups, *spatial)})
    (y,) = graph.add_node("Transpose", [y], {"perm": (0, 2, 1, 3, 4)})
    (y,) = graph.add_node("Reshape", [y], {"shape": tuple(x.type.shape)})
    return y


def test_channel_shuffle_of_a_blocked_value_stays_blocked(assert_same_results):
    """ShuffleNet v2's unit: a Concat of two branches, the two-group shuffle, the channel split. With x = 8, a shuffle
    whose groups divide the block and whose C / g is whole blocks is one ChannelShuffleNCHWc, the Concat and Split
    around it blocked too; 2 groups of 12 channels (not whole blocks) and 3 groups (they do not divide the block) go
    through NCHW. The odd spatial size (5 x 7) changes nothing."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 16, 5, 7), "float32"))
    (joined,) = graph.add_node("Concat", [conv(graph, x, 16), conv(graph, x, 16)], {"axis": 1})
    kept, changed = graph.add_node("Split", [shuffle(graph, joined, 2)], {"axis": 1, "split": (16, 16), "_outputs": 2})
    (four,) = graph.add_node("Concat", [kept, conv(graph, changed, 16)], {"axis": 1})
    shuffled = shuffle(graph, four, 4)
    halves = conv(graph, shuffle(graph, conv(graph, shuffled, 24), 2), 8)
    thirds = conv(graph, shuffle(graph, conv(graph, shuffled, 48), 3), 8)
    graph.outputs = [halves, thirds]
    altered = alter_layout(graph, Target.parse("wasm"))
    assert ops(altered) == [
        "LayoutTransform",
        *["ConvNCHWc", "Relu"] * 2,
        "Concat",
        "ChannelShuffleNCHWc",
        "Split",
        "ConvNCHWc",
        "Relu",
        "Concat",
        "ChannelShuffleNCHWc",  # 4 groups of 8 channels
        "ConvNCHWc",
        "Relu",
        "LayoutTransform",  # 2 groups of 12 channels: not whole blocks
        *["Reshape", "Transpose", "Reshape"],
        "Conv",  # small, and no blocked conv after it: it stays NCHW
        "Relu",
        "ConvNCHWc",
        "Relu",
        "LayoutTransform",  # 3 groups do not divide a block of 8
        *["Reshape", "Transpose", "Reshape"],
        "Conv",
        "Relu",
    ]
    assert [node.attrs for node in altered.nodes if node.op == "ChannelShuffleNCHWc"] == [{"groups": 2}, {"groups": 4}]
    assert_same_results(graph, altered, rtol=1e-5, atol=1e-5)
