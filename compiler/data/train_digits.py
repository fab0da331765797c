"""Trains the small digits CNN that the zoo ships as `digits.onnx` and that `tessel demo` runs through the compiler.

Pure numpy (forward and backward written out) on scikit-learn's bundled 8x8 digits, so the model is rebuilt
from nothing but this file: `python -m compiler.data.train_digits` writes `compiler/data/digits.onnx`.

The network: input float32[1,1,8,8] (pixels scaled to 0..1) → Conv 3x3 pad 1 (16) → Relu → MaxPool 2 →
Conv 3x3 pad 1 (32) → Relu → Flatten → Gemm 10 → Softmax, output "probabilities" float32[1,10].
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MODEL_PATH = Path(__file__).with_name("digits.onnx")
SEED = 0
EPOCHS = 40
BATCH_SIZE = 32
LEARNING_RATE = 2e-3


def _load_all() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    return images, digits.target.astype(np.int64)


def _split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split

    images, labels = _load_all()
    return train_test_split(images, labels, test_size=0.25, random_state=0, stratify=labels)


def held_out_split() -> tuple[np.ndarray, np.ndarray]:
    """The held-out digits the model never trained on: images float32[N,1,8,8] in 0..1 and labels int64[N]."""
    _, x_test, _, y_test = _split()
    return x_test, y_test


# -- layers: forward returns (output, cache); backward takes the cache --------------------------------


def _im2col(x: np.ndarray) -> np.ndarray:
    """Rows of 3x3 patches (padding 1) for every output pixel: [N*H*W, C*9]."""
    n, c, h, w = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    return windows.transpose(0, 2, 3, 1, 4, 5).reshape(n * h * w, c * 9)


def _conv_forward(x, weight, bias):
    n, _, h, w = x.shape
    columns = _im2col(x)
    out = columns @ weight.reshape(weight.shape[0], -1).T + bias
    return out.reshape(n, h, w, -1).transpose(0, 3, 1, 2), (x.shape, columns)


def _conv_backward(grad_out, weight, cache):
    shape, columns = cache
    n, c, h, w = shape
    grad_rows = grad_out.transpose(0, 2, 3, 1).reshape(-1, weight.shape[0])
    grad_weight = (grad_rows.T @ columns).reshape(weight.shape)
    grad_bias = grad_rows.sum(axis=0)
    grad_columns = (grad_rows @ weight.reshape(weight.shape[0], -1)).reshape(n, h, w, c, 3, 3)
    grad_padded = np.zeros((n, c, h + 2, w + 2), grad_out.dtype)
    for i in range(3):
        for j in range(3):
            grad_padded[:, :, i : i + h, j : j + w] += grad_columns[..., i, j].transpose(0, 3, 1, 2)
    return grad_padded[:, :, 1:-1, 1:-1], grad_weight, grad_bias


def _pool_forward(x):
    n, c, h, w = x.shape
    blocks = x.reshape(n, c, h // 2, 2, w // 2, 2)
    out = blocks.max(axis=(3, 5))
    return out, (blocks, out)


def _pool_backward(grad_out, cache):
    blocks, out = cache
    # Ties only happen between zeros left by the Relu before the pool, whose gradient is zero anyway.
    mask = blocks == out[:, :, :, None, :, None]
    grad = mask * grad_out[:, :, :, None, :, None]
    n, c, h, _, w, _ = blocks.shape
    return grad.reshape(n, c, h * 2, w * 2)


@dataclass
class _Params:
    conv1_weight: np.ndarray
    conv1_bias: np.ndarray
    conv2_weight: np.ndarray
    conv2_bias: np.ndarray
    fc_weight: np.ndarray
    fc_bias: np.ndarray

    @classmethod
    def initial(cls, rng: np.random.Generator) -> _Params:
        def he(shape, fan_in):
            return rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)

        return cls(
            he((16, 1, 3, 3), 9),
            np.zeros(16),
            he((32, 16, 3, 3), 144),
            np.zeros(32),
            he((10, 512), 512) / np.sqrt(2.0),
            np.zeros(10),
        )

    def names(self) -> list[str]:
        return [field.name for field in fields(self)]


def _forward(params: _Params, x: np.ndarray):
    hidden1, conv1_cache = _conv_forward(x, params.conv1_weight, params.conv1_bias)
    relu1 = np.maximum(hidden1, 0)
    pooled, pool_cache = _pool_forward(relu1)
    hidden2, conv2_cache = _conv_forward(pooled, params.conv2_weight, params.conv2_bias)
    relu2 = np.maximum(hidden2, 0)
    flat = relu2.reshape(len(x), -1)
    logits = flat @ params.fc_weight.T + params.fc_bias
    return logits, (hidden1, conv1_cache, pool_cache, hidden2, conv2_cache, flat)


def _gradients(params: _Params, x: np.ndarray, labels: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    logits, (hidden1, conv1_cache, pool_cache, hidden2, conv2_cache, flat) = _forward(params, x)
    shifted = logits - logits.max(axis=1, keepdims=True)
    probabilities = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    loss = -np.mean(np.log(probabilities[np.arange(len(x)), labels] + 1e-12))
    grad_logits = probabilities
    grad_logits[np.arange(len(x)), labels] -= 1
    grad_logits /= len(x)
    grads = {"fc_weight": grad_logits.T @ flat, "fc_bias": grad_logits.sum(axis=0)}
    grad_relu2 = (grad_logits @ params.fc_weight).reshape(hidden2.shape) * (hidden2 > 0)
    grad_pooled, grads["conv2_weight"], grads["conv2_bias"] = _conv_backward(
        grad_relu2, params.conv2_weight, conv2_cache
    )
    grad_relu1 = _pool_backward(grad_pooled, pool_cache) * (hidden1 > 0)
    _, grads["conv1_weight"], grads["conv1_bias"] = _conv_backward(grad_relu1, params.conv1_weight, conv1_cache)
    return float(loss), grads


def train(epochs: int = EPOCHS, verbose: bool = True) -> _Params:
    """Adam on mini-batches, seeded throughout, so the same weights come out on every run."""
    x_train, _, y_train, _ = _split()
    x_train = x_train.astype(np.float64)
    rng = np.random.default_rng(SEED)
    params = _Params.initial(rng)
    first_moment = {name: np.zeros_like(getattr(params, name)) for name in params.names()}
    second_moment = {name: np.zeros_like(getattr(params, name)) for name in params.names()}
    beta1, beta2, step = 0.9, 0.999, 0
    for epoch in range(epochs):
        order = rng.permutation(len(x_train))
        # Cosine decay settles the weights so the last epoch is not a lucky or unlucky snapshot.
        rate = LEARNING_RATE * 0.5 * (1 + np.cos(np.pi * epoch / epochs))
        total = 0.0
        for start in range(0, len(order), BATCH_SIZE):
            batch = order[start : start + BATCH_SIZE]
            loss, grads = _gradients(params, x_train[batch], y_train[batch])
            total += loss * len(batch)
            step += 1
            for name, grad in grads.items():
                first_moment[name] = beta1 * first_moment[name] + (1 - beta1) * grad
                second_moment[name] = beta2 * second_moment[name] + (1 - beta2) * grad * grad
                corrected1 = first_moment[name] / (1 - beta1**step)
                corrected2 = second_moment[name] / (1 - beta2**step)
                setattr(params, name, getattr(params, name) - rate * corrected1 / (np.sqrt(corrected2) + 1e-8))
        if verbose and (epoch + 1) % 10 == 0:
            print(f"epoch {epoch + 1}/{epochs}: training loss {total / len(x_train):.4f}")
    return params


def accuracy(params: _Params, images: np.ndarray, labels: np.ndarray) -> float:
    logits, _ = _forward(params, images.astype(np.float64))
    return float(np.mean(logits.argmax(axis=1) == labels))


def export(params: _Params, path: Path = MODEL_PATH) -> None:
    """Write the trained network as an opset-17 ONNX model with batch 1 and float32 weights."""
    initializers = [numpy_helper.from_array(getattr(params, name).astype(np.float32), name) for name in params.names()]
    nodes = [
        helper.make_node(
            "Conv", ["input", "conv1_weight", "conv1_bias"], ["conv1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]
        ),
        helper.make_node("Relu", ["conv1"], ["relu1"]),
        helper.make_node("MaxPool", ["relu1"], ["pool1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node(
            "Conv", ["pool1", "conv2_weight", "conv2_bias"], ["conv2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]
        ),
        helper.make_node("Relu", ["conv2"], ["relu2"]),
        helper.make_node("Flatten", ["relu2"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fc_weight", "fc_bias"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "digits",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [1, 10])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tessel-train-digits")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train the digits CNN and write it as ONNX.")
    parser.add_argument("-o", "--output", type=Path, default=MODEL_PATH, help=f"where to write (default {MODEL_PATH})")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    args = parser.parse_args(argv)
    params = train(args.epochs)
    x_test, y_test = held_out_split()
    export(params, args.output)
    print(f"held-out accuracy {accuracy(params, x_test, y_test):.4f} on {len(y_test)} digits; wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
