"""Sizes known only at run time (issue 40): a `Sym` is an integer polynomial over named sizes, each in an inclusive
range (`seq` in 1..2048), so `seq`, `4*seq`, `past+seq` and `seq*seq` are all Syms.

A Sym stands where an int stands in a shape, and in the int64 arrays that shape arithmetic folds to at import (numpy
object arrays): +, -, * and the exact // and % work, comparisons answer when the ranges settle them, and anything
that needs the number itself (`int(sym)`, an undecided comparison) raises a SymbolicSizeError naming the size. So
code written for ints either works on Syms or fails loudly; it never takes a size's bound for its value.

A tensor with a symbolic shape is stored at its largest shape (`TensorType.max_shape`), with that shape's strides,
and only the box of its actual sizes is read and written: see docs/architecture.md, "Symbolic sizes".
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
import re
from collections.abc import Callable, Mapping

import numpy as np

from compiler.errors import ShapeError, SymbolicSizeError
from compiler.target import size_capacity

__all__ = [
    "Sym",
    "SymbolicSizeError",
    "array_dtype",
    "capacity",
    "evaluate",
    "parse_size",
    "size_array",
    "symbols_of",
    "upper",
]


# the largest value a size may take: kernels read sizes as int32
SIZE_LIMIT = (1 << 31) - 1

Monomial = tuple[str, ...]  # the names multiplied, sorted, with repeats; () is the constant term

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")


def _planned_as(operation: Callable[[int, int], int]):
    """An operator that, while a template plans (planning()), is `operation` on the ints of the operands' layout
    planned ints (Sym.planned), and the polynomial operation otherwise."""

    def decorate(method):
        @functools.wraps(method)
        def operator(self, other):
            if not _PLANNING.get():
                return method(self, other)
            if Sym._of(other) is None:
                return NotImplemented
            return operation(self.planned, other.planned if isinstance(other, Sym) else int(other))

        return operator

    return decorate


class Sym:
    __slots__ = ("terms", "ranges")

    def __init__(self, terms: Mapping[Monomial, int], ranges: Mapping[str, tuple[int, int]]):
        self.terms = {monomial: coef for monomial, coef in terms.items() if coef}
        self.ranges = dict(ranges)

    @staticmethod
    def symbol(name: str, low: int, high: int) -> Sym:
        if not _NAME.match(name):
            raise ShapeError(f"the size name {name!r} is not a name: use letters, digits and _, as in seq or past")
        if not 0 <= low <= high <= SIZE_LIMIT:
            raise ShapeError(
                f"the size {name} has the range {low}..{high}; give 0 <= low <= high <= {SIZE_LIMIT} (kernels take "
                "sizes as 32-bit integers)"
            )
        return Sym({(name,): 1}, {name: (low, high)})

    # -- arithmetic

    @staticmethod
    def _make(terms: dict, ranges: dict) -> Sym | int:
        terms = {monomial: coef for monomial, coef in terms.items() if coef}
        if not terms:
            return 0
        if list(terms) == [()]:
            return terms[()]
        used = {name for monomial in terms for name in monomial}
        return Sym(terms, {name: ranges[name] for name in used})

    @staticmethod
    def _of(value) -> Sym | None:
        if isinstance(value, Sym):
            return value
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            return None
        return Sym({(): int(value)}, {})

    @_planned_as(int.__add__)
    def __add__(self, other):
        other = Sym._of(other)
        if other is None:
            return NotImplemented
        terms = dict(self.terms)
        for monomial, coef in other.terms.items():
            terms[monomial] = terms.get(monomial, 0) + coef
        return Sym._make(terms, {**self.ranges, **other.ranges})

    __radd__ = __add__

    def __neg__(self):
        if _PLANNING.get():
            return -self.planned
        return Sym._make({monomial: -coef for monomial, coef in self.terms.items()}, self.ranges)

    @_planned_as(int.__sub__)
    def __sub__(self, other):
        other = Sym._of(other)
        return NotImplemented if other is None else self + (-other)

    @_planned_as(lambda a, b: b - a)
    def __rsub__(self, other):
        other = Sym._of(other)
        return NotImplemented if other is None else other + (-self)

    @_planned_as(int.__mul__)
    def __mul__(self, other):
        other = Sym._of(other)
        if other is None:
            return NotImplemented
        terms: dict = {}
        for (left, a), (right, b) in itertools.product(self.terms.items(), other.terms.items()):
            monomial = tuple(sorted(left + right))
            terms[monomial] = terms.get(monomial, 0) + a * b
        return Sym._make(terms, {**self.ranges, **other.ranges})

    __rmul__ = __mul__

    def _divided(self, other) -> Sym | int | None:
        """self / other when it is exact term by term (a polynomial times an int or a monomial), else None."""
        other = Sym._of(other)
        if other is None:
            return None
        if not other.terms:
            raise ZeroDivisionError("a size divided by zero")
        if len(other.terms) > 1:
            # a polynomial divides exactly only a whole multiple of itself here: 64*past+64*seq by 16*past+16*seq
            monomial, coef = next(iter(other.terms.items()))
            factor = self.terms.get(monomial, 0)
            if factor % coef == 0 and self == (factor // coef) * other:
                return factor // coef
            return None
        ((divisor, coef),) = other.terms.items()
        terms = {}
        for monomial, value in self.terms.items():
            rest = list(monomial)
            for name in divisor:
                if name not in rest:
                    return None
                rest.remove(name)
            if value % coef:
                return None
            terms[tuple(rest)] = value // coef
        return Sym._make(terms, self.ranges)

    @_planned_as(int.__floordiv__)
    def __floordiv__(self, other):
        if Sym._of(other) is None:
            return NotImplemented
        quotient = self._divided(other)
        if quotient is None:
            raise SymbolicSizeError(
                f"{self} // {other} is not a whole polynomial in the sizes; Tessel divides a symbolic size only "
                "where it divides exactly (4*seq // 4, seq*64 // seq)"
            )
        return quotient

    @_planned_as(lambda a, b: b // a)
    def __rfloordiv__(self, other):
        other = Sym._of(other)
        if other is None:
            return NotImplemented
        return other // self

    @_planned_as(int.__mod__)
    def __mod__(self, other):
        if Sym._of(other) is None:
            return NotImplemented
        if self._divided(other) is None:
            raise SymbolicSizeError(f"{self} % {other} depends on the size's value; give it a multiple or a fixed size")
        return 0

    @_planned_as(lambda a, b: b % a)
    def __rmod__(self, other):
        other = Sym._of(other)
        return NotImplemented if other is None else other % self

    # -- comparison: structural equality; an order when the ranges decide it

    def __eq__(self, other):
        other = Sym._of(other)
        return other is not None and self.terms == other.terms

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash(tuple(sorted(self.terms.items())))

    def bounds(self) -> tuple[int, int]:
        """The least and greatest values over the ranges of the sizes used (interval arithmetic: the greatest is
        exact for the polynomials of shapes, sums of products with positive coefficients)."""
        low = high = 0
        for monomial, coef in self.terms.items():
            term_low = term_high = coef
            for name in monomial:
                a, b = self.ranges[name]
                products = (term_low * a, term_low * b, term_high * a, term_high * b)
                term_low, term_high = min(products), max(products)
            low, high = low + term_low, high + term_high
        return low, high

    def _decide(self, other, op: str) -> bool:
        if _PLANNING.get():
            value = self.planned
            other = other.planned if isinstance(other, Sym) else int(other)
            return {"lt": value < other, "le": value <= other, "gt": value > other, "ge": value >= other}[op]
        difference = self - other
        if not isinstance(difference, Sym):
            return {"lt": difference < 0, "le": difference <= 0, "gt": difference > 0, "ge": difference >= 0}[op]
        low, high = difference.bounds()
        answers = {
            "lt": (high < 0, low >= 0),
            "le": (high <= 0, low > 0),
            "gt": (low > 0, high <= 0),
            "ge": (low >= 0, high < 0),
        }
        true, false = answers[op]
        if true or false:
            return true
        symbol = {"lt": "<", "le": "<=", "gt": ">", "ge": ">="}[op]
        raise SymbolicSizeError(
            f"whether {self} {symbol} {other} depends on the sizes' values ({self.describe_ranges()}); "
            "give the size a narrower range with --dim, or a fixed size"
        )

    def __lt__(self, other):
        return NotImplemented if Sym._of(other) is None else self._decide(other, "lt")

    def __le__(self, other):
        return NotImplemented if Sym._of(other) is None else self._decide(other, "le")

    def __gt__(self, other):
        return NotImplemented if Sym._of(other) is None else self._decide(other, "gt")

    def __ge__(self, other):
        return NotImplemented if Sym._of(other) is None else self._decide(other, "ge")

    # -- as a tensor expression: the kernel stage registers how (set_expr_converter), as it registers op computes

    def __tensor_expr__(self):
        if _TO_EXPR is None:
            raise SymbolicSizeError(f"the symbolic size {self} reached a tensor expression, but no converter is set")
        return _TO_EXPR(self)

    # -- what needs a number

    def __int__(self):
        if _PLANNING.get():
            return self.planned
        raise SymbolicSizeError(
            f"a fixed number is needed where the model has the symbolic size {self} ({self.describe_ranges()}); "
            "compile with a fixed size for it (--input-shape) instead of a range"
        )

    __index__ = __int__

    def __bool__(self):
        if _PLANNING.get():
            return self.planned != 0
        low, high = self.bounds()
        if low > 0 or high < 0:
            return True
        if low == high == 0:
            return False
        raise SymbolicSizeError(f"whether {self} is zero depends on the sizes' values ({self.describe_ranges()})")

    def evaluate(self, values: Mapping[str, int]) -> int:
        total = 0
        for monomial, coef in self.terms.items():
            term = coef
            for name in monomial:
                term *= values[name]
            total += term
        return total

    @property
    def upper(self) -> int:
        return self.bounds()[1]

    @property
    def capacity(self) -> int:
        """The extent a dimension of this size is laid out for: its largest value, rounded up (size_capacity)."""
        return size_capacity(self.upper)

    @property
    def planned(self) -> int:
        """The int a template plans this size as (planning()): its capacity, or for a plan of the smallest sizes, its
        value with every name at the least of its range (at least 1: a template plans no empty loop)."""
        if _PLANNING.get() == SMALLEST:
            return max(1, self.evaluate({name: low for name, (low, _) in self.ranges.items()}))
        return self.capacity

    @property
    def names(self) -> list[str]:
        return sorted(self.ranges)

    def describe_ranges(self) -> str:
        return ", ".join(f"{name} in {low}..{high}" for name, (low, high) in sorted(self.ranges.items()))

    def __str__(self):
        parts = []
        for monomial, coef in sorted(self.terms.items(), key=lambda item: (-len(item[0]), item[0])):
            names = "*".join(monomial)
            if not monomial:
                text = str(abs(coef))
            elif abs(coef) == 1:
                text = names
            else:
                text = f"{abs(coef)}*{names}"
            parts.append(("-" if coef < 0 else "+", text))
        head_sign, head = parts[0]
        return ("-" if head_sign == "-" else "") + head + "".join(f"{sign}{text}" for sign, text in parts[1:])

    __repr__ = __str__


_TO_EXPR: Callable | None = None
LARGEST, SMALLEST = "largest", "smallest"
_PLANNING: contextvars.ContextVar[str | None] = contextvars.ContextVar("sym_planning", default=None)


@contextlib.contextmanager
def planning(sizes: str = LARGEST):
    """Within the block, a Sym is an int in every arithmetic operation, order, int() and truth test, for schedule
    templates choosing tiles: with LARGEST its layout extent (its largest value, rounded up: `capacity`), with SMALLEST
    its value at the least sizes (`planned`: a kernel's variant for a decode step's single row). That is safe there
    because they only choose: the loops run to the run's sizes (as expressions of size vars), and lowering guards
    every split of a symbolic extent."""
    token = _PLANNING.set(sizes)
    try:
        yield
    finally:
        _PLANNING.reset(token)


def set_expr_converter(convert: Callable) -> None:
    """How a Sym becomes a tensor expression (compiler/compute/ registers it; the graph knows no expressions)."""
    global _TO_EXPR
    _TO_EXPR = convert


def is_static(dim) -> bool:
    return not isinstance(dim, Sym)


def upper(dim) -> int:
    """A dimension's largest value: itself for an int."""
    return dim.upper if isinstance(dim, Sym) else int(dim)


