"""The loop-IR simplifier: constant folding, linear index canonicalisation, and facts from loop ranges.

`tir/lower.py` runs it on every PrimFunc it builds, so guards that loop ranges prove always true
disappear and index arithmetic is small before any codegen sees it.
"""

from __future__ import annotations

import dataclasses
import math

from compiler.te.expr import (
    Binary,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    IfThenElse,
    Let,
    Logical,
    Select,
    SizeVar,
    Var,
    is_int,
)
from compiler.te.tensor import substitute, walk
from compiler.tir.nodes import (
    Allocate,
    Barrier,
    For,
    ForKind,
    IfThen,
    LetStmt,
    Load,
    Prefetch,
    PrimFunc,
    Seq,
    Stmt,
    Store,
)
from compiler.tir.visitor import ScopedMutator, StmtMutator, structural_key

Bounds = tuple[int | None, int | None]
UNKNOWN: Bounds = (None, None)
INDEX_DTYPES = ("int32", "int64")


def _wrap(value: int, dtype: str) -> int:
    if dtype == "bool":
        return bool(value)
    bits = int(dtype.removeprefix("u").removeprefix("int"))
    value &= (1 << bits) - 1
    if not dtype.startswith("u") and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def _const(value, dtype: str) -> Const:
    if dtype == "bool":
        return Const(bool(value), dtype)
    if is_int(dtype):
        return Const(_wrap(int(value), dtype), dtype)
    return Const(float(value), dtype)


