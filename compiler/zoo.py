"""Example models built in code: the inputs that tests, benchmarks, the CLI and the demo hand to the frontend.

Each model is an opset-17 ONNX ModelProto with seeded random weights (He-scaled, so activations stay in a
sane range) laid out the way framework exporters write them — batch norm unfolded, ReLU6 as Clip with constant
min/max inputs, PyTorch's Shape→Gather→Unsqueeze→Concat→Reshape flatten, SiLU as x * Sigmoid(x), GELU in its erf
form, a Linear on 3-D inputs as MatMul + Add — so the frontend and passes meet real-world graphs. The broad zoo
after the first five covers the patterns of common CNNs, transformers and 1-D audio nets at small sizes (docs/
modules.md lists them). Nothing is downloaded; `digits` is the trained model shipped in `compiler/data/`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from compiler.errors import TesselError

MODELS = (
    "mlp",
    "mobilenet_v2",
    "resnet18",
    "dwconv_block",
    "digits",
    "squeezenet",
    "shufflenet_v2",
    "mobilenet_v3_small",
    "efficientnet_b0",
    "densenet_block",
    "inception_block",
    "resnet50_bottleneck",
    "unet_small",
    "yolo_neck",
    "vit_tiny",
    "bert_tiny",
    "audio_conv1d",
    "odd_convnet",
    "odd_transformer",
)
OPSET = 17
DIGITS_PATH = Path(__file__).parent / "data" / "digits.onnx"

INPUT_SHAPES = {
    "mlp": (1, 784),
    "mobilenet_v2": (1, 3, 224, 224),
    "resnet18": (1, 3, 224, 224),
    "dwconv_block": (1, 256, 96, 96),
    "digits": (1, 1, 8, 8),
    "squeezenet": (1, 3, 128, 128),
    "shufflenet_v2": (1, 3, 224, 224),
    "mobilenet_v3_small": (1, 3, 224, 224),
    "efficientnet_b0": (1, 3, 160, 160),
    "densenet_block": (1, 64, 28, 28),
    "inception_block": (1, 192, 28, 28),
    "resnet50_bottleneck": (1, 3, 112, 112),
    "unet_small": (1, 3, 96, 96),
    "yolo_neck": (1, 3, 192, 192),
    "vit_tiny": (1, 3, 112, 176),
    "bert_tiny": (1, 128, 128),
    "audio_conv1d": (1, 1, 16000),
    "odd_convnet": (1, 3, 97, 131),
    "odd_transformer": (1, 77, 200),
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

    def split(self, x: str, sizes: list[int], axis: int = 1) -> list[str]:
        """Split on `axis` into parts of `sizes`, the sizes given as an input as opset 13+ exporters write them."""
        outputs = [self.name("split") for _ in sizes]
        sizes_input = self.constant("split_sizes", np.array(sizes, np.int64))
        self.nodes.append(helper.make_node("Split", [x, sizes_input], outputs, name=outputs[0], axis=axis))
        return outputs

    def reshape(self, x: str, shape: tuple[int, ...]) -> str:
        return self.node("Reshape", [x, self.constant("shape", np.array(shape, np.int64))], "reshape")

    def linear(self, x: str, in_features: int, out_features: int) -> str:
        """A Linear on a 3-D input as torch.onnx.export writes it: MatMul by the [in, out] weight, then Add."""
        weight = self.rng.standard_normal((in_features, out_features)) * np.sqrt(1 / in_features)
        bias = self.rng.normal(0.0, 0.01, out_features)
        x = self.node("MatMul", [x, self.constant("linear_weight", weight.astype(np.float32))], "matmul")
        return self.node("Add", [x, self.constant("linear_bias", bias.astype(np.float32))], "add")

    def conv(
        self,
        x: str,
        in_channels: int,
        out_channels: int,
        kernel: int,
        stride: int = 1,
        groups: int = 1,
        *,
        rank: int = 2,
        dilation: int = 1,
        pad: int | None = None,
        bias: bool = False,
        output: str | None = None,
    ) -> str:
        """A `rank`-D convolution with a square kernel; padding keeps the size at stride 1 unless `pad` is given."""
        fan_in = in_channels // groups * kernel**rank
        shape = (out_channels, in_channels // groups, *(kernel,) * rank)
        weight = self.rng.standard_normal(shape) * np.sqrt(2 / fan_in)
        inputs = [x, self.constant("conv_weight", weight.astype(np.float32))]
        if bias:
            inputs.append(self.constant("conv_bias", self.rng.normal(0.0, 0.01, out_channels).astype(np.float32)))
        pad = dilation * (kernel - 1) // 2 if pad is None else pad
        dilations = {"dilations": [dilation] * rank} if dilation != 1 else {}
        return self.node(
            "Conv",
            inputs,
            "conv",
            output,
            kernel_shape=[kernel] * rank,
            strides=[stride] * rank,
            pads=[pad] * 2 * rank,
            group=groups,
            **dilations,
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


def _scalar(b: _Builder, hint: str, value: float) -> str:
    return b.constant(hint, np.array(value, np.float32))


def _silu(b: _Builder, x: str) -> str:
    """SiLU as torch.onnx.export writes it at opset 17: x * Sigmoid(x)."""
    return b.node("Mul", [x, b.node("Sigmoid", [x], "sigmoid")], "silu")


def _max_pool(
    b: _Builder,
    x: str,
    kernel: int,
    stride: int,
    pad: int = 0,
    ceil: bool = False,
    rank: int = 2,
    output: str | None = None,
) -> str:
    return b.node(
        "MaxPool",
        [x],
        "maxpool",
        output,
        kernel_shape=[kernel] * rank,
        strides=[stride] * rank,
        pads=[pad] * 2 * rank,
        ceil_mode=int(ceil),
    )


def _squeezenet() -> onnx.ModelProto:
    """SqueezeNet 1.1 (Iandola et al. 2016, the torchvision variant): convs with bias and no batch norm."""
    b = _Builder(seed=5)

    def conv_relu(x: str, in_channels: int, out_channels: int, kernel: int, stride: int = 1, pad: int = 0) -> str:
        return b.node("Relu", [b.conv(x, in_channels, out_channels, kernel, stride, pad=pad, bias=True)])

    def fire(x: str, in_channels: int, squeeze: int, expand: int) -> str:
        s = conv_relu(x, in_channels, squeeze, 1)
        return b.node("Concat", [conv_relu(s, squeeze, expand, 1), conv_relu(s, squeeze, expand, 3, pad=1)], axis=1)

    x = _max_pool(b, conv_relu("input", 3, 64, 3, stride=2), 3, 2, ceil=True)
    x = _max_pool(b, fire(fire(x, 64, 16, 64), 128, 16, 64), 3, 2, ceil=True)
    x = _max_pool(b, fire(fire(x, 128, 32, 128), 256, 32, 128), 3, 2, ceil=True)
    for in_channels, squeeze, expand in ((256, 48, 192), (384, 48, 192), (384, 64, 256), (512, 64, 256)):
        x = fire(x, in_channels, squeeze, expand)
    x = b.node("GlobalAveragePool", [conv_relu(x, 512, 1000, 1)], "pool")
    b.node("Flatten", [x], output="output", axis=1)
    return b.model("squeezenet", INPUT_SHAPES["squeezenet"], "output", (1, 1000))


def _shufflenet_v2() -> onnx.ModelProto:
    """ShuffleNetV2 0.5x (Ma et al. 2018): channel split, two-group channel shuffle, depthwise 3x3 convs."""
    b = _Builder(seed=6)

    def conv_bn(x: str, in_channels: int, out_channels: int, kernel: int, stride: int = 1, relu: bool = True) -> str:
        groups = in_channels if kernel == 3 else 1
        # He scaling assumes a ReLU halves the variance; without one, a smaller gamma keeps it from doubling.
        gamma = 1.0 if relu else 0.7
        y = b.batch_norm(b.conv(x, in_channels, out_channels, kernel, stride, groups), out_channels, gamma)
        return b.node("Relu", [y]) if relu else y

    def shuffle(x: str, channels: int, size: int) -> str:
        x = b.reshape(x, (1, 2, channels // 2, size, size))
        x = b.node("Transpose", [x], "shuffle", perm=[0, 2, 1, 3, 4])
        return b.reshape(x, (1, channels, size, size))

    def branch(x: str, in_channels: int, channels: int, stride: int) -> str:
        y = conv_bn(x, in_channels, channels, 1)
        y = conv_bn(y, channels, channels, 3, stride, relu=False)
        return conv_bn(y, channels, channels, 1)

    x = b.node("Relu", [b.batch_norm(b.conv("input", 3, 24, 3, stride=2), 24)])
    x = _max_pool(b, x, 3, 2, pad=1)
    channels, size = 24, INPUT_SHAPES["shufflenet_v2"][2] // 4
    for out_channels, repeats in ((48, 4), (96, 8), (192, 4)):
        half = out_channels // 2
        size //= 2
        left = conv_bn(conv_bn(x, channels, channels, 3, 2, relu=False), channels, half, 1)
        x = shuffle(b.node("Concat", [left, branch(x, channels, half, 2)], axis=1), out_channels, size)
        for _ in range(repeats - 1):
            kept, changed = b.split(x, [half, half])
            x = shuffle(b.node("Concat", [kept, branch(changed, half, half, 1)], axis=1), out_channels, size)
        channels = out_channels
    x = b.node("Relu", [b.batch_norm(b.conv(x, channels, 1024, 1), 1024)])
    x = b.node("ReduceMean", [x], "mean", axes=[2, 3], keepdims=0)
    b.gemm(x, 1024, 1000, output="output")
    return b.model("shufflenet_v2", INPUT_SHAPES["shufflenet_v2"], "output", (1, 1000))


def _squeeze_excite(b: _Builder, x: str, channels: int, squeeze: int, inner, gate) -> str:
    """Squeeze-excite: global pool, two 1x1 convs with bias, a gate, and the gate's broadcast Mul back onto `x`."""
    s = b.node("GlobalAveragePool", [x], "pool")
    s = inner(b.conv(s, channels, squeeze, 1, bias=True))
    s = gate(b.conv(s, squeeze, channels, 1, bias=True))
    return b.node("Mul", [x, s], "excite")