def capacity(dim) -> int:
    """The extent a dimension is laid out for: an int itself, a Sym its largest value rounded up (size_capacity)."""
    return dim.capacity if isinstance(dim, Sym) else int(dim)


def evaluate(dim, values: Mapping[str, int]) -> int:
    return dim.evaluate(values) if isinstance(dim, Sym) else int(dim)


def symbols_of(shape) -> dict[str, tuple[int, int]]:
    """The sizes a shape uses, with their ranges."""
    found: dict[str, tuple[int, int]] = {}
    for dim in shape:
        if isinstance(dim, Sym):
            found.update(dim.ranges)
    return found


def size_array(values) -> np.ndarray:
    """Sizes as an int64 array, or, where any is symbolic, an object array of ints and Syms (what shape arithmetic
    folds to at import; TensorType calls its dtype int64: array_dtype)."""
    array = np.asarray(values, dtype=object)
    if any(isinstance(item, Sym) for item in array.reshape(-1)):
        return array
    return array.astype(np.int64)


def array_dtype(array: np.ndarray) -> str:
    return "int64" if array.dtype == object else str(array.dtype)


_TERM = re.compile(r"([+-]?)([^+-]+)")


def parse_size(text: str, ranges: Mapping[str, tuple[int, int]]) -> Sym | int:
    """The Sym that str() wrote ("4*seq+past", "seq*seq-1"), over sizes of the given ranges; a ShapeError naming the
    text when it is not one (a bundle's manifest holds these)."""
    compact = str(text).replace(" ", "")
    if not compact or _TERM.sub("", compact):
        raise ShapeError(f"{text!r} is not a size expression")
    total: Sym | int = 0
    for sign, body in _TERM.findall(compact):
        term: Sym | int = -1 if sign == "-" else 1
        for factor in body.split("*"):
            if factor.isdigit():
                term = term * int(factor)
            elif factor in ranges:
                term = term * Sym.symbol(factor, *ranges[factor])
            else:
                raise ShapeError(f"{text!r} names {factor!r}, which is not one of the sizes {', '.join(ranges)}")
        total = total + term
    return total
