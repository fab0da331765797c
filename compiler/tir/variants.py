"""A kernel of two lowerings of one group, chosen between at run time by the sizes (issue 40, docs/symbolic.md): a
symbolic group's schedule planned for its sizes' largest values, and a variant planned for their smallest
(schedules' `schedule_small_sizes`: a decode step's single row in a MatMulPacked, which the general kernel computes in a
block of 6 rows). The variant runs only at the smallest sizes, so it is simplified with them as constants (a 1-row
block's loop over `seq * 36` panels becomes 36, its column guards fold away)."""

from __future__ import annotations

from compiler.te.expr import Compare, Const, Expr, Logical, SizeVar, TEError
from compiler.tir.nodes import Buffer, IfThen, LetStmt, Load, PrimFunc, Stmt, Store
from compiler.tir.simplify import simplify, substitute_stmt
from compiler.tir.visitor import StmtMutator


def by_smallest_sizes(general: PrimFunc, small: PrimFunc) -> PrimFunc:
    """One kernel with `general`'s arguments that runs `small`'s body where every size `small` reads is at the least of
    its range, and `general`'s otherwise. Each lowering reads its sizes from the sizes argument first (lower's
    bind_sizes); the kernel reads each once, before the choice, and `small`'s body sees the sizes' smallest values as
    constants."""
    if [(buffer.name, buffer.shape, buffer.dtype) for buffer in small.params] != [
        (buffer.name, buffer.shape, buffer.dtype) for buffer in general.params
    ]:
        raise TEError(f"{general.name}: a variant for small sizes must take the general kernel's arguments")
    general_lets, general_body = _size_lets(general.body)
    small_lets, small_body = _size_lets(_Rebind(dict(zip(small.params, general.params))).visit(small.body))
    smallest = {let.var: Const(let.var.low, let.var.dtype) for let in small_lets}
    small_body = simplify(PrimFunc(small.name, general.params, substitute_stmt(small_body, smallest))).body
    lets = {let.var: let.value for let in general_lets}
    for let in small_lets:
        lets.setdefault(let.var, let.value)
    condition: Expr | None = None
    for var, low in smallest.items():
        test = Compare("eq", var, low)
        condition = test if condition is None else Logical("and", (condition, test))
    if condition is None:
        raise TEError(f"{general.name}: a variant for small sizes must read the sizes")
    body: Stmt = IfThen(condition, small_body, general_body)
    for var, value in reversed(lets.items()):
        body = LetStmt(var, value, body)
    return PrimFunc(general.name, general.params, body)


def _size_lets(body: Stmt) -> tuple[list[LetStmt], Stmt]:
    """The LetStmts reading size vars at the head of a kernel's body (bind_sizes wrote them), and what they wrap."""
    lets = []
    while isinstance(body, LetStmt) and isinstance(body.var, SizeVar):
        lets.append(body)
        body = body.body
    return lets, body


class _Rebind(StmtMutator):
    """Statements with their loads and stores of some buffers moved to others (a lowering's arguments to another's)."""

    def __init__(self, buffers: dict[Buffer, Buffer]):
        self.buffers = buffers

    def visit_load(self, node: Load) -> Load:
        index = self.visit(node.index)
        buffer = self.buffers.get(node.buffer, node.buffer)
        return node if buffer is node.buffer and index is node.index else Load(buffer, index)

    def visit_store(self, node: Store) -> Store:
        index, value = self.visit(node.index), self.visit(node.value)
        buffer = self.buffers.get(node.buffer, node.buffer)
        unchanged = buffer is node.buffer and index is node.index and value is node.value
        return node if unchanged else Store(buffer, index, value)
