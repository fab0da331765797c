"""The frontend's validation layer (compiler/frontend/checks.py): each damaged or invalid model of issue 14 ends
in one TesselError naming what is wrong, and the valid ones (local functions, external data) import and match
onnxruntime."""

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.build import INDEX_LIMIT
from compiler.cli import main
from compiler.errors import ModelError, ShapeError, TesselError
from compiler.frontend import load_onnx
from compiler.frontend.checks import DENSE_LIMIT
from compiler.frontend.onnx import external_data_files, model_in_folder
from compiler.graph.reference import run_reference

RNG = np.random.default_rng(0)
ROOT = Path(__file__).resolve().parents[2]


def _model(nodes, inputs, outputs, initializers=(), opset=17, **kwargs) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8, **kwargs)


def _tensor(name, shape, elem_type=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem_type, shape)


def _relu() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [_tensor("x", [2, 3])], [_tensor("y", [2, 3])])


def _onnxruntime(model: onnx.ModelProto, feeds: dict) -> list:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _dense(weight: np.ndarray) -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "weight"], ["y"], name="dense")]
    return _model(nodes, [_tensor("x", [2, 3])], [_tensor("y", [2, 4])], [numpy_helper.from_array(weight, "weight")])


def test_a_model_with_a_local_function_is_inlined_and_matches_onnxruntime():
    function = helper.make_function(
        "local",
        "Swish",
        ["a"],
        ["b"],
        [helper.make_node("Sigmoid", ["a"], ["s"]), helper.make_node("Mul", ["a", "s"], ["b"])],
        [helper.make_opsetid("", 17)],
    )
    nodes = [helper.make_node("Swish", ["x"], ["y"], domain="local", name="swish")]
    model = _model(
        nodes,
        [_tensor("x", [2, 3])],
        [_tensor("y", [2, 3])],
        functions=[function],
    )
    model.opset_import.append(helper.make_opsetid("local", 1))
    onnx.checker.check_model(model)
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    got = run_reference(load_onnx(model), {"x": x})["y"]
    np.testing.assert_allclose(got, _onnxruntime(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_raw_data_longer_than_its_dims_names_the_initializer():
    model = _dense(np.ones((3, 4), np.float32))
    model.graph.initializer[0].raw_data += b"\0"
    with pytest.raises(ModelError, match=r"initializer 'weight' has dims \[3, 4\], which need 48 bytes.*holds 49"):
        load_onnx(model)


def test_typed_data_that_does_not_match_its_dims_names_the_initializer():
    model = _dense(np.ones((3, 4), np.float32))
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.float_data.extend([1.0] * 11)
    with pytest.raises(ModelError, match=r"initializer 'weight' .* need 12 values, but it holds 11"):
        load_onnx(model)


def test_a_negative_input_dim_is_a_shape_error():
    model = _relu()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -2
    with pytest.raises(ShapeError, match=r"input 'x' has the shape \[-2, 3\]; dimensions must be >= 0"):
        load_onnx(model)


def test_a_shape_whose_byte_size_overflows_int64_is_refused():
    model = _model(
        [helper.make_node("Softmax", ["x"], ["y"])], [_tensor("x", [2, 2**63 - 1, 4, 6])], [_tensor("y", [2, 4])]
    )
    with pytest.raises(ShapeError, match="more bytes than a 64-bit size can count"):
        load_onnx(model)


def test_a_tensor_attribute_where_ints_are_expected_names_the_attribute():
    pads = helper.make_tensor("pads", TensorProto.INT64, [4], [1, 1, 1, 1])
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=pads)
    weight = numpy_helper.from_array(np.ones((1, 1, 3, 3), np.float32), "w")
    model = _model([node], [_tensor("x", [1, 1, 5, 5])], [_tensor("y", [1, 1, 5, 5])], [weight])
    with pytest.raises(
        ModelError, match=r"node conv \(Conv\): attribute 'pads' is of type TENSOR, but Conv takes INTS there"
    ):
        load_onnx(model)


def test_a_node_without_its_inputs_names_the_node():
    model = _relu()
    del model.graph.node[0].input[:]
    with pytest.raises(ModelError, match=r"node relu \(Relu\): it has 0 inputs, but Relu .* takes 1"):
        load_onnx(model)


def test_an_empty_required_input_names_the_node():
    model = _dense(np.ones((3, 4), np.float32))
    model.graph.node[0].input[1] = ""
    with pytest.raises(ModelError, match=r"node dense \(MatMul\): its input 1 \('B'\) is left empty"):
        load_onnx(model)


@pytest.mark.parametrize("indices", [[0, 12], [-1, 3]])
def test_a_sparse_initializer_index_outside_its_dims_is_refused(indices):
    values = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "weight")
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array(indices, np.int64)), [3, 4])
    model = _dense(np.ones((3, 4), np.float32))
    del model.graph.initializer[:]
    model.graph.sparse_initializer.append(sparse)
    with pytest.raises(ModelError, match=r"initializer 'weight''s index -?\d+ lies outside its dims \[3, 4\]"):
        load_onnx(model)


