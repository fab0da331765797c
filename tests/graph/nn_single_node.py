"""Test helper: runs one ONNX node both in an outside oracle (onnxruntime, or ONNX's own reference evaluator for
what onnxruntime lacks) and through Tessel's op registry (shape rule + numpy
reference), moving constant inputs into attrs the way the frontend does, so tests can compare the two."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from single_node import run_registry

from compiler.graph.ir import TensorType
from compiler.graph.registry import get_op


@dataclass(frozen=True)
class NodeRun:
    expected: list[np.ndarray]  # the oracle's outputs
    actual: list[np.ndarray]  # the registry reference's outputs
    inferred: list[TensorType]  # the registry shape rule's output types


def run_node(
    op: str,
    inputs: list[np.ndarray | None],
    attrs: dict | None = None,
    outputs: int = 1,
    opset: int = 21,
    oracle: str = "onnxruntime",
) -> NodeRun:
    const_names = dict(get_op(op).const_inputs)
    while inputs and inputs[-1] is None:
        inputs = inputs[:-1]
    graph_inputs, initializers, names = [], [], []
    feeds: dict[str, np.ndarray] = {}
    for index, array in enumerate(inputs):
        names.append("" if array is None else f"input{index}")
        if array is None:
            continue
        if index in const_names:
            initializers.append(numpy_helper.from_array(array, names[-1]))
        else:
            elem = helper.np_dtype_to_tensor_dtype(array.dtype)
            graph_inputs.append(helper.make_tensor_value_info(names[-1], elem, array.shape))
            feeds[names[-1]] = array
    output_names = [f"output{i}" for i in range(outputs)]
    node = helper.make_node(op, names, output_names, **(attrs or {}))
    inferred, actual = run_registry(node, list(inputs))
    graph_outputs = [
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), None)
        for name, t in zip(output_names, inferred, strict=True)
    ]
    graph = helper.make_graph([node], "single", graph_inputs, graph_outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    if oracle == "onnxruntime":
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        expected = session.run(None, feeds)
    else:
        expected = [np.asarray(array) for array in ReferenceEvaluator(model).run(None, feeds)]
    return NodeRun(expected, actual, inferred)


def check_node(
    op: str,
    inputs: list[np.ndarray | None],
    attrs: dict | None = None,
    outputs: int = 1,
    opset: int = 21,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    oracle: str = "onnxruntime",
) -> NodeRun:
    """Assert that infer() gives exactly the oracle's output types and the reference its values."""
    run = run_node(op, inputs, attrs, outputs, opset, oracle)
    assert len(run.actual) == len(run.expected) == len(run.inferred)
    for expected, actual, inferred in zip(run.expected, run.actual, run.inferred):
        assert inferred == TensorType(expected.shape, str(expected.dtype))
        assert actual.shape == expected.shape and actual.dtype == expected.dtype
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)
    return run
