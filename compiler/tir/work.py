"""Work estimates over the loop IR, target-neutral: how many operations a loop runs, from its extents and its
body. Codegen keeps a parallel loop whose estimate is below PARALLEL_MIN_WORK on the calling thread (natively
today; wasm threads are to use the same rule), because handing it to a thread pool costs more than it saves."""

from __future__ import annotations

from compiler.te.expr import Binary, Call, Cast, Compare, Const, Expr, IfThenElse, Let, Logical, Select, Var
from compiler.tir.nodes import Allocate, For, ForKind, IfThen, KernelCall, LetStmt, Load, Seq, Stmt, Store
from compiler.tir.simplify import bounds

# Operations per call, about the instructions codegen/fast_math.py's polynomials take; other calls (sqrt, min,
# fma...) are one instruction.
CALL_OPERATIONS = {"exp": 14, "log": 20, "tanh": 24, "sigmoid": 18, "erf": 28, "pow": 36}
# A parallel loop whose estimate is below this stays on the calling thread. Measured on the 2-core VM with
# `benchmarks/threads.py --calibrate` (elementwise, polynomial and reduction bodies, workers awake): loops of up
# to ~16,000 operations (5-7 us on one thread) were 4-10% slower at two threads than at one, loops of ~65,000 and
# more 31-39% faster; the threshold sits between. Handing a loop to a pool whose workers do not come costs the
# caller ~0.4 us, so a loop just above it loses little when the other core is busy.
PARALLEL_MIN_WORK = 32_768


def expr_operations(expr: Expr) -> int:
    """Operations to evaluate `expr` once (loads included, index arithmetic not: it is mostly hoisted)."""
    if isinstance(expr, Const | Var):
        return 0
    if isinstance(expr, Load):
        return 1
    if isinstance(expr, Call):
        return CALL_OPERATIONS.get(expr.name, 1) + sum(expr_operations(arg) for arg in expr.args)
    if isinstance(expr, Binary | Compare):
        return 1 + expr_operations(expr.a) + expr_operations(expr.b)
    if isinstance(expr, Logical):
        return 1 + sum(expr_operations(arg) for arg in expr.args)
    if isinstance(expr, Select | IfThenElse):
        return 1 + expr_operations(expr.cond) + expr_operations(expr.true_value) + expr_operations(expr.false_value)
    if isinstance(expr, Cast):
        return 1 + expr_operations(expr.value)
    if isinstance(expr, Let):
        return expr_operations(expr.value) + expr_operations(expr.body)
    return 1


def stmt_work(stmt: Stmt, env: dict | None = None) -> int | None:
    """Operations `stmt` runs, with every loop at the upper bound of its extent given the bounds of the variables
    in `env`; None when an extent has no known bound. A vectorized loop counts its body once: it runs as vector
    instructions, and its extent is the target's vector width."""
    env = env or {}
    if isinstance(stmt, Store):
        return 1 + expr_operations(stmt.value)
    if isinstance(stmt, Seq):
        parts = [stmt_work(child, env) for child in stmt.stmts]
        return None if None in parts else sum(parts)
    if isinstance(stmt, For):
        extent = bounds(stmt.extent, env)[1]
        low = bounds(stmt.min, env)
        if extent is None:
            return None
        high = None if low[1] is None else low[1] + extent - 1
        body = stmt_work(stmt.body, {**env, stmt.var: (low[0], high)})
        if body is None:
            return None
        return body if stmt.kind == ForKind.VECTORIZED else max(extent, 0) * body
    if isinstance(stmt, IfThen):
        then_work = stmt_work(stmt.then_body, env)
        else_work = 0 if stmt.else_body is None else stmt_work(stmt.else_body, env)
        return None if None in (then_work, else_work) else expr_operations(stmt.cond) + max(then_work, else_work)
    if isinstance(stmt, LetStmt):
        body = stmt_work(stmt.body, {**env, stmt.var: bounds(stmt.value, env)})
        return None if body is None else expr_operations(stmt.value) + body
    if isinstance(stmt, Allocate):
        return stmt_work(stmt.body, env)
    if isinstance(stmt, KernelCall):
        return None
    return 0


def worth_parallel(loop: For, env: dict | None = None) -> bool:
    """Whether a parallel loop does enough work to hand to a thread pool (unknown work: yes)."""
    work = stmt_work(loop, env)
    return work is None or work >= PARALLEL_MIN_WORK
