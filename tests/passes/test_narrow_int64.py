"""narrow_int64 stores a graph's int64 values as int32 for a device without int64 (webgpu) and leaves the graph alone
for a device that has it."""

import numpy as np
import pytest

from compiler.errors import ModelError
from compiler.graph.ir import Graph, TensorType
from compiler.passes.narrow_int64 import narrow_int64
from compiler.target import Target


def _graph(offsets: np.ndarray) -> Graph:
    graph = Graph(name="ids")
    ids = graph.add_input("ids", TensorType((4,), "int64"))
    table = graph.add_param("table", np.ones((10, 3), np.float32))
    (rows,) = graph.add_node("Gather", [table, ids], {"axis": 0})
    (shifted,) = graph.add_node("Add", [ids, graph.add_param("offsets", offsets)])
    (wide,) = graph.add_node("Cast", [rows], {"to": "int64"})
    graph.outputs = [rows, shifted, wide]
    return graph


def test_int64_values_become_int32_on_webgpu_and_stay_elsewhere():
    graph = _graph(np.array([1, 2, 3, -4], np.int64))
    narrowed = narrow_int64(graph, Target.parse("webgpu"))
    narrowed.verify()
    assert [value.type.dtype for value in narrowed.inputs] == ["int32"]
    assert [value.type.dtype for value in narrowed.outputs] == ["float32", "int32", "int32"]
    assert {array.dtype for array in narrowed.params.values()} == {np.dtype("float32"), np.dtype("int32")}
    assert [value.type.dtype for value in graph.inputs] == ["int64"]
    assert narrow_int64(graph, Target.parse("opencl")) is graph


def test_a_constant_outside_int32_is_refused_by_name():
    with pytest.raises(ModelError, match="constant 'offsets'"):
        narrow_int64(_graph(np.array([0, 0, 0, 1 << 31], np.int64)), Target.parse("webgpu"))