def test_a_sparse_initializer_in_range_loads_densely():
    values = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "weight")
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([0, 11], np.int64)), [3, 4])
    model = _dense(np.ones((3, 4), np.float32))
    del model.graph.initializer[:]
    model.graph.sparse_initializer.append(sparse)
    (weight,) = load_onnx(model).params.values()
    assert weight.reshape(-1)[[0, 11]].tolist() == [1.0, 2.0] and weight.sum() == 3.0


def _sparse_softmax(dims) -> onnx.ModelProto:
    """A Softmax over one sparse initializer: about 250 bytes however large its dims."""
    values = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "weight")
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([0, 1], np.int64)), dims)
    model = _model([helper.make_node("Softmax", ["weight"], ["y"], name="softmax")], [], [_tensor("y", None)])
    model.graph.sparse_initializer.append(sparse)
    return model


@pytest.mark.parametrize("dims", [[1 << 40, 4], [1 << 20, 1 << 20], [DENSE_LIMIT + 1], [3, 1 << 59]])
def test_a_sparse_initializer_too_large_to_make_dense_is_one_clear_error(tmp_path, capsys, dims):
    path = tmp_path / "softmax.onnx"
    onnx.save(_sparse_softmax(dims), path)
    assert main(["compile", str(path), "-o", str(tmp_path / "bundle")]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [
        f"tessel: error: initializer 'weight' is a sparse tensor of dims {dims}: {math.prod(dims):,} elements once "
        "dense, and Tessel stores every weight dense, in tensors its kernels index with 32-bit integers (at most "
        "2,147,483,647 elements); give it smaller dims"
    ]


def test_the_dense_limit_of_a_sparse_tensor_is_what_a_kernel_indexes():
    assert DENSE_LIMIT == INDEX_LIMIT


def test_a_sparse_tensor_constant_too_large_to_make_dense_names_the_node():
    sparse = _sparse_softmax([1 << 40]).graph.sparse_initializer[0]
    nodes = [helper.make_node("Constant", [], ["c"], sparse_value=sparse, name="huge")]
    with pytest.raises(
        ModelError, match=r"node huge \(Constant\): attribute 'sparse_value' is a sparse tensor of dims"
    ):
        load_onnx(_model(nodes, [], [_tensor("c", None)]))


def test_a_sparse_initializer_that_fits_the_limit_but_not_the_memory_is_one_clear_error(tmp_path):
    """Under the element limit, the dense array may still be more than the process may allocate (the service
    imports in a memory-limited process): a ModelError, not a MemoryError's traceback."""
    path = tmp_path / "softmax.onnx"
    onnx.save(_sparse_softmax([1 << 15, 1 << 15]), path)  # 4 GiB of float32 once dense
    script = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
        "from compiler.cli import main; sys.exit(main(['compile', sys.argv[1], '-o', sys.argv[2]]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path), str(tmp_path / "bundle")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "tessel: error: initializer 'weight' is a sparse tensor of dims [32768, 32768], which Tessel stores dense: "
        "its 4,294,967,296 bytes are more memory than this process may take"
    ]


