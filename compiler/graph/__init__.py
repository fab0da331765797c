"""Graph IR and op registry. Importing the package registers every op (compiler/graph/ops/), so the registry is
complete before any node is added or verified."""

import compiler.graph.ops  # noqa: F401  (registers every op)
from compiler.graph.ir import DTYPES, Graph, GraphError, Node, TensorType, Value
from compiler.graph.registry import OpDef, Pattern, get_op, registered_ops

__all__ = [
    "DTYPES",
    "Graph",
    "GraphError",
    "Node",
    "OpDef",
    "Pattern",
    "TensorType",
    "Value",
    "get_op",
    "registered_ops",
]
