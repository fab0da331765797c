"""The ONNX importer: params, constants, import-time folding, older-opset rewrites and the errors a user
meets. Numbers are checked against numpy and onnxruntime."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper, version_converter

from compiler.errors import ModelError, ShapeError, TesselError, UnsupportedOpError
from compiler.frontend import load_onnx
from compiler.graph.reference import run_reference

RNG = np.random.default_rng(0)


def _model(nodes, inputs, outputs, initializers=(), opset=13, ir_version=8) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)


def _tensor(name, shape, elem_type=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem_type, shape)


def _onnxruntime(model: onnx.ModelProto, feeds: dict) -> list:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _dense_model() -> tuple[onnx.ModelProto, np.ndarray]:
    weight = RNG.standard_normal((3, 4)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "weight"], ["y"], name="dense")]
    model = _model(nodes, [_tensor("x", [2, 3])], [_tensor("y", [2, 4])], [numpy_helper.from_array(weight, "weight")])
    return model, weight


def test_initializers_become_params_and_are_not_inputs():
    model, weight = _dense_model()
    # before IR version 4 every initializer was also listed as a graph input
    model.graph.input.append(_tensor("weight", [3, 4]))
    graph = load_onnx(model)
    assert [v.name for v in graph.inputs] == ["x"]
    assert [v.name for v in graph.outputs] == ["y"]
    (param,) = graph.params
    assert param.name == "weight"
    np.testing.assert_array_equal(graph.params[param], weight)
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(run_reference(graph, {"x": x})["y"], x @ weight, rtol=1e-6)


def test_a_path_bytes_and_a_proto_load_alike(tmp_path):
    model, _ = _dense_model()
    path = tmp_path / "dense.onnx"
    onnx.save(model, path)
    texts = {str(load_onnx(source)) for source in (model, model.SerializeToString(), path, str(path))}
    assert len(texts) == 1


_CONSTANT_FORMS = {
    "value": (helper.make_tensor("c", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0]), np.float32([1, 2, 3])),
    "value_float": (2.5, np.float32(2.5)),
    "value_floats": ([1.5, -2.0, 0.25], np.float32([1.5, -2.0, 0.25])),
    "value_int": (7, np.int64(7)),
    "value_ints": ([1, -2, 3], np.int64([1, -2, 3])),
    "sparse_value": (
        helper.make_sparse_tensor(
            helper.make_tensor("v", TensorProto.FLOAT, [2], [5.0, 6.0]),
            helper.make_tensor("i", TensorProto.INT64, [2], [0, 2]),
            [3],
        ),
        np.float32([5, 0, 6]),
    ),
}


@pytest.mark.parametrize("form", sorted(_CONSTANT_FORMS))
def test_every_form_of_constant_becomes_a_param(form):
    attribute, expected = _CONSTANT_FORMS[form]
    elem_type = TensorProto.INT64 if expected.dtype == np.int64 else TensorProto.FLOAT
    nodes = [
        helper.make_node("Constant", [], ["c"], **{form: attribute}),
        helper.make_node("Add", ["x", "c"], ["y"]),
    ]
    graph = load_onnx(_model(nodes, [_tensor("x", [3], elem_type)], [_tensor("y", [3], elem_type)]))
    assert [node.op for node in graph.nodes] == ["Add"]
    (param,) = graph.params
    assert param.name == "c"
    np.testing.assert_array_equal(graph.params[param], expected)
    assert graph.params[param].dtype == expected.dtype


def test_a_string_constant_is_named_in_the_error():
    nodes = [helper.make_node("Constant", [], ["c"], value_string="hello", name="greeting")]
    with pytest.raises(TesselError, match=r"node greeting \(Constant\): Constant holds strings"):
        load_onnx(_model(nodes, [_tensor("x", [1])], [_tensor("c", [])]))


def test_a_sparse_initializer_becomes_a_dense_param():
    sparse = helper.make_sparse_tensor(
        helper.make_tensor("table", TensorProto.FLOAT, [2], [4.0, 8.0]),
        helper.make_tensor("indices", TensorProto.INT64, [2, 2], [0, 1, 1, 0]),
        [2, 2],
    )
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "table"], ["y"])], "test", [_tensor("x", [1, 2])], [_tensor("y", [1, 2])]
    )
    graph.sparse_initializer.append(sparse)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    imported = load_onnx(model)
    np.testing.assert_array_equal(next(iter(imported.params.values())), [[0, 4], [8, 0]])
    x = np.float32([[1, 2]])
    np.testing.assert_array_equal(run_reference(imported, {"x": x})["y"], _onnxruntime(model, {"x": x})[0])


def test_a_shape_computation_chain_folds_into_the_reshape():
    # what torch.onnx.export writes for x.view(x.size(0), -1)
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0, np.int64))),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Constant", [], ["axes"], value=numpy_helper.from_array(np.array([0], np.int64))),
        helper.make_node("Unsqueeze", ["batch", "axes"], ["batch_1d"]),
        helper.make_node("Constant", [], ["rest"], value=numpy_helper.from_array(np.array([-1], np.int64))),
        helper.make_node("Concat", ["batch_1d", "rest"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"], name="flatten"),
    ]
    model = _model(nodes, [_tensor("x", [2, 3, 4])], [_tensor("y", [2, 12])])
    graph = load_onnx(model)
    assert [node.op for node in graph.nodes] == ["Reshape"]
    assert graph.nodes[0].attrs["shape"] == (2, -1)
    assert graph.nodes[0].inputs == graph.inputs
    assert not graph.params
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(run_reference(graph, {"x": x})["y"], _onnxruntime(model, {"x": x})[0])


def test_constant_subexpressions_fold_to_params():
    a, b = np.float32([1, 2, 3]), np.float32([10, 20, 30])
    nodes = [helper.make_node("Mul", ["a", "b"], ["ab"]), helper.make_node("Add", ["x", "ab"], ["y"])]
    initializers = [numpy_helper.from_array(a, "a"), numpy_helper.from_array(b, "b")]
    graph = load_onnx(_model(nodes, [_tensor("x", [3])], [_tensor("y", [3])], initializers))
    assert [node.op for node in graph.nodes] == ["Add"]
    assert {v.name: array.tolist() for v, array in graph.params.items()} == {"ab": [10, 40, 90]}


def test_const_inputs_become_attributes_and_dtype_enums_become_names():
    nodes = [
        helper.make_node("Squeeze", ["x"], ["squeezed"], axes=[0]),  # opset 11: axes is an attribute
        helper.make_node("Clip", ["squeezed", "low", ""], ["clipped"]),
        helper.make_node("Cast", ["clipped"], ["y"], to=TensorProto.FLOAT16),
    ]
    low = numpy_helper.from_array(np.float32(-0.5), "low")
    model = _model(nodes, [_tensor("x", [1, 5])], [_tensor("y", [5], TensorProto.FLOAT16)], [low], opset=11)
    graph = load_onnx(model)
    squeeze, clip, cast = graph.nodes
    assert squeeze.attrs == {"axes": (0,)}
    assert clip.attrs == {"min": -0.5} and clip.inputs == [squeeze.outputs[0]]
    assert cast.attrs == {"to": "float16"}
    x = RNG.standard_normal((1, 5)).astype(np.float32)
    np.testing.assert_array_equal(run_reference(graph, {"x": x})["y"], _onnxruntime(model, {"x": x})[0])


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64])
def test_range_keeps_the_dtype_of_its_bounds(dtype):
    elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [helper.make_node("Range", ["start", "limit", "delta"], ["r"]), helper.make_node("Add", ["x", "r"], ["y"])]
    bounds = [numpy_helper.from_array(np.array(v, dtype), n) for n, v in [("start", 1), ("limit", 9), ("delta", 2)]]
    model = _model(nodes, [_tensor("x", [4], elem_type)], [_tensor("y", [4], elem_type)], bounds, opset=11)
    graph = load_onnx(model)
    x = np.arange(4).astype(dtype)
    result = run_reference(graph, {"x": x})["y"]
    expected = _onnxruntime(model, {"x": x})[0]
    assert result.dtype == expected.dtype
    np.testing.assert_array_equal(result, expected)


def test_a_runtime_value_in_a_shape_input_names_the_node_and_input():
    nodes = [helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape_it")]
    inputs = [_tensor("x", [2, 3]), _tensor("target", [2], TensorProto.INT64)]
    with pytest.raises(ShapeError, match=r"reshape_it \(Reshape\).*'shape'.*'target'.*must be a constant"):
        load_onnx(_model(nodes, inputs, [_tensor("y", [3, 2])]))


def test_multi_output_nodes_keep_their_onnx_names():
    nodes = [helper.make_node("Split", ["x"], ["first", "second"], axis=1)]
    model = _model(nodes, [_tensor("x", [2, 4])], [_tensor("first", [2, 2]), _tensor("second", [2, 2])], opset=11)
    graph = load_onnx(model)
    (split,) = graph.nodes
    assert split.attrs == {"axis": 1, "_outputs": 2}
    assert [v.name for v in graph.outputs] == ["first", "second"]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_before_opset_13_coerces_to_2d(op):
    nodes = [helper.make_node(op, ["x"], ["y"], axis=1)]
    model = _model(nodes, [_tensor("x", [2, 3, 4])], [_tensor("y", [2, 3, 4])], opset=11)
    graph = load_onnx(model)
    assert [node.op for node in graph.nodes] == ["Flatten", op, "Reshape"]
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    flat = x.reshape(2, 12)
    expected = np.exp(flat - flat.max(axis=1, keepdims=True))
    expected = expected / expected.sum(axis=1, keepdims=True)
    if op == "LogSoftmax":
        expected = np.log(expected)
    result = run_reference(graph, {"x": x})["y"]
    np.testing.assert_allclose(result, expected.reshape(2, 3, 4), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result, _onnxruntime(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_softmax_before_opset_13_over_the_last_axis_needs_no_reshape():
    nodes = [helper.make_node("Softmax", ["x"], ["y"])]
    model = _model(nodes, [_tensor("x", [2, 5])], [_tensor("y", [2, 5])], opset=12)
    graph = load_onnx(model)
    assert [(node.op, node.attrs) for node in graph.nodes] == [("Softmax", {"axis": -1})]
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    np.testing.assert_allclose(run_reference(graph, {"x": x})["y"], _onnxruntime(model, {"x": x})[0], rtol=1e-5)


def test_resize_11_empty_roi_and_scales_mean_absent():
    nodes = [helper.make_node("Resize", ["x", "roi", "scales", "sizes"], ["y"], mode="nearest")]
    initializers = [
        numpy_helper.from_array(np.zeros(0, np.float32), "roi"),
        numpy_helper.from_array(np.zeros(0, np.float32), "scales"),
        numpy_helper.from_array(np.int64([1, 1, 4, 6]), "sizes"),
    ]
    model = _model(nodes, [_tensor("x", [1, 1, 2, 3])], [_tensor("y", [1, 1, 4, 6])], initializers, opset=11)
    graph = load_onnx(model)
    assert graph.nodes[0].attrs == {"mode": "nearest", "sizes": (1, 1, 4, 6)}
    x = RNG.standard_normal((1, 1, 2, 3)).astype(np.float32)
    np.testing.assert_array_equal(run_reference(graph, {"x": x})["y"], _onnxruntime(model, {"x": x})[0])


def test_one_error_lists_every_unsupported_op_with_its_nodes():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="fine"),
        helper.make_node("Frobnicate", ["a"], ["b"], name="frob_1"),
        helper.make_node("Twiddle", ["b"], ["c"], name="twiddle"),
        helper.make_node("Frobnicate", ["c"], ["d"], name="frob_2"),
        helper.make_node("Frobnicate", ["d"], ["y"], domain="com.example"),
    ]
    with pytest.raises(UnsupportedOpError) as error:
        load_onnx(_model(nodes, [_tensor("x", [2])], [_tensor("y", [2])]))
    assert error.value.ops == {
        "Frobnicate": ["frob_1", "frob_2"],
        "Twiddle": ["twiddle"],
        "com.example.Frobnicate": ["Frobnicate_4"],
    }
    message = str(error.value)
    for name in ("Frobnicate", "frob_1", "frob_2", "Twiddle", "twiddle", "com.example.Frobnicate", "Frobnicate_4"):
        assert name in message


def test_unsupported_ops_are_reported_before_any_other_problem():
    nodes = [helper.make_node("Frobnicate", ["x"], ["y"], name="frob")]
    model = _model(nodes, [_tensor("x", ["batch"])], [_tensor("y", ["batch"])], opset=9)
    with pytest.raises(UnsupportedOpError, match=r"Frobnicate \(nodes: frob\)"):
        load_onnx(model)


def _symbolic_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    return _model(nodes, [_tensor("x", ["batch", 3])], [_tensor("y", ["batch", 3])])


def test_a_symbolic_dimension_says_how_to_fix_it():
    with pytest.raises(ShapeError) as error:
        load_onnx(_symbolic_model())
    message = str(error.value)
    assert "'x'" in message and "batch" in message
    assert "input_shapes={'x': (1, 3)}" in message
    assert "--input-shape x=1,3" in message


def test_input_shapes_fix_a_symbolic_dimension():
    graph = load_onnx(_symbolic_model(), input_shapes={"x": (5, 3)})
    assert graph.inputs[0].type.shape == (5, 3)
    assert graph.outputs[0].type.shape == (5, 3)
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_array_equal(run_reference(graph, {"x": x})["y"], np.maximum(x, 0))


def test_input_shapes_for_a_name_that_is_not_an_input_lists_the_inputs():
    model, _ = _dense_model()
    with pytest.raises(ShapeError, match=r"'weight'.*its inputs are 'x'"):
        load_onnx(model, input_shapes={"weight": (3, 4)})


def test_input_shapes_of_the_wrong_rank_is_an_error():
    with pytest.raises(ShapeError, match=r"rank 3.*declares rank 2"):
        load_onnx(_symbolic_model(), input_shapes={"x": (1, 1, 3)})


def test_an_unsupported_input_dtype_names_the_input():
    nodes = [helper.make_node("Identity", ["text"], ["y"])]
    model = _model(nodes, [_tensor("text", [2], TensorProto.STRING)], [_tensor("y", [2], TensorProto.STRING)])
    with pytest.raises(TesselError, match="input 'text' has dtype STRING"):
        load_onnx(model)


@pytest.mark.parametrize("opset", [9, 22])
def test_an_opset_outside_11_to_21_is_named(opset):
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    with pytest.raises(ModelError, match=f"opset {opset}; Tessel supports opsets 11 to 21"):
        load_onnx(_model(nodes, [_tensor("x", [2])], [_tensor("y", [2])], opset=opset))


def test_weights_in_an_external_file_load_from_the_path_only(tmp_path):
    model, weight = _dense_model()
    path = tmp_path / "dense.onnx"
    onnx.save(model, path, save_as_external_data=True, location="weights.bin", size_threshold=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dense.onnx", "weights.bin"]
    graph = load_onnx(path)
    np.testing.assert_array_equal(next(iter(graph.params.values())), weight)
    with pytest.raises(ModelError, match="external file; compile the model from its path"):
        load_onnx(path.read_bytes())


def test_a_missing_file_is_a_model_error(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        load_onnx(tmp_path / "nowhere.onnx")


def test_an_empty_file_is_a_model_error(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(ModelError, match="is empty"):
        load_onnx(path)


@pytest.mark.parametrize(
    "content",
    [b"hello, this is not a model\n", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", b'{"graph": []}', bytes(range(256))],
)
def test_a_file_that_is_not_onnx_is_a_model_error(tmp_path, content):
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelError, match="not an ONNX model"):
        load_onnx(path)


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9, 0.99])
def test_a_truncated_file_is_a_model_error(tmp_path, fraction):
    data = _dense_model()[0].SerializeToString()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(ModelError):
        load_onnx(path)


_PYTORCH_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
# opset 6 broadcast a PRelu slope of shape [C] along axis 1; onnx.version_converter keeps the slope as it
# is, which later opsets read as numpy broadcasting against the last axis, so the converted model is invalid
_NOT_CONVERTIBLE = {
    f"test_PReLU_{rank}d_multiparam": "version_converter leaves an opset-6 channel-wise PRelu slope"
    for rank in (1, 2, 3)
}


@pytest.mark.parametrize("opset", [11, 18])
def test_pytorch_exports_shipped_with_onnx_match_their_outputs(opset):
    """The PyTorch-exported cases in the onnx wheel (opset 6), converted to `opset` by onnx itself."""
    failures, passed = [], 0
    for case in sorted([*_PYTORCH_DATA.glob("pytorch-converted/*"), *_PYTORCH_DATA.glob("pytorch-operator/*")]):
        if case.name in _NOT_CONVERTIBLE:
            continue
        model = version_converter.convert_version(onnx.load(case / "model.onnx"), opset)
        try:
            graph = load_onnx(model)
            for data_set in sorted(case.glob("test_data_set_*")):
                inputs = [numpy_helper.to_array(onnx.load_tensor(f)) for f in sorted(data_set.glob("input_*.pb"))]
                outputs = [numpy_helper.to_array(onnx.load_tensor(f)) for f in sorted(data_set.glob("output_*.pb"))]
                results = run_reference(graph, {v.name: array for v, array in zip(graph.inputs, inputs)})
                for result, expected in zip(results.values(), outputs, strict=True):
                    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-5)
                passed += 1
        except Exception as error:  # collect every failing case into one report
            failures.append(f"{case.name}: {type(error).__name__}: {str(error).strip().splitlines()[0][:200]}")
    assert not failures, "\n".join(failures)
    assert passed >= 100
