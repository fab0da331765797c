"""Test helper (not collected): one-node ONNX models run by onnxruntime and by the op registry.

It hands attributes and constant inputs to the registry the way the op contract says the frontend
does, then checks `infer` against onnxruntime's output types and `reference` against its values.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import helper, numpy_helper

from compiler.frontend.onnx import as_attribute, attribute_value
from compiler.graph.ir import TensorType
from compiler.graph.registry import get_op


def registry_attrs(node: onnx.NodeProto) -> dict:
    """The node's attributes converted exactly as the frontend converts them for the registry."""
    return {a.name: attribute_value(a, node.op_type, f"attribute {a.name}") for a in node.attribute}


def run_registry(node: onnx.NodeProto, arrays: list[np.ndarray | None]):
    """Types from `infer` and arrays from `reference` for `node` on `arrays` (one per ONNX input,
    None where omitted), with the op's const inputs moved into attrs."""
    op = get_op(node.op_type)
    attrs = registry_attrs(node)
    const_indices = dict(op.const_inputs)
    tensors = []
    for index, array in enumerate(arrays):
        if index in const_indices:
            if array is not None:
                attrs[const_indices[index]] = as_attribute(np.asarray(array), node.op_type)
        else:
            tensors.append(array)
    while tensors and tensors[-1] is None:
        tensors.pop()
    outputs = [name for name in node.output]
    while outputs and not outputs[-1]:
        outputs.pop()
    if len(outputs) > 1:
        attrs["_outputs"] = len(outputs)
    types = op.infer([None if a is None else TensorType(a.shape, str(a.dtype)) for a in tensors], attrs)
    results = op.run_reference(tensors, attrs)
    return types, results


def assert_same(expected: np.ndarray, actual: np.ndarray, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    actual = np.asarray(actual)
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype}, expected {expected.dtype}"
    assert actual.shape == expected.shape, f"shape {actual.shape}, expected {expected.shape}"
    if expected.dtype.kind == "f":
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    else:
        np.testing.assert_array_equal(actual, expected)


def check_op(
    op_type: str,
    inputs: list[np.ndarray | None],
    attrs: dict | None = None,
    outputs: int = 1,
    opset: int = 21,
    rtol: float = 1e-4,
    atol: float = 1e-5,
) -> list[np.ndarray]:
    """Build `op_type` on `inputs` (the op's const inputs become initializers), run it through
    onnxruntime and the registry, and assert both agree; returns onnxruntime's outputs."""
    const_indices = dict(get_op(op_type).const_inputs)
    names = ["" if array is None else f"input{index}" for index, array in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    output_names = [f"output{index}" for index in range(outputs)]
    node = helper.make_node(op_type, names, output_names, **(attrs or {}))
    graph_inputs, initializers, feeds = [], [], {}
    for index, (name, array) in enumerate(zip(names, inputs)):
        if array is None:
            continue
        if index in const_indices:
            initializers.append(numpy_helper.from_array(np.asarray(array), name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), None))
            feeds[name] = array
    graph_outputs = [helper.make_empty_tensor_value_info(name) for name in output_names]
    graph = helper.make_graph([node], "single", graph_inputs, graph_outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    types, results = run_registry(node, list(inputs))
    assert types == [TensorType(e.shape, str(e.dtype)) for e in expected], f"infer gave {types}"
    assert len(results) == len(expected)
    for want, got in zip(expected, results):
        assert_same(want, got, rtol, atol)
    return expected
