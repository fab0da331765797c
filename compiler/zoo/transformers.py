"""The zoo's transformer and audio models: a ViT and a BERT at tiny widths, a 1-D conv audio net, and an
odd-shaped transformer (layer norm and GELU as exporters write them)."""

from __future__ import annotations

import numpy as np
import onnx

from compiler.zoo.builder import INPUT_SHAPES, Builder
from compiler.zoo.convnets import max_pool, scalar


def _layer_norm(b: Builder, x: str, width: int, decomposed: bool) -> str:
    """LayerNormalization over the last axis: the opset-17 op, or the ReduceMean/Sub/Pow/Sqrt/Div form older
    exporters write."""
    gamma = b.constant("ln_scale", b.rng.uniform(0.8, 1.2, width).astype(np.float32))
    beta = b.constant("ln_bias", b.rng.normal(0.0, 0.1, width).astype(np.float32))
    if not decomposed:
        return b.node("LayerNormalization", [x, gamma, beta], "layernorm", axis=-1, epsilon=1e-6)
    centred = b.node("Sub", [x, b.node("ReduceMean", [x], "mean", axes=[-1], keepdims=1)], "centre")
    variance = b.node(
        "ReduceMean", [b.node("Pow", [centred, scalar(b, "two", 2.0)], "square")], "mean", axes=[-1], keepdims=1
    )
    deviation = b.node("Sqrt", [b.node("Add", [variance, scalar(b, "epsilon", 1e-12)], "add")], "sqrt")
    x = b.node("Div", [centred, deviation], "normalized")
    return b.node("Add", [b.node("Mul", [x, gamma], "mul"), beta], "add")


def _gelu(b: Builder, x: str) -> str:
    """GELU in the erf form torch exports below opset 20: x * 0.5 * (1 + erf(x / sqrt 2))."""
    y = b.node("Erf", [b.node("Div", [x, scalar(b, "sqrt2", np.sqrt(2.0))], "div")], "erf")
    y = b.node("Mul", [x, b.node("Add", [y, scalar(b, "one", 1.0)], "add")], "mul")
    return b.node("Mul", [y, scalar(b, "half", 0.5)], "gelu")


def encoder(b: Builder, x: str, sequence: int, width: int, heads: int, hidden: int, post_norm: bool) -> str:
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
            scores = b.node("Div", [scores, scalar(b, "scale", np.sqrt(depth))], "scaled")
        else:
            scores = b.node("Mul", [scores, scalar(b, "scale", depth**-0.5)], "scaled")
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


def vit_tiny() -> onnx.ModelProto:
    """ViT-Ti/16 (Dosovitskiy et al. 2020; width 192, 3 heads, MLP 768) cut to 4 layers: a 16x16-patch Conv on a
    112x176 image gives 7x11 = 77 tokens, then position embeddings, pre-norm encoders, mean pooling, a classifier."""
    b = Builder(seed=14)
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
        x = encoder(b, x, sequence, width, heads=3, hidden=768, post_norm=False)
    x = _layer_norm(b, b.node("ReduceMean", [x], "mean", axes=[1], keepdims=0), width, decomposed=False)
    b.gemm(x, width, 1000, output="output")
    return b.model("vit_tiny", INPUT_SHAPES["vit_tiny"], "output", (1, 1000))


def bert_tiny() -> onnx.ModelProto:
    """BERT-tiny (Turc et al. 2019; 2 layers, width 128, 4 heads, feed-forward 512) at 128 tokens, from the summed
    embeddings on (the token lookup is a Gather outside the encoder): post-norm layers with the decomposed
    LayerNorm, and the pooler's first-token Gemm and Tanh."""
    b = Builder(seed=15)
    _, sequence, width = INPUT_SHAPES["bert_tiny"]
    x = _layer_norm(b, "input", width, decomposed=True)
    for _ in range(2):
        x = encoder(b, x, sequence, width, heads=4, hidden=512, post_norm=True)
    first = b.node("Gather", [x, b.constant("first", np.array(0, np.int64))], "first", axis=1)
    b.node("Tanh", [b.gemm(first, width, width)], output="output")
    return b.model("bert_tiny", INPUT_SHAPES["bert_tiny"], "output", (1, width))


def audio_conv1d() -> onnx.ModelProto:
    """A 1-D conv net on one second of 16 kHz audio, after M5 (Dai et al. 2017) with dilated layers added as in
    TCNs: a wide stride-4 first conv, conv-BN-ReLU blocks with stride, dilation 2 and 4 and 1-D max pools, global
    average pooling and a 35-word classifier (Speech Commands)."""
    b = Builder(seed=16)

    def unit(x: str, in_channels: int, out_channels: int, kernel: int, stride: int = 1, dilation: int = 1) -> str:
        y = b.conv(x, in_channels, out_channels, kernel, stride, rank=1, dilation=dilation)
        return b.node("Relu", [b.batch_norm(y, out_channels)])

    x = max_pool(b, unit("input", 1, 48, 79, stride=4), 4, 4, rank=1)
    x = max_pool(b, unit(unit(x, 48, 48, 3), 48, 96, 3, stride=2), 4, 4, rank=1)
    x = unit(unit(x, 96, 96, 3, dilation=2), 96, 96, 3, dilation=4)
    x = unit(x, 96, 160, 3, stride=2)
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x], "pool")], "flatten", axis=1)
    b.gemm(x, 160, 35, output="output")
    return b.model("audio_conv1d", INPUT_SHAPES["audio_conv1d"], "output", (1, 35))


def odd_transformer() -> onnx.ModelProto:
    """Two pre-norm encoder layers at widths no schedule was chosen for: 77 tokens of width 200, 5 heads of 40,
    an MLP of 700, then mean pooling and a 13-way classifier."""
    b = Builder(seed=18)
    _, sequence, width = INPUT_SHAPES["odd_transformer"]
    x = "input"
    for _ in range(2):
        x = encoder(b, x, sequence, width, heads=5, hidden=700, post_norm=False)
    x = _layer_norm(b, b.node("ReduceMean", [x], "mean", axes=[1], keepdims=0), width, decomposed=False)
    b.gemm(x, width, 13, output="output")
    return b.model("odd_transformer", INPUT_SHAPES["odd_transformer"], "output", (1, 13))
