"""Constant folding, the first graph pass: it evaluates at compile time what depends only on params.

Hands on a graph where such nodes are gone and their results are params (left for eliminate_dead to
prune the params they read).
"""

from __future__ import annotations

import numpy as np

from compiler.graph.ir import Graph, Node
from compiler.graph.registry import FOLD_GROWTH_LIMIT_ELEMENTS as GROWTH_LIMIT_ELEMENTS
from compiler.graph.registry import decompresses, get_op, worth_folding
from compiler.target import Target

__all__ = ["GROWTH_LIMIT_ELEMENTS", "fold_constants", "fold_decompressions"]

# The ops that may read a decompressed weight narrow, by the input that holds it: a dense or conv kernel's weight
# (alter_layout packs it: pack_dense, the blocked conv's per-filter scale), a Gather's table (on CPU targets its group
# reads each gathered element narrow). A decompression feeding only these stays a node until the layout passes ran.
NARROW_WEIGHT_READERS = {"MatMul": 1, "Gemm": 1, "Conv": 1, "Gather": 0}
# those whose narrow weight reaches the kernels as it is, without a layout pass taking it: kept by fold_decompressions
# on CPU targets
NARROW_AT_RUN_TIME = ("Gather",)

# Ops whose results are not a function of their inputs, so evaluating them once would change the model.
NONDETERMINISTIC_OPS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial"}
)


def fold_constants(graph: Graph, keep_narrow_weights: bool | tuple[str, ...] = True) -> Graph:
    """Replace each node whose inputs are all params (or a Shape/Size of any value) by params holding its results;
    except, when `keep_narrow_weights`, a decompression of a weight (registry.decompresses) read only as the weight of
    a MatMul, Gemm or Conv or the table of a Gather (NARROW_WEIGHT_READERS), which the layout passes may hand to a
    kernel that reads the weight narrow; given as a tuple of ops, only those read by them."""
    result = graph.copy()
    readers: dict = {}
    for node in result.nodes:
        for position, value in enumerate(node.inputs):
            readers.setdefault(value, []).append((node.op, position))
    readable = NARROW_WEIGHT_READERS if keep_narrow_weights is True else keep_narrow_weights or ()
    kept: list[Node] = []
    for node in result.nodes:
        if readable and _narrow_weight(node, readers, readable):
            kept.append(node)
            continue
        arrays = _evaluate(node, result)
        if arrays is None:
            kept.append(node)
            continue
        for value, array in zip(node.outputs, arrays, strict=True):
            # contiguous, because references may hand back views (a transposed weight) that later stages copy raw
            result.params[value] = np.asarray(array, dtype=value.type.dtype, order="C")
    result.nodes = kept
    return result


def fold_decompressions(graph: Graph, target: Target | None = None) -> Graph:
    """Constant folding after the layout passes: the decompressions that no kernel took narrow become float params,
    but for a CPU `target` those a Gather reads (NARROW_AT_RUN_TIME), which its group computes for the gathered
    elements only. GPU targets widen every one (WGSL has no 8- or 16-bit storage to read)."""
    cpu = target is not None and target.family == "cpu"
    return fold_constants(graph, keep_narrow_weights=NARROW_AT_RUN_TIME if cpu else False)


def _narrow_weight(node: Node, readers: dict, readable) -> bool:
    inputs = [value.type for value in node.inputs if value is not None]
    if not decompresses(node.op, inputs, [value.type for value in node.outputs]) or len(node.outputs) != 1:
        return False
    uses = readers.get(node.outputs[0], [])
    return bool(uses) and all(op in readable and NARROW_WEIGHT_READERS[op] == position for op, position in uses)


def _evaluate(node: Node, graph: Graph) -> list[np.ndarray] | None:
    """The node's output arrays if it can be folded, else None."""
    if node.op in ("Shape", "Size"):
        shape = _static_shape(node)
        return None if shape is None else [shape]
    tensors = [value for value in node.inputs if value is not None]
    if node.op in NONDETERMINISTIC_OPS or any(value not in graph.params for value in tensors):
        return None
    if node.op == "SizeValues" or not all(value.type.static for value in node.outputs):
        return None  # known only once a run gives the symbolic sizes
    if not worth_folding([value.type for value in tensors], [value.type for value in node.outputs]):
        return None
    arrays = [None if value is None else graph.params[value] for value in node.inputs]
    return get_op(node.op).run_reference(arrays, node.attrs)


def _static_shape(node: Node) -> np.ndarray:
    shape = node.inputs[0].type.shape
    if not node.inputs[0].type.static:
        return None  # the frontend made these SizeValues; a pass that makes one of a symbolic shape keeps it
    if node.op == "Size":
        return np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    # ONNX clamps start and end after adding the rank to negatives, exactly as Python slicing does
    start, end = node.attrs.get("start", 0), node.attrs.get("end", len(shape))
    return np.array(shape[start:end], dtype=np.int64)
