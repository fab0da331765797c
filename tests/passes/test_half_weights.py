"""half_weights (`--weights fp16`): which dense weights it stores as float16, and whole models compiled with it.

Tolerances: a float16 weight is its float32 value within 2^-11 relative (round to nearest even). Against onnxruntime
on the float32 model, bert_tiny's outputs (largest magnitude 0.99) move by up to 5.7e-4 (mean 1.3e-4) and the batched
mlp's (1.15) by up to 4.2e-4, the same on llvm and wasm; the stated tolerance is 2e-3 of the output's largest
magnitude (at least 1), mean 5e-4. Against onnxruntime on the model whose dense weights are rounded to float16 first,
the compiled outputs agree as a float32 compile does (1e-5 of the range): the kernel computes in float32."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from compiler import zoo
from compiler.build import compile_model
from compiler.errors import TargetError, TesselError
from compiler.graph.ir import Graph, TensorType
from compiler.graph.registry import DECOMPRESS_MIN_ELEMENTS
from compiler.passes.half_weights import FLOAT16_MAX, WeightsWarning, half_weights
from compiler.passes.pipeline import optimize
from compiler.target import Target
from tests.model_checks import assert_close_in_range

RNG = np.random.default_rng(11)
WEIGHT = RNG.standard_normal((96, 80)).astype(np.float32)  # 7680 elements: past DECOMPRESS_MIN_ELEMENTS


def _dense(rows: int = 7, weight: np.ndarray = WEIGHT, op: str = "MatMul") -> Graph:
    graph = Graph()
    x = graph.add_input("x", TensorType((rows, weight.shape[0]), "float32"))
    graph.outputs = graph.add_node(op, [x, graph.add_param("w", weight)])
    return graph


def test_a_packed_dense_weight_is_stored_float16_behind_a_cast(assert_same_structure):
    graph = _dense()
    text = str(graph)
    halved = half_weights(graph)
    assert str(graph) == text, "the pass changed its input graph"
    expected = Graph()
    x = expected.add_input("x", TensorType((7, 96), "float32"))
    (wide,) = expected.add_node("Cast", [expected.add_param("w_fp16", WEIGHT.astype(np.float16))], {"to": "float32"})
    expected.outputs = expected.add_node("MatMul", [x, wide])
    assert_same_structure(halved, expected)
    (cast,) = [node for node in halved.nodes if node.op == "Cast"]
    np.testing.assert_array_equal(halved.params[cast.inputs[0]], WEIGHT.astype(np.float16))
    # the pipeline keeps the Cast for pack_dense, which packs the float16 bytes
    packed = optimize(halved, fuse=False, target=Target.parse("llvm"))
    assert [node.inputs[1].type.dtype for node in packed.nodes if node.op == "MatMulPacked"] == ["float16"]
    assert sorted({array.dtype.name for array in packed.params.values()}) == ["float16"]


def test_a_gemm_weight_is_stored_float16():
    graph = Graph()
    x = graph.add_input("x", TensorType((4, 80), "float32"))
    bias = graph.add_param("b", np.zeros(96, np.float32))
    graph.outputs = graph.add_node("Gemm", [x, graph.add_param("w", WEIGHT), bias], {"transB": 1})
    halved = half_weights(graph)
    assert [node.op for node in halved.nodes] == ["Cast", "Gemm"]
    assert sorted(array.dtype.name for array in halved.params.values()) == ["float16", "float32"]  # the bias stays


def _single_row():
    return _dense(rows=1)


def _small():
    side = int(DECOMPRESS_MIN_ELEMENTS**0.5) - 1
    return _dense(weight=RNG.standard_normal((side, side)).astype(np.float32))


def _read_elsewhere():
    graph = _dense()
    (product,) = graph.outputs
    weight = graph.nodes[0].inputs[1]
    graph.outputs = [product, *graph.add_node("Relu", [weight])]
    return graph


def _as_activation():
    graph = Graph()
    x = graph.add_input("x", TensorType((80, 7), "float32"))
    graph.outputs = graph.add_node("MatMul", [graph.add_param("w", WEIGHT), x])
    return graph


def _scaled_gemm():
    graph = Graph()
    x = graph.add_input("x", TensorType((4, 80), "float32"))
    graph.outputs = graph.add_node("Gemm", [x, graph.add_param("w", WEIGHT)], {"transB": 1, "alpha": 0.5})
    return graph


@pytest.mark.parametrize(
    "make",
    [_single_row, _small, _read_elsewhere, _as_activation, _scaled_gemm],
    ids=["single-row", "small", "read-elsewhere", "input-0", "gemm-alpha"],
)
def test_weights_no_kernel_reads_narrow_stay_float32_unrounded(make):
    """pack_dense would not pack these (or the param has other readers): float16 bytes would be widened back to
    float32 by fold_decompressions, so the pass leaves them as they are rather than round them for nothing."""
    graph = make()
    halved = half_weights(graph)
    assert str(halved) == str(graph)
    for value, array in graph.params.items():
        assert halved.params[value] is array


def test_a_weight_beyond_float16_stays_float32_with_a_warning():
    weight = WEIGHT.copy()
    weight[3, 5] = -70000.0
    with pytest.warns(WeightsWarning, match=r"weight 'w' holds values up to 70000 .* beyond float16's 65504"):
        halved = half_weights(_dense(weight=weight))
    assert [node.op for node in halved.nodes] == ["MatMul"]
    assert [array.dtype.name for array in halved.params.values()] == ["float32"]


def test_a_weight_at_float16s_largest_value_is_stored_float16():
    weight = WEIGHT.copy()
    weight[0, 0] = FLOAT16_MAX
    halved = half_weights(_dense(weight=weight))
    (half,) = halved.params.values()
    assert half.dtype == np.float16 and half[0, 0] == FLOAT16_MAX and np.isfinite(half).all()


def test_unknown_weights_format_and_gpu_targets_are_one_error():
    with pytest.raises(TesselError, match="unknown weights format 'int8'; use fp32 or fp16"):
        compile_model(_dense(), target="llvm", weights="int8")
    with pytest.raises(TargetError, match="weights fp16 applies to the CPU targets .* webgpu kernels read float32"):
        compile_model(_dense(), target="webgpu", weights="fp16")


# -- whole models --------------------------------------------------------------------------------------------------


def _batched(model: onnx.ModelProto, rows: int) -> onnx.ModelProto:
    """The zoo's mlp takes one row, which pack_dense leaves to the unpacked Gemm: this copy takes `rows`."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = rows
    return model


