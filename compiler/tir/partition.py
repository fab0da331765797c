"""Loop partitioning: a loop whose body tests its variable (a padded read's `select(0 <= row < H, ...)`, a clamped
region) is cut at every iteration where one of those tests starts or stops holding for all values of the other
vars, so each piece knows which tests it can drop: the interior runs without them, and a border keeps only its
own side's (a row of two tiles, each a border, becomes two pieces with one test each).

A serial loop of a run-time extent (a symbolic size's row tiles) is cut at the same constant cuts, each piece running
to the lesser of its cut and the loop's end.

A parallel loop is one job of the thread pool, so it is not cut: its body branches instead, on the value of the term
of its var that the tests read (a fused loop's row), each branch knowing that term's range (a blocked conv's task
then reads its padding in place without a test in its interior rows).

`tir/lower.py` applies it to the loops a schedule marked with `Stage.partition`, then simplifies: the simplifier,
knowing each piece's range, folds the decided tests and the clamps of the indices they guard.
"""

from __future__ import annotations

import dataclasses

from compiler.te.expr import Binary, Compare, Const, Expr, IfThenElse, Select, Var
from compiler.te.tensor import walk
from compiler.tir.nodes import For, ForKind, IfThen, LetStmt, PrimFunc, Seq, Stmt, walk_stmts
from compiler.tir.simplify import Bounds, Linear, bounds, loop_bounds
from compiler.tir.visitor import ScopedMutator, structural_key

# a test `coef * v + rest >= threshold`, by comparison, as (sign, threshold) on `a - b`
_NORMAL = {"ge": (1, 0), "gt": (1, 1), "le": (-1, 0), "lt": (-1, 1)}


def partition_loops(func: PrimFunc, loop_vars: set[Var]) -> PrimFunc:
    """`func` with each serial loop over a var of `loop_vars` cut into pieces (see the module)."""
    return PrimFunc(func.name, func.params, _Partition(loop_vars).visit(func.body))


class _Partition(ScopedMutator):
    """Statements with their marked loops cut, `env` holding the bounds of the vars in scope."""

    def __init__(self, loop_vars: set[Var]):
        super().__init__()
        self.loop_vars = loop_vars

    def visit_expr(self, expr: Expr) -> Expr:
        return expr

    def visit_for(self, stmt: For) -> Stmt:
        low, extent = stmt.min, stmt.extent
        if (
            stmt.var in self.loop_vars
            and stmt.kind == ForKind.SERIAL
            and isinstance(low, Const)
            and isinstance(extent, Const)
        ):
            first, last = int(low.value), int(low.value) + int(extent.value) - 1
            starts = [first, *_cuts(stmt, first, last, self.env), last + 1]
            if len(starts) > 2:
                return Seq(tuple(self.loop(stmt, start, stop - 1) for start, stop in zip(starts, starts[1:])))
        if stmt.var in self.loop_vars and stmt.kind == ForKind.SERIAL and isinstance(low, Const):
            pieces = self.symbolic_pieces(stmt)
            if pieces is not None:
                return pieces
        if stmt.var in self.loop_vars and stmt.kind == ForKind.PARALLEL:
            env = {**self.env, stmt.var: loop_bounds(low, extent, self.env)}
            body = _branches(stmt.var, stmt.body, env)
            if body is not stmt.body:
                stmt = For(stmt.var, low, extent, stmt.kind, body, stmt.thread_tag)
        return self.loop(stmt, None, None)

    def symbolic_pieces(self, stmt: For) -> Stmt | None:
        """A loop of a run-time extent (a symbolic size's row tiles) cut at its tests' constant cuts, each piece
        running from its start to the lesser of its cut and the loop's end (none past the end): the interior tiles of
        a tile loop over `(seq + 5) / 6` test nothing, only the tiles past the last full one of the layout do."""
        first = int(stmt.min.value)
        last = loop_bounds(stmt.min, stmt.extent, self.env)[1]
        if last is None:
            return None
        cuts = _cuts(stmt, first, last, self.env)
        if not cuts:
            return None
        dtype = stmt.min.dtype
        end = Binary("add", stmt.min, stmt.extent)
        pieces = []
        for start, stop in zip([first, *cuts], [*cuts, None]):
            upper = end if stop is None else Binary("min", Const(stop, dtype), end)
            count = Binary("max", Binary("sub", upper, Const(start, dtype)), Const(0, dtype))
            body = self.inside(stmt.var, (start, last if stop is None else stop - 1), stmt.body)
            pieces.append(For(stmt.var, Const(start, dtype), count, stmt.kind, body, stmt.thread_tag))
        return Seq(tuple(pieces))

    def loop(self, stmt: For, start: int | None, stop: int | None) -> For:
        """`stmt` over [start, stop] (its own range when None), its body partitioned in turn."""
        low, extent = stmt.min, stmt.extent
        if start is not None:
            low, extent = Const(start, stmt.min.dtype), Const(stop - start + 1, stmt.min.dtype)
        body = self.inside(stmt.var, loop_bounds(low, extent, self.env), stmt.body)
        return For(stmt.var, low, extent, stmt.kind, body, stmt.thread_tag)

    def visit_letstmt(self, stmt: LetStmt) -> Stmt:
        return LetStmt(stmt.var, stmt.value, self.inside(stmt.var, bounds(stmt.value, self.env), stmt.body))


