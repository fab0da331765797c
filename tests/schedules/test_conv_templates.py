"""Depthwise convs whose channels are short of a whole block (mobilenet_v3_small's 72, 88 and 120; odd counts and
5x5 / 7x7 windows here that no zoo model has) stay blocked, their channels padded, and match onnxruntime compiled
for the host and wasm."""

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.build import compile_model
from compiler.frontend.onnx import load_onnx
from compiler.passes.pipeline import optimize
from compiler.target import Target


def depthwise_net(channels: int, kernel: int, stride: int, height: int, width: int) -> onnx.ModelProto:
    """1x1 conv (5 -> channels) + ReLU, the depthwise conv with a bias + HardSwish, 1x1 conv to 16."""
    rng = np.random.default_rng(channels * kernel + stride)
    arrays = {
        "w1": rng.standard_normal((channels, 5, 1, 1)) / 2,
        "b1": rng.standard_normal(channels) / 10,
        "wd": rng.standard_normal((channels, 1, kernel, kernel)) / kernel,
        "bd": rng.standard_normal(channels) / 10,
        "w2": rng.standard_normal((16, channels, 1, 1)) / np.sqrt(channels),
    }
    window = {"kernel_shape": [kernel] * 2, "strides": [stride] * 2, "pads": [kernel // 2] * 4, "group": channels}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["y1"], kernel_shape=[1, 1]),
        helper.make_node("Relu", ["y1"], ["r1"]),
        helper.make_node("Conv", ["r1", "wd", "bd"], ["d"], **window),
        helper.make_node("HardSwish", ["d"], ["h"]),
        helper.make_node("Conv", ["h", "w2"], ["out"], kernel_shape=[1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "depthwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, height, width])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(array.astype(np.float32), name) for name, array in arrays.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("target", ["llvm", "wasm"])
@pytest.mark.parametrize(
    ("channels", "kernel", "stride", "height", "width"),
    [(72, 5, 2, 13, 11), (44, 7, 1, 9, 17), (63, 3, 2, 10, 15)],
)
def test_depthwise_with_padded_channels_is_blocked_and_matches_onnxruntime(
    channels, kernel, stride, height, width, target
):
    model = depthwise_net(channels, kernel, stride, height, width)
    altered = optimize(load_onnx(model), fuse=False, target=Target.parse(target))
    (depthwise,) = [node for node in altered.nodes if node.attrs.get("group", 1) > 1]
    assert depthwise.op == "ConvNCHWc", altered
    block = depthwise.outputs[0].type.shape[-1]
    assert depthwise.attrs["group"] == -(-channels // block) * block
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 5, height, width)).astype(np.float32)}
    (expected,) = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    actual = compile_model(model, target=target).run(feeds)["out"]
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)


def pointwise_net(width: int) -> onnx.ModelProto:
    """A 3x3 conv (6 -> 16) + ReLU, then two 1x1 convs (16 -> 24 -> 16, the last with a residual add): both kinds of
    blocked dense conv over a row of `width` columns."""
    rng = np.random.default_rng(width)
    arrays = {
        "w0": rng.standard_normal((16, 6, 3, 3)) / 6,
        "b0": rng.standard_normal(16) / 10,
        "w1": rng.standard_normal((24, 16, 1, 1)) / 4,
        "w2": rng.standard_normal((16, 24, 1, 1)) / 5,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["y0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["y0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1"], ["y1"], kernel_shape=[1, 1]),
        helper.make_node("Conv", ["y1", "w2"], ["y2"], kernel_shape=[1, 1]),
        helper.make_node("Add", ["y2", "r0"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "pointwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 5, width])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(array.astype(np.float32), name) for name, array in arrays.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("width", [14, 7, 13, 3])
def test_wasm_pointwise_convs_take_their_own_tile_and_match_onnxruntime(width):
    """On 16-byte vectors a 1x1 conv keeps 1 filter block x 4 columns, its last tile shorter rather than all of them
    halved (14 columns: 4 + 4 + 4 + 2, not 7 tiles of 2), while the 3x3 conv keeps 2 blocks x up to 7 columns."""
    model = pointwise_net(width)
    module = compile_model(model, target="wasm")
    tiles = {}
    for kernel in module.source("tir").split("func ")[1:]:
        shapes = {
            tuple(map(int, shape))
            for shape in re.findall(r"allocate conv\S*: float32\[1, (\d+), 1, (\d+), 8\]", kernel)
        }
        tiles[kernel.split("(")[0]] = (shapes, kernel)
    pointwise = [kernel for shapes, kernel in tiles.values() if shapes == {(1, min(4, width))}]
    assert len(pointwise) == 2, tiles
    if width % 4 and width > 4:
        assert all(re.search(rf"for \(column\S*: int32, 0, {width % 4}\) unrolled", kernel) for kernel in pointwise)
    (window,) = [shapes for shapes, kernel in tiles.values() if "w0_packed" in kernel.split("\n")[0]]
    assert {blocks for blocks, _ in window} == {2} and all(columns <= 7 for _, columns in window), tiles
    feeds = {"x": np.random.default_rng(2).standard_normal((1, 6, 5, width)).astype(np.float32)}
    (expected,) = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    np.testing.assert_allclose(module.run(feeds)["out"], expected, rtol=1e-4, atol=1e-5)
