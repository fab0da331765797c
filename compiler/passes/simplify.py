"""Algebraic simplification, run after batch-norm folding: removes ops that compute nothing at
inference and merges chains of layout ops into one.

Hands on a graph with the same graph-output Values and fewer nodes for fusion to group.
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node, Value

RESHAPES = ("Reshape", "Flatten")

# op -> (input positions that may hold the neutral param, the neutral element)
NEUTRAL_OPERANDS = {"Add": ((0, 1), 0), "Sub": ((1,), 0), "Mul": ((0, 1), 1), "Div": ((1,), 1)}


def simplify(graph: Graph) -> Graph:
    """Remove Identity, inference Dropout, same-shape Reshape, identity Transpose and x*1, x+0, x-0, x/1; write
    x ** 2 as x * x; merge Reshape/Flatten chains into one Reshape and Transpose chains into one Transpose; graph
    outputs keep their Values.

    One walk in topological order, so the pass is linear in the nodes: each node first reads its inputs through the
    renames of the nodes removed before it, then is merged into its producer or removed as often as that applies."""
    return _Simplifier(graph.copy()).run()


class _Simplifier:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.outputs = set(graph.outputs)
        self.rename: dict[Value, Value] = {}
        self.producer: dict[Value, Node] = {}
        self.dropped: set[int] = set()
        # how many nodes read each value: a merged-away producer is removed when nothing else reads it
        self.readers: dict[Value, int] = {}
        for node in graph.nodes:
            for value in set(node.inputs):
                self.readers[value] = self.readers.get(value, 0) + 1

    def resolve(self, value: Value | None) -> Value | None:
        while value in self.rename:
            value = self.rename[value]
        return value

    def run(self) -> Graph:
        kept: list[Node] = []
        for node in self.graph.nodes:
            node.inputs = [self.resolve(value) for value in node.inputs]
            node = self.rewrite(node)
            if node is not None:
                kept.append(node)
                self.producer.update((value, node) for value in node.outputs)
        self.graph.nodes = [node for node in kept if id(node) not in self.dropped]
        for node in self.graph.nodes:
            node.inputs = [self.resolve(value) for value in node.inputs]
        return self.graph

    def rewrite(self, node: Node) -> Node | None:
        """The node after every rewrite that applies to it, or None when it is removed."""
        while True:
            square = _square(node, self.graph)
            if square is not None:
                if node.inputs[1] not in square.inputs:
                    self.readers[node.inputs[1]] -= 1
                node = square
            alias = _alias(node, self.graph, self.readers)
            if alias is not None and self.remove(node, alias):
                return None
            source = self.producer.get(node.inputs[0]) if node.inputs else None
            merged = _merge(source, node) if source is not None and _merges(source, node) else None
            if merged is None:
                return node
            middle = node.inputs[0]
            self.readers[middle] -= 1
            self.readers[merged.inputs[0]] = self.readers.get(merged.inputs[0], 0) + 1
            if not self.readers[middle] and middle not in self.outputs:
                self.drop(source)
            node = merged

    def drop(self, node: Node) -> None:
        self.dropped.add(id(node))
        for value in node.outputs:
            del self.producer[value]
        for value in set(node.inputs):
            self.readers[value] -= 1

    def remove(self, node: Node, alias: Value) -> bool:
        """Drop `node`, whose first output equals `alias`; False when that would rename a graph output."""
        output = node.outputs[0]
        if output in self.outputs and (alias in self.outputs or alias not in self.producer):
            return False
        for value in set(node.inputs):
            self.readers[value] -= 1
        if output in self.outputs:
            # the output Value must survive, so the alias's producer defines it instead of the alias
            producer = self.producer.pop(alias)
            producer.outputs[producer.outputs.index(alias)] = output
            self.producer[output] = producer
            self.rename[alias] = output
            self.readers[output] = self.readers.get(output, 0) + self.readers.pop(alias, 0)
        else:
            self.rename[output] = alias
            self.readers[alias] += self.readers.pop(output, 0)
        return True


def _alias(node: Node, graph: Graph, readers: dict[Value, int]) -> Value | None:
    """The input that the node's only live output always equals, or None."""
    output = node.outputs[0]
    if node.op == "Identity":
        return node.inputs[0]
    if node.op == "Dropout":
        unused = all(not readers.get(value) and value not in graph.outputs for value in node.outputs[1:])
        return node.inputs[0] if unused and not node.attrs.get("training_mode", 0) else None
    if node.op in RESHAPES and node.inputs[0].type == output.type:
        return node.inputs[0]
    if node.op == "Transpose" and permutation(node) == tuple(range(len(output.type.shape))):
        return node.inputs[0]
    if node.op in NEUTRAL_OPERANDS:
        positions, neutral = NEUTRAL_OPERANDS[node.op]
        for position in positions:
            operand, other = node.inputs[position], node.inputs[1 - position]
            array = graph.params.get(operand)
            if array is not None and other.type == output.type and np.all(array == neutral):
                return other
    return None


def _square(node: Node, graph: Graph) -> Node | None:
    """x * x for a float Pow whose exponent is the constant 2 and does not broadcast x: the same correctly rounded
    value, where a pow reads its exponent at run time and evaluates exp(2 log x) (bert_tiny's decomposed layer
    norms, 1 thread: each variance pass 0.031-0.033 ms with the pow, 0.005-0.007 as a multiply)."""
    if node.op != "Pow" or len(node.inputs) != 2:
        return None
    base, exponent = node.inputs
    array = graph.params.get(exponent)
    if array is None or not np.all(array == 2) or base.type != node.outputs[0].type:
        return None
    if not np.issubdtype(np.dtype(base.type.dtype), np.floating):
        return None
    return Node("Mul", [base, base], node.outputs, {}, node.name)


def _merges(source: Node, node: Node) -> bool:
    return (source.op in RESHAPES and node.op in RESHAPES) or (source.op == node.op == "Transpose")


def _merge(source: Node, node: Node) -> Node | None:
    """One node computing node(source(x)) from x; None when the result cannot be written as one node."""
    origin, output = source.inputs[0], node.outputs[0]
    if node.op == "Transpose":
        first, second = permutation(source), permutation(node)
        composed = tuple(first[axis] for axis in second)
        return Node("Transpose", [origin], [output], {"perm": composed}, node.name)
    if 0 in output.type.shape:
        # an explicit 0 in a Reshape shape means "copy this dimension", not an empty one
        return None
    return Node("Reshape", [origin], [output], {"shape": output.type.shape}, node.name)


def permutation(node: Node) -> tuple[int, ...]:
    rank = len(node.inputs[0].type.shape)
    return tuple(node.attrs.get("perm", range(rank - 1, -1, -1)))
