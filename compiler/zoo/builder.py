"""The graph builder the zoo's models are written with: named initializers with seeded He-scaled weights, and one
method per layer as exporters spell it (conv + unfolded batch norm, ReLU6 as Clip, PyTorch's flatten, Linear as
MatMul + Add)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


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


class Builder:
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
