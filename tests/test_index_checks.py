"""Data-dependent indices (Gather, GatherElements, GatherND, ScatterND, ScatterElements) are checked at run time: one out of range makes the run
raise RunError naming the op, natively and in wasm, where onnxruntime raises INVALID_ARGUMENT (or FAIL);
int64 indices are compared in 64 bits, so 2**40 and 2**32 + 1 do not wrap into range; negatives in range
count from the end and match onnxruntime."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from compiler import compile_model
from compiler.errors import RunError

BAD = [5, 1000, -1000, 2**40, 2**32 + 1]
GOOD = [0, 4, -1, -5]
SHAPES = {"Gather": ([2], [2, 3]), "GatherElements": ([2, 3], [2, 3]), "GatherND": ([2, 1], [2, 3])}


def _model(op: str, index_dtype=TensorProto.INT64) -> onnx.ModelProto:
    index_shape, output_shape = SHAPES[op]
    attributes = {} if op == "GatherND" else {"axis": 0}
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "i"], ["y"], **attributes)],
        "index_check",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3]),
            helper.make_tensor_value_info("i", index_dtype, index_shape),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module", params=[(op, target) for op in SHAPES for target in ("llvm", "wasm")], ids=str)
def compiled(request):
    op, target = request.param
    model = _model(op)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return op, compile_model(model, target), session


def _feeds(op: str, last: int, dtype=np.int64) -> dict:
    indices = np.zeros(SHAPES[op][0], dtype)
    indices.flat[-1] = last
    indices.flat[0] = 2
    return {"x": np.arange(15, dtype=np.float32).reshape(5, 3), "i": indices}


@pytest.mark.parametrize("index", BAD)
def test_out_of_range_index_raises_like_onnxruntime(compiled, index):
    op, module, session = compiled
    feeds = _feeds(op, index)
    with pytest.raises(Exception, match="INVALID_ARGUMENT|Out of range|out of data bounds|invalid indice"):
        session.run(None, feeds)
    with pytest.raises(RunError, match=f"index is out of range in {op} \\(group"):
        module.run(feeds)


def test_in_range_indices_match_onnxruntime_after_a_failure(compiled):
    op, module, session = compiled
    with pytest.raises(RunError):
        module.run(_feeds(op, 2**32 + 1))
    for index in GOOD:
        feeds = _feeds(op, index)
        np.testing.assert_array_equal(module.run(feeds)["y"], session.run(None, feeds)[0])


@pytest.mark.parametrize("target", ["llvm", "wasm"])
def test_int32_indices_are_checked(target):
    module = compile_model(_model("Gather", TensorProto.INT32), target)
    with pytest.raises(RunError):
        module.run(_feeds("Gather", -6, np.int32))
    assert module.run(_feeds("Gather", -5, np.int32))["y"].tolist()[1] == [0.0, 1.0, 2.0]


def test_constant_out_of_range_indices_are_refused_while_folding():
    graph = helper.make_graph(
        [helper.make_node("Gather", ["c", "i"], ["g"]), helper.make_node("Add", ["g", "x"], ["y"])],
        "folded",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [
            helper.make_tensor("c", TensorProto.FLOAT, [5, 3], np.arange(15, dtype=np.float32)),
            helper.make_tensor("i", TensorProto.INT64, [2], [0, 2**32 + 1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(RunError, match="Gather index 4294967297 is out of range for an axis of 5"):
        compile_model(model, "llvm")


def _scatter_nd_model(data_shape, index_shape) -> onnx.ModelProto:
    depth = index_shape[-1]
    graph = helper.make_graph(
        [helper.make_node("ScatterND", ["x", "i", "u"], ["y"])],
        "scatter_nd",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, data_shape),
            helper.make_tensor_value_info("i", TensorProto.INT64, index_shape),
            helper.make_tensor_value_info("u", TensorProto.FLOAT, index_shape[:-1] + data_shape[depth:]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, data_shape)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _scatter_nd_feeds(data_shape, index_shape, seed=0) -> dict:
    """Distinct addressed elements (ONNX leaves repeats undefined), about half of them counted from the end."""
    rng = np.random.default_rng(seed)
    depth, rows = index_shape[-1], int(np.prod(index_shape[:-1]))
    cells = rng.permutation(int(np.prod(data_shape[:depth])))[:rows]
    indices = np.stack(np.unravel_index(cells, data_shape[:depth]), -1).reshape(index_shape).astype(np.int64)
    indices[..., 0] -= data_shape[0] * (rng.random(indices.shape[:-1]) < 0.5)
    updates_shape = index_shape[:-1] + data_shape[depth:]
    return {
        "x": rng.standard_normal(data_shape).astype(np.float32),
        "i": indices,
        "u": rng.standard_normal(updates_shape).astype(np.float32),
    }


@pytest.mark.parametrize(
    "data_shape, index_shape", [([5, 3], [2, 1]), ([5, 3], [2, 2]), ([4, 5, 3], [2, 3, 2]), ([8], [3, 1])]
)
@pytest.mark.parametrize("target", ["llvm", "wasm"])
def test_scatter_nd_matches_onnxruntime_and_checks_every_index(target, data_shape, index_shape):
    model = _scatter_nd_model(data_shape, index_shape)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    module = compile_model(model, target)
    feeds = _scatter_nd_feeds(data_shape, index_shape)
    np.testing.assert_array_equal(module.run(feeds)["y"], session.run(None, feeds)[0])
    dim = data_shape[index_shape[-1] - 1]  # the axis the last index column addresses
    for bad in BAD:
        damaged = {**feeds, "i": feeds["i"].copy()}
        # as far outside this axis as `bad` is outside an axis of 5
        damaged["i"].flat[-1] = bad if bad < 0 else bad + dim - 5
        with pytest.raises(Exception, match="INVALID_ARGUMENT|invalid ind|out of bounds"):
            session.run(None, damaged)
        with pytest.raises(RunError, match="index is out of range in ScatterND"):
            module.run(damaged)


@pytest.mark.parametrize("target", ["llvm", "wasm"])
def test_scatter_elements_matches_onnxruntime_and_checks_every_index(target):
    graph = helper.make_graph(
        [helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1)],
        "scatter_elements",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5]),
            helper.make_tensor_value_info("i", TensorProto.INT64, [2, 3]),
            helper.make_tensor_value_info("u", TensorProto.FLOAT, [2, 3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    module = compile_model(model, target)
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((2, 5)).astype(np.float32), "i": np.array([[0, -1, 2], [4, 3, -5]])}
    feeds["u"] = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(module.run(feeds)["y"], session.run(None, feeds)[0])
    for bad in BAD:
        damaged = {**feeds, "i": feeds["i"].copy()}
        damaged["i"][1, 2] = bad
        with pytest.raises(Exception, match="INVALID_ARGUMENT|invalid ind|out of bounds|out of range"):
            session.run(None, damaged)
        with pytest.raises(RunError, match="index is out of range in ScatterElements"):
            module.run(damaged)


@pytest.mark.parametrize("target", ["llvm", "wasm"])
def test_a_model_with_no_kernel_calls_reports_no_failure(target):
    """Shape folds to a constant output the host copies: the run entry calls no kernel and must still return 0."""
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["y"])],
        "no_calls",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [2])],
    )
    module = compile_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), target)
    assert module.manifest["calls"] == []
    for _ in range(3):
        assert module.run({"x": np.zeros((2, 3), np.float32)})["y"].tolist() == [2, 3]


@pytest.mark.parametrize(
    "batch_dims, data_shape, index_shape",
    [(0, [5, 3], [2, 2]), (1, [2, 5, 3], [2, 4, 1]), (0, [5, 4, 3], [3, 2, 2]), (2, [2, 3, 4, 2], [2, 3, 1])],
)
def test_gather_nd_matches_onnxruntime(batch_dims, data_shape, index_shape):
    graph = helper.make_graph(
        [helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)],
        "gather_nd",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, data_shape),
            helper.make_tensor_value_info("i", TensorProto.INT64, index_shape),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(batch_dims)
    feeds = {
        "x": rng.standard_normal(data_shape).astype(np.float32),
        "i": rng.integers(-2, 2, index_shape).astype(np.int64),
    }
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    for target in ("llvm", "wasm"):
        np.testing.assert_array_equal(compile_model(model, target).run(feeds)["y"], expected)