def bounds(expr: Expr, env: dict[Var, Bounds]) -> Bounds:
    """Inclusive integer bounds of `expr` given bounds of the vars in `env`; None where unknown."""
    if isinstance(expr, Const):
        return (int(expr.value), int(expr.value)) if not isinstance(expr.value, float) else UNKNOWN
    if isinstance(expr, SizeVar):
        # a run's size lies in its range, whatever a let binding it (from the sizes argument) says it is
        known = env.get(expr)
        return known if known is not None and None not in known else (expr.low, expr.high)
    if isinstance(expr, Var):
        return env.get(expr, UNKNOWN)
    if isinstance(expr, Compare | Logical):
        return (0, 1)
    if not is_int(expr.dtype):
        return UNKNOWN
    if isinstance(expr, Cast):
        inner = bounds(expr.value, env)
        return inner if is_int(expr.value.dtype) or expr.value.dtype == "bool" else UNKNOWN
    if isinstance(expr, Select | IfThenElse):
        return _union(bounds(expr.true_value, env), bounds(expr.false_value, env))
    if isinstance(expr, Let):
        return bounds(expr.body, {**env, expr.var: bounds(expr.value, env)})
    if isinstance(expr, Call) and expr.name == "index_check":
        high = bounds(expr.args[1], env)[1]
        return (0, None if high is None else high - 1)
    if not isinstance(expr, Binary):
        return UNKNOWN
    a, b = bounds(expr.a, env), bounds(expr.b, env)
    op = expr.op
    if op == "add":
        return (_opt(a[0], b[0], int.__add__), _opt(a[1], b[1], int.__add__))
    if op == "sub":
        return (_opt(a[0], b[1], int.__sub__), _opt(a[1], b[0], int.__sub__))
    if op == "mul":
        if None in a or None in b:
            if b[0] is not None and b[0] == b[1]:
                return _scale(a, b[0])
            if a[0] is not None and a[0] == a[1]:
                return _scale(b, a[0])
            return UNKNOWN
        products = [x * y for x in a for y in b]
        return (min(products), max(products))
    if op == "min":
        # The smaller of two values is below either one's known upper bound.
        return (_opt(a[0], b[0], min), _known(min, a[1], b[1]))
    if op == "max":
        return (_known(max, a[0], b[0]), _opt(a[1], b[1], max))
    divisor = b[0] if b[0] is not None and b[0] == b[1] else None
    if divisor is None and b[0] is not None and b[0] > 0 and b[1] is not None and a[0] is not None and a[0] >= 0:
        # a positive divisor known only by its range (a symbolic size's): a non-negative quotient lies between the
        # dividend's ends over the divisor's, a remainder below the divisor's largest value
        if op in ("floordiv", "div"):
            return (a[0] // b[1], None if a[1] is None else a[1] // b[0])
        if op == "floormod":
            return (0, b[1] - 1 if a[1] is None else min(a[1], b[1] - 1))
    if divisor is None or divisor <= 0:
        return UNKNOWN
    if op == "floordiv" or (op == "div" and a[0] is not None and a[0] >= 0):
        return (None if a[0] is None else a[0] // divisor, None if a[1] is None else a[1] // divisor)
    if op == "floormod":
        if None not in a and a[0] // divisor == a[1] // divisor:
            return (a[0] % divisor, a[1] % divisor)
        return (0, divisor - 1)
    return UNKNOWN


def loop_bounds(low: Expr, extent: Expr, env: dict[Var, Bounds]) -> Bounds:
    """Inclusive bounds of the var of a loop that starts at `low` and runs `extent` iterations."""
    low_bounds, extent_high = bounds(low, env), bounds(extent, env)[1]
    high = None if low_bounds[1] is None or extent_high is None else low_bounds[1] + extent_high - 1
    return (low_bounds[0], high)


def _opt(x, y, fn):
    return None if x is None or y is None else fn(x, y)


def _known(pick, x, y):
    known = [value for value in (x, y) if value is not None]
    return pick(known) if known else None


def _scale(b: Bounds, factor: int) -> Bounds:
    low = None if b[0] is None else b[0] * factor
    high = None if b[1] is None else b[1] * factor
    return (low, high) if factor >= 0 else (high, low)


def _union(a: Bounds, b: Bounds) -> Bounds:
    low = None if a[0] is None or b[0] is None else min(a[0], b[0])
    high = None if a[1] is None or b[1] is None else max(a[1], b[1])
    return (low, high)


class Linear:
    """sum(coef * atom) + const over an int dtype; atoms kept in order of first appearance."""

    def __init__(self, dtype: str, terms: dict | None = None, const: int = 0):
        self.dtype = dtype
        self.terms: dict[tuple, list] = terms if terms is not None else {}
        self.const = const

    @staticmethod
    def of(expr: Expr) -> Linear:
        if isinstance(expr, Const):
            return Linear(expr.dtype, const=int(expr.value))
        if isinstance(expr, Binary) and expr.op in ("add", "sub"):
            left, right = Linear.of(expr.a), Linear.of(expr.b)
            return left.plus(right, 1 if expr.op == "add" else -1)
        if isinstance(expr, Binary) and expr.op == "mul":
            if isinstance(expr.b, Const):
                return Linear.of(expr.a).times(int(expr.b.value))
            if isinstance(expr.a, Const):
                return Linear.of(expr.b).times(int(expr.a.value))
        return Linear(expr.dtype, {structural_key(expr): [expr, 1]})

    def plus(self, other: Linear, sign: int = 1) -> Linear:
        terms = {key: list(value) for key, value in self.terms.items()}
        for key, (atom, coef) in other.terms.items():
            if key in terms:
                terms[key][1] += sign * coef
            else:
                terms[key] = [atom, sign * coef]
        return Linear(self.dtype, {k: v for k, v in terms.items() if v[1] != 0}, self.const + sign * other.const)

    def times(self, factor: int) -> Linear:
        if factor == 0:
            return Linear(self.dtype)
        return Linear(self.dtype, {k: [a, c * factor] for k, (a, c) in self.terms.items()}, self.const * factor)

    def bounds(self, env) -> Bounds:
        low, high = self.const, self.const
        for atom, coef in self.terms.values():
            atom_low, atom_high = _scale(bounds(atom, env), coef)
            low = _opt(low, atom_low, int.__add__)
            high = _opt(high, atom_high, int.__add__)
        return (low, high)

    def to_expr_divided(self, divisor: int) -> Expr:
        """The expression of self / divisor, for coefficients and constant that `divisor` divides."""
        terms = {k: [a, c // divisor] for k, (a, c) in self.terms.items()}
        return Linear(self.dtype, terms, self.const // divisor).to_expr()

    def to_expr(self) -> Expr:
        items = list(self.terms.values())
        positive = [item for item in items if item[1] > 0]
        negative = [item for item in items if item[1] < 0]
        result: Expr | None = None
        constant = self.const
        if not positive and constant != 0:
            result, constant = _const(constant, self.dtype), 0
        for atom, coef in positive:
            term = atom if coef == 1 else Binary("mul", atom, _const(coef, self.dtype))
            result = term if result is None else Binary("add", result, term)
        for atom, coef in negative:
            if result is None:
                result = Binary("mul", atom, _const(coef, self.dtype))
                continue
            term = atom if coef == -1 else Binary("mul", atom, _const(-coef, self.dtype))
            result = Binary("sub", result, term)
        if result is None:
            return _const(self.const, self.dtype)
        if constant > 0:
            result = Binary("add", result, _const(constant, self.dtype))
        elif constant < 0:
            result = Binary("sub", result, _const(-constant, self.dtype))
        return result


def _fold_binary(op: str, a: Const, b: Const, dtype: str) -> Const | None:
    x, y = a.value, b.value
    if is_int(dtype):
        x, y = int(x), int(y)
        if op in ("div", "floordiv", "floormod") and y == 0:
            return None
        if op == "div":
            quotient = abs(x) // abs(y)
            return _const(quotient if (x >= 0) == (y >= 0) else -quotient, dtype)
        table = {
            "add": lambda: x + y,
            "sub": lambda: x - y,
            "mul": lambda: x * y,
            "floordiv": lambda: x // y,
            "floormod": lambda: x % y,
            "min": lambda: min(x, y),
            "max": lambda: max(x, y),
            "pow": lambda: x**y if y >= 0 else None,
        }
        value = table[op]()
        return None if value is None else _const(value, dtype)
    if dtype == "bool":
        return None
    try:
        table = {
            "add": lambda: x + y,
            "sub": lambda: x - y,
            "mul": lambda: x * y,
            "div": lambda: x / y,
            "floordiv": lambda: math.floor(x / y),
            "floormod": lambda: x - math.floor(x / y) * y,
            "min": lambda: min(x, y),
            "max": lambda: max(x, y),
            "pow": lambda: x**y,
        }
        return _const(table[op](), dtype)
    except (ZeroDivisionError, OverflowError, ValueError):
        return None


def _compare(op: str, x, y) -> bool:
    return {"lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y, "eq": x == y, "ne": x != y}[op]


_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}


class _Simplifier(ScopedMutator):
    """Expressions and statements under the bounds `env` holds for the vars in scope; a statement that does nothing
    visits to None."""

    def __init__(self, env: dict):
        super().__init__(env)
        # the run-time extent of each loop from 0 to a symbolic size: numeric bounds alone cannot show that the
        # loop's var stays below that size
        self.extents: dict[Var, Expr] = {}

    def generic_visit(self, node):
        if isinstance(node, Stmt):
            raise TypeError(f"simplify: unknown statement {type(node).__name__}")
        return super().generic_visit(node)

    def below(self, a: Expr, b: Expr) -> bool:
        """Whether a < b for every value of the vars, by the structure of a symbolic bound: a clamp
        `max(min(x, b - 1), 0)`, a loop's var against its extent, a difference that is a negative constant."""
        difference = Linear.of(a).plus(Linear.of(b), -1)
        if not difference.terms:
            return difference.const < 0
        if isinstance(a, Binary) and a.op in ("min", "max"):
            holds = self.below(a.a, b), self.below(a.b, b)
            return any(holds) if a.op == "min" else all(holds)
        if a in self.extents:
            gap = Linear.of(self.extents[a]).plus(Linear.of(b), -1)
            return not gap.terms and gap.const <= 0
        a_high, b_low = bounds(a, self.env)[1], bounds(b, self.env)[0]
        return a_high is not None and b_low is not None and a_high < b_low

    # ---- expressions

    def visit_load(self, e: Load) -> Expr:
        return Load(e.buffer, self.visit(e.index))

    def visit_binary(self, e: Binary) -> Expr:
        return self.binary(e.op, self.visit(e.a), self.visit(e.b))

    def visit_compare(self, e: Compare) -> Expr:
        return self.compare(e.op, self.visit(e.a), self.visit(e.b))

    def visit_logical(self, e: Logical) -> Expr:
        return self.logical(e.op, [self.visit(arg) for arg in e.args])

    def visit_select(self, e: Select | IfThenElse) -> Expr:
        cond = self.visit(e.cond)
        if isinstance(cond, Const):
            return self.visit(e.true_value if cond.value else e.false_value)
        return type(e)(cond, self.visit(e.true_value), self.visit(e.false_value))

    visit_ifthenelse = visit_select

    def visit_cast(self, e: Cast) -> Expr:
        value = self.visit(e.value)
        if value.dtype == e.dtype:
            return value
        if isinstance(value, Const) and not (is_int(e.dtype) and isinstance(value.value, float)):
            return _const(value.value, e.dtype)
        if isinstance(value, Const) and is_int(e.dtype) and math.isfinite(value.value):
            return _const(math.trunc(value.value), e.dtype)
        return Cast(e.dtype, value)

    def visit_call(self, e: Call) -> Expr:
        return Call(e.name, tuple(self.visit(arg) for arg in e.args), e.dtype)

    def visit_let(self, e: Let) -> Expr:
        value = self.visit(e.value)
        if isinstance(value, Const | Var):
            return self.visit(substitute(e.body, {e.var: value}))
        return Let(e.var, value, self.inside(e.var, bounds(value, self.env), e.body))

    # ---- statements

    def visit_store(self, stmt: Store) -> Stmt | None:
        index, value = self.visit(stmt.index), self.visit(stmt.value)
        if _adds_a_zero_product(stmt.buffer, index, value):
            return None
        return Store(stmt.buffer, index, value)

    def visit_for(self, stmt: For) -> Stmt | None:
        low, extent = self.visit(stmt.min), self.visit(stmt.extent)
        if isinstance(extent, Const) and extent.value <= 0:
            return None
        if isinstance(extent, Const) and extent.value == 1 and stmt.kind != ForKind.THREAD_BINDING:
            return self.visit(substitute_stmt(stmt.body, {stmt.var: low}))
        if _is_zero(low) and not isinstance(extent, Const):
            self.extents[stmt.var] = extent
        body = self.inside(stmt.var, loop_bounds(low, extent, self.env), stmt.body)
        if body is None:
            return None
        return _guarded_loop(For(stmt.var, low, extent, stmt.kind, body, stmt.thread_tag))

    def visit_ifthen(self, stmt: IfThen) -> Stmt | None:
        cond = self.visit(stmt.cond)
        if isinstance(cond, Const):
            branch = stmt.then_body if cond.value else stmt.else_body
            return None if branch is None else self.visit(branch)
        then_body = self.visit(stmt.then_body)
        else_body = self.visit(stmt.else_body) if stmt.else_body is not None else None
        if then_body is None and else_body is None:
            return None
        if then_body is None:
            return IfThen(Logical("not", (cond,)), else_body)
        return IfThen(cond, then_body, else_body)

    def visit_seq(self, stmt: Seq) -> Stmt | None:
        parts: list[Stmt] = []
        for child in stmt.stmts:
            simplified = self.visit(child)
            if isinstance(simplified, Seq):
                parts.extend(simplified.stmts)
            elif simplified is not None:
                parts.append(simplified)
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else Seq(tuple(parts))

    def visit_allocate(self, stmt: Allocate) -> Stmt | None:
        body = self.visit(stmt.body)
        return None if body is None else Allocate(stmt.buffer, body)

    def visit_letstmt(self, stmt: LetStmt) -> Stmt | None:
        value = self.visit(stmt.value)
        if isinstance(value, Const | Var):
            return self.visit(substitute_stmt(stmt.body, {stmt.var: value}))
        body = self.inside(stmt.var, bounds(value, self.env), stmt.body)
        return None if body is None else LetStmt(stmt.var, value, body)

    def visit_barrier(self, stmt: Barrier) -> Stmt:
        return stmt

    def visit_prefetch(self, stmt: Prefetch) -> Stmt:
        return Prefetch(self.visit(stmt.element))

    def binary(self, op: str, a: Expr, b: Expr) -> Expr:
        dtype = a.dtype
        if isinstance(a, Const) and isinstance(b, Const):
            folded = _fold_binary(op, a, b, dtype)
            if folded is not None:
                return folded
        if dtype in INDEX_DTYPES:
            return self.index_binary(op, a, b)
        if op == "add" and _is_zero(b):
            return a
        if op == "add" and _is_zero(a):
            return b
        if op == "sub" and _is_zero(b):
            return a
        if op in ("mul", "div") and _is_one(b):
            return a
        if op == "mul" and _is_one(a):
            return b
        if op == "mul" and is_int(dtype) and (_is_zero(a) or _is_zero(b)):
            return _const(0, dtype)
        return Binary(op, a, b)

    def index_binary(self, op: str, a: Expr, b: Expr) -> Expr:
        dtype = a.dtype
        if op in ("add", "sub"):
            return _merge_div_mod(Linear.of(a).plus(Linear.of(b), 1 if op == "add" else -1)).to_expr()
        if op == "mul" and (isinstance(a, Const) or isinstance(b, Const)):
            return Linear.of(Binary("mul", a, b)).to_expr()
        if op in ("min", "max"):
            a_bounds, b_bounds = bounds(a, self.env), bounds(b, self.env)
            a_first = a_bounds[1] is not None and b_bounds[0] is not None and a_bounds[1] <= b_bounds[0]
            b_first = b_bounds[1] is not None and a_bounds[0] is not None and b_bounds[1] <= a_bounds[0]
            if a_first or b_first:
                return (a if a_first else b) if op == "min" else (b if a_first else a)
            return Binary(op, a, b)
        if op in ("floordiv", "floormod", "div") and isinstance(b, Const) and b.value > 0:
            return self.division(op, a, int(b.value), dtype)
        low = bounds(a, self.env)[0]
        if op in ("floordiv", "floormod", "div") and low is not None and low >= 0 and self.below(a, b):
            # a run-time size divides a value already below it (a loop's var by its extent, a clamped row)
            return a if op == "floormod" else _const(0, dtype)
        count = self.quotient_count(a, b) if op in ("floordiv", "div") else None
        if count is not None:
            # a fused loop's outer index: below the outer loop's extent, which numeric bounds cannot show (a tile
            # loop of (seq + 3) / 4 fused with 96 panels: the panel's column guard stayed in the vector loop)
            return Binary("min", Binary(op, a, b), _const(count - 1, dtype))
        return Binary(op, a, b)

    def quotient_count(self, a: Expr, b: Expr) -> int | None:
        """k where `a` is a loop's var over [0, k * b) for a run-time `b`: a // b is then below k."""
        if a not in self.extents:
            return None
        extent, divisor = Linear.of(self.extents[a]), Linear.of(b)
        if extent.const or divisor.const or len(extent.terms) != 1 or len(divisor.terms) != 1:
            return None
        ((key, (_, count)),) = extent.terms.items()
        ((divisor_key, (_, unit)),) = divisor.terms.items()
        return count if key == divisor_key and unit == 1 and count > 0 else None

    def division(self, op: str, a: Expr, divisor: int, dtype: str) -> Expr:
        if divisor == 1:
            return a if op != "floormod" else _const(0, dtype)
        numerator_low = bounds(a, self.env)[0]
        if op == "div" and (numerator_low is None or numerator_low < 0):
            return Binary(op, a, _const(divisor, dtype))
        linear = Linear.of(a)
        multiple = Linear(dtype, {k: v for k, v in linear.terms.items() if v[1] % divisor == 0})
        rest = Linear(dtype, {k: v for k, v in linear.terms.items() if v[1] % divisor != 0}, linear.const)
        rest_low, rest_high = rest.bounds(self.env)
        if rest_low is not None and rest_high is not None and rest_low // divisor == rest_high // divisor:
            quotient = rest_low // divisor
            if op == "floormod":
                return rest.plus(Linear(dtype, const=quotient * divisor), -1).to_expr()
            return multiple.plus(Linear(dtype, const=quotient * divisor)).to_expr_divided(divisor)
        if op == "floormod":
            return Binary("floormod", rest.to_expr(), _const(divisor, dtype))
        kind = "div" if numerator_low is not None and numerator_low >= 0 else "floordiv"
        if multiple.terms and rest.bounds(self.env)[0] is not None and rest.bounds(self.env)[0] >= 0:
            quotient = multiple.to_expr_divided(divisor)
            return self.binary("add", quotient, Binary(kind, rest.to_expr(), _const(divisor, dtype)))
        return Binary(kind, linear.to_expr(), _const(divisor, dtype))

    def compare(self, op: str, a: Expr, b: Expr) -> Expr:
        if isinstance(a, Const) and isinstance(b, Const):
            return Const(_compare(op, a.value, b.value), "bool")
        if a.dtype not in INDEX_DTYPES:
            return Compare(op, a, b)
        difference = Linear.of(a).plus(Linear.of(b), -1)
        low, high = difference.bounds(self.env)
        decided = _decide(op, low, high)
        if decided is not None:
            return Const(decided, "bool")
        constant = difference.const
        difference.const = 0
        if difference.terms and all(coef < 0 for _, coef in difference.terms.values()):
            return Compare(_FLIP[op], difference.times(-1).to_expr(), _const(constant, a.dtype))
        return Compare(op, difference.to_expr(), _const(-constant, a.dtype))

    def logical(self, op: str, args: list[Expr]) -> Expr:
        if op == "not":
            (arg,) = args
            return Const(not arg.value, "bool") if isinstance(arg, Const) else Logical("not", (arg,))
        absorbing = op == "or"
        kept = []
        for arg in args:
            if isinstance(arg, Const):
                if bool(arg.value) == absorbing:
                    return Const(absorbing, "bool")
                continue
            kept.append(arg)
        if not kept:
            return Const(not absorbing, "bool")
        result = kept[0]
        for arg in kept[1:]:
            result = Logical(op, (result, arg))
        return result


def _merge_div_mod(linear: Linear) -> Linear:
    """Rewrite k*c*(x // c) + k*(x % c) as k*x, the pattern fused loops leave behind."""
    for key, (atom, coef) in list(linear.terms.items()):
        if not (isinstance(atom, Binary) and atom.op == "floormod" and isinstance(atom.b, Const)):
            continue
        divisor = int(atom.b.value)
        for other_key, (other, other_coef) in list(linear.terms.items()):
            if (
                isinstance(other, Binary)
                and other.op in ("floordiv", "div")
                and isinstance(other.b, Const)
                and other.b.value == divisor
                and other_coef == coef * divisor
                and structural_key(other.a) == structural_key(atom.a)
            ):
                rest = Linear(linear.dtype, dict(linear.terms), linear.const)
                del rest.terms[key], rest.terms[other_key]
                return _merge_div_mod(rest.plus(Linear.of(atom.a).times(coef)))
    return linear


def _decide(op: str, low, high) -> bool | None:
    """Decide `difference op 0` from the difference's bounds."""
    if op == "lt":
        return True if high is not None and high < 0 else False if low is not None and low >= 0 else None
    if op == "le":
        return True if high is not None and high <= 0 else False if low is not None and low > 0 else None
    if op == "gt":
        return True if low is not None and low > 0 else False if high is not None and high <= 0 else None
    if op == "ge":
        return True if low is not None and low >= 0 else False if high is not None and high < 0 else None
    if low is not None and low == high:
        return (low == 0) if op == "eq" else (low != 0)
    if (low is not None and low > 0) or (high is not None and high < 0):
        return op == "ne"
    return None


def _adds_a_zero_product(buffer, index: Expr, value: Expr) -> bool:
    """A reduction step `buf[i] = buf[i] + 0 * y` (a padded tap whose test partitioning decided: the padding is zero):
    it adds nothing, save the NaN that IEEE makes of 0 * inf, so it is dropped (and with it a loop left empty). Only
    in this form: elsewhere 0 * y stays, so an inf or NaN operand still shows in the result."""
    if not (isinstance(value, Binary) and value.op == "add" and isinstance(value.b, Binary) and value.b.op == "mul"):
        return False
    step = value.a
    if not (isinstance(step, Load) and step.buffer is buffer and structural_key(step.index) == structural_key(index)):
        return False
    return _is_zero(value.b.a) or _is_zero(value.b.b)


def _is_zero(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == 0 and not isinstance(e.value, bool)


def _is_one(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == 1 and not isinstance(e.value, bool)


class _Substitution(StmtMutator):
    """Vars replaced by expressions; the var a loop or a let binds is never replaced."""

    def __init__(self, mapping: dict[Var, Expr]):
        self.mapping = mapping

    def visit_var(self, var: Var) -> Expr:
        return self.mapping.get(var, var)

    def visit_for(self, stmt: For | LetStmt) -> Stmt:
        return dataclasses.replace(self.generic_visit(stmt), var=stmt.var)

    visit_letstmt = visit_for


def substitute_stmt(stmt: Stmt, mapping: dict[Var, Expr]) -> Stmt:
    return _Substitution(mapping).visit(stmt)


def _guarded_loop(loop: For) -> Stmt | None:
    """A loop whose whole body is one test: the terms that do not read the loop variable move outside it, and a
    bound `var < k` shortens the loop instead of being tested in every iteration (the columns of a tail tile,
    whose unrolled accumulators then stay in registers)."""
    body = loop.body
    if loop.kind == ForKind.THREAD_BINDING or not isinstance(body, IfThen) or body.else_body is not None:
        return loop
    terms = list(body.cond.args) if isinstance(body.cond, Logical) and body.cond.op == "and" else [body.cond]
    outside = [term for term in terms if not any(node is loop.var for node in walk(term))]
    extent, kept = loop.extent, []
    for term in terms:
        if any(term is other for other in outside):
            continue
        bounded = isinstance(term, Compare) and term.op in ("lt", "le") and term.a is loop.var
        if bounded and isinstance(term.b, Const) and isinstance(loop.min, Const) and isinstance(extent, Const):
            limit = term.b.value - loop.min.value + (term.op == "le")
            extent = _const(min(extent.value, limit), extent.dtype)
        else:
            kept.append(term)
    if len(kept) == len(terms):
        return loop
    if isinstance(extent, Const) and extent.value <= 0:
        return None
    inner = IfThen(_conjunction(kept), body.then_body) if kept else body.then_body
    result = For(loop.var, loop.min, extent, loop.kind, inner, loop.thread_tag)
    return IfThen(_conjunction(outside), result) if outside else result


def _conjunction(terms: list[Expr]) -> Expr:
    return terms[0] if len(terms) == 1 else Logical("and", tuple(terms))


def simplify(node, env: dict[Var, Bounds] | None = None):
    """Simplify an expression, a statement or a PrimFunc; `env` gives known var bounds (inclusive)."""
    simplifier = _Simplifier(dict(env or {}))
    if isinstance(node, PrimFunc):
        body = simplifier.visit(node.body)
        return PrimFunc(node.name, node.params, body if body is not None else Seq(()), dict(node.attrs))
    body = simplifier.visit(node)
    return body if body is not None or not isinstance(node, Stmt) else Seq(())
