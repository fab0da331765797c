"""passes/integer_products.py: a MatMul or Conv of uint8 activations by constant int8 levels becomes an integer
kernel (dot products over levels packed four to a word: MatMulIntegerPacked, ConvNCHWc over int32 words) on CPU
targets; its results equal onnxruntime's on the same file, natively and in wasm, and the ops' numpy references;
the forms it leaves alone keep the float kernel and still match."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler import compile_model
from compiler.frontend import load_onnx
from compiler.graph.reference import run_reference
from compiler.passes.pipeline import optimize
from compiler.target import Target

RNG = np.random.default_rng(17)


def _model(nodes, name: str, input_shape: list[int], params):
    """An opset-17 model of `nodes` from the float input x of `input_shape` to y."""
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, input_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        params,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


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
    return _model(nodes, "dynamic", [2, 9, inner], params)


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
    return _model(nodes, "qdq", [2, 9, inner], params)


def _qdq_conv(channels: int, filters: int, kernel: int, stride: int, zero: int):
    """Quantize -> Dequantize of the input (uint8, zero point `zero`), a per-filter int8 weight dequantized, a padded
    Conv with a bias, then a ReLU: the static QDQ form of a conv layer (input 2 x channels x 30 x 33: a lone conv
    takes the blocked layout only with enough work, alter_layout's ISOLATED_MIN_MACS)."""
    weight = RNG.integers(-127, 128, (filters, channels, kernel, kernel)).astype(np.int8)
    params = [
        numpy_helper.from_array(weight, "w"),
        numpy_helper.from_array(RNG.uniform(0.001, 0.01, filters).astype(np.float32), "ws"),
        numpy_helper.from_array(np.array(0.03, np.float32), "xs"),
        numpy_helper.from_array(np.array(zero, np.uint8), "xz"),
        numpy_helper.from_array(RNG.standard_normal(filters).astype(np.float32), "bias"),
    ]
    pad = kernel // 2
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"], axis=0),
        helper.make_node("Conv", ["xd", "wd", "bias"], ["c"], pads=[pad] * 4, strides=[stride] * 2),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    return _model(nodes, "qdq_conv", [2, channels, 30, 33], params)


def _products(model) -> list[str]:
    """The dense ops of `model` after the llvm passes. Every weight here has at least DECOMPRESS_MIN_ELEMENTS
    elements, so that it stays narrow (smaller ones are widened at compile time)."""
    graph = optimize(load_onnx(model), fuse=False, target=Target.parse("llvm"))
    ops = {"MatMulPacked": "MatMulPacked", "MatMulIntegerPacked": "MatMulIntegerPacked", "ConvNCHWc": "ConvNCHWc"}
    return [
        ops[node.op] + (" integer" if node.op == "ConvNCHWc" and node.inputs[1].type.dtype == "int32" else "")
        for node in graph.nodes
        if node.op in ops
    ]


def _compare(model, target: str, atol: float = 0.0) -> None:
    shape = [dim.dim_value for dim in model.graph.input[0].type.tensor_type.shape.dim]
    x = RNG.standard_normal(shape).astype(np.float32)
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


@pytest.mark.parametrize("target", ["llvm", "wasm"])
@pytest.mark.parametrize(
    "channels, filters, kernel, stride, zero",
    [(32, 48, 3, 1, 131), (32, 48, 3, 2, 0), (128, 128, 1, 1, 7)],
)
def test_static_qdq_conv_is_an_integer_conv_equal_to_onnxruntimes(target, channels, filters, kernel, stride, zero):
    """Padded 3x3 convs (the padding holds the zero point, whose products the column sums take off), a strided
    one, a pointwise one; the input scale joins the filters' scales before the bias. Equal to onnxruntime to float32
    rounding of the scales' product."""
    model = _qdq_conv(channels, filters, kernel, stride, zero)
    assert _products(model) == ["ConvNCHWc integer"]
    _compare(model, target, atol=2e-5)


@pytest.mark.parametrize(
    "model",
    [lambda: _dynamic(68, 72), lambda: _qdq(128, 40), lambda: _qdq_conv(32, 48, 3, 1, 131)],
    ids=["dynamic matmul", "qdq matmul", "qdq conv"],
)
def test_integer_ops_references_match_the_compiled_kernels(model):
    """The graph after the passes, run op by op with numpy (each op's reference), against the compiled model."""
    model = model()
    graph = optimize(load_onnx(model), fuse=False, target=Target.parse("llvm"))
    shape = [dim.dim_value for dim in model.graph.input[0].type.tensor_type.shape.dim]
    x = RNG.standard_normal(shape).astype(np.float32)
    (expected,) = run_reference(graph, {"x": x}).values()
    (actual,) = compile_model(model, target="llvm").run({"x": x}).values()
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-5)