def test_a_value_name_that_is_not_utf8_is_refused():
    data = _relu().SerializeToString().replace(b"\x12\x01y", b"\x12\x01\xff")
    with pytest.raises(ModelError, match="output 0 of node relu .* is not valid UTF-8"):
        load_onnx(data)


def test_an_attribute_string_that_is_not_utf8_is_refused():
    node = helper.make_node("Pad", ["x", "pads"], ["y"], name="pad", mode="constant")
    node.attribute[0].s = b"\xffconstant"
    pads = numpy_helper.from_array(np.zeros(4, np.int64), "pads")
    model = _model([node], [_tensor("x", [2, 3])], [_tensor("y", [2, 3])], [pads])
    with pytest.raises(ModelError, match=r"node pad \(Pad\): attribute 'mode' is not valid UTF-8"):
        load_onnx(model)


def test_mixed_dtypes_in_one_type_parameter_are_refused_as_onnxruntime_refuses_them():
    nodes = [helper.make_node("Gemm", ["x", "w"], ["y"], name="gemm")]
    weight = numpy_helper.from_array(np.ones((3, 2), np.float32), "w")
    model = _model(nodes, [_tensor("x", [2, 3], TensorProto.INT64)], [_tensor("y", [2, 2])], [weight])
    with pytest.raises(Exception, match="bound to different types"):
        _onnxruntime(model, {"x": np.ones((2, 3), np.int64)})
    with pytest.raises(
        ModelError, match=r"node gemm \(Gemm\): input 1 \('B'\) is float32 but input 0 \('A'\) is int64"
    ):
        load_onnx(model)


def test_a_dtype_outside_the_schema_is_refused():
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [_tensor("x", [2], TensorProto.BOOL)], [])
    model.graph.output.append(_tensor("y", [2], TensorProto.BOOL))
    with pytest.raises(ModelError, match=r"node relu \(Relu\): input 0 \('X'\) is bool, which Relu does not take"):
        load_onnx(model)


def test_an_unknown_attribute_is_refused():
    model = _dense(np.ones((3, 4), np.float32))
    model.graph.node[0].attribute.append(helper.make_attribute("transA", 1))
    with pytest.raises(
        ModelError, match=r"node dense \(MatMul\): it has the attribute 'transA', which MatMul does not"
    ):
        load_onnx(model)


def test_a_flag_attribute_outside_0_and_1_is_refused():
    shape = numpy_helper.from_array(np.array([3, 2], np.int64), "shape")
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape", allowzero=-1)
    model = _model([node], [_tensor("x", [2, 3])], [_tensor("y", [3, 2])], [shape])
    with pytest.raises(ModelError, match=r"node reshape \(Reshape\): attribute 'allowzero' is -1; it is a flag"):
        load_onnx(model)


def test_the_default_domain_s_long_name_finds_the_schema():
    model = _relu()
    model.graph.node[0].domain = "ai.onnx"
    assert [node.op for node in load_onnx(model).nodes] == ["Relu"]


def test_an_op_the_schema_does_not_know_is_refused_even_if_tessel_has_it():
    model = _relu()
    model.graph.node[0].op_type = "LayoutTransform"
    with pytest.raises(ModelError, match="ONNX has no operator 'LayoutTransform'"):
        load_onnx(model)


def test_import_time_folding_leaves_a_huge_constant_unfolded():
    # 200 bytes of model that would fold into a 256 GiB constant
    shape = numpy_helper.from_array(np.array([2**34, 4], np.int64), "shape")
    one = numpy_helper.from_array(np.ones(1, np.float32), "one")
    nodes = [helper.make_node("Expand", ["one", "shape"], ["y"], name="expand")]
    graph = load_onnx(_model(nodes, [], [_tensor("y", [2**34, 4])], [one, shape]))
    assert [node.op for node in graph.nodes] == ["Expand"]
    assert graph.outputs[0].type.shape == (2**34, 4)


