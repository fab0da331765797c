"""Target-neutral analysis of the loop IR that code generators decide with: an index's affine coefficient in a loop
variable, a clamped run (a padded row read in vectors), and whether a vectorized loop's body can be widened lane by
lane. codegen/llvm/ widens loads and loops by them; the C and WGSL printers can read the same facts."""

from __future__ import annotations

from compiler.te.expr import Binary, Cast, Const, Expr, IfThenElse, Let, Var, is_int
from compiler.tir.nodes import Allocate, Barrier, Buffer, For, IfThen, LetStmt, Load, Stmt, Store
from compiler.tir.visitor import structurally_equal, walk


def affine_coefficient(expr: Expr, var: Var, lets: dict[Var, Expr]) -> int | None:
    """The constant c with expr = c*var + (terms free of var), or None if expr is not affine in var."""
    if isinstance(expr, Var):
        if expr is var:
            return 1
        return affine_coefficient(lets[expr], var, lets) if expr in lets else 0
    if isinstance(expr, Const):
        return 0
    if isinstance(expr, Binary) and expr.op in ("add", "sub", "mul"):
        left, right = affine_coefficient(expr.a, var, lets), affine_coefficient(expr.b, var, lets)
        if left is None or right is None:
            return None
        if expr.op == "add":
            return left + right
        if expr.op == "sub":
            return left - right
        if left == 0 and right == 0:
            return 0
        if left == 0 and isinstance(expr.a, Const):
            return int(expr.a.value) * right
        if right == 0 and isinstance(expr.b, Const):
            return left * int(expr.b.value)
        return None
    if isinstance(expr, Cast) and is_int(expr.dtype) and is_int(expr.value.dtype):
        return affine_coefficient(expr.value, var, lets)
    depends = any(
        node is var or (isinstance(node, Var) and node in lets and affine_coefficient(node, var, lets) != 0)
        for node in walk(expr)
    )
    return None if depends else 0


def clamp_bounds(expr: Expr) -> tuple[Expr, int | None, int | None] | None:
    """(x, low, high) when expr is max(min(x, high), low) or min(max(x, low), high) with constant bounds; a clamp on
    one side only (max(x, low) or min(x, high), as a partitioned loop's border keeps) has None for the other."""
    if not (isinstance(expr, Binary) and expr.op in ("min", "max") and isinstance(expr.b, Const)):
        return None
    inner = expr.a
    other = "max" if expr.op == "min" else "min"
    if not (isinstance(inner, Binary) and inner.op == other and isinstance(inner.b, Const)):
        bound = int(expr.b.value)
        return (inner, bound, None) if expr.op == "max" else (inner, None, bound)
    bounds = sorted((int(expr.b.value), int(inner.b.value)))
    return inner.a, bounds[0], bounds[1]


def _without(expr: Expr, old: Expr, new: Expr) -> Expr:
    """expr with the node `old` replaced by `new`, rebuilding the index arithmetic on the way."""
    if expr is old:
        return new
    if isinstance(expr, Binary):
        return Binary(expr.op, _without(expr.a, old, new), _without(expr.b, old, new))
    if isinstance(expr, Cast):
        return Cast(expr.dtype, _without(expr.value, old, new))
    return expr


def clamped_run(index: Expr, var: Var, lets: dict[Var, Expr]) -> tuple[Expr, int, int, Expr] | None:
    """(position, low, high, unclamped index) when `index` reads clamp(position, low, high) with position stepping
    by one per lane of `var`, and is contiguous in `var` once that clamp is dropped: a padded row read in vectors
    (compiler/compute/support.py clamps pad reads into bounds so that the select around them stays a plain select)."""
    for node in walk(index):
        bounds = clamp_bounds(node)
        if bounds is None or affine_coefficient(bounds[0], var, lets) != 1:
            continue
        unclamped = _without(index, node, bounds[0])
        if affine_coefficient(unclamped, var, lets) == 1:
            return (*bounds, unclamped)
    return None


def repeated_run(index: Expr, var: Var, lets: dict[Var, Expr]) -> int | None:
    """k when index = (terms free of var) + var / k, a constant k > 1 (var, a vector loop's, counts up from 0): lane i
    reads element i // k of one contiguous run, each repeated k times (a nearest Resize by an integer factor)."""
    terms, repeats = [index], []
    while terms:
        term = terms.pop()
        if isinstance(term, Var) and term in lets and affine_coefficient(term, var, lets) != 0:
            term = lets[term]
        if isinstance(term, Binary) and term.op == "add":
            terms += [term.a, term.b]
        elif affine_coefficient(term, var, lets) == 0:
            continue
        elif (
            isinstance(term, Binary)
            and term.op in ("div", "floordiv")
            and term.a is var
            and isinstance(term.b, Const)
            and int(term.b.value) > 1
        ):
            repeats.append(int(term.b.value))
        else:
            return None
    return repeats[0] if len(repeats) == 1 else None


def can_widen(body: Stmt, var: Var) -> bool:
    """A body widens to vector operations when it is straight-line stores whose lanes cannot see
    each other's writes: a buffer the body reads is written at one affine index (distinct per lane)
    and read only at that index; a buffer it only writes may take any index that varies with the
    lane, since a scatter in lane order leaves the last lane's value as the serial loop would."""
    lets: dict[Var, Expr] = {}
    stores: dict[Buffer, Expr] = {}
    for node in walk(body):
        if isinstance(node, (For, IfThen, Allocate, Barrier, IfThenElse)):
            return False
        if isinstance(node, (LetStmt, Let)):
            lets[node.var] = node.value
        elif isinstance(node, Store):
            if node.buffer in stores and not structurally_equal(stores[node.buffer], node.index):
                return False
            stores[node.buffer] = node.index
    loaded = {node.buffer for node in walk(body) if isinstance(node, Load)}
    for buffer, index in stores.items():
        coefficient = affine_coefficient(index, var, lets)
        if coefficient == 0 or (coefficient is None and buffer in loaded):
            return False
    return all(
        structurally_equal(node.index, stores[node.buffer])
        for node in walk(body)
        if isinstance(node, Load) and node.buffer in stores
    )