def _branches(var: Var, body: Stmt, env) -> Stmt:
    """A parallel loop's body (one job: its loop cannot be cut) cut by branches instead: on the value of the first
    term holding the loop's var (the var itself, or a fused loop's row `var / columns`) that the body's tests cut as
    _cuts does, each branch binding the term, clamped into its piece, to a var of its own so that the simplifier
    knows its range there (the clamp costs a compare or two per task). Each branch is cut again on the next such
    term (a MatMul's last row tile and its last column tile, both in one fused loop: four branches)."""
    for key, (atom, cuts) in _term_cuts(body, var, env).items():
        first, last = bounds(atom, env)
        if first is None or last is None:
            continue
        starts = [first, *sorted(cut for cut in cuts if first < cut <= last), last + 1]
        if len(starts) == 2:
            continue
        value = Var(f"{var.name}.piece", atom.dtype)
        branch: Stmt | None = None
        for start, stop in reversed(list(zip(starts, starts[1:]))):
            piece = Var(f"{var.name}.piece{start}", atom.dtype)
            clamped = Binary("max", Binary("min", value, Const(stop - 1, atom.dtype)), Const(start, atom.dtype))
            inner = LetStmt(piece, clamped, _branches(var, _Replace(key, piece).visit(body), env))
            branch = inner if branch is None else IfThen(Compare("lt", value, Const(stop, atom.dtype)), inner, branch)
        return LetStmt(value, atom, branch)
    return body


class _Replace(ScopedMutator):
    """Every expression structurally equal to `key` replaced by `var`."""

    def __init__(self, key: tuple, var: Var):
        super().__init__()
        self.key, self.var = key, var

    def visit_expr(self, expr: Expr) -> Expr:
        if structural_key(expr) == self.key:
            return self.var
        return self.generic_visit(expr)


def _cuts(loop: For, first: int, last: int, env) -> list[int]:
    """Where, inside (first, last], a test of the loop's body that is linear in its var starts or stops holding
    for every value of the other vars: the sorted starts of the pieces after the first."""
    found = _term_cuts(loop.body, loop.var, env).get(structural_key(loop.var))
    return sorted(cut for cut in (found[1] if found else ()) if first < cut <= last)


def _term_cuts(body: Stmt, var: Var, env) -> dict[tuple, tuple[Expr, set[int]]]:
    """For each term holding `var` (by structural key: the term and the values of it where a test of `body` starts or
    stops holding for every value of the other vars), over the integer tests that hold `var` in that one term only
    (a test where it is also inside another term is not linear in it)."""
    everywhere = {**env, **_inner_ranges(body, env)}
    found: dict[tuple, tuple[Expr, set[int]]] = {}
    for test in _tests(body):
        sign, threshold = _NORMAL.get(test.op, (0, 0))
        if not sign or test.a.dtype not in ("int32", "int64"):
            continue
        linear = Linear.of(test.a).plus(Linear.of(test.b), -1).times(sign)
        holding = [key for key, (atom, _) in linear.terms.items() if any(node is var for node in walk(atom))]
        if len(holding) != 1:
            continue
        atom, coef = linear.terms[holding[0]]
        terms = {key: term for key, term in linear.terms.items() if key != holding[0]}
        rest_low = Linear(linear.dtype, terms, linear.const).bounds(everywhere)[0]
        if rest_low is None:
            continue
        # coef * t + rest >= threshold for every rest  <=>  coef * t >= threshold - rest_low: from t = ceil(need /
        # coef) on when coef > 0, up to t = floor(need / coef) when coef < 0
        need = threshold - rest_low
        found.setdefault(holding[0], (atom, set()))[1].add(-(-need // coef) if coef > 0 else need // coef + 1)
    return found


def _tests(stmt: Stmt) -> list[Compare]:
    """The integer comparisons in the conditions of the selects and branches under `stmt`."""
    conditions: list[Expr] = []
    for node in walk_stmts(stmt):
        if isinstance(node, IfThen):
            conditions.append(node.cond)
        for expr in _exprs(node):
            conditions += [item.cond for item in walk(expr) if isinstance(item, Select | IfThenElse)]
    seen, tests = set(), []
    for condition in conditions:
        for item in walk(condition):
            if isinstance(item, Compare) and structural_key(item) not in seen:
                seen.add(structural_key(item))
                tests.append(item)
    return tests


def _inner_ranges(stmt: Stmt, env) -> dict[Var, Bounds]:
    """Bounds of the vars of the loops and lets nested in `stmt`."""
    ranges: dict[Var, Bounds] = {}
    for node in walk_stmts(stmt):
        scope = {**env, **ranges}
        if isinstance(node, For):
            ranges[node.var] = loop_bounds(node.min, node.extent, scope)
        elif isinstance(node, LetStmt):
            ranges[node.var] = bounds(node.value, scope)
    return ranges


def _exprs(stmt: Stmt) -> list[Expr]:
    """The expressions a statement holds directly (not those of nested statements)."""
    return [getattr(stmt, item.name) for item in dataclasses.fields(stmt) if isinstance(getattr(stmt, item.name), Expr)]
