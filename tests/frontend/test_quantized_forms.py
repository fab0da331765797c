"""The quantized forms besides QDQ (compiler/frontend/quantized.py), against onnxruntime on the same file.

Tolerances, per case:
- exact where onnxruntime's kernel computes what the rewrite computes: QGemm, QLinearMatMul, QLinearConv (an exact
  integer accumulation and one float multiply before rounding), QLinearAdd, QLinearConcat, QLinearGlobalAveragePool,
  and MatMulNBits / MatMulInteger up to float32 rounding of the float product;
- one quantization step where onnxruntime computes in fixed point or by lookup table (QLinearMul,
  QLinearAveragePool, QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax);
- whole quantized models: a few of the output's quantization steps, since one rounding that differs in an early layer
  (a float accumulation in another order) moves the values after it.
The ONNX node tests of QuantizeLinear, DynamicQuantizeLinear, MatMulInteger, ConvInteger, QLinearMatMul and
QLinearConv run in tests/test_node_tests_compiled.py like every op's."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.build import compile_model
from compiler.errors import ModelError, ShapeError, UnsupportedOpError

RNG = np.random.default_rng(3)
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]


def _model(nodes, inputs, outputs, initializers) -> onnx.ModelProto:
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, initializers), opset_imports=OPSETS)


def _onnxruntime(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _compare(model, feeds, tolerance: float, target: str = "llvm") -> None:
    (expected,) = _onnxruntime(model, feeds)
    (actual,) = compile_model(model, target=target).run(feeds).values()
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    difference = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    assert difference.max() <= tolerance, f"differs by up to {difference.max()} (tolerance {tolerance})"


def _scale(value, name):
    return numpy_helper.from_array(np.array(value, np.float32), name)


def _zero(value, name, dtype=np.uint8):
    return numpy_helper.from_array(np.array(value, dtype), name)


def _info(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


SCALES = [
    _scale(0.05, "as"),
    _zero(120, "az"),
    _scale(0.03, "bs"),
    _zero(130, "bz"),
    _scale(0.07, "cs"),
    _zero(125, "cz"),
]
X = RNG.integers(0, 256, (2, 16, 8, 8)).astype(np.uint8)
Y = RNG.integers(0, 256, (2, 16, 8, 8)).astype(np.uint8)


@pytest.mark.parametrize(
    "op, attributes, tolerance",
    [
        ("QLinearAdd", {}, 0),
        ("QLinearMul", {}, 1),
        ("QLinearGlobalAveragePool", {}, 0),
        ("QLinearAveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, 1),
        ("QLinearSigmoid", {}, 1),
        ("QLinearLeakyRelu", {"alpha": 0.1}, 1),
        ("QLinearSoftmax", {"axis": -1, "opset": 13}, 1),
        ("QLinearConcat", {"axis": 1}, 0),
    ],
)
def test_contrib_qlinear_ops_match_onnxruntime(op, attributes, tolerance):
    binary = op in ("QLinearAdd", "QLinearMul")
    if op == "QLinearConcat":
        names = ["cs", "cz", "x", "as", "az", "y", "bs", "bz"]
    elif binary:
        names = ["x", "as", "az", "y", "bs", "bz", "cs", "cz"]
    else:
        names = ["x", "as", "az", "cs", "cz"]
    uses_y = "y" in names
    inputs = [_info("x", TensorProto.UINT8, X.shape)] + ([_info("y", TensorProto.UINT8, Y.shape)] if uses_y else [])
    node = helper.make_node(op, names, ["out"], domain="com.microsoft", **attributes)
    used = [tensor for tensor in SCALES if tensor.name in names]
    model = _model([node], inputs, [_info("out", TensorProto.UINT8, None)], used)
    _compare(model, {"x": X, **({"y": Y} if uses_y else {})}, tolerance)


def test_channels_last_global_average_pool():
    node = helper.make_node(
        "QLinearGlobalAveragePool", ["x", "as", "az", "cs", "cz"], ["out"], domain="com.microsoft", channels_last=1
    )
    x = RNG.integers(0, 256, (2, 5, 5, 12)).astype(np.uint8)
    model = _model([node], [_info("x", TensorProto.UINT8, x.shape)], [_info("out", TensorProto.UINT8, None)], SCALES)
    _compare(model, {"x": x}, 0)


@pytest.mark.parametrize("output_scale", [True, False])
def test_qgemm_matches_onnxruntime(output_scale):
    a = RNG.integers(0, 256, (6, 40)).astype(np.uint8)
    weight = numpy_helper.from_array(RNG.integers(-127, 128, (24, 40)).astype(np.int8), "w")
    bias = numpy_helper.from_array(RNG.integers(-5000, 5000, (24,)).astype(np.int32), "bias")
    per_column = [_scale(RNG.uniform(0.01, 0.05, 24), "ws"), _zero(np.zeros(24), "wz", np.int8)]
    names = ["a", "as", "az", "w", "ws", "wz", "bias"] + (["cs", "cz"] if output_scale else [])
    node = helper.make_node("QGemm", names, ["out"], domain="com.microsoft", transB=1, alpha=1.0)
    output_type = TensorProto.UINT8 if output_scale else TensorProto.FLOAT
    model = _model(
        [node],
        [_info("a", TensorProto.UINT8, a.shape)],
        [_info("out", output_type, None)],
        [*SCALES, weight, bias, *per_column],
    )
    _compare(model, {"a": a}, 0 if output_scale else 1e-4)


def _nbits_model(k, n, bits, block, zero_points: str, bias: bool):
    """A MatMulNBits node with packed random weights, as the quantizer lays them out."""
    blocks = -(-k // block)
    values = RNG.integers(0, 1 << bits, (n, blocks * block)).astype(np.uint8)
    per_byte = 8 // bits
    grouped = values.reshape(n, blocks, block // per_byte, per_byte).astype(np.uint32)
    packed = np.zeros(grouped.shape[:-1], np.uint32)
    for position in range(per_byte):
        packed |= grouped[..., position] << (bits * position)
    initializers = [
        numpy_helper.from_array(packed.astype(np.uint8), "b"),
        numpy_helper.from_array(RNG.uniform(0.01, 0.1, n * blocks).astype(np.float32), "scales"),
    ]
    names = ["a", "b", "scales"]
    if zero_points == "packed":
        levels = RNG.integers(0, 1 << bits, (n, blocks)).astype(np.uint32)
        per_row = -(-blocks * bits // 8)
        padded = np.zeros((n, per_row * per_byte), np.uint32)
        padded[:, :blocks] = levels
        grouped = padded.reshape(n, per_row, per_byte)
        zeros = np.zeros((n, per_row), np.uint32)
        for position in range(per_byte):
            zeros |= grouped[..., position] << (bits * position)
        initializers.append(numpy_helper.from_array(zeros.astype(np.uint8).reshape(-1), "zeros"))
        names.append("zeros")
    elif zero_points == "float":
        initializers.append(numpy_helper.from_array(RNG.uniform(0, 1 << bits, n * blocks).astype(np.float32), "zeros"))
        names.append("zeros")
    if bias:
        names += ["", "bias"] if zero_points != "none" else ["", "", "bias"]
        initializers.append(numpy_helper.from_array(RNG.standard_normal(n).astype(np.float32), "bias"))
    node = helper.make_node(
        "MatMulNBits", names, ["out"], domain="com.microsoft", K=k, N=n, bits=bits, block_size=block
    )
    return _model(
        [node], [_info("a", TensorProto.FLOAT, [3, 5, k])], [_info("out", TensorProto.FLOAT, None)], initializers
    )


@pytest.mark.parametrize(
    "k, bits, block, zero_points, bias",
    [
        (64, 4, 32, "none", False),
        (70, 4, 32, "packed", True),
        (96, 4, 16, "float", False),
        (64, 8, 32, "packed", False),
    ],
)
def test_matmul_nbits_matches_onnxruntime(k, bits, block, zero_points, bias):
    model = _nbits_model(k, 24, bits, block, zero_points, bias)
    feeds = {"a": RNG.standard_normal((3, 5, k)).astype(np.float32)}
    _compare(model, feeds, 1e-4)


def test_matmul_nbits_in_wasm():
    model = _nbits_model(64, 16, 4, 32, "packed", False)
    _compare(model, {"a": RNG.standard_normal((3, 5, 64)).astype(np.float32)}, 1e-4, target="wasm")


def test_malformed_quantization_parameters_are_clear_errors():
    weight = numpy_helper.from_array(RNG.integers(-127, 128, (8, 4)).astype(np.int8), "w")
    node = helper.make_node("DequantizeLinear", ["w", "s"], ["wf"])
    matmul = helper.make_node("MatMul", ["x", "wf"], ["out"])
    for scale, message in ((0.0, "must be finite and non-zero"), (float("nan"), "must be finite and non-zero")):
        model = _model(
            [node, matmul],
            [_info("x", TensorProto.FLOAT, [2, 8])],
            [_info("out", TensorProto.FLOAT, None)],
            [weight, _scale(scale, "s")],
        )
        with pytest.raises(ModelError, match=message):
            compile_model(model, target="llvm")

    bad_shape = _nbits_model(64, 16, 4, 32, "none", False)
    bad_shape.graph.node[0].attribute[0].i = 96  # K no longer matches A or the packed weight
    with pytest.raises(ShapeError, match="K is 96"):
        compile_model(bad_shape, target="llvm")

    odd_block = _nbits_model(64, 16, 4, 32, "none", False)
    for attribute in odd_block.graph.node[0].attribute:
        if attribute.name == "block_size":
            attribute.i = 24
    with pytest.raises(ShapeError, match="power of two"):
        compile_model(odd_block, target="llvm")

    unknown = _nbits_model(64, 16, 4, 32, "none", False)
    unknown.graph.node[0].attribute.append(helper.make_attribute("act_order", 1))
    with pytest.raises(ModelError, match="'act_order', which MatMulNBits does not take"):
        compile_model(unknown, target="llvm")

    per_row = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["out"])
    conv_weight = numpy_helper.from_array(RNG.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8), "w")
    model = _model(
        [per_row],
        [_info("x", TensorProto.UINT8, [1, 3, 8, 8])],
        [_info("out", TensorProto.UINT8, None)],
        [
            conv_weight,
            _scale([0.1, 0.2], "xs"),
            _zero([1, 2], "xz"),
            _scale(0.1, "ws"),
            _zero(0, "wz", np.int8),
            _scale(0.1, "ys"),
            _zero(0, "yz"),
        ],
    )
    with pytest.raises(ShapeError, match="x_scale must hold one value"):
        compile_model(model, target="llvm")


def test_an_unknown_contrib_op_is_named():
    node = helper.make_node("QLinearSomething", ["x"], ["out"], domain="com.microsoft")
    model = _model([node], [_info("x", TensorProto.UINT8, [2])], [_info("out", TensorProto.UINT8, None)], [])
    with pytest.raises(UnsupportedOpError, match="com.microsoft.QLinearSomething"):
        compile_model(model, target="llvm")


# -- whole models quantized by onnxruntime's own tools ------------------------------------------------------------


def _quantized(name: str, mode: str, folder) -> onnx.ModelProto:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from compiler import zoo

    source, output = folder / f"{name}.onnx", folder / f"{name}.{mode}.onnx"
    zoo.save_model(name, source)
    if mode in ("qdq", "qop"):

        class Samples(CalibrationDataReader):
            def __init__(self):
                self.samples = iter([zoo.sample_input(name, seed=seed) for seed in range(3)])

            def get_next(self):
                return next(self.samples, None)

        quant_format = QuantFormat.QDQ if mode == "qdq" else QuantFormat.QOperator
        quantize_static(
            str(source),
            str(output),
            Samples(),
            quant_format=quant_format,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )
    elif mode == "dynamic":
        quantize_dynamic(str(source), str(output), weight_type=QuantType.QInt8)
    else:
        quantizer = MatMulNBitsQuantizer(onnx.load(str(source)), block_size=32, is_symmetric=False)
        quantizer.process()
        quantizer.model.save_model_to_file(str(output))
    return onnx.load(str(output))


@pytest.mark.parametrize(
    "name, mode, target",
    [
        ("mlp", "qdq", "llvm"),
        ("mlp", "qop", "llvm"),
        ("mlp", "dynamic", "llvm"),
        ("mlp", "q4", "wasm"),
        ("bert_tiny", "qop", "llvm"),
        ("bert_tiny", "dynamic", "wasm"),
        # its run-time scale is a 0-d value: a one-thread kernel on GPU targets
        ("bert_tiny", "dynamic", "opencl"),
        ("bert_tiny", "q4", "llvm"),
        ("resnet50_bottleneck", "qdq", "llvm"),
        ("dwconv_block", "qdq", "wasm"),
    ],
)
def test_quantized_zoo_models_match_onnxruntime(name, mode, target, tmp_path):
    """4-bit weights are dequantized exactly, so the float model's tolerance holds. 8-bit models agree within what
    onnxruntime's own two paths disagree by: its optimised session (integer kernels) against its unoptimised one
    (float ops between Q and DQ) on bert_tiny's QDQ file differ by up to 0.09 (mean 0.02) on outputs of mean
    magnitude 0.54; one rounding that tips the other way in an early layer moves everything after it."""
    from compiler import zoo

    model = _quantized(name, mode, tmp_path)
    feeds = zoo.sample_input(name, seed=7)
    (expected,) = _onnxruntime(model, feeds)
    (actual,) = compile_model(model, target=target).run(feeds).values()
    difference = np.abs(actual - expected)
    magnitude = float(np.abs(expected).mean())
    if mode == "q4":
        assert difference.max() <= 1e-4 * max(1.0, float(np.abs(expected).max()))
    else:
        assert difference.max() <= 0.25 * magnitude and difference.mean() <= 0.05 * magnitude


# -- narrow weights stay narrow -----------------------------------------------------------------------------------


def _packed_weights(model) -> list[str]:
    from compiler.frontend import load_onnx
    from compiler.passes.pipeline import optimize
    from compiler.target import Target

    graph = optimize(load_onnx(model), fuse=False, target=Target.parse("llvm"))
    kinds = {"MatMulPacked": "", "MatMulIntegerPacked": " integer"}
    return sorted(node.inputs[1].type.dtype + kinds[node.op] for node in graph.nodes if node.op in kinds)


@pytest.mark.parametrize(
    "mode, dtype, count", [("qdq", "int32 integer", 13), ("dynamic", "int32 integer", 13), ("q4", "uint8", 12)]
)
def test_quantized_dense_weights_stay_narrow_in_the_bundle(mode, dtype, count, tmp_path):
    """Every quantized dense weight of bert_tiny is packed in its stored dtype and widened in the kernel, the
    single-row pooler's too (the 4-bit quantizer leaves that Gemm float), so the params are about 0.3x the float
    model's (its embeddings and norms stay float32). 8-bit ones, whose activations are quantized per tensor to
    uint8, are integer products over int8 levels packed four to an int32 word (passes/integer_products.py)."""
    from compiler import zoo

    model = _quantized("bert_tiny", mode, tmp_path)
    assert _packed_weights(model) == [dtype] * count
    float_bytes = compile_model(zoo.build_model("bert_tiny"), target="llvm").manifest["params"]["bytes"]
    module = compile_model(model, target="llvm")
    assert module.manifest["params"]["bytes"] <= 0.35 * float_bytes


def test_float16_weights_are_widened_in_the_kernel():
    """A float32 MatMul whose weight is stored float16 and Cast up (as mixed-precision converters write it)."""
    weight = numpy_helper.from_array(RNG.standard_normal((96, 80)).astype(np.float16), "w16")
    nodes = [
        helper.make_node("Cast", ["w16"], ["w"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["x", "w"], ["out"]),
    ]
    model = _model(nodes, [_info("x", TensorProto.FLOAT, [7, 96])], [_info("out", TensorProto.FLOAT, None)], [weight])
    assert _packed_weights(model) == ["float16"]
    _compare(model, {"x": RNG.standard_normal((7, 96)).astype(np.float32)}, 1e-4)
    _compare(model, {"x": RNG.standard_normal((7, 96)).astype(np.float32)}, 1e-4, target="wasm")


def test_quantized_conv_weights_stay_narrow(tmp_path):
    """A QDQ convnet's per-filter int8 weights are packed narrow for the blocked conv, scaled in its epilogue: as
    int8 levels widened in the kernel where the input has 3 channels (the stem), as int32 words of four input
    channels' levels, read by integer dot products over the uint8 input, everywhere else
    (passes/integer_products.py)."""
    from compiler.frontend import load_onnx
    from compiler.passes.pipeline import optimize
    from compiler.target import Target

    model = _quantized("resnet50_bottleneck", "qdq", tmp_path)
    graph = optimize(load_onnx(model), fuse=False, target=Target.parse("llvm"))
    convs = [node for node in graph.nodes if node.op == "ConvNCHWc"]
    kinds = [(node.inputs[0].type.dtype, node.inputs[1].type.dtype) for node in convs]
    assert kinds == [("float32", "int8")] + [("uint8", "int32")] * (len(convs) - 1)


@pytest.mark.parametrize("elem_type, low, high", [(TensorProto.INT4, -8, 8), (TensorProto.UINT4, 0, 16)])
def test_int4_weights_dequantized_into_a_matmul(elem_type, low, high):
    """The standard 4-bit form (opset 21): int4/uint4 initializer levels, blocked scales, DequantizeLinear, MatMul.
    The file's two-a-byte levels are read as 8-bit ones, then packed two a byte again for the kernel (signed ones
    offset by 8, their zero point with them)."""
    rows, inner, columns, block = 5, 128, 64, 32
    levels = helper.make_tensor("q", elem_type, [inner, columns], RNG.integers(low, high, inner * columns).tolist())
    scale = numpy_helper.from_array(RNG.uniform(0.01, 0.05, (inner // block, columns)).astype(np.float32), "s")
    nodes = [
        helper.make_node("DequantizeLinear", ["q", "s"], ["w"], axis=0, block_size=block),
        helper.make_node("MatMul", ["x", "w"], ["out"]),
    ]
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "g",
            [_info("x", TensorProto.FLOAT, [rows, inner])],
            [_info("out", TensorProto.FLOAT, None)],
            [levels, scale],
        ),
        opset_imports=[helper.make_opsetid("", 21)],
    )
    from compiler.frontend import load_onnx
    from compiler.passes.pipeline import optimize
    from compiler.target import Target

    graph = optimize(load_onnx(model), fuse=False, target=Target.parse("llvm"))
    (packed,) = [node for node in graph.nodes if node.op == "MatMulPacked"]
    assert packed.attrs.get("bits") == 4 and packed.inputs[1].type.shape[1] == inner // 2
    feeds = {"x": RNG.standard_normal((rows, inner)).astype(np.float32)}
    _compare(model, feeds, 1e-4)
    _compare(model, feeds, 1e-4, target="wasm")


# -- quantized and float16 tables read narrow by a Gather ------------------------------------------------------------

VOCABULARY, WIDTH, TABLE_BLOCK = 300, 64, 32


def _gather_block_quantized(form: str, width: int = WIDTH):
    """com.microsoft.GatherBlockQuantized of a (VOCABULARY, width) table in blocks of 32 along its rows, ids (2, 5):
    int4 levels (signed, no zero point: 0), uint4 levels with zero points, uint8 bytes of two 4-bit levels (no zero
    point: 8), or uint8 8-bit levels (no zero point: 128), opset 21 for the 4-bit types."""
    shape, blocks = (VOCABULARY, width), (VOCABULARY, -(-width // TABLE_BLOCK))
    scales = numpy_helper.from_array(RNG.uniform(0.01, 0.05, blocks).astype(np.float32), "s")
    inputs, attrs, params = ["q", "ids", "s"], {"block_size": TABLE_BLOCK}, [scales]
    if form in ("int4", "uint4"):
        low, high = (-8, 8) if form == "int4" else (0, 16)
        kind = TensorProto.INT4 if form == "int4" else TensorProto.UINT4
        params.append(helper.make_tensor("q", kind, shape, RNG.integers(low, high, VOCABULARY * width).tolist()))
        if form == "uint4":
            params.append(helper.make_tensor("z", kind, blocks, RNG.integers(0, 16, blocks[0] * blocks[1]).tolist()))
            inputs.append("z")
    elif form == "packed4":
        params.append(numpy_helper.from_array(RNG.integers(0, 256, (VOCABULARY, width // 2)).astype(np.uint8), "q"))
    else:
        params.append(numpy_helper.from_array(RNG.integers(0, 256, shape).astype(np.uint8), "q"))
        attrs["bits"] = 8
    node = helper.make_node("GatherBlockQuantized", inputs, ["y"], domain="com.microsoft", **attrs)
    graph = helper.make_graph(
        [node], "g", [_info("ids", TensorProto.INT64, [2, 5])], [_info("y", TensorProto.FLOAT, None)], params
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )


@pytest.mark.parametrize("form", ["int4", "uint4", "packed4", "uint8"])
@pytest.mark.parametrize("target", ["llvm", "wasm"])
def test_gather_block_quantized_reads_its_table_narrow(form, target):
    """Exact against onnxruntime, and the kernel reads the levels (the bundle keeps them narrow, not a float table):
    4-bit levels two a byte (with a float32 scale and a zero point per block of 32: about 0.66 bytes an element),
    8-bit ones a byte each."""
    model = _gather_block_quantized(form)
    feeds = {"ids": RNG.integers(0, VOCABULARY, (2, 5)).astype(np.int64)}
    _compare(model, feeds, 1e-6, target=target)
    params = compile_model(model, target=target).manifest["params"]["bytes"]
    assert params < VOCABULARY * WIDTH * (1.2 if form == "uint8" else 0.7)  # float32: 4 bytes an element


def test_float16_embeddings_stay_float16_for_the_gather():
    """A float16 table widened by a Cast (what float16 converters write) and gathered: the bundle keeps it float16
    on CPU targets, and a GPU target widens it at compile time."""
    from compiler.frontend import load_onnx
    from compiler.passes.pipeline import optimize
    from compiler.target import Target

    table = numpy_helper.from_array(RNG.standard_normal((VOCABULARY, WIDTH)).astype(np.float16), "t16")
    nodes = [
        helper.make_node("Cast", ["t16"], ["t"], to=TensorProto.FLOAT),
        helper.make_node("Gather", ["t", "ids"], ["y"]),
    ]
    model = _model(nodes, [_info("ids", TensorProto.INT64, [3, 4])], [_info("y", TensorProto.FLOAT, None)], [table])
    feeds = {"ids": RNG.integers(0, VOCABULARY, (3, 4)).astype(np.int64)}
    _compare(model, feeds, 0.0)
    assert compile_model(model, target="llvm").manifest["params"]["bytes"] == VOCABULARY * WIDTH * 2
    on_gpu = optimize(load_onnx(model), fuse=False, target=Target.parse("webgpu"))
    assert [node.op for node in on_gpu.nodes] == ["Gather"] and on_gpu.nodes[0].inputs[0].type.dtype == "float32"


def test_gather_block_quantized_with_levels_outside_its_bits_is_a_clear_error():
    """uint8 levels one a byte under bits=4 (not the two-a-byte form) that do not fit 4 bits: refused, never packed
    into nibbles that would drop their high bits."""
    model = _gather_block_quantized("uint8")
    (node,) = model.graph.node
    kept = [attribute for attribute in node.attribute if attribute.name != "bits"]  # bits then defaults to 4
    del node.attribute[:]
    node.attribute.extend(kept)
    with pytest.raises(ShapeError, match="outside 4 bits"):
        compile_model(model, target="llvm")


@pytest.mark.parametrize("target", ["opencl", "webgpu"])
def test_gather_block_quantized_on_gpu_targets(target):
    """The two-levels-a-byte rows are plain ops (Gather, Mod, Div, Reshape, Sub, Mul): GPU targets run them too."""
    model = _gather_block_quantized("packed4")
    _compare(model, {"ids": RNG.integers(0, VOCABULARY, (2, 5)).astype(np.int64)}, 1e-6, target=target)


@pytest.mark.parametrize("form, width", [("int4", 47), ("uint4", 47), ("packed4", 48)])
def test_gather_block_quantized_rows_of_partial_blocks(form, width):
    """Rows that are not whole blocks (47 levels, an odd count, in blocks of 32; 48 from 24 bytes): the gathered rows
    are dequantized by a blocked DequantizeLinear, exact against onnxruntime."""
    model = _gather_block_quantized(form, width)
    _compare(model, {"ids": RNG.integers(0, VOCABULARY, (2, 5)).astype(np.int64)}, 1e-6)
