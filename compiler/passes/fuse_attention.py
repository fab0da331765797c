"""Attention as the exporters write it, made one op for CPU targets: MatMul(Q, Kt), an optional scale (Mul or Div by a
scalar param) and additive mask (Add), Softmax over the last axis, an optional guard that turns its NaNs into zeros
(Where(IsNaN(p), 0, p): torch's scaled_dot_product_attention for fully masked rows) and MatMul(p, V) become one
Attention node. Several constant additive terms between the scores and the softmax, with reshapes between them (Swin's
relative position bias, then its shifted-window mask added to the scores viewed per window) are first merged into one
constant mask, when it stays within the constant-folding size limit; so the kernel stage makes the scores, their softmax and the product with V per tile of query rows,
in cache, and the (..., M, N) score matrix never reaches memory. Runs before alter_layout; hands it a graph whose
attention blocks are Attention nodes (compiler/graph/ops/dense.py).
"""

from __future__ import annotations

import numpy as np

from compiler.errors import ShapeError
from compiler.graph.ir import Graph, Node, Value
from compiler.graph.ops.dense import attention_types
from compiler.graph.registry import worth_folding
from compiler.target import Target

# The most keys an Attention takes: a task holds its row tile's scores and their exponentials in local buffers
# (compiler/schedules/cpu/attention.py), at most a few hundred KB within a wasm worker's 1 MB stack
MAX_KEYS = 4096


def fuse_attention(graph: Graph, target: Target) -> Graph:
    """Every float32 softmax(Q Kt [* scale] [+ mask]) V over at most MAX_KEYS keys whose intermediate values nothing
    else reads becomes an Attention node computing the last MatMul's output."""
    result = _merge_masks(graph.copy())
    blocks = _Blocks(result)
    replaced: dict[int, Node] = {}
    removed: set[int] = set()
    for node in result.nodes:
        if node.op == "Softmax":
            found = blocks.match(node)
            if found is not None:
                attention, members = found
                replaced[id(members[-1])] = attention
                removed.update(id(member) for member in members)
    result.nodes = [
        replaced.get(id(node), node) for node in result.nodes if id(node) not in removed or id(node) in replaced
    ]
    return result


