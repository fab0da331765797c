"""Depthwise convs whose channels are short of a whole block (mobilenet_v3_small's 72, 88 and 120; odd counts and
5x5 / 7x7 windows here that no zoo model has) stay blocked, their channels padded, and match onnxruntime compiled
for the host and wasm."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.build import compile_model
from compiler.frontend.onnx import load_onnx
from compiler.passes.pipeline import optimize


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
    altered = optimize(load_onnx(model), fuse=False, target=target)
    (depthwise,) = [node for node in altered.nodes if node.attrs.get("group", 1) > 1]
    assert depthwise.op == "ConvNCHWc", altered
    block = depthwise.outputs[0].type.shape[-1]
    assert depthwise.attrs["group"] == -(-channels // block) * block
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 5, height, width)).astype(np.float32)}
    (expected,) = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    actual = compile_model(model, target=target).run(feeds)["out"]
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
