"""The zoo's convolutional models (and the MLP): MobileNets, ResNets, SqueezeNet, ShuffleNet, EfficientNet,
DenseNet, Inception, U-Net and YOLO blocks at small sizes, and an odd-shaped convnet."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from compiler.zoo.builder import INPUT_SHAPES, Builder


def multilayer_perceptron() -> onnx.ModelProto:
    b = Builder(seed=1)
    x = b.node("Relu", [b.gemm("input", 784, 512)])
    x = b.node("Relu", [b.gemm(x, 512, 512)])
    b.gemm(x, 512, 10, output="output")
    return b.model("mlp", INPUT_SHAPES["mlp"], "output", (1, 10))


def _relu6(b: Builder, x: str) -> str:
    low = b.constant("clip_min", np.array(0.0, np.float32))
    high = b.constant("clip_max", np.array(6.0, np.float32))
    return b.node("Clip", [x, low, high], "relu6")


def mobilenet_v2() -> onnx.ModelProto:
    b = Builder(seed=2)
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


def _torch_flatten(b: Builder, x: str) -> str:
    """`x.view(x.size(0), -1)` as torch.onnx.export writes it: the batch size read back from the shape at run time."""
    shape = b.node("Shape", [x], "shape")
    index = b.node("Constant", [], "constant", value=numpy_helper.from_array(np.array(0, np.int64)))
    batch = b.node("Gather", [shape, index], "gather", axis=0)
    axes = b.node("Constant", [], "constant", value=numpy_helper.from_array(np.array([0], np.int64)))
    batch = b.node("Unsqueeze", [batch, axes], "unsqueeze")
    rest = b.node("Constant", [], "constant", value=numpy_helper.from_array(np.array([-1], np.int64)))
    target = b.node("Concat", [batch, rest], "concat", axis=0)
    return b.node("Reshape", [x, target], "reshape")


def resnet18() -> onnx.ModelProto:
    b = Builder(seed=3)
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


def dwconv_block() -> onnx.ModelProto:
    """The seeds' case: depthwise conv → per-channel scale and shift → relu, which fusion must make one kernel."""
    b = Builder(seed=4)
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


def scalar(b: Builder, hint: str, value: float) -> str:
    return b.constant(hint, np.array(value, np.float32))


def _silu(b: Builder, x: str) -> str:
    """SiLU as torch.onnx.export writes it at opset 17: x * Sigmoid(x)."""
    return b.node("Mul", [x, b.node("Sigmoid", [x], "sigmoid")], "silu")


