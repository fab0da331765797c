"""`--weights fp16` (compile_model(weights="fp16")): dense weights stored as float16, computed in float32.

Run by the driver on the imported graph, before the pipeline's first constant folding. Each float32 param of at least
registry.DECOMPRESS_MIN_ELEMENTS elements that is read only as the weight (input 1) of MatMuls and Gemms that
pack_dense makes MatMulPacked (alter_layout.packs_dense: more than one row of A) becomes Cast(float16 param) -- the
form a mixed-precision converter writes -- so fold_constants keeps the Cast, pack_dense packs the float16 bytes and
the kernel widens each element as it reads it (compute/dense.py, matmul_packed): the bundle holds half the bytes and
the products and sums stay float32. Hands the pipeline a graph that computes with each such weight rounded to float16.

A weight also read elsewhere keeps its float32 bytes unrounded: storing it float16 would round it for nothing, since
fold_decompressions would widen it back. So does a single-row MatMul's (packs_dense without `narrow`), although
pack_dense would now pack it narrow (a quantized model's single rows are): storing those float16 too is a choice
left for a measurement of decode steps. A weight
with a value beyond float16's range (|w| > 65504) keeps float32 too, with a WeightsWarning naming it.
"""

from __future__ import annotations

import warnings

import numpy as np

from compiler.graph.ir import Graph, Node, Value
from compiler.graph.registry import DECOMPRESS_MIN_ELEMENTS
from compiler.passes.alter_layout import packs_dense

__all__ = ["FLOAT16_MAX", "WeightsWarning", "half_weights"]

# the largest finite float16: a float32 beyond it would become an infinity
FLOAT16_MAX = float(np.finfo(np.float16).max)


class WeightsWarning(UserWarning):
    """A dense weight that `--weights fp16` keeps float32 because its values do not fit float16."""


def half_weights(graph: Graph) -> Graph:
    """`graph` with every dense weight that a packed kernel reads stored float16 behind a Cast to float32 (the
    module's docstring says which); everything else unchanged."""
    result = graph.copy()
    uses: dict[Value, list[tuple[Node, int]]] = {}
    for node in result.nodes:
        for position, value in enumerate(node.inputs):
            if value is not None:
                uses.setdefault(value, []).append((node, position))
    outputs = set(result.outputs)
    widened: dict[Value, Value] = {}
    casts: list[Node] = []
    for value, array in list(result.params.items()):
        readers = uses.get(value, [])
        if value.type.dtype != "float32" or value.type.size < DECOMPRESS_MIN_ELEMENTS or value in outputs:
            continue
        if not readers or not all(position == 1 and packs_dense(node) for node, position in readers):
            continue
        largest = float(np.max(np.abs(array)))
        if largest > FLOAT16_MAX:
            warnings.warn(
                f"weight {value.name!r} holds values up to {largest:.6g} in magnitude, beyond float16's "
                f"{FLOAT16_MAX:g}: it stays float32",
                WeightsWarning,
                stacklevel=2,
            )
            continue
        half = result.add_param(f"{value.name}_fp16", array.astype(np.float16))
        wide = Value(result.fresh_name(f"{value.name}_widened"), value.type)
        casts.append(Node("Cast", [half], [wide], {"to": "float32"}, f"{value.name}_widen"))
        widened[value] = wide
        del result.params[value]
    for node in result.nodes:
        node.inputs = [widened.get(value, value) for value in node.inputs]
    result.nodes = casts + result.nodes
    return result
