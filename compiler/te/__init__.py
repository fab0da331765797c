"""The tensor-expression language (TVM-like): placeholders, computes, reductions and schedules.

Operator computes (`compiler/compute/`) and schedule templates write these; `tir/lower.py` turns a
schedule into loop IR.
"""

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
    TEError,
    Var,
    as_expr,
    const,
    is_int,
)
from compiler.te.expr import _binary as expr_binary
from compiler.te.expr import _promote as promote
from compiler.te.schedule import Schedule, Stage, create_schedule
from compiler.te.tensor import (
    ComputeOp,
    IterVar,
    Operation,
    PlaceholderOp,
    Reduce,
    Tensor,
    TensorLoad,
    compute,
    placeholder,
    reduce_axis,
    reduce_max,
    reduce_min,
    reduce_sum,
    thread_axis,
)

sum = reduce_sum
max = reduce_max
min = reduce_min


def var(name: str = "v", dtype: str = "int32") -> Var:
    return Var(name, dtype)


def size_var(name: str, low: int, high: int) -> SizeVar:
    """A size known at run time, in [low, high], read from the kernel's sizes argument (lower's `sizes` order)."""
    return SizeVar(name, "int32", low=low, high=high)


def _pair(a, b) -> tuple[Expr, Expr]:
    if isinstance(a, Expr) and not isinstance(b, Expr):
        b = as_expr(b, a.dtype)
    elif isinstance(b, Expr) and not isinstance(a, Expr):
        a = as_expr(a, b.dtype)
    else:
        a, b = as_expr(a), as_expr(b)
    dtype = promote(a.dtype, b.dtype)
    return a.astype(dtype), b.astype(dtype)


def maximum(a, b) -> Expr:
    return Binary("max", *_pair(a, b))


def minimum(a, b) -> Expr:
    return Binary("min", *_pair(a, b))


def _condition(cond) -> Expr:
    if isinstance(cond, bool):
        # `a == b` on expressions is Python's identity test, not a comparison the kernel makes
        raise TEError(f"a condition must be an expression, not the Python value {cond}; compare with te.equal(a, b)")
    cond = as_expr(cond)
    if cond.dtype != "bool":
        raise TEError(f"a condition must be a bool expression, got {cond.dtype}")
    return cond


def equal(a, b) -> Expr:
    """`a == b` as an expression (Python's == on expressions tests identity, so that they can key dicts)."""
    return expr_binary("eq", a, b)


def select(cond, true_value, false_value) -> Expr:
    """`cond ? true_value : false_value`; lowering guards arms that could read out of bounds."""
    a, b = _pair(true_value, false_value)
    return Select(_condition(cond), a, b)


def if_then_else(cond, true_value, false_value) -> Expr:
    """Like select, but only the taken branch is evaluated."""
    a, b = _pair(true_value, false_value)
    return IfThenElse(_condition(cond), a, b)


def all(*conds) -> Expr:  # noqa: A001
    if len(conds) == 1 and isinstance(conds[0], list | tuple):
        conds = tuple(conds[0])
    if not conds:
        return Const(True, "bool")
    result = _condition(conds[0])
    for cond in conds[1:]:
        result = Logical("and", (result, _condition(cond)))
    return result


def any(*conds) -> Expr:  # noqa: A001
    if len(conds) == 1 and isinstance(conds[0], list | tuple):
        conds = tuple(conds[0])
    if not conds:
        return Const(False, "bool")
    result = _condition(conds[0])
    for cond in conds[1:]:
        result = Logical("or", (result, _condition(cond)))
    return result


def _float_call(name: str):
    def call(x) -> Expr:
        x = as_expr(x)
        if x.dtype not in ("float16", "float32", "float64"):
            raise TEError(f"te.{name} needs a float expression, got {x.dtype}; cast it with .astype('float32')")
        return Call(name, (x,), x.dtype)

    call.__name__ = name
    return call


exp = _float_call("exp")
log = _float_call("log")
sqrt = _float_call("sqrt")
rsqrt = _float_call("rsqrt")
tanh = _float_call("tanh")
sigmoid = _float_call("sigmoid")
erf = _float_call("erf")
sin = _float_call("sin")
cos = _float_call("cos")
floor = _float_call("floor")
ceil = _float_call("ceil")
round = _float_call("round")  # noqa: A001


def index_check(index, extent) -> Expr:
    """A data-dependent index that must lie in [0, extent): where it does not, the read takes index 0
    (never outside the buffer) and the model's run entry returns the failing call, which the runtimes
    raise as a RunError. `extent` is an int, or a size known at run time."""
    index = as_expr(index)
    if not is_int(index.dtype):
        raise TEError(f"te.index_check needs an integer index, got {index.dtype}")
    if isinstance(extent, int):
        return Call("index_check", (index, Const(int(extent), index.dtype)), index.dtype)
    extent = as_expr(extent, index.dtype)
    return Call(
        "index_check", (index, extent if extent.dtype == index.dtype else Cast(index.dtype, extent)), index.dtype
    )


def dot_bytes(activations, word) -> Expr:
    """sum(activations[i] * signed byte i of `word`) as int32: four uint8 expressions times the four int8 values packed
    in an int32 one, lowest byte first, with no rounding or saturation (the largest sum, 4 * 255 * 128, fits 18
    bits). One instruction of a machine's integer dot product per 32-bit lane (x86's vpdpbusd), where codegen finds
    one; widening multiplies and pairwise adds elsewhere."""
    activations = [as_expr(a) for a in activations]
    word = as_expr(word)
    if [a.dtype for a in activations] != ["uint8"] * 4 or word.dtype != "int32":
        raise TEError(
            "te.dot_bytes takes four uint8 values and one int32 word, got "
            f"{[a.dtype for a in activations]} and {word.dtype}"
        )
    return Call("dot_bytes", (*activations, word), "int32")


def abs(x) -> Expr:  # noqa: A001
    x = as_expr(x)
    return Call("abs", (x,), x.dtype)


def pow(x, y) -> Expr:  # noqa: A001
    a, b = _pair(x, y)
    return Binary("pow", a, b)


__all__ = [
    "Binary",
    "Call",
    "Cast",
    "Compare",
    "ComputeOp",
    "Const",
    "Expr",
    "IfThenElse",
    "Let",
    "Logical",
    "Select",
    "SizeVar",
    "IterVar",
    "Operation",
    "PlaceholderOp",
    "Reduce",
    "Schedule",
    "Stage",
    "TEError",
    "Tensor",
    "TensorLoad",
    "Var",
    "abs",
    "all",
    "any",
    "ceil",
    "compute",
    "const",
    "create_schedule",
    "dot_bytes",
    "erf",
    "exp",
    "floor",
    "if_then_else",
    "index_check",
    "log",
    "max",
    "maximum",
    "min",
    "minimum",
    "placeholder",
    "pow",
    "reduce_axis",
    "round",
    "rsqrt",
    "select",
    "equal",
    "sigmoid",
    "size_var",
    "sqrt",
    "sum",
    "tanh",
    "thread_axis",
    "var",
]