class _Blocks:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.producer = {value: node for node in graph.nodes for value in node.outputs}
        self.readers: dict[Value, list[Node]] = {}
        for node in graph.nodes:
            for value in node.inputs:
                if value is not None:
                    self.readers.setdefault(value, []).append(node)

    def private(self, value: Value) -> bool:
        """Whether `value` is read by one node and is not a graph output."""
        return len(self.readers.get(value, [])) == 1 and value not in self.graph.outputs

    def scalar(self, value: Value | None) -> float | None:
        """The value of a one-element param, else None."""
        array = self.graph.params.get(value)
        return float(array.reshape(-1)[0]) if array is not None and array.size == 1 else None

    def match(self, softmax: Node) -> tuple[Node, list[Node]] | None:
        """(the Attention node, the nodes it replaces in graph order) for the block around `softmax`, or None."""
        (logits,) = softmax.inputs[:1]
        rank = len(logits.type.shape)
        if logits.type.dtype != "float32" or rank < 2 or int(softmax.attrs.get("axis", -1)) not in (-1, rank - 1):
            return None
        members, mask, scale = [softmax], None, 1.0
        value = logits
        step = self.producer.get(value)
        if step is not None and step.op == "Add" and self.private(value):
            scores_side = [u for u in step.inputs if self.producer.get(u) is not None and self._leads_to_matmul(u)]
            if len(scores_side) == 1:
                (value,) = scores_side
                mask = next(u for u in step.inputs if u is not value)
                members.insert(0, step)
                step = self.producer.get(value)
        scaled = self.scaled(step)
        if scaled is not None and self.private(value):
            value, scale = scaled
            members.insert(0, step)
            step = self.producer.get(value)
        if step is None or step.op != "MatMul" or not self.private(value):
            return None
        members.insert(0, step)
        q, kt = step.inputs
        weights, nan_to_zero = softmax.outputs[0], 0
        readers = self.readers.get(weights, [])
        if len(readers) == 2 and weights not in self.graph.outputs:
            guard = self._nan_guard(weights, readers)
            if guard is None:
                return None
            members += guard
            weights, nan_to_zero = guard[-1].outputs[0], 1
        if not self.private(weights):
            return None
        (product,) = self.readers[weights]
        if product.op != "MatMul" or product.inputs[0] is not weights:
            return None
        v = product.inputs[1]
        try:
            scores = attention_types(q.type, kt.type, v.type)
        except ShapeError:
            return None
        if (
            scores != tuple(logits.type.shape)
            or scores[-1] > MAX_KEYS
            or {q.type.dtype, kt.type.dtype, v.type.dtype} != {"float32"}
        ):
            return None
        if mask is not None and (mask.type.dtype != "float32" or len(mask.type.shape) > rank):
            return None
        inputs = [q, kt, v, *([mask] if mask is not None else [])]
        attrs = {"scale": scale, "nan_to_zero": nan_to_zero}
        members.append(product)
        order = {id(node): position for position, node in enumerate(self.graph.nodes)}
        members.sort(key=lambda node: order[id(node)])
        return Node("Attention", inputs, list(product.outputs), attrs, product.name), members

    def scaled(self, step: Node | None) -> tuple[Value, float] | None:
        """(the scaled value, the factor) when `step` multiplies a value by a nonzero scalar param or divides it by
        one, else None."""
        if step is None or step.op not in ("Mul", "Div"):
            return None
        first, second = step.inputs
        if step.op == "Mul" and self.scalar(first) is not None:
            first, second = second, first
        factor = self.scalar(second)
        if factor is None or factor == 0.0 or first in self.graph.params:
            return None
        return first, factor if step.op == "Mul" else 1.0 / factor

    def _leads_to_matmul(self, value: Value) -> bool:
        step = self.producer.get(value)
        scaled = self.scaled(step)
        if scaled is not None:
            step = self.producer.get(scaled[0])
        return step is not None and step.op == "MatMul"

    def _nan_guard(self, weights: Value, readers: list[Node]) -> list[Node] | None:
        """[IsNaN, Where] when the softmax's two readers are Where(IsNaN(p), 0, p), else None."""
        check = next((node for node in readers if node.op == "IsNaN"), None)
        where = next((node for node in readers if node.op == "Where"), None)
        if check is None or where is None or not self.private(check.outputs[0]):
            return None
        condition, zero, kept = where.inputs
        if condition is not check.outputs[0] or kept is not weights or self.scalar(zero) != 0.0:
            return None
        if (
            tuple(where.outputs[0].type.shape) != tuple(weights.type.shape)
            or np.dtype(where.outputs[0].type.dtype) != np.float32
        ):
            return None
        return [check, where]


def _merge_masks(graph: Graph) -> Graph:
    """Each softmax input made from a value s of its own shape by additions of params and reshapes only (every step
    read by its next one alone), with at least two steps, becomes s + one param: the steps applied to zeros. A
    reshape keeps the elements' order and an addition of a constant is one, so the chain is s + that constant up to
    the order of float additions. Left alone where the merged constant would outgrow the folding limit."""
    blocks = _Blocks(graph)
    replaced: dict[int, Node] = {}
    removed: set[int] = set()
    for softmax in graph.nodes:
        if softmax.op != "Softmax":
            continue
        chain, value = [], softmax.inputs[0]
        while blocks.private(value) and (step := blocks.producer.get(value)) is not None:
            if step.op == "Reshape":
                value = step.inputs[0]
            elif step.op == "Add":
                running = [u for u in step.inputs if u not in graph.params]
                if len(running) != 1 or tuple(running[0].type.shape) != tuple(value.type.shape):
                    break
                value = running[0]
            else:
                break
            chain.insert(0, step)
        logits = softmax.inputs[0]
        if len(chain) < 2 or tuple(value.type.shape) != tuple(logits.type.shape) or value.type.dtype != "float32":
            continue
        terms = {id(step): next(u for u in step.inputs if u in graph.params) for step in chain if step.op == "Add"}
        if not worth_folding([term.type for term in terms.values()], [logits.type]):
            continue
        merged = np.zeros(value.type.shape, np.float32)
        for step in chain:
            if step.op == "Add":
                merged = merged + graph.params[terms[id(step)]].astype(np.float32)
            else:
                merged = merged.reshape(step.outputs[0].type.shape)
        mask = graph.add_param(f"{chain[-1].name}_mask", merged.reshape(logits.type.shape).astype(np.float32))
        replaced[id(chain[-1])] = Node("Add", [value, mask], [logits], {}, chain[-1].name)
        removed.update(id(step) for step in chain)
    graph.nodes = [
        replaced.get(id(node), node) for node in graph.nodes if id(node) not in removed or id(node) in replaced
    ]
    return graph