def _rounded(model: onnx.ModelProto, op: str) -> onnx.ModelProto:
    """`model` with the weights (input 1) of its `op` nodes rounded to float16 and stored float32 again."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    weights = {node.input[1] for node in model.graph.node if node.op_type == op}
    for position, tensor in enumerate(model.graph.initializer):
        if tensor.name in weights:
            array = numpy_helper.to_array(tensor).astype(np.float16).astype(np.float32)
            model.graph.initializer[position].CopyFrom(numpy_helper.from_array(array, tensor.name))
    return model


def _onnxruntime(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _dense_weight_bytes(model: onnx.ModelProto, op: str) -> int:
    weights = {node.input[1] for node in model.graph.node if node.op_type == op}
    return sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer if t.name in weights)


MLP_ROWS = 4
MODELS = {
    # bert_tiny's 12 MatMul weights halve; its pooler's Gemm reads one row (the first token) and stays float32
    "bert_tiny": (lambda: zoo.build_model("bert_tiny"), "MatMul", 12, lambda: zoo.sample_input("bert_tiny", seed=7)),
    "mlp": (
        lambda: _batched(zoo.build_model("mlp"), MLP_ROWS),
        "Gemm",
        3,
        lambda: {"input": RNG.standard_normal((MLP_ROWS, 784)).astype(np.float32)},
    ),
}


@pytest.mark.parametrize("target", ["llvm", "wasm"])
@pytest.mark.parametrize("name", list(MODELS))
def test_fp16_weights_halve_the_dense_bytes_and_match_onnxruntime(name, target):
    make, op, count, inputs = MODELS[name]
    model, feeds = make(), inputs()
    float32 = compile_model(model, target=target)
    module = compile_model(model, target=target, weights="fp16")
    assert "weights" not in float32.manifest["options"] and module.manifest["options"]["weights"] == "fp16"
    assert module.manifest["content_hash"] != float32.manifest["content_hash"]
    # each dense weight's packed panels (N padded to whole vectors, as in the float32 bundle) in half the bytes
    wide = {entry["name"]: entry for entry in float32.manifest["params"]["layout"]}
    halves = [entry for entry in module.manifest["params"]["layout"] if entry["dtype"] == "float16"]
    assert len(halves) == count
    for entry in halves:
        packed = wide[entry["name"].replace("_widened", "")]
        assert packed["dtype"] == "float32" and packed["shape"] == entry["shape"]
        assert packed["nbytes"] == 2 * entry["nbytes"]
    saved = float32.manifest["params"]["bytes"] - module.manifest["params"]["bytes"]
    assert abs(saved - sum(entry["nbytes"] for entry in halves)) <= 64 * len(halves)  # params.bin's 64-byte alignment
    assert saved >= 0.49 * _dense_weight_bytes(model, op)
    (actual,) = module.run(feeds).values()
    expected = _onnxruntime(model, feeds)
    scale = max(1.0, float(np.abs(expected).max()))
    difference = np.abs(actual.astype(np.float64) - expected)
    assert difference.max() <= 2e-3 * scale and difference.mean() <= 5e-4 * scale
    assert difference.max() > 1e-5 * scale, "the weights were not rounded to float16"
    assert_close_in_range(actual, _onnxruntime(_rounded(model, op), feeds))


def test_a_single_row_mlp_keeps_its_float32_weights():
    """The zoo's mlp (one row) runs its Gemms unpacked, which read float32: fp16 changes nothing in its bundle."""
    model = zoo.build_model("mlp")
    float32 = compile_model(model, target="llvm")
    module = compile_model(model, target="llvm", weights="fp16")
    assert module.params == float32.params
    assert [entry["dtype"] for entry in module.manifest["params"]["layout"]] == ["float32"] * 6
    feeds = zoo.sample_input("mlp", seed=3)
    np.testing.assert_array_equal(*(list(m.run(feeds).values())[0] for m in (module, float32)))
