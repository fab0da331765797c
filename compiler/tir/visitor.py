"""One visitor and one mutator over the loop IR: its statements (tir/nodes.py) and their scalar expressions (te.expr,
with tir's Load). The simplifier, partitioning, lowering's select guard, the printer and the code generators dispatch
through them, and this module holds the loop IR's one walk and one structural equality."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from enum import Enum

from compiler.te.expr import Compare, Const, Expr, Logical, Var
from compiler.te.tensor import children as expr_children
from compiler.tir.nodes import Stmt

_METHODS: dict[tuple[type, type], Callable] = {}


def _method(visitor: type, node: type) -> Callable:
    """visitor's `visit_<class name, lowercased>` for `node`'s class or its nearest base that has one (visit_expr and
    visit_stmt catch every expression and statement without their own), else its generic_visit."""
    key = (visitor, node)
    if key not in _METHODS:
        names = (f"visit_{base.__name__.lower()}" for base in node.__mro__)
        _METHODS[key] = next(
            (getattr(visitor, name) for name in names if hasattr(visitor, name)), visitor.generic_visit
        )
    return _METHODS[key]


def children(node) -> Iterator:
    """The statements and expressions a node holds directly, in field order (a KernelCall's buffers are not nodes)."""
    return expr_children(node, (Expr, Stmt))


def walk(node) -> Iterator:
    """`node` and every statement and expression under it, parents before children."""
    stack = [node]
    while stack:
        item = stack.pop()
        yield item
        if not isinstance(item, Var | Const):
            stack.extend(reversed(list(children(item))))


class StmtVisitor:
    """Walks statements and expressions: `visit(node)` calls the subclass's `visit_for`, `visit_store`, `visit_load`,
    `visit_binary`... (the node's class name, lowercased) where it has one, else `generic_visit`, which visits the
    node's children. A handler decides whether to go on into its node's children (`self.generic_visit(node)`)."""

    def visit(self, node):
        return _method(type(self), type(node))(self, node)

    def generic_visit(self, node) -> None:
        for child in children(node):
            self.visit(child)


class StmtMutator:
    """Rebuilds statements and expressions: `visit(node)` dispatches as StmtVisitor does and returns the node that
    replaces `node`. `generic_visit` rebuilds a node from its visited children (the node itself when none changed;
    Vars and Consts are leaves); a statement a handler returns None for is dropped from a Seq."""

    def visit(self, node):
        return _method(type(self), type(node))(self, node)

    def generic_visit(self, node):
        if isinstance(node, Var | Const):
            return node
        changes = {}
        for item in dataclasses.fields(node):
            value = getattr(node, item.name)
            if isinstance(value, Expr | Stmt):
                new = self.visit(value)
            elif isinstance(value, tuple) and any(isinstance(element, Expr | Stmt) for element in value):
                visited = (self.visit(element) if isinstance(element, Expr | Stmt) else element for element in value)
                new = tuple(element for element in visited if element is not None)
                if len(new) == len(value) and all(a is b for a, b in zip(new, value)):
                    new = value
            else:
                continue
            if new is not value:
                changes[item.name] = new
        return dataclasses.replace(node, **changes) if changes else node


class ScopedMutator(StmtMutator):
    """A StmtMutator that carries a mapping `env` for the vars in scope (their bounds, say): `inside` visits a body
    with one more var bound, and restores `env` after."""

    def __init__(self, env: dict | None = None):
        self.env = {} if env is None else env

    def inside(self, var, value, node):
        outer = self.env
        self.env = {**outer, var: value}
        try:
            return self.visit(node)
        finally:
            self.env = outer


def structural_key(node) -> tuple:
    """Equal keys mean structurally equal nodes: vars and buffers by identity, everything else by structure."""
    if isinstance(node, Var):
        return ("var", id(node))
    if isinstance(node, Const):
        return ("const", node.dtype, node.value)
    parts: list = [type(node).__name__]
    for item in dataclasses.fields(node):
        value = getattr(node, item.name)
        if isinstance(value, Expr | Stmt):
            parts.append(structural_key(value))
        elif isinstance(value, tuple):
            parts.append(tuple(structural_key(v) if isinstance(v, Expr | Stmt) else _atom(v) for v in value))
        else:
            parts.append(_atom(value))
    if isinstance(node, Compare | Logical):
        parts.append(node.dtype)
    return tuple(parts)


def _atom(value):
    """A field that is not a node: plain values and enums by value, anything else (a Buffer) by identity."""
    if isinstance(value, tuple):
        return tuple(_atom(item) for item in value)
    if isinstance(value, str | int | float | bool | Enum) or value is None:
        return value
    return id(value)


def structurally_equal(a, b) -> bool:
    return a is b or structural_key(a) == structural_key(b)
