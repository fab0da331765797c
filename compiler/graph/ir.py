"""The graph IR: typed values, op nodes in topological order, params as numpy arrays.

The frontend writes it, the passes rewrite it, and the kernel builder reads it; `print(graph)` gives
the text form that pass tests compare.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.graph.printer import format_graph
from compiler.graph.registry import get_op
from compiler.graph.sym import Sym, capacity

INT64_MAX = (1 << 63) - 1
DTYPES = ("float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")

ITEMSIZE = {dtype: np.dtype(dtype).itemsize for dtype in DTYPES}


class GraphError(ValueError):
    """A graph that breaks an invariant (dangling value, type mismatch, cycle...)."""


@dataclass(frozen=True)
class TensorType:
    """A shape's entries are ints or Syms (sizes known at run time, compiler/graph/sym.py). A symbolic tensor is
    laid out at `max_shape`, so `nbytes` is what that takes; `size` is the element count, symbolic too."""

    shape: tuple[int | Sym, ...]
    dtype: str

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(d if isinstance(d, Sym) else int(d) for d in self.shape))
        if self.dtype not in DTYPES:
            raise GraphError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        if any(d.bounds()[0] < 0 if isinstance(d, Sym) else d < 0 for d in self.shape):
            raise GraphError(f"negative dimension in shape {self.shape}")
        if self.nbytes > INT64_MAX:
            raise GraphError(f"shape {list(self.shape)} of {self.dtype} has more bytes than a 64-bit size can count")

    @property
    def size(self) -> int | Sym:
        return math.prod(self.shape)

    @property
    def static(self) -> bool:
        return not any(isinstance(d, Sym) for d in self.shape)

    @property
    def max_shape(self) -> tuple[int, ...]:
        """The shape the tensor is laid out for: each symbolic dim at its largest value, rounded up (Sym.capacity)."""
        return tuple(map(capacity, self.shape))

    @property
    def nbytes(self) -> int:
        return math.prod(self.max_shape) * ITEMSIZE[self.dtype]

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


class Value:
    """A tensor flowing through the graph; compared by identity, named for printing."""

    __slots__ = ("name", "type")

    def __init__(self, name: str, type: TensorType):
        self.name = name
        self.type = type

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


@dataclass(eq=False)
class Node:
    """One op applied to values. `inputs` may hold None for an omitted optional input."""

    op: str
    inputs: list[Value | None]
    outputs: list[Value]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""


@dataclass(eq=False)
class Graph:
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    params: dict[Value, np.ndarray] = field(default_factory=dict)
    name: str = "graph"
    # every name fresh_name has seen or handed out, built on its first call: passes name each Value they make
    # through it, so a pass that adds a node per conv stays linear instead of rescanning the graph each time
    _taken_names: set[str] | None = field(default=None, init=False, repr=False)

    # -- building -------------------------------------------------------------------------------
    def fresh_name(self, hint: str) -> str:
        if self._taken_names is None:
            self._taken_names = {v.name for v in self.values()}
        taken = self._taken_names
        name = hint
        for i in itertools.count(1):
            if name not in taken:
                break
            name = f"{hint}_{i}"
        taken.add(name)
        return name

    def add_input(self, name: str, type: TensorType) -> Value:
        value = Value(self.fresh_name(name), type)
        self.inputs.append(value)
        return value

    def add_param(self, name: str, array: np.ndarray) -> Value:
        array = np.asarray(array)
        value = Value(self.fresh_name(name), TensorType(array.shape, str(array.dtype)))
        self.params[value] = array
        return value

    def add_node(
        self,
        op: str,
        inputs: list[Value | None],
        attrs: dict[str, Any] | None = None,
        name: str = "",
        output_names: list[str] | None = None,
    ) -> list[Value]:
        """Append a node, inferring its output types from the op registry; returns the outputs."""
        attrs = dict(attrs or {})
        op_def = get_op(op)
        types = op_def.infer([v.type if v is not None else None for v in inputs], attrs)
        hints = output_names or [
            f"{name or op.lower()}_out{i}" if len(types) > 1 else (name or op.lower()) for i in range(len(types))
        ]
        outputs = [Value(self.fresh_name(h), t) for h, t in zip(hints, types, strict=True)]
        self.nodes.append(Node(op, list(inputs), outputs, attrs, name or outputs[0].name))
        return outputs

    # -- queries --------------------------------------------------------------------------------
    def values(self) -> list[Value]:
        seen: dict[int, Value] = {}
        for v in [*self.inputs, *self.params]:
            seen.setdefault(id(v), v)
        for node in self.nodes:
            for v in [*node.inputs, *node.outputs]:
                if v is not None:
                    seen.setdefault(id(v), v)
        return list(seen.values())

    def producers(self) -> dict[Value, Node]:
        return {v: node for node in self.nodes for v in node.outputs}

    def consumers(self) -> dict[Value, list[Node]]:
        result: dict[Value, list[Node]] = {}
        for node in self.nodes:
            for v in node.inputs:
                if v is None:
                    continue
                readers = result.setdefault(v, [])
                # nodes come in order, so a second read by this node finds it last
                if not readers or readers[-1] is not node:
                    readers.append(node)
        return result

    def copy(self) -> Graph:
        """A shallow structural copy: new lists and node objects, same Values and arrays."""
        nodes = [Node(n.op, list(n.inputs), list(n.outputs), dict(n.attrs), n.name) for n in self.nodes]
        return Graph(list(self.inputs), list(self.outputs), nodes, dict(self.params), self.name)

    # -- checking and printing --------------------------------------------------------------------
    def verify(self) -> None:
        """Raise GraphError unless every value is defined once before use and types agree."""
        defined: set[Value] = set()
        for v in [*self.inputs, *self.params]:
            _check_name(v)
            if v in defined:
                raise GraphError(f"value %{v.name} is defined twice")
            defined.add(v)
        for value, array in self.params.items():
            if tuple(array.shape) != value.type.shape or str(array.dtype) != value.type.dtype:
                raise GraphError(f"param %{value.name} holds {array.dtype}{list(array.shape)}, typed {value.type}")
        for node in self.nodes:
            for v in node.inputs:
                if v is not None and v not in defined:
                    raise GraphError(
                        f"node {node.name} ({node.op}) uses %{v.name} before it is defined (dangling value or cycle)"
                    )
            if node.op != "fused":
                expected = get_op(node.op).infer([v.type if v is not None else None for v in node.inputs], node.attrs)
                got = [v.type for v in node.outputs]
                if expected != got:
                    raise GraphError(
                        f"node {node.name} ({node.op}) outputs {[str(t) for t in got]}, inference says {[str(t) for t in expected]}"
                    )
            for v in node.outputs:
                _check_name(v)
                if v in defined:
                    raise GraphError(f"value %{v.name} is defined twice (second time by node {node.name})")
                defined.add(v)
        for v in self.outputs:
            if v not in defined:
                raise GraphError(f"graph output %{v.name} is never defined")

    def __str__(self) -> str:
        return format_graph(self)


def _check_name(value: Value) -> None:
    # names reach the bundle's manifest.json and the JS runtime, which take text only
    if not isinstance(value.name, str):
        raise GraphError(f"value name {value.name!r} is not text")
