"""The op registry: one entry per op with its shape rule, pattern kind, numpy reference and (filled
by `compiler/compute/`, issue 4) its tensor-expression compute.

Graph-level semantics live in `compiler/graph/ops/`; the kernel stage attaches `compute` later with
`set_compute`, so the graph never imports the tensor-expression layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from compiler.errors import UnsupportedOpError

if TYPE_CHECKING:  # the registry reads types; ir.py imports it to infer and verify nodes
    from compiler.graph.ir import TensorType


class Pattern(IntEnum):
    """Fusion pattern kinds, ordered as TVM orders them: a group's pattern is the max of its ops'."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    REDUCE = 3
    OUT_EWISE_FUSABLE = 4
    OPAQUE = 8


InferFn = Callable[[list["TensorType | None"], dict[str, Any]], list["TensorType"]]


@dataclass
class OpDef:
    name: str
    infer: InferFn
    pattern: Pattern | Callable[[dict[str, Any]], Pattern]
    reference: Callable[..., Any]  # reference(*arrays, **attrs) -> array or list of arrays
    # ONNX inputs that must be constant, moved by the frontend into attrs: ((index, attr_name), ...)
    const_inputs: tuple[tuple[int, str], ...] = ()
    compute: Callable[..., Any] | None = None

    def pattern_of(self, attrs: dict[str, Any]) -> Pattern:
        return self.pattern(attrs) if callable(self.pattern) else self.pattern

    def run_reference(self, arrays: list, attrs: dict[str, Any]) -> list:
        result = self.reference(*arrays, **attrs)
        return list(result) if isinstance(result, list | tuple) else [result]


_REGISTRY: dict[str, OpDef] = {}


def register_op(name: str, *, infer: InferFn, pattern, reference, const_inputs=()) -> OpDef:
    if name in _REGISTRY:
        raise ValueError(f"op {name} registered twice")
    _REGISTRY[name] = OpDef(name, infer, pattern, reference, tuple(const_inputs))
    return _REGISTRY[name]


# A folded result may grow past its inputs only up to this many elements: beyond it, an Expand, Tile or
# ConstantOfShape is cheaper to compute at run time than to ship in the params, and a hostile model cannot make
# the compiler allocate gigabytes (a 200-byte Expand to [2^34, 4]).
FOLD_GROWTH_LIMIT_ELEMENTS = 1 << 20


def worth_folding(inputs: list[TensorType], outputs: list[TensorType]) -> bool:
    """Whether a node reading only constants should be evaluated at compile time, decided from its types alone so
    that nothing is allocated for a node that is then left to run time."""
    grown = sum(t.size for t in outputs)
    return grown <= max(sum(t.size for t in inputs), FOLD_GROWTH_LIMIT_ELEMENTS)


# A decompression of a param at least this large is a weight stored narrow (int8 levels, float16): folding it would
# widen the bundle's bytes 2-4x, so the import and the first constant folding keep it for the kernel that reads it
# (passes/alter_layout.py, pack_dense); smaller ones (scales, biases) fold as before.
DECOMPRESS_MIN_ELEMENTS = 4096


def decompresses(op: str, inputs: list[TensorType], outputs: list[TensorType]) -> bool:
    """Whether the node widens a narrow weight: a DequantizeLinear, or a Cast from float16 to float32, of at least
    DECOMPRESS_MIN_ELEMENTS elements."""
    if not inputs or not outputs or not inputs[0].static or inputs[0].size < DECOMPRESS_MIN_ELEMENTS:
        return False
    if op == "DequantizeLinear":
        return True
    return op == "Cast" and inputs[0].dtype == "float16" and outputs[0].dtype == "float32"


def get_op(name: str) -> OpDef:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnsupportedOpError(f"op {name!r} is not supported by Tessel", {name: []}) from None


def is_registered(name: str) -> bool:
    return name in _REGISTRY


def registered_ops() -> list[str]:
    return sorted(_REGISTRY)


def set_compute(name: str, compute: Callable[..., Any]) -> None:
    get_op(name).compute = compute
