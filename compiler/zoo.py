"""Example models built in code: the inputs that tests, benchmarks, the CLI and the demo hand to the frontend.

Each model is an opset-17 ONNX ModelProto with seeded random weights (He-scaled, so activations stay in a
sane range) laid out the way framework exporters write them — batch norm unfolded, ReLU6 as Clip with constant
min/max inputs, PyTorch's Shape→Gather→Unsqueeze→Concat→Reshape flatten — so the frontend and passes meet
real-world graphs. Nothing is downloaded; `digits` is the trained model shipped in `compiler/data/`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from compiler.errors import TesselError

MODELS = ("mlp", "mobilenet_v2", "resnet18", "dwconv_block", "digits")
OPSET = 17
DIGITS_PATH = Path(__file__).parent / "data" / "digits.onnx"

INPUT_SHAPES = {
    "mlp": (1, 784),
    "mobilenet_v2": (1, 3, 224, 224),
    "resnet18": (1, 3, 224, 224),
    "dwconv_block": (1, 256, 96, 96),
    "digits": (1, 1, 8, 8),
}


class _Builder:
    """Collects nodes and initializers with unique names, and draws weights from one seeded generator."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.counts: dict[str, int] = {}

    def name(self, hint: str) -> str:
        self.counts[hint] = self.counts.get(hint, 0) + 1
        return f"{hint}{self.counts[hint]}"

    def constant(self, hint: str, array: np.ndarray) -> str:
        name = self.name(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op: str, inputs: list[str], hint: str | None = None, output: str | None = None, **attrs) -> str:
        output = output or self.name(hint or op.lower())
        self.nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def conv(self, x: str, in_channels: int, out_channels: int, kernel: int, stride: int = 1, groups: int = 1) -> str:
        fan_in = in_channels // groups * kernel * kernel
        weight = self.rng.standard_normal((out_channels, in_channels // groups, kernel, kernel)) * np.sqrt(2 / fan_in)
        pad = kernel // 2
        return self.node(
            "Conv",
            [x, self.constant("conv_weight", weight.astype(np.float32))],
            "conv",
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=[pad] * 4,
            group=groups,
        )

    def batch_norm(self, x: str, channels: int, gamma_scale: float = 1.0) -> str:
        """Inference batch norm with realistic statistics: positive variance, gamma near `gamma_scale`."""
        gamma = self.rng.uniform(0.8, 1.2, channels) * gamma_scale
        beta = self.rng.normal(0.0, 0.1, channels)
        mean = self.rng.normal(0.0, 0.1, channels)
        variance = self.rng.uniform(0.5, 1.5, channels)
        params = [
            self.constant(hint, array.astype(np.float32))
            for hint, array in (("bn_scale", gamma), ("bn_bias", beta), ("bn_mean", mean), ("bn_var", variance))
        ]
        return self.node("BatchNormalization", [x, *params], "bn", epsilon=1e-5)

    def gemm(self, x: str, in_features: int, out_features: int, output: str | None = None) -> str:
        # Stored [out, in] with transB=1, as PyTorch's Linear exports.
        weight = self.rng.standard_normal((out_features, in_features)) * np.sqrt(1 / in_features)
        bias = self.rng.normal(0.0, 0.01, out_features)
        return self.node(
            "Gemm",
            [
                x,
                self.constant("fc_weight", weight.astype(np.float32)),
                self.constant("fc_bias", bias.astype(np.float32)),
            ],
            "fc",
            output,
            transB=1,
        )

    def model(self, name: str, input_shape: tuple[int, ...], output: str, output_shape: tuple[int, ...]):
        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(input_shape))],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, list(output_shape))],
            self.initializers,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tessel-zoo")
        model.ir_version = 8
        return model


def _mlp() -> onnx.ModelProto:
    b = _Builder(seed=1)
    x = b.node("Relu", [b.gemm("input", 784, 512)])
    x = b.node("Relu", [b.gemm(x, 512, 512)])
    b.gemm(x, 512, 10, output="output")
    return b.model("mlp", INPUT_SHAPES["mlp"], "output", (1, 10))


def _relu6(b: _Builder, x: str) -> str:
    low = b.constant("clip_min", np.array(0.0, np.float32))
    high = b.constant("clip_max", np.array(6.0, np.float32))
    return b.node("Clip", [x, low, high], "relu6")


