"""Work estimates over the loop IR, target-neutral: how many operations a loop runs, from its extents and its
body. Codegen keeps a parallel loop whose estimate is below PARALLEL_MIN_WORK on the calling thread (natively
today; wasm threads are to use the same rule), because handing it to a thread pool costs more than it saves."""

from __future__ import annotations

from compiler.te.expr import Binary, Call, Cast, Compare, Const, Expr, IfThenElse, Let, Logical, Select, Var
from compiler.tir.analysis import affine_coefficient
from compiler.tir.nodes import Allocate, For, ForKind, IfThen, KernelCall, LetStmt, Load, Seq, Stmt, Store
from compiler.tir.simplify import bounds

# Operations per call, about the instructions codegen/fast_math.py's and tir/fast_math.py's polynomials take (erf: a
# clamp, two degree-5 polynomials and a division); other calls (sqrt, min, fma...) are one instruction.
CALL_OPERATIONS = {"exp": 14, "log": 20, "tanh": 24, "sigmoid": 18, "erf": 16, "pow": 36}
# A parallel loop whose estimate is below this stays on the calling thread. Measured on the 2-core VM with
# `benchmarks/threads.py --calibrate` (elementwise, polynomial and reduction bodies, workers awake): loops of up
# to ~16,000 operations (5-7 us on one thread) were 4-10% slower at two threads than at one, loops of ~65,000 and
# more 31-39% faster; the threshold sits between. Handing a loop to a pool whose workers do not come costs the
# caller ~0.4 us, so a loop just above it loses little when the other core is busy.
PARALLEL_MIN_WORK = 32_768


def access_operations(index: Expr, vector: tuple[Var, int] | None) -> int:
    """Operations of one load or store at `index`; in a vectorized loop (`vector`: its variable and lanes) one
    whose lanes are not contiguous costs per lane: a stride-s access reads about s vectors' span (as many as the
    lanes at most), an index that is not affine in the lane is a gather, one load per lane, its index computed
    as vector arithmetic. Counted as one, shufflenet's channel shuffles (gathers, 2-4 ns per counted operation)
    were estimated below the threshold and stayed on one thread for 20-40 us each."""
    if vector is None:
        return 1
    var, lanes = vector
    stride = affine_coefficient(index, var, {})
    if stride is None:
        return lanes + expr_operations(index, vector)
    return max(1, min(abs(stride), lanes))


def expr_operations(expr: Expr, vector: tuple[Var, int] | None = None) -> int:
    """Operations to evaluate `expr` once (loads included, index arithmetic not: it is mostly hoisted, except a
    gather's, see access_operations), inside a vectorized loop when `vector` is given."""
    if isinstance(expr, Const | Var):
        return 0
    if isinstance(expr, Load):
        return access_operations(expr.index, vector)
    if isinstance(expr, Call):
        return CALL_OPERATIONS.get(expr.name, 1) + sum(expr_operations(arg, vector) for arg in expr.args)
    if isinstance(expr, Binary | Compare):
        return 1 + expr_operations(expr.a, vector) + expr_operations(expr.b, vector)
    if isinstance(expr, Logical):
        return 1 + sum(expr_operations(arg, vector) for arg in expr.args)
    if isinstance(expr, Select | IfThenElse):
        parts = (expr.cond, expr.true_value, expr.false_value)
        return 1 + sum(expr_operations(part, vector) for part in parts)
    if isinstance(expr, Cast):
        return 1 + expr_operations(expr.value, vector)
    if isinstance(expr, Let):
        return expr_operations(expr.value, vector) + expr_operations(expr.body, vector)
    return 1


def stmt_work(stmt: Stmt, env: dict | None = None, vector: tuple[Var, int] | None = None) -> int | None:
    """Operations `stmt` runs, with every loop at the upper bound of its extent given the bounds of the variables
    in `env`; None when an extent has no known bound. A vectorized loop counts its body once: it runs as vector
    instructions, and its extent is the target's vector width (`vector` inside it: its variable and lanes), save
    for accesses that are not contiguous (access_operations)."""
    env = env or {}
    if isinstance(stmt, Store):
        return access_operations(stmt.index, vector) + expr_operations(stmt.value, vector)
    if isinstance(stmt, Seq):
        parts = [stmt_work(child, env, vector) for child in stmt.stmts]
        return None if None in parts else sum(parts)
    if isinstance(stmt, For):
        extent = bounds(stmt.extent, env)[1]
        low = bounds(stmt.min, env)
        if extent is None:
            return None
        high = None if low[1] is None else low[1] + extent - 1
        vectorized = stmt.kind == ForKind.VECTORIZED
        inner = (stmt.var, max(extent, 1)) if vectorized and vector is None else vector
        body = stmt_work(stmt.body, {**env, stmt.var: (low[0], high)}, inner)
        if body is None:
            return None
        return body if vectorized else max(extent, 0) * body
    if isinstance(stmt, IfThen):
        then_work = stmt_work(stmt.then_body, env, vector)
        else_work = 0 if stmt.else_body is None else stmt_work(stmt.else_body, env, vector)
        if None in (then_work, else_work):
            return None
        return expr_operations(stmt.cond, vector) + max(then_work, else_work)
    if isinstance(stmt, LetStmt):
        body = stmt_work(stmt.body, {**env, stmt.var: bounds(stmt.value, env)}, vector)
        return None if body is None else expr_operations(stmt.value, vector) + body
    if isinstance(stmt, Allocate):
        return stmt_work(stmt.body, env, vector)
    if isinstance(stmt, KernelCall):
        return None
    return 0


def worth_parallel(loop: For, env: dict | None = None) -> bool:
    """Whether a parallel loop does enough work to hand to a thread pool (unknown work: yes)."""
    work = stmt_work(loop, env)
    return work is None or work >= PARALLEL_MIN_WORK