def _mobilenet_v3_small() -> onnx.ModelProto:
    """MobileNetV3-small (Howard et al. 2019, torchvision's layer table): HardSwish, and squeeze-excite gated by
    HardSigmoid(alpha=1/6) as torch exports it."""
    b = _Builder(seed=7)

    def hard_swish(x: str) -> str:
        return b.node("HardSwish", [x], "hswish")

    def relu(x: str) -> str:
        return b.node("Relu", [x])

    def hard_sigmoid(x: str) -> str:
        return b.node("HardSigmoid", [x], "hsigmoid", alpha=1 / 6, beta=0.5)

    x = hard_swish(b.batch_norm(b.conv("input", 3, 16, 3, stride=2), 16))
    channels = 16
    # (kernel, expanded channels, output channels, squeeze-excite, activation, stride)
    for kernel, hidden, out_channels, excite, activation, stride in (
        (3, 16, 16, True, relu, 2),
        (3, 72, 24, False, relu, 2),
        (3, 88, 24, False, relu, 1),
        (5, 96, 40, True, hard_swish, 2),
        (5, 240, 40, True, hard_swish, 1),
        (5, 240, 40, True, hard_swish, 1),
        (5, 120, 48, True, hard_swish, 1),
        (5, 144, 48, True, hard_swish, 1),
        (5, 288, 96, True, hard_swish, 2),
        (5, 576, 96, True, hard_swish, 1),
        (5, 576, 96, True, hard_swish, 1),
    ):
        y = x
        if hidden != channels:
            y = activation(b.batch_norm(b.conv(y, channels, hidden, 1), hidden))
        y = activation(b.batch_norm(b.conv(y, hidden, hidden, kernel, stride, groups=hidden), hidden))
        if excite:
            squeeze = max(8, (hidden // 4 + 4) // 8 * 8)
            y = _squeeze_excite(b, y, hidden, squeeze, relu, hard_sigmoid)
        y = b.batch_norm(b.conv(y, hidden, out_channels, 1), out_channels, gamma_scale=0.5)
        if stride == 1 and channels == out_channels:
            y = b.node("Add", [x, y], "residual")
        x, channels = y, out_channels
    x = hard_swish(b.batch_norm(b.conv(x, channels, 576, 1), 576))
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x], "pool")], "flatten", axis=1)
    x = hard_swish(b.gemm(x, 576, 1024))
    b.gemm(x, 1024, 1000, output="output")
    return b.model("mobilenet_v3_small", INPUT_SHAPES["mobilenet_v3_small"], "output", (1, 1000))


