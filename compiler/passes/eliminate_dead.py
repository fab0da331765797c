"""Dead-code elimination, run after constant folding and again at the end of the pass pipeline.

Hands on a graph holding only the nodes and params that some graph output depends on.
"""

from __future__ import annotations

from compiler.graph.ir import Graph, Value


def eliminate_dead(graph: Graph) -> Graph:
    """Drop every node none of whose outputs reaches a graph output, and every param no kept node uses."""
    result = graph.copy()
    live: set[Value] = set(result.outputs)
    kept = []
    for node in reversed(result.nodes):
        if any(value in live for value in node.outputs):
            kept.append(node)
            live.update(value for value in node.inputs if value is not None)
    result.nodes = kept[::-1]
    result.params = {value: array for value, array in result.params.items() if value in live}
    return result
