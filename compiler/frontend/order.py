"""The order the importer reads an ONNX graph's nodes in: a topological order of their data dependencies. ONNX
requires the node list to be sorted, but writers break it (onnxruntime's float16 converter appends the Casts of
keep_io_types at the end) and onnxruntime sorts the graph itself, so Tessel does too. Only a real cycle, or a value
defined twice, is refused, each with one ModelError naming the nodes.
"""

from __future__ import annotations

import heapq

import onnx
from onnx import AttributeProto

from compiler.errors import ModelError

# A cycle longer than this is shown by its first and last nodes.
_CYCLE_SHOWN = 12


def node_label(node: onnx.NodeProto, index: int) -> str:
    """How errors name a node: its name, or its op type and its position in the file."""
    return node.name or f"{node.op_type}_{index}"


def _described(graph: onnx.GraphProto, index: int) -> str:
    node = graph.node[index]
    return f"node {node_label(node, index)} ({node.op_type})"


def outer_names(graph: onnx.GraphProto) -> set[str]:
    """The names a subgraph (an If branch, a Loop or Scan body) reads from the scopes around it: those its nodes and
    its own subgraphs use that neither its inputs, initializers nor nodes define."""
    defined = {info.name for info in graph.input}
    defined.update(tensor.name for tensor in graph.initializer)
    defined.update(sparse.values.name for sparse in graph.sparse_initializer)
    defined.update(name for node in graph.node for name in node.output)
    used = {name for node in graph.node for name in node_inputs(node)}
    return {name for name in used if name and name not in defined}


def node_inputs(node: onnx.NodeProto) -> list[str]:
    """Every name a node reads: its inputs, then the outer-scope names its subgraph attributes read."""
    names = list(node.input)
    for attribute in node.attribute:
        if attribute.type == AttributeProto.GRAPH:
            names += sorted(outer_names(attribute.g))
        elif attribute.type == AttributeProto.GRAPHS:
            names += sorted(name for graph in attribute.graphs for name in outer_names(graph))
    return names


def _definitions(graph: onnx.GraphProto) -> dict[str, int]:
    """Which node makes each value; a ModelError naming both definitions of a value defined twice."""
    defined: dict[str, str] = {info.name: f"graph input {info.name!r}" for info in graph.input}
    # before IR version 4 every initializer was also listed as a graph input: that is one definition
    defined.update({tensor.name: f"initializer {tensor.name!r}" for tensor in graph.initializer})
    defined.update({sparse.values.name: f"initializer {sparse.values.name!r}" for sparse in graph.sparse_initializer})
    producer: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for name in node.output:
            if not name:
                continue  # an optional output nobody asked for
            if name in defined:
                raise ModelError(
                    f"value {name!r} is defined twice, by {defined[name]} and by {_described(graph, index)}; every "
                    "value of an ONNX graph has one definition: export the model again"
                )
            defined[name] = _described(graph, index)
            producer[name] = index
    return producer


def node_order(graph: onnx.GraphProto) -> list[int]:
    """The positions of the graph's nodes in an order where each comes after the nodes whose outputs it reads. It is
    stable: of the nodes that are ready, the earliest in the file goes first, so a sorted model keeps its order
    exactly. A name no node defines is no dependency here (the importer names it if no input or initializer
    defines it either); a cycle is a ModelError naming its nodes."""
    producer = _definitions(graph)
    depends = [{producer[name] for name in node_inputs(node) if name in producer} for node in graph.node]
    users: list[list[int]] = [[] for _ in graph.node]
    for index, producers in enumerate(depends):
        for source in producers:
            users[source].append(index)
    waiting = [len(producers) for producers in depends]
    ready = [index for index, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for user in users[index]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    if len(order) < len(graph.node):
        _refuse_cycle(graph, producer, {index for index, count in enumerate(waiting) if count > 0})
    return order


def _refuse_cycle(graph: onnx.GraphProto, producer: dict[str, int], blocked: set[int]) -> None:
    """Every node the sort could not place waits on another such node, so walking from one to a blocked producer
    of its inputs must come back to a node already seen: the nodes from there on are a cycle."""

    def blocked_input(index: int) -> tuple[str, int]:
        return next(
            (name, producer[name])
            for name in node_inputs(graph.node[index])
            if name in producer and producer[name] in blocked
        )

    walk, seen = [min(blocked)], {}
    while walk[-1] not in seen:
        seen[walk[-1]] = len(walk) - 1
        walk.append(blocked_input(walk[-1])[1])
    cycle = walk[seen[walk[-1]] : -1][::-1]  # the walk went from users to producers
    start = cycle.index(min(cycle))  # begin where the file does
    cycle = cycle[start:] + cycle[:start]
    made = [blocked_input(cycle[(k + 1) % len(cycle)])[0] for k in range(len(cycle))]
    steps = [f"{_described(graph, cycle[0])} makes {made[0]!r}"]
    steps += [f"read by {_described(graph, index)}, which makes {name!r}" for index, name in zip(cycle[1:], made[1:])]
    if len(steps) > _CYCLE_SHOWN:
        half = _CYCLE_SHOWN // 2
        steps = [*steps[:half], f"... {len(steps) - 2 * half} more nodes ...", *steps[-half:]]
    first = _described(graph, cycle[0])
    what = f"{first} reads its own output" if len(cycle) == 1 else f"{len(cycle)} nodes form a cycle"
    raise ModelError(
        f"the model's graph is not acyclic: {what} ({', '.join(steps)}, read by {first}); Tessel sorts the nodes of "
        "any acyclic graph, but a value cannot depend on itself: a repeated computation belongs in a Loop or Scan "
        "node, so fix the tool that wrote this graph and export the model again"
    )