def _efficientnet_b0() -> onnx.ModelProto:
    """EfficientNet-B0's stages (Tan & Le 2019) with one block per stage instead of 1-2-2-3-3-4-1: MBConv with SiLU,
    squeeze-excite at a quarter of the block's input channels, 3x3 and 5x5 depthwise convs."""
    b = _Builder(seed=8)

    def silu(x: str) -> str:
        return _silu(b, x)

    def sigmoid(x: str) -> str:
        return b.node("Sigmoid", [x], "gate")

    x = silu(b.batch_norm(b.conv("input", 3, 32, 3, stride=2), 32))
    channels = 32
    # (expansion, kernel, stride, output channels, blocks)
    for expansion, kernel, stride, out_channels, blocks in (
        (1, 3, 1, 16, 1),
        (6, 3, 2, 24, 2),
        (6, 5, 2, 40, 1),
        (6, 3, 2, 80, 1),
        (6, 5, 1, 112, 1),
        (6, 5, 2, 192, 2),
        (6, 3, 1, 320, 1),
    ):
        for block in range(blocks):
            block_stride = stride if block == 0 else 1
            hidden = channels * expansion
            y = x
            if expansion != 1:
                y = silu(b.batch_norm(b.conv(y, channels, hidden, 1), hidden))
            y = silu(b.batch_norm(b.conv(y, hidden, hidden, kernel, block_stride, groups=hidden), hidden))
            y = _squeeze_excite(b, y, hidden, max(1, channels // 4), silu, sigmoid)
            y = b.batch_norm(b.conv(y, hidden, out_channels, 1), out_channels, gamma_scale=0.5)
            if block_stride == 1 and channels == out_channels:
                y = b.node("Add", [x, y], "residual")
            x, channels = y, out_channels
    x = silu(b.batch_norm(b.conv(x, channels, 1280, 1), 1280))
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x], "pool")], "flatten", axis=1)
    b.gemm(x, 1280, 1000, output="output")
    return b.model("efficientnet_b0", INPUT_SHAPES["efficientnet_b0"], "output", (1, 1000))


