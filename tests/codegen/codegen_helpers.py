"""Hand-built PrimFuncs for the codegen and runtime tests, so they do not depend on TE lowering."""

from __future__ import annotations

from compiler.te.expr import Call, Const, Expr, Var
from compiler.tir.nodes import Buffer, For, ForKind, Load, PrimFunc, Store

TARGETS = ["llvm", "wasm"]


def index(value: int) -> Const:
    return Const(value, "int32")


def loop(var: Var, extent: int, body, kind: ForKind = ForKind.SERIAL, start: int = 0, tag: str | None = None) -> For:
    return For(var, index(start), index(extent), kind, body, thread_tag=tag)


def elementwise(
    name: str,
    dtypes: list[str],
    out_dtype: str,
    size: int,
    fn,
    kind: ForKind = ForKind.SERIAL,
    lanes: int = 0,
) -> PrimFunc:
    """out[i] = fn(in0[i], in1[i], ...); with `lanes`, the loop is split into an outer loop of `kind`
    and a vectorized inner loop of `lanes`."""
    inputs = [Buffer(f"in{position}", (size,), dtype) for position, dtype in enumerate(dtypes)]
    out = Buffer("out", (size,), out_dtype)
    if lanes:
        outer, inner = Var("outer"), Var("inner")
        flat = outer * lanes + inner
        body = Store(out, flat, fn(*(Load(buffer, flat) for buffer in inputs)))
        stmt = loop(outer, size // lanes, loop(inner, lanes, body, ForKind.VECTORIZED), kind)
    else:
        i = Var("i")
        stmt = loop(i, size, Store(out, i, fn(*(Load(buffer, i) for buffer in inputs))), kind)
    return PrimFunc(name, [*inputs, out], stmt)


def unary_call(name: str, dtype: str, size: int, lanes: int = 8) -> PrimFunc:
    def fn(x: Expr) -> Expr:
        return Call(name, (x,), dtype)

    return elementwise(name, [dtype], dtype, size, fn, lanes=lanes)