def _mobilenet_v2() -> onnx.ModelProto:
    b = _Builder(seed=2)
    x = _relu6(b, b.batch_norm(b.conv("input", 3, 32, 3, stride=2), 32))
    channels = 32
    # (expansion t, output channels c, repeats n, first stride s), the table of Sandler et al. 2018.
    for expansion, out_channels, repeats, first_stride in (
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ):
        for repeat in range(repeats):
            stride = first_stride if repeat == 0 else 1
            hidden = channels * expansion
            y = x
            if expansion != 1:
                y = _relu6(b, b.batch_norm(b.conv(y, channels, hidden, 1), hidden))
            y = _relu6(b, b.batch_norm(b.conv(y, hidden, hidden, 3, stride=stride, groups=hidden), hidden))
            # A smaller gamma on the linear bottleneck keeps the residual sums from growing block after block.
            y = b.batch_norm(b.conv(y, hidden, out_channels, 1), out_channels, gamma_scale=0.5)
            if stride == 1 and channels == out_channels:
                y = b.node("Add", [x, y], "residual")
            x, channels = y, out_channels
    x = _relu6(b, b.batch_norm(b.conv(x, channels, 1280, 1), 1280))
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x], "pool")], "flatten", axis=1)
    b.gemm(x, 1280, 1000, output="output")
    return b.model("mobilenet_v2", INPUT_SHAPES["mobilenet_v2"], "output", (1, 1000))


def _torch_flatten(b: _Builder, x: str) -> str:
    """`x.view(x.size(0), -1)` as torch.onnx.export writes it: the batch size read back from the shape at run time."""
    shape = b.node("Shape", [x], "shape")
    index = b.node("Constant", [], "constant", value=numpy_helper.from_array(np.array(0, np.int64)))
    batch = b.node("Gather", [shape, index], "gather", axis=0)
    axes = b.node("Constant", [], "constant", value=numpy_helper.from_array(np.array([0], np.int64)))
    batch = b.node("Unsqueeze", [batch, axes], "unsqueeze")
    rest = b.node("Constant", [], "constant", value=numpy_helper.from_array(np.array([-1], np.int64)))
    target = b.node("Concat", [batch, rest], "concat", axis=0)
    return b.node("Reshape", [x, target], "reshape")


def _resnet18() -> onnx.ModelProto:
    b = _Builder(seed=3)
    x = b.node("Relu", [b.batch_norm(b.conv("input", 3, 64, 7, stride=2), 64)])
    x = b.node("MaxPool", [x], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    channels = 64
    for stage, out_channels in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            y = b.node("Relu", [b.batch_norm(b.conv(x, channels, out_channels, 3, stride=stride), out_channels)])
            y = b.batch_norm(b.conv(y, out_channels, out_channels, 3), out_channels, gamma_scale=0.5)
            shortcut = x
            if stride != 1 or channels != out_channels:
                shortcut = b.batch_norm(b.conv(x, channels, out_channels, 1, stride=stride), out_channels)
            x = b.node("Relu", [b.node("Add", [shortcut, y], "residual")])
            channels = out_channels
    x = _torch_flatten(b, b.node("GlobalAveragePool", [x], "pool"))
    b.gemm(x, 512, 1000, output="output")
    return b.model("resnet18", INPUT_SHAPES["resnet18"], "output", (1, 1000))


def _dwconv_block() -> onnx.ModelProto:
    """The seeds' case: depthwise conv → per-channel scale and shift → relu, which fusion must make one kernel."""
    b = _Builder(seed=4)
    channels = 256
    weight = b.rng.standard_normal((channels, 1, 3, 3)) * np.sqrt(2 / 9)
    x = b.node(
        "Conv",
        ["input", b.constant("dw_weight", weight.astype(np.float32))],
        "dwconv",
        kernel_shape=[3, 3],
        strides=[1, 1],
        pads=[1, 1, 1, 1],
        group=channels,
    )
    scale = b.rng.uniform(0.5, 1.5, (1, channels, 1, 1)).astype(np.float32)
    shift = b.rng.normal(0.0, 0.1, (1, channels, 1, 1)).astype(np.float32)
    x = b.node("Mul", [x, b.constant("scale", scale)], "scale")
    x = b.node("Add", [x, b.constant("shift", shift)], "shift")
    b.node("Relu", [x], output="output")
    return b.model("dwconv_block", INPUT_SHAPES["dwconv_block"], "output", (1, channels, 96, 96))


def _digits() -> onnx.ModelProto:
    return onnx.load(str(DIGITS_PATH))


_BUILDERS = {
    "mlp": _mlp,
    "mobilenet_v2": _mobilenet_v2,
    "resnet18": _resnet18,
    "dwconv_block": _dwconv_block,
    "digits": _digits,
}


def _check_name(name: str) -> None:
    if name not in _BUILDERS:
        raise TesselError(f"unknown zoo model {name!r}; choose one of {', '.join(MODELS)}")


def build_model(name: str) -> onnx.ModelProto:
    """The zoo model `name` as an ONNX ModelProto; the same weights on every call."""
    _check_name(name)
    return _BUILDERS[name]()


def save_model(name: str, path: str | Path) -> Path:
    """Write the zoo model `name` to `path` as a .onnx file and return the path."""
    path = Path(path)
    onnx.save(build_model(name), str(path))
    return path


def sample_input(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """A seeded random input for model `name`: pixels in 0..1 for digits, standard normal for the others."""
    _check_name(name)
    rng = np.random.default_rng(seed)
    shape = INPUT_SHAPES[name]
    array = rng.random(shape) if name == "digits" else rng.standard_normal(shape)
    return {"input": array.astype(np.float32)}