def _densenet_block() -> onnx.ModelProto:
    """A DenseNet-121 dense block (Huang et al. 2017): six pre-activation BN-ReLU-1x1-BN-ReLU-3x3 layers, each fed the
    Concat of every earlier output as torchvision writes it, then the transition's BN-ReLU-1x1 and 2x2 average pool."""
    b = _Builder(seed=9)
    growth, bottleneck = 32, 128
    features, channels = ["input"], 64
    for _ in range(6):
        x = b.node("Concat", features, axis=1) if len(features) > 1 else features[0]
        x = b.conv(b.node("Relu", [b.batch_norm(x, channels)]), channels, bottleneck, 1)
        x = b.conv(b.node("Relu", [b.batch_norm(x, bottleneck)]), bottleneck, growth, 3)
        features.append(x)
        channels += growth
    x = b.node("Concat", features, axis=1)
    x = b.conv(b.node("Relu", [b.batch_norm(x, channels)]), channels, channels // 2, 1)
    b.node("AveragePool", [x], output="output", kernel_shape=[2, 2], strides=[2, 2])
    return b.model("densenet_block", INPUT_SHAPES["densenet_block"], "output", (1, channels // 2, 14, 14))


def _inception_block() -> onnx.ModelProto:
    """GoogLeNet's inception 3a (Szegedy et al. 2014, torchvision's conv-BN-ReLU units): 1x1, 1x1-3x3, 1x1-5x5 and
    3x3-max-pool-1x1 branches joined by Concat, then the stride-2 ceil_mode max pool that follows in the net."""
    b = _Builder(seed=10)

    def unit(x: str, in_channels: int, out_channels: int, kernel: int) -> str:
        return b.node("Relu", [b.batch_norm(b.conv(x, in_channels, out_channels, kernel), out_channels)])

    branches = [
        unit("input", 192, 64, 1),
        unit(unit("input", 192, 96, 1), 96, 128, 3),
        unit(unit("input", 192, 16, 1), 16, 32, 5),
        unit(_max_pool(b, "input", 3, 1, pad=1, ceil=True), 192, 32, 1),
    ]
    x = b.node("Concat", branches, axis=1)
    _max_pool(b, x, 3, 2, ceil=True, output="output")
    return b.model("inception_block", INPUT_SHAPES["inception_block"], "output", (1, 256, 14, 14))


def _resnet50_bottleneck() -> onnx.ModelProto:
    """ResNet-50's stem and the first bottleneck of each of its first three stages (He et al. 2016, v1.5: the stride
    on the 3x3), at 112x112, then global pooling and the classifier."""
    b = _Builder(seed=11)

    def conv_bn(x: str, in_channels: int, out_channels: int, kernel: int, stride: int = 1, gamma: float = 1.0):
        return b.batch_norm(b.conv(x, in_channels, out_channels, kernel, stride), out_channels, gamma_scale=gamma)

    x = b.node("Relu", [conv_bn("input", 3, 64, 7, stride=2)])
    x = _max_pool(b, x, 3, 2, pad=1)
    channels = 64
    for width, stride in ((64, 1), (128, 2), (256, 2)):
        out_channels = 4 * width
        y = b.node("Relu", [conv_bn(x, channels, width, 1)])
        y = b.node("Relu", [conv_bn(y, width, width, 3, stride)])
        y = conv_bn(y, width, out_channels, 1, gamma=0.5)
        shortcut = conv_bn(x, channels, out_channels, 1, stride)
        x = b.node("Relu", [b.node("Add", [shortcut, y], "residual")])
        channels = out_channels
    x = _torch_flatten(b, b.node("GlobalAveragePool", [x], "pool"))
    b.gemm(x, channels, 1000, output="output")
    return b.model("resnet50_bottleneck", INPUT_SHAPES["resnet50_bottleneck"], "output", (1, 1000))


def _resize(b: _Builder, x: str, mode: str) -> str:
    """2x upsampling as torch exports nn.Upsample at opset 17: an empty roi and constant scales."""
    scales = b.constant("scales", np.array([1, 1, 2, 2], np.float32))
    attributes = {"mode": mode}
    if mode == "nearest":
        attributes.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    else:
        attributes.update(coordinate_transformation_mode="half_pixel")
    return b.node("Resize", [x, "", scales], "resize", **attributes)


def _unet_small() -> onnx.ModelProto:
    """A three-level U-Net (Ronneberger et al. 2015) with conv-BN-ReLU pairs: one decoder level upsamples with a
    stride-2 ConvTranspose, the other with a bilinear Resize and a 1x1 conv, each joined to its skip by Concat."""
    b = _Builder(seed=12)

    def double(x: str, in_channels: int, out_channels: int) -> str:
        # Max pools and skip Concats raise the variance that random batch-norm statistics do not take out again;
        # a smaller gamma keeps activations near unit scale, as trained statistics would.
        for channels in (in_channels, out_channels):
            y = b.batch_norm(b.conv(x, channels, out_channels, 3), out_channels, gamma_scale=0.8)
            x = b.node("Relu", [y])
        return x

    first = double("input", 3, 16)
    second = double(_max_pool(b, first, 2, 2), 16, 32)
    x = double(_max_pool(b, second, 2, 2), 32, 64)
    weight = b.rng.standard_normal((64, 32, 2, 2)) * np.sqrt(2 / (64 * 4))
    bias = b.rng.normal(0.0, 0.01, 32)
    x = b.node(
        "ConvTranspose",
        [x, b.constant("up_weight", weight.astype(np.float32)), b.constant("up_bias", bias.astype(np.float32))],
        "up",
        kernel_shape=[2, 2],
        strides=[2, 2],
    )
    x = double(b.node("Concat", [second, x], axis=1), 64, 32)
    x = b.conv(_resize(b, x, "linear"), 32, 16, 1, bias=True)
    x = double(b.node("Concat", [first, x], axis=1), 32, 16)
    b.conv(x, 16, 3, 1, bias=True, output="output")
    size = INPUT_SHAPES["unet_small"][2]
    return b.model("unet_small", INPUT_SHAPES["unet_small"], "output", (1, 3, size, size))


def _yolo_neck() -> onnx.ModelProto:
    """A YOLOv5-style net cut to its neck: a strided conv-BN-SiLU backbone to P5, SPPF (three chained 5x5 max pools,
    Concat), and a top-down FPN with nearest 2x Resize and Concat to P3, ending in the 255-channel P3 head."""
    b = _Builder(seed=13)

    def unit(x: str, in_channels: int, out_channels: int, kernel: int, stride: int = 1) -> str:
        return _silu(b, b.batch_norm(b.conv(x, in_channels, out_channels, kernel, stride), out_channels))

    x, features, channels = "input", [], 3
    for out_channels in (16, 32, 64, 128, 256):
        x = unit(x, channels, out_channels, 3, stride=2)
        features.append(x)
        channels = out_channels
    x = unit(x, 256, 128, 1)
    pools = [x]
    for _ in range(3):
        pools.append(_max_pool(b, pools[-1], 5, 1, pad=2))
    x = unit(b.node("Concat", pools, axis=1), 512, 256, 1)
    for lateral, channels in ((features[3], 128), (features[2], 64)):
        x = _resize(b, unit(x, 2 * channels, channels, 1), "nearest")
        x = unit(b.node("Concat", [x, lateral], axis=1), 2 * channels, channels, 3)
    b.conv(x, 64, 255, 1, bias=True, output="output")
    size = INPUT_SHAPES["yolo_neck"][2] // 8
    return b.model("yolo_neck", INPUT_SHAPES["yolo_neck"], "output", (1, 255, size, size))


def _layer_norm(b: _Builder, x: str, width: int, decomposed: bool) -> str:
    """LayerNormalization over the last axis: the opset-17 op, or the ReduceMean/Sub/Pow/Sqrt/Div form older
    exporters write."""
    gamma = b.constant("ln_scale", b.rng.uniform(0.8, 1.2, width).astype(np.float32))
    beta = b.constant("ln_bias", b.rng.normal(0.0, 0.1, width).astype(np.float32))
    if not decomposed:
        return b.node("LayerNormalization", [x, gamma, beta], "layernorm", axis=-1, epsilon=1e-6)
    centred = b.node("Sub", [x, b.node("ReduceMean", [x], "mean", axes=[-1], keepdims=1)], "centre")
    variance = b.node(
        "ReduceMean", [b.node("Pow", [centred, _scalar(b, "two", 2.0)], "square")], "mean", axes=[-1], keepdims=1
    )
    deviation = b.node("Sqrt", [b.node("Add", [variance, _scalar(b, "epsilon", 1e-12)], "add")], "sqrt")
    x = b.node("Div", [centred, deviation], "normalized")
    return b.node("Add", [b.node("Mul", [x, gamma], "mul"), beta], "add")


def _gelu(b: _Builder, x: str) -> str:
    """GELU in the erf form torch exports below opset 20: x * 0.5 * (1 + erf(x / sqrt 2))."""
    y = b.node("Erf", [b.node("Div", [x, _scalar(b, "sqrt2", np.sqrt(2.0))], "div")], "erf")
    y = b.node("Mul", [x, b.node("Add", [y, _scalar(b, "one", 1.0)], "add")], "mul")
    return b.node("Mul", [y, _scalar(b, "half", 0.5)], "gelu")


def _encoder(b: _Builder, x: str, sequence: int, width: int, heads: int, hidden: int, post_norm: bool) -> str:
    """One transformer encoder layer: multi-head self-attention with Reshape/Transpose heads, then a GELU MLP;
    pre-norm (ViT) with the LayerNormalization op, or post-norm (BERT) with the decomposed form."""
    depth = width // heads

    def attention(y: str) -> str:
        def heads_of(z: str, perm: list[int]) -> str:
            return b.node("Transpose", [b.reshape(z, (1, sequence, heads, depth))], "heads", perm=perm)

        query = heads_of(b.linear(y, width, width), [0, 2, 1, 3])
        key = heads_of(b.linear(y, width, width), [0, 2, 3, 1])
        value = heads_of(b.linear(y, width, width), [0, 2, 1, 3])
        scores = b.node("MatMul", [query, key], "scores")
        # BERT's exporter divides by sqrt(depth), timm's ViT multiplies by its inverse.
        if post_norm:
            scores = b.node("Div", [scores, _scalar(b, "scale", np.sqrt(depth))], "scaled")
        else:
            scores = b.node("Mul", [scores, _scalar(b, "scale", depth**-0.5)], "scaled")
        attended = b.node("MatMul", [b.node("Softmax", [scores], "softmax", axis=-1), value], "attended")
        attended = b.node("Transpose", [attended], "merge", perm=[0, 2, 1, 3])
        return b.linear(b.reshape(attended, (1, sequence, width)), width, width)

    def mlp(y: str) -> str:
        return b.linear(_gelu(b, b.linear(y, width, hidden)), hidden, width)

    if post_norm:
        x = _layer_norm(b, b.node("Add", [x, attention(x)], "residual"), width, decomposed=True)
        return _layer_norm(b, b.node("Add", [x, mlp(x)], "residual"), width, decomposed=True)
    x = b.node("Add", [x, attention(_layer_norm(b, x, width, decomposed=False))], "residual")
    return b.node("Add", [x, mlp(_layer_norm(b, x, width, decomposed=False))], "residual")


def _vit_tiny() -> onnx.ModelProto:
    """ViT-Ti/16 (Dosovitskiy et al. 2020; width 192, 3 heads, MLP 768) cut to 4 layers: a 16x16-patch Conv on a
    112x176 image gives 7x11 = 77 tokens, then position embeddings, pre-norm encoders, mean pooling, a classifier."""
    b = _Builder(seed=14)
    width, (_, _, height, breadth) = 192, INPUT_SHAPES["vit_tiny"]
    sequence = (height // 16) * (breadth // 16)
    weight = b.rng.standard_normal((width, 3, 16, 16)) * np.sqrt(1 / (3 * 256))
    bias = b.rng.normal(0.0, 0.01, width)
    x = b.node(
        "Conv",
        [
            "input",
            b.constant("patch_weight", weight.astype(np.float32)),
            b.constant("patch_bias", bias.astype(np.float32)),
        ],
        "patches",
        kernel_shape=[16, 16],
        strides=[16, 16],
    )
    x = b.node("Transpose", [b.reshape(x, (1, width, sequence))], "tokens", perm=[0, 2, 1])
    position = b.rng.normal(0.0, 0.02, (1, sequence, width)).astype(np.float32)
    x = b.node("Add", [x, b.constant("position", position)], "embedded")
    for _ in range(4):
        x = _encoder(b, x, sequence, width, heads=3, hidden=768, post_norm=False)
    x = _layer_norm(b, b.node("ReduceMean", [x], "mean", axes=[1], keepdims=0), width, decomposed=False)
    b.gemm(x, width, 1000, output="output")
    return b.model("vit_tiny", INPUT_SHAPES["vit_tiny"], "output", (1, 1000))


def _bert_tiny() -> onnx.ModelProto:
    """BERT-tiny (Turc et al. 2019; 2 layers, width 128, 4 heads, feed-forward 512) at 128 tokens, from the summed
    embeddings on (the token lookup is a Gather outside the encoder): post-norm layers with the decomposed
    LayerNorm, and the pooler's first-token Gemm and Tanh."""
    b = _Builder(seed=15)
    _, sequence, width = INPUT_SHAPES["bert_tiny"]
    x = _layer_norm(b, "input", width, decomposed=True)
    for _ in range(2):
        x = _encoder(b, x, sequence, width, heads=4, hidden=512, post_norm=True)
    first = b.node("Gather", [x, b.constant("first", np.array(0, np.int64))], "first", axis=1)
    b.node("Tanh", [b.gemm(first, width, width)], output="output")
    return b.model("bert_tiny", INPUT_SHAPES["bert_tiny"], "output", (1, width))


def _audio_conv1d() -> onnx.ModelProto:
    """A 1-D conv net on one second of 16 kHz audio, after M5 (Dai et al. 2017) with dilated layers added as in
    TCNs: a wide stride-4 first conv, conv-BN-ReLU blocks with stride, dilation 2 and 4 and 1-D max pools, global
    average pooling and a 35-word classifier (Speech Commands)."""
    b = _Builder(seed=16)

    def unit(x: str, in_channels: int, out_channels: int, kernel: int, stride: int = 1, dilation: int = 1) -> str:
        y = b.conv(x, in_channels, out_channels, kernel, stride, rank=1, dilation=dilation)
        return b.node("Relu", [b.batch_norm(y, out_channels)])

    x = _max_pool(b, unit("input", 1, 48, 79, stride=4), 4, 4, rank=1)
    x = _max_pool(b, unit(unit(x, 48, 48, 3), 48, 96, 3, stride=2), 4, 4, rank=1)
    x = unit(unit(x, 96, 96, 3, dilation=2), 96, 96, 3, dilation=4)
    x = unit(x, 96, 160, 3, stride=2)
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x], "pool")], "flatten", axis=1)
    b.gemm(x, 160, 35, output="output")
    return b.model("audio_conv1d", INPUT_SHAPES["audio_conv1d"], "output", (1, 35))