def test_external_data_loads_from_beside_the_model_and_is_listed(tmp_path):
    weight = RNG.standard_normal((3, 4)).astype(np.float32)
    path = tmp_path / "dense.onnx"
    onnx.save(_dense(weight), path, save_as_external_data=True, location="dense.onnx.data", size_threshold=0)
    np.testing.assert_array_equal(next(iter(load_onnx(path).params.values())), weight)
    assert external_data_files(path) == [tmp_path / "dense.onnx.data"]
    assert model_in_folder(tmp_path) == path


def _with_location(tmp_path, location: str):
    path = tmp_path / "model" / "dense.onnx"
    path.parent.mkdir()
    onnx.save(_dense(np.ones((3, 4), np.float32)), path, save_as_external_data=True, location="w.bin", size_threshold=0)
    model = onnx.load(path, load_external_data=False)
    model.graph.initializer[0].external_data[0].value = location
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin"])
def test_external_data_outside_the_model_folder_is_refused(tmp_path, location):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 48)
    path = _with_location(tmp_path, location)
    for load in (load_onnx, external_data_files):
        with pytest.raises(ModelError, match=f"tensor 'weight' keeps its data in '{location}', outside the model's"):
            load(path)


def test_missing_or_short_external_data_is_named(tmp_path):
    path = _with_location(tmp_path, "gone.bin")
    with pytest.raises(ModelError, match="keeps its data in 'gone.bin', which is missing"):
        load_onnx(path)
    (path.parent / "gone.bin").write_bytes(b"\0" * 47)
    with pytest.raises(ModelError, match=r"tensor 'weight' \(data file 'gone.bin'\) asks for 48 bytes .* has 47"):
        load_onnx(path)


def test_every_failure_is_a_tessel_error_with_the_node_named():
    # a reference that fails on values the schema allows (a kernel_shape that disagrees with the weight)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", kernel_shape=[5, 5])
    weight = numpy_helper.from_array(np.ones((1, 1, 3, 3), np.float32), "w")
    model = _model([node], [_tensor("x", [1, 1, 5, 5])], [_tensor("y", [1, 1, 5, 5])], [weight])
    with pytest.raises(TesselError, match=r"node conv \(Conv\)"):
        load_onnx(model)


def test_a_local_function_whose_domain_is_not_imported_is_refused():
    function = helper.make_function("local", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])], [])
    function.opset_import.append(helper.make_opsetid("", 17))
    model = _model([helper.make_node("Twice", ["x"], ["y"], domain="local")], [_tensor("x", [2])], [_tensor("y", [2])])
    model.functions.append(function)
    with pytest.raises(ModelError, match="is in domain 'local', of which the model imports no opset"):
        load_onnx(model)


def test_clip_bounds_must_be_scalars():
    bounds = [
        numpy_helper.from_array(np.zeros(3, np.float32), "low"),
        numpy_helper.from_array(np.ones(1, np.float32), "high"),
    ]
    node = helper.make_node("Clip", ["x", "low", "high"], ["y"], name="clip")
    model = _model([node], [_tensor("x", [2, 3])], [_tensor("y", [2, 3])], bounds)
    with pytest.raises(ShapeError, match=r"node clip \(Clip\): Clip's min must be a scalar, but it holds 3 values"):
        load_onnx(model)


def test_a_graph_output_declared_with_another_dtype_is_refused():
    model = _relu()
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT32
    with pytest.raises(
        ModelError, match="graph output 'y' is declared INT32, but the node that makes it computes float32"
    ):
        load_onnx(model)


@pytest.mark.parametrize("ir_version", [0, 2, onnx.IR_VERSION + 1])
def test_an_ir_version_onnxruntime_cannot_read_is_refused(ir_version):
    model = _relu()
    model.ir_version = ir_version
    with pytest.raises(ModelError, match=f"has ONNX IR version {ir_version}; Tessel reads IR versions 3 to"):
        load_onnx(model)
