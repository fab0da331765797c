"""Blocked layouts end to end: small ONNX models whose NCHW[x]c chains run through Concat, Split, Slice, every pool,
Pad, Resize, the SE scale, residual adds and ShuffleNet's channel shuffle match onnxruntime, as the reference executor on the altered graph and
compiled for the host and wasm; and the altered graphs keep those ops blocked (no conversion between them)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.build import compile_model
from compiler.frontend.onnx import load_onnx
from compiler.graph.reference import run_reference
from compiler.passes.pipeline import optimize
from compiler.target import Target


class _Builder:
    """An ONNX graph built op by op, with random conv weights."""

    def __init__(self, shape):
        self.rng = np.random.default_rng(3)
        self.nodes, self.initializers, self.shape = [], [], shape

    def constant(self, array) -> str:
        name = f"c{len(self.initializers)}"
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op: str, inputs: list[str], outputs: int = 1, **attrs) -> list[str]:
        names = [f"v{len(self.nodes)}_{k}" for k in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, names, **attrs))
        return names

    def conv(self, x: str, channels: int, filters: int, kernel: int = 1, relu: bool = True, rank=2, **attrs) -> str:
        weight = self.rng.standard_normal((filters, channels // attrs.get("group", 1), *[kernel] * rank))
        weight = self.constant((weight / np.sqrt(weight[0].size)).astype(np.float32))
        bias = self.constant(self.rng.standard_normal(filters).astype(np.float32) * 0.1)
        window = {"kernel_shape": [kernel] * rank, "pads": [kernel // 2] * 2 * rank}
        (y,) = self.op("Conv", [x, weight, bias], **window, **attrs)
        return self.op("Relu", [y])[0] if relu else y

    def model(self, outputs: list[str]) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            "layouts",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, self.shape)],
            [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
            self.initializers,
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def fire_net() -> onnx.ModelProto:
    """SqueezeNet's shape: a strided RGB stem, ceil_mode max pools, fire modules (Concat), a head of 63 classes
    (padded to whole blocks), a global pool."""
    b = _Builder([1, 3, 33, 33])
    x = b.conv("x", 3, 32, 3, strides=[2, 2])
    (x,) = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    for _ in range(2):
        squeezed = b.conv(x, 32, 16)
        (x,) = b.op("Concat", [b.conv(squeezed, 16, 16), b.conv(squeezed, 16, 16, 3)], axis=1)
    (x,) = b.op("AveragePool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)
    (pooled,) = b.op("GlobalAveragePool", [b.conv(x, 32, 63)])
    return b.model([b.op("Flatten", [pooled])[0]])


def excite_net() -> onnx.ModelProto:
    """MobileNetV3 / EfficientNet pieces: SE (global pool, 1x1 convs, HardSigmoid, the broadcast scale), a
    depthwise conv, SiLU, a residual Add, a grouped conv, a channel Split and Slice."""
    b = _Builder([1, 8, 12, 12])
    x = b.conv("x", 8, 32, 3)
    (pooled,) = b.op("GlobalAveragePool", [x])
    (gate,) = b.op("HardSigmoid", [b.conv(b.conv(pooled, 32, 8), 8, 32, relu=False)])
    (scaled,) = b.op("Mul", [x, gate])
    depthwise = b.conv(scaled, 32, 32, 3, relu=False, group=32)
    (sigmoid,) = b.op("Sigmoid", [depthwise])
    (silu,) = b.op("Mul", [depthwise, sigmoid])
    (residual,) = b.op("Add", [b.conv(silu, 32, 32, relu=False), x])
    grouped = b.conv(residual, 32, 32, 3, group=2)
    left, right = b.op("Split", [grouped, b.constant(np.array([16, 16]))], outputs=2, axis=1)
    (sliced,) = b.op("Slice", [right, *(b.constant(np.array(v)) for v in ([8, 0], [16, 12], [1, 3], [1, 2]))])
    return b.model([b.conv(left, 16, 16), b.conv(sliced, 8, 8)])


def upsample_net() -> onnx.ModelProto:
    """U-Net / YOLO-neck pieces: a reflect Pad, nearest and linear Resize, a skip Concat, SPPF's 5x5 max pools, a
    strided ConvTranspose."""
    b = _Builder([1, 8, 10, 10])
    skip = b.conv("x", 8, 16, 3)
    (down,) = b.op("MaxPool", [skip], kernel_shape=[2, 2], strides=[2, 2])
    down = b.conv(down, 16, 16, 3)
    empty_roi = b.constant(np.zeros(0, np.float32))
    (up,) = b.op("Resize", [down, empty_roi, b.constant(np.array([1, 1, 2, 2], np.float32))], mode="nearest")
    (x,) = b.op("Concat", [up, skip], axis=1)
    (pooled,) = b.op("MaxPool", [x], kernel_shape=[5, 5], pads=[2, 2, 2, 2])
    (padded,) = b.op("Pad", [pooled, b.constant(np.array([0, 0, 1, 1, 0, 0, 1, 1]))], mode="reflect")
    x = b.conv(padded, 32, 16, 3)
    (resized,) = b.op("Resize", [x, "", "", b.constant(np.array([1, 16, 17, 15]))], mode="linear")
    weight = b.constant(b.rng.standard_normal((16, 16, 3, 3)).astype(np.float32) / 12)
    (up,) = b.op("ConvTranspose", [x, weight], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])
    return b.model([b.conv(resized, 16, 8), b.conv(up, 16, 8)])


def audio_net() -> onnx.ModelProto:
    """A 1-D conv net (audio): strided and dilated Conv1d, a MaxPool1d, a global pool; blocked as rows of height
    one."""
    b = _Builder([1, 1, 400])
    x = b.conv("x", 1, 16, 9, rank=1, strides=[4])
    (x,) = b.op("MaxPool", [x], kernel_shape=[3], strides=[2], ceil_mode=1)
    x = b.conv(x, 16, 24, 3, rank=1, dilations=[2])
    (pooled,) = b.op("GlobalAveragePool", [b.conv(x, 24, 32, 3, rank=1, strides=[2])])
    return b.model([b.op("Flatten", [pooled])[0]])


def shuffle_net() -> onnx.ModelProto:
    """ShuffleNet v2's unit at an odd size: a channel Split, a depthwise branch, Concat, the two-group shuffle as
    torch exports it (Reshape, Transpose, Reshape), then a four-group one (blocked with x = 8; with 16 on AVX-512 its
    C / g = 8 is not whole blocks, and it runs in NCHW)."""
    b = _Builder([1, 8, 7, 9])
    x = b.conv("x", 8, 32, 3)
    left, right = b.op("Split", [x, b.constant(np.array([16, 16]))], outputs=2, axis=1)
    right = b.conv(b.conv(right, 16, 16, 3, relu=False, group=16), 16, 16)
    (x,) = b.op("Concat", [left, right], axis=1)
    for groups in (2, 4):
        (x,) = b.op("Reshape", [x, b.constant(np.array([1, groups, 32 // groups, 7, 9]))])
        (x,) = b.op("Transpose", [x], perm=[0, 2, 1, 3, 4])
        (x,) = b.op("Reshape", [x, b.constant(np.array([1, 32, 7, 9]))])
        (x,) = b.op("Relu", [x])  # else the simplifier merges one shuffle's last Reshape with the next one's first
    return b.model([b.conv(x, 32, 16, 3)])


MODELS = {"fire": fire_net, "excite": excite_net, "upsample": upsample_net, "audio": audio_net, "shuffle": shuffle_net}
# the ops that must run blocked in each model: none of them is fed or followed by a LayoutTransform in NCHW
BLOCKED = {
    "fire": {"Concat", "MaxPoolNCHWc", "AveragePoolNCHWc", "ReduceMean"},
    "excite": {"ReduceMean", "HardSigmoid", "Mul", "Add", "Split", "Slice"},
    "upsample": {"MaxPoolNCHWc", "Resize", "Concat", "Pad", "ConvTransposeNCHWc"},
    "audio": {"ConvNCHWc", "MaxPoolNCHWc", "ReduceMean"},
    "shuffle": {"Split", "Concat", "ChannelShuffleNCHWc"},
}


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    shape = [dim.dim_value for dim in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("name", MODELS)
def test_altered_graph_stays_blocked_and_matches_onnxruntime(name):
    model = MODELS[name]()
    feeds = _feeds(model)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    altered = optimize(load_onnx(model), fuse=False, target=Target.parse("wasm"))
    blocked = {node.op for node in altered.nodes if len(node.outputs[0].type.shape) == 5} - {"LayoutTransform"}
    assert BLOCKED[name] <= blocked, altered
    transforms = [node for node in altered.nodes if node.op == "LayoutTransform"]
    assert len(transforms) <= len(model.graph.output) + 1, altered
    actual = run_reference(altered, feeds)
    for (output, array), wanted in zip(actual.items(), expected):
        np.testing.assert_allclose(array, wanted, rtol=1e-4, atol=1e-5, err_msg=output)


@pytest.mark.parametrize("target", ["llvm", "wasm"])
@pytest.mark.parametrize("name", MODELS)
def test_compiled_model_matches_onnxruntime(name, target):
    model = MODELS[name]()
    feeds = _feeds(model)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    results = compile_model(model, target=target).run(feeds)
    for (output, array), wanted in zip(results.items(), expected):
        np.testing.assert_allclose(array, wanted, rtol=1e-4, atol=1e-5, err_msg=f"{name} {target} {output}")


def concat_net() -> onnx.ModelProto:
    """Concats the memory plan does in place: one of the input's conversion and a conv, whose parts others read
    too; and one it cannot, a Concat of a Concat (fused into one group of two Concats)."""
    b = _Builder([1, 16, 6, 6])
    a, c, d = (b.conv("x", 16, 16, 3) for _ in range(3))
    (inner,) = b.op("Concat", [a, c], axis=1)
    (outer,) = b.op("Concat", [inner, d], axis=1)
    (with_input,) = b.op("Concat", ["x", b.conv(a, 16, 16)], axis=1)
    return b.model([b.conv(outer, 48, 16), b.conv(a, 16, 16), b.conv(with_input, 32, 16)])


@pytest.mark.parametrize("target", ["llvm", "wasm"])
def test_concat_parts_are_written_in_place(target):
    model = concat_net()
    feeds = _feeds(model)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    module = compile_model(model, target=target)
    ops = {kernel["name"]: kernel["ops"] for kernel in module.manifest["kernels"]}
    calls = [ops[call["kernel"]] for call in module.manifest["calls"]]
    assert [members for members in calls if "Concat" in members] == [["Concat", "Concat"]], calls
    for (output, array), wanted in zip(module.run(feeds).items(), expected):
        np.testing.assert_allclose(array, wanted, rtol=1e-4, atol=1e-5, err_msg=f"{target} {output}")
    replayed, _ = module.replay(feeds, repeat=2)
    for (output, array), wanted in zip(replayed.items(), expected):
        np.testing.assert_allclose(array, wanted, rtol=1e-4, atol=1e-5, err_msg=f"{target} {output} replayed")
