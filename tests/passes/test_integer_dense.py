"""passes/integer_dense.py: a MatMul of uint8 activations by constant int8 levels becomes a MatMulIntegerPacked
(integer dot products over levels packed four to a word) on CPU targets, and its results equal onnxruntime's on
the same file exactly, natively and in wasm; the forms it leaves alone keep the float kernel and still match."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler import compile_model
from compiler.frontend import load_onnx
from compiler.passes.pipeline import optimize
from compiler.target import Target

RNG = np.random.default_rng(17)


def _dynamic(inner: int, columns: int, weight_dtype=np.int8, weight_zero: int | None = None):
    """DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul, as onnxruntime's dynamic quantizer writes a MatMul:
    x of shape (2, 9, inner), a constant weight (inner, columns)."""
    info = np.iinfo(weight_dtype)
    weight = RNG.integers(info.min, info.max + 1, (inner, columns)).astype(weight_dtype)
    params = [numpy_helper.from_array(weight, "w")]
    matmul_inputs = ["xq", "w", "xz"]
    if weight_zero is not None:
        params.append(numpy_helper.from_array(np.array(weight_zero, weight_dtype), "wz"))
        matmul_inputs.append("wz")
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("MatMulInteger", matmul_inputs, ["acc"]),
        helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["accf", "xs"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "dynamic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 9, inner])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 9, columns])],
        params,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _qdq(inner: int, columns: int):
    """QuantizeLinear -> DequantizeLinear of activations (uint8, zero point 117), a per-column int8 weight
    dequantized, MatMul, and a bias: the static QDQ form."""
    weight = RNG.integers(-127, 128, (inner, columns)).astype(np.int8)
    params = [
        numpy_helper.from_array(weight, "w"),
        numpy_helper.from_array(RNG.uniform(0.001, 0.01, columns).astype(np.float32), "ws"),
        numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
        numpy_helper.from_array(np.array(117, np.uint8), "xz"),
        numpy_helper.from_array(RNG.standard_normal(columns).astype(np.float32), "bias"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"], axis=1),
        helper.make_node("MatMul", ["xd", "wd"], ["product"]),
        helper.make_node("Add", ["product", "bias"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 9, inner])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 9, columns])],
        params,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _products(model) -> list[str]:
    """The dense ops of `model` after the llvm passes. Every weight here has at least DECOMPRESS_MIN_ELEMENTS
    elements, so that it stays narrow (smaller ones are widened at compile time)."""
    graph = optimize(load_onnx(model), fuse=False, target=Target.parse("llvm"))
    return [node.op for node in graph.nodes if node.op in ("MatMulPacked", "MatMulIntegerPacked")]


def _compare(model, target: str, atol: float = 0.0) -> None:
    x = RNG.standard_normal(model.graph.input[0].type.tensor_type.shape.dim[2].dim_value * 18).astype(np.float32)
    x = x.reshape(2, 9, -1)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})
    (actual,) = compile_model(model, target=target).run({"x": x}).values()
    np.testing.assert_allclose(actual, expected, rtol=0, atol=atol)


@pytest.mark.parametrize("target", ["llvm", "wasm"])
def test_dynamic_quantized_matmul_is_an_integer_product_equal_to_onnxruntimes(target):
    """K = 68 (17 words), N = 72: the last panel of 64 columns is ragged."""
    model = _dynamic(68, 72)
    assert _products(model) == ["MatMulIntegerPacked"]
    _compare(model, target)


@pytest.mark.parametrize("target", ["llvm", "wasm"])
def test_static_qdq_matmul_takes_the_activation_scale_after_the_product(target):
    """The per-tensor activation scale and the per-column weight scales both apply once per output: equal to
    onnxruntime's float result to float32 rounding."""
    model = _qdq(128, 40)
    assert _products(model) == ["MatMulIntegerPacked"]
    _compare(model, target, atol=2e-5)


@pytest.mark.parametrize(
    "model, why",
    [
        (lambda: _dynamic(30, 160), "K is not a multiple of 4"),
        (lambda: _dynamic(64, 72, np.uint8), "uint8 weight levels"),
        (lambda: _dynamic(64, 72, np.int8, weight_zero=3), "a weight zero point"),
    ],
)
def test_other_forms_keep_the_float_kernel_and_match(model, why):
    model = model()
    assert _products(model) == ["MatMulPacked"], why
    _compare(model, "llvm", atol=1e-3)