def _odd_convnet() -> onnx.ModelProto:
    """Shapes no schedule was chosen for (they were picked before any was timed): a 97x131 image, channel counts
    27, 45, 61, 19 and 80 that no vector width divides, a 5x5 stride-2 stem on 3 channels, a 7x7 depthwise conv, a
    3-group dilated conv, a stride-3 conv, average and max pools with ceil_mode, a sigmoid gate and a Concat of 61
    and 19 channels."""
    b = _Builder(seed=17)
    x = b.node("HardSwish", [b.batch_norm(b.conv("input", 3, 27, 5, stride=2), 27)], "hswish")
    x = b.node("Relu", [b.batch_norm(b.conv(x, 27, 27, 7, groups=27), 27)])
    x = b.node("Relu", [b.batch_norm(b.conv(x, 27, 45, 1), 45)])
    x = b.node("Relu", [b.conv(x, 45, 45, 3, groups=3, dilation=2, bias=True)])
    x = b.node("Relu", [b.conv(x, 45, 61, 3, stride=3, bias=True)])
    x = b.node("AveragePool", [x], "avgpool", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    x = b.node("Mul", [x, b.node("Sigmoid", [b.conv(x, 61, 61, 1, bias=True)], "gate")], "gated")
    x = b.node("Concat", [x, b.node("Relu", [b.conv(x, 61, 19, 3, bias=True)])], "concat", axis=1)
    x = _max_pool(b, x, 2, 2, ceil=True)
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x], "pool")], "flatten", axis=1)
    b.gemm(x, 80, 11, output="output")
    return b.model("odd_convnet", INPUT_SHAPES["odd_convnet"], "output", (1, 11))


