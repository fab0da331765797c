"""The loop IR: statements over flat buffers, with scalar expressions from `te.expr`.

`tir/lower.py` writes it from a TE schedule; each codegen is one visitor over it. Every loop says
its kind and every buffer its scope, so backends never guess.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from compiler.te.expr import Expr, Var
from compiler.te.schedule import SCOPES as SCOPES  # re-exported: a Buffer's scope is one of the schedule's
from compiler.te.tensor import THREAD_TAGS as THREAD_TAGS  # and a bound For's tag one of te's thread tags
from compiler.te.tensor import children

_buffer_ids = itertools.count()


@dataclass(eq=False)
class Buffer:
    """A flat, row-major array. Params of a PrimFunc are `global`; Allocate makes the others."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    scope: str = "global"
    uid: int = field(default_factory=lambda: next(_buffer_ids), repr=False)

    __hash__ = object.__hash__

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def strides(self) -> tuple[int, ...]:
        strides, acc = [], 1
        for extent in reversed(self.shape):
            strides.append(acc)
            acc *= extent
        return tuple(reversed(strides))


@dataclass(eq=False)
class Load(Expr):
    buffer: Buffer
    index: Expr  # flat element index

    @property
    def dtype(self) -> str:
        return self.buffer.dtype


class Stmt:
    __hash__ = object.__hash__


class ForKind(Enum):
    SERIAL = "serial"
    PARALLEL = "parallel"  # iterations run on a thread pool (native); serial in WASM
    VECTORIZED = "vectorized"  # constant extent; the body becomes vector operations
    UNROLLED = "unrolled"  # constant extent; the body is repeated
    THREAD_BINDING = "thread_binding"  # bound to `thread_tag`; a GPU grid axis


@dataclass(eq=False)
class For(Stmt):
    var: Var
    min: Expr
    extent: Expr
    kind: ForKind
    body: Stmt
    thread_tag: str | None = None


@dataclass(eq=False)
class Store(Stmt):
    buffer: Buffer
    index: Expr
    value: Expr


@dataclass(eq=False)
class Allocate(Stmt):
    buffer: Buffer
    body: Stmt


@dataclass(eq=False)
class IfThen(Stmt):
    cond: Expr
    then_body: Stmt
    else_body: Stmt | None = None


@dataclass(eq=False)
class LetStmt(Stmt):
    var: Var
    value: Expr
    body: Stmt


@dataclass(eq=False)
class Seq(Stmt):
    stmts: tuple[Stmt, ...]


@dataclass(eq=False)
class Barrier(Stmt):
    """All threads of a block wait here; `scope` is the memory made visible ("shared")."""

    scope: str = "shared"


@dataclass(eq=False)
class Prefetch(Stmt):
    """A hint that `element` (a Load whose value is never used) will be read soon: native code brings its cache line
    toward the core ahead of the reads; a target without prefetch instructions emits nothing. Results never change."""

    element: Load


@dataclass(eq=False)
class PrimFunc:
    """One kernel: `params` are global buffers in argument order. `attrs` holds what later stages add
    (`tir/gpu.py` puts a GPU kernel's launch dimensions under "launch")."""

    name: str
    params: list[Buffer]
    body: Stmt
    attrs: dict = field(default_factory=dict)


@dataclass(eq=False)
class KernelCall(Stmt):
    """Call kernel `func` of the same module; each argument is a buffer's base address plus a byte
    offset, so a model's `run` entry can hand kernels pointers into its params and its arena."""

    func: str
    args: tuple[tuple[Buffer, int], ...]


def walk_stmts(stmt: Stmt):
    """`stmt` and every statement nested in it, parents first (their expressions are not entered; tir/visitor.walk
    enters both)."""
    stack = [stmt]
    while stack:
        item = stack.pop()
        yield item
        stack.extend(reversed(list(children(item, (Stmt,)))))
