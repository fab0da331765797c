"""Example models built in code: the inputs that tests, benchmarks, the CLI and the demo hand to the frontend.

Each model is an opset-17 ONNX ModelProto with seeded random weights (He-scaled, so activations stay in a
sane range) laid out the way framework exporters write them — batch norm unfolded, ReLU6 as Clip with constant
min/max inputs, PyTorch's Shape→Gather→Unsqueeze→Concat→Reshape flatten, SiLU as x * Sigmoid(x), GELU in its erf
form, a Linear on 3-D inputs as MatMul + Add — so the frontend and passes meet real-world graphs. The broad zoo
after the first five covers the patterns of common CNNs, transformers and 1-D audio nets at small sizes (docs/
modules.md lists them). Nothing is downloaded; `digits` is the trained model shipped in `compiler/data/`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from compiler.errors import TesselError
from compiler.zoo.builder import INPUT_SHAPES
from compiler.zoo.convnets import (
    densenet_block,
    dwconv_block,
    efficientnet_b0,
    inception_block,
    mobilenet_v2,
    mobilenet_v3_small,
    multilayer_perceptron,
    odd_convnet,
    resnet18,
    resnet50_bottleneck,
    shufflenet_v2,
    squeezenet,
    unet_small,
    yolo_neck,
)
from compiler.zoo.transformers import audio_conv1d, bert_tiny, odd_transformer, vit_tiny

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


DIGITS_PATH = Path(__file__).parent.parent / "data" / "digits.onnx"


def _digits() -> onnx.ModelProto:
    return onnx.load(str(DIGITS_PATH))


_BUILDERS = {
    "mlp": multilayer_perceptron,
    "mobilenet_v2": mobilenet_v2,
    "resnet18": resnet18,
    "dwconv_block": dwconv_block,
    "digits": _digits,
    "squeezenet": squeezenet,
    "shufflenet_v2": shufflenet_v2,
    "mobilenet_v3_small": mobilenet_v3_small,
    "efficientnet_b0": efficientnet_b0,
    "densenet_block": densenet_block,
    "inception_block": inception_block,
    "resnet50_bottleneck": resnet50_bottleneck,
    "unet_small": unet_small,
    "yolo_neck": yolo_neck,
    "vit_tiny": vit_tiny,
    "bert_tiny": bert_tiny,
    "audio_conv1d": audio_conv1d,
    "odd_convnet": odd_convnet,
    "odd_transformer": odd_transformer,
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