def max_pool(
    b: Builder,
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


def squeezenet() -> onnx.ModelProto:
    """SqueezeNet 1.1 (Iandola et al. 2016, the torchvision variant): convs with bias and no batch norm."""
    b = Builder(seed=5)

    def conv_relu(x: str, in_channels: int, out_channels: int, kernel: int, stride: int = 1, pad: int = 0) -> str:
        return b.node("Relu", [b.conv(x, in_channels, out_channels, kernel, stride, pad=pad, bias=True)])

    def fire(x: str, in_channels: int, squeeze: int, expand: int) -> str:
        s = conv_relu(x, in_channels, squeeze, 1)
        return b.node("Concat", [conv_relu(s, squeeze, expand, 1), conv_relu(s, squeeze, expand, 3, pad=1)], axis=1)

    x = max_pool(b, conv_relu("input", 3, 64, 3, stride=2), 3, 2, ceil=True)
    x = max_pool(b, fire(fire(x, 64, 16, 64), 128, 16, 64), 3, 2, ceil=True)
    x = max_pool(b, fire(fire(x, 128, 32, 128), 256, 32, 128), 3, 2, ceil=True)
    for in_channels, squeeze, expand in ((256, 48, 192), (384, 48, 192), (384, 64, 256), (512, 64, 256)):
        x = fire(x, in_channels, squeeze, expand)
    x = b.node("GlobalAveragePool", [conv_relu(x, 512, 1000, 1)], "pool")
    b.node("Flatten", [x], output="output", axis=1)
    return b.model("squeezenet", INPUT_SHAPES["squeezenet"], "output", (1, 1000))


def shufflenet_v2() -> onnx.ModelProto:
    """ShuffleNetV2 0.5x (Ma et al. 2018): channel split, two-group channel shuffle, depthwise 3x3 convs."""
    b = Builder(seed=6)

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
    x = max_pool(b, x, 3, 2, pad=1)
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


def _squeeze_excite(b: Builder, x: str, channels: int, squeeze: int, inner, gate) -> str:
    """Squeeze-excite: global pool, two 1x1 convs with bias, a gate, and the gate's broadcast Mul back onto `x`."""
    s = b.node("GlobalAveragePool", [x], "pool")
    s = inner(b.conv(s, channels, squeeze, 1, bias=True))
    s = gate(b.conv(s, squeeze, channels, 1, bias=True))
    return b.node("Mul", [x, s], "excite")


def mobilenet_v3_small() -> onnx.ModelProto:
    """MobileNetV3-small (Howard et al. 2019, torchvision's layer table): HardSwish, and squeeze-excite gated by
    HardSigmoid(alpha=1/6) as torch exports it."""
    b = Builder(seed=7)

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


def efficientnet_b0() -> onnx.ModelProto:
    """EfficientNet-B0's stages (Tan & Le 2019) with one block per stage instead of 1-2-2-3-3-4-1: MBConv with SiLU,
    squeeze-excite at a quarter of the block's input channels, 3x3 and 5x5 depthwise convs."""
    b = Builder(seed=8)

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


def densenet_block() -> onnx.ModelProto:
    """A DenseNet-121 dense block (Huang et al. 2017): six pre-activation BN-ReLU-1x1-BN-ReLU-3x3 layers, each fed the
    Concat of every earlier output as torchvision writes it, then the transition's BN-ReLU-1x1 and 2x2 average pool."""
    b = Builder(seed=9)
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


def inception_block() -> onnx.ModelProto:
    """GoogLeNet's inception 3a (Szegedy et al. 2014, torchvision's conv-BN-ReLU units): 1x1, 1x1-3x3, 1x1-5x5 and
    3x3-max-pool-1x1 branches joined by Concat, then the stride-2 ceil_mode max pool that follows in the net."""
    b = Builder(seed=10)

    def unit(x: str, in_channels: int, out_channels: int, kernel: int) -> str:
        return b.node("Relu", [b.batch_norm(b.conv(x, in_channels, out_channels, kernel), out_channels)])

    branches = [
        unit("input", 192, 64, 1),
        unit(unit("input", 192, 96, 1), 96, 128, 3),
        unit(unit("input", 192, 16, 1), 16, 32, 5),
        unit(max_pool(b, "input", 3, 1, pad=1, ceil=True), 192, 32, 1),
    ]
    x = b.node("Concat", branches, axis=1)
    max_pool(b, x, 3, 2, ceil=True, output="output")
    return b.model("inception_block", INPUT_SHAPES["inception_block"], "output", (1, 256, 14, 14))


def resnet50_bottleneck() -> onnx.ModelProto:
    """ResNet-50's stem and the first bottleneck of each of its first three stages (He et al. 2016, v1.5: the stride
    on the 3x3), at 112x112, then global pooling and the classifier."""
    b = Builder(seed=11)

    def conv_bn(x: str, in_channels: int, out_channels: int, kernel: int, stride: int = 1, gamma: float = 1.0):
        return b.batch_norm(b.conv(x, in_channels, out_channels, kernel, stride), out_channels, gamma_scale=gamma)

    x = b.node("Relu", [conv_bn("input", 3, 64, 7, stride=2)])
    x = max_pool(b, x, 3, 2, pad=1)
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


def _resize(b: Builder, x: str, mode: str) -> str:
    """2x upsampling as torch exports nn.Upsample at opset 17: an empty roi and constant scales."""
    scales = b.constant("scales", np.array([1, 1, 2, 2], np.float32))
    attributes = {"mode": mode}
    if mode == "nearest":
        attributes.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    else:
        attributes.update(coordinate_transformation_mode="half_pixel")
    return b.node("Resize", [x, "", scales], "resize", **attributes)


def unet_small() -> onnx.ModelProto:
    """A three-level U-Net (Ronneberger et al. 2015) with conv-BN-ReLU pairs: one decoder level upsamples with a
    stride-2 ConvTranspose, the other with a bilinear Resize and a 1x1 conv, each joined to its skip by Concat."""
    b = Builder(seed=12)

    def double(x: str, in_channels: int, out_channels: int) -> str:
        # Max pools and skip Concats raise the variance that random batch-norm statistics do not take out again;
        # a smaller gamma keeps activations near unit scale, as trained statistics would.
        for channels in (in_channels, out_channels):
            y = b.batch_norm(b.conv(x, channels, out_channels, 3), out_channels, gamma_scale=0.8)
            x = b.node("Relu", [y])
        return x

    first = double("input", 3, 16)
    second = double(max_pool(b, first, 2, 2), 16, 32)
    x = double(max_pool(b, second, 2, 2), 32, 64)
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


def yolo_neck() -> onnx.ModelProto:
    """A YOLOv5-style net cut to its neck: a strided conv-BN-SiLU backbone to P5, SPPF (three chained 5x5 max pools,
    Concat), and a top-down FPN with nearest 2x Resize and Concat to P3, ending in the 255-channel P3 head."""
    b = Builder(seed=13)

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
        pools.append(max_pool(b, pools[-1], 5, 1, pad=2))
    x = unit(b.node("Concat", pools, axis=1), 512, 256, 1)
    for lateral, channels in ((features[3], 128), (features[2], 64)):
        x = _resize(b, unit(x, 2 * channels, channels, 1), "nearest")
        x = unit(b.node("Concat", [x, lateral], axis=1), 2 * channels, channels, 3)
    b.conv(x, 64, 255, 1, bias=True, output="output")
    size = INPUT_SHAPES["yolo_neck"][2] // 8
    return b.model("yolo_neck", INPUT_SHAPES["yolo_neck"], "output", (1, 255, size, size))


def odd_convnet() -> onnx.ModelProto:
    """Shapes no schedule was chosen for (they were picked before any was timed): a 97x131 image, channel counts
    27, 45, 61, 19 and 80 that no vector width divides, a 5x5 stride-2 stem on 3 channels, a 7x7 depthwise conv, a
    3-group dilated conv, a stride-3 conv, average and max pools with ceil_mode, a sigmoid gate and a Concat of 61
    and 19 channels."""
    b = Builder(seed=17)
    x = b.node("HardSwish", [b.batch_norm(b.conv("input", 3, 27, 5, stride=2), 27)], "hswish")
    x = b.node("Relu", [b.batch_norm(b.conv(x, 27, 27, 7, groups=27), 27)])
    x = b.node("Relu", [b.batch_norm(b.conv(x, 27, 45, 1), 45)])
    x = b.node("Relu", [b.conv(x, 45, 45, 3, groups=3, dilation=2, bias=True)])
    x = b.node("Relu", [b.conv(x, 45, 61, 3, stride=3, bias=True)])
    x = b.node("AveragePool", [x], "avgpool", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    x = b.node("Mul", [x, b.node("Sigmoid", [b.conv(x, 61, 61, 1, bias=True)], "gate")], "gated")
    x = b.node("Concat", [x, b.node("Relu", [b.conv(x, 61, 19, 3, bias=True)])], "concat", axis=1)
    x = max_pool(b, x, 2, 2, ceil=True)
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x], "pool")], "flatten", axis=1)
    b.gemm(x, 80, 11, output="output")
    return b.model("odd_convnet", INPUT_SHAPES["odd_convnet"], "output", (1, 11))