def _odd_transformer() -> onnx.ModelProto:
    """Two pre-norm encoder layers at widths no schedule was chosen for: 77 tokens of width 200, 5 heads of 40,
    an MLP of 700, then mean pooling and a 13-way classifier."""
    b = _Builder(seed=18)
    _, sequence, width = INPUT_SHAPES["odd_transformer"]
    x = "input"
    for _ in range(2):
        x = _encoder(b, x, sequence, width, heads=5, hidden=700, post_norm=False)
    x = _layer_norm(b, b.node("ReduceMean", [x], "mean", axes=[1], keepdims=0), width, decomposed=False)
    b.gemm(x, width, 13, output="output")
    return b.model("odd_transformer", INPUT_SHAPES["odd_transformer"], "output", (1, 13))


def _digits() -> onnx.ModelProto:
    return onnx.load(str(DIGITS_PATH))


_BUILDERS = {
    "mlp": _mlp,
    "mobilenet_v2": _mobilenet_v2,
    "resnet18": _resnet18,
    "dwconv_block": _dwconv_block,
    "digits": _digits,
    "squeezenet": _squeezenet,
    "shufflenet_v2": _shufflenet_v2,
    "mobilenet_v3_small": _mobilenet_v3_small,
    "efficientnet_b0": _efficientnet_b0,
    "densenet_block": _densenet_block,
    "inception_block": _inception_block,
    "resnet50_bottleneck": _resnet50_bottleneck,
    "unet_small": _unet_small,
    "yolo_neck": _yolo_neck,
    "vit_tiny": _vit_tiny,
    "bert_tiny": _bert_tiny,
    "audio_conv1d": _audio_conv1d,
    "odd_convnet": _odd_convnet,
    "odd_transformer": _odd_transformer,
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


def model_flops(model: onnx.ModelProto) -> int:
    """2 x the multiply-adds of every Conv, ConvTranspose, Gemm and MatMul, from the shapes ONNX shape inference
    gives: the work the benchmarks' GFLOP/s and `tessel zoo --list` count (elementwise ops are left out)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for info in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        shapes[info.name] = [dim.dim_value for dim in info.type.tensor_type.shape.dim]
    for tensor in inferred.graph.initializer:
        shapes[tensor.name] = list(tensor.dims)
    macs = 0
    for node in inferred.graph.node:
        if node.op_type == "Conv":
            weight, output = shapes[node.input[1]], shapes[node.output[0]]
            macs += int(np.prod(output)) * int(np.prod(weight[1:]))
        elif node.op_type == "ConvTranspose":
            # every input element is scattered through the (M/group) x kernel weights of its channel
            weight, source = shapes[node.input[1]], shapes[node.input[0]]
            macs += int(np.prod(source)) * int(np.prod(weight[1:]))
        elif node.op_type in ("Gemm", "MatMul"):
            left, output = shapes[node.input[0]], shapes[node.output[0]]
            transposed = any(item.name == "transA" and item.i for item in node.attribute)
            inner = left[-2] if transposed else left[-1]
            macs += int(np.prod(output)) * inner
    return 2 * macs


def model_parameters(model: onnx.ModelProto) -> int:
    """Elements of every initializer: the model's weights, biases, batch-norm statistics and constant tables."""
    return sum(int(np.prod(tensor.dims)) for tensor in model.graph.initializer)


def sample_input(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """A seeded random input for model `name`: pixels in 0..1 for digits, standard normal for the others."""
    _check_name(name)
    rng = np.random.default_rng(seed)
    shape = INPUT_SHAPES[name]
    array = rng.random(shape) if name == "digits" else rng.standard_normal(shape)
    return {"input": array.astype(np.float32)}
