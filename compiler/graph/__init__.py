"""Graph IR and op registry."""

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
