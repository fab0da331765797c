"""The reference executor: runs a Graph (fused or not) node by node with each op's numpy reference. It is
the oracle compiled code is checked against, so it checks the inputs it is given against the graph's and
every result against the type inference gave its node."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from compiler.errors import ShapeError, TesselError
from compiler.graph.ir import Graph, Node, Value
from compiler.graph.registry import get_op


def run_reference(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run `graph` on named numpy inputs; returns the outputs by value name, in `graph.outputs` order."""
    bound = _check_inputs(graph, inputs)
    env = _execute(graph, bound)
    return {v.name: np.array(env[v]) if v in graph.params else env[v] for v in graph.outputs}


def _describe(graph: Graph) -> str:
    return ", ".join(f"{v.name!r} {v.type}" for v in graph.inputs) or "no inputs"


def _check_inputs(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[Value, np.ndarray]:
    expected = {v.name: v for v in graph.inputs}
    unknown = [name for name in inputs if name not in expected]
    missing = [name for name in expected if name not in inputs]
    if unknown or missing:
        problems = []
        if unknown:
            problems.append(f"unknown input(s) {', '.join(map(repr, unknown))}")
        if missing:
            problems.append(f"missing input(s) {', '.join(map(repr, missing))}")
        raise ShapeError(f"{' and '.join(problems)}; the graph takes {_describe(graph)}")
    bound = {}
    for name, value in expected.items():
        array = np.asarray(inputs[name])
        if array.shape != value.type.shape:
            raise ShapeError(
                f"input {name!r} has shape {list(array.shape)}, but the graph takes {list(value.type.shape)}; "
                "reshape it, or compile the model for this shape"
            )
        if str(array.dtype) != value.type.dtype:
            raise TesselError(
                f"input {name!r} has dtype {array.dtype}, but the graph takes {value.type.dtype}; "
                f"convert it with .astype(numpy.{value.type.dtype})"
            )
        bound[value] = array
    return bound


def _execute(graph: Graph, bound: dict[Value, np.ndarray]) -> dict[Value, np.ndarray]:
    env: dict[Value, np.ndarray] = {**graph.params, **bound}
    for node in graph.nodes:
        arguments = [env[v] if v is not None else None for v in node.inputs]
        if node.op == "fused":
            body: Graph = node.attrs["body"]
            inner = _execute(body, dict(zip(body.inputs, arguments, strict=True)))
            results = [inner[v] for v in body.outputs]
        else:
            results = [np.asarray(r) for r in get_op(node.op).run_reference(arguments, node.attrs)]
        _check_results(node, results)
        env.update(zip(node.outputs, results, strict=True))
    return env


def _check_results(node: Node, results: list[np.ndarray]) -> None:
    """A mismatch here is a bug in an op's reference or shape rule, not in the user's model."""
    if len(results) != len(node.outputs):
        raise AssertionError(
            f"node {node.name} ({node.op}) returned {len(results)} results for {len(node.outputs)} outputs"
        )
    for value, result in zip(node.outputs, results, strict=True):
        if result.shape != value.type.shape or str(result.dtype) != value.type.dtype:
            raise AssertionError(
                f"node {node.name} ({node.op}) computed {result.dtype}{list(result.shape)} for %{value.name}, "
                f"but inference typed it {value.type}"
            )
