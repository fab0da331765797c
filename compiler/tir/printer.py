"""Text form of the loop IR, stable and readable: what tests compare and `kernel.source("tir")` shows.

Vars that share a name get `_1`, `_2`... suffixes in order of appearance, so the text is unambiguous.
Integer `/` truncates (C division); floor division prints as `floordiv(a, b)` and `floormod(a, b)`.
"""

from __future__ import annotations

import math

from compiler.te.expr import Binary, Call, Cast, Compare, Const, Expr, IfThenElse, Let, Logical, Select, Var
from compiler.tir.nodes import Allocate, Barrier, For, ForKind, IfThen, LetStmt, Load, PrimFunc, Seq, Stmt, Store

_INFIX = {
    "add": " + ",
    "sub": " - ",
    "mul": "*",
    "div": " / ",
    "lt": " < ",
    "le": " <= ",
    "gt": " > ",
    "ge": " >= ",
    "eq": " == ",
    "ne": " != ",
    "and": " && ",
    "or": " || ",
}
_CHAINS = ("add", "sub", "mul", "and", "or")


class _Printer:
    def __init__(self):
        self.names: dict[int, str] = {}
        self.taken: set[str] = set()

    def name(self, var: Var) -> str:
        key = id(var)
        if key not in self.names:
            name, suffix = var.name, 0
            while name in self.taken:
                suffix += 1
                name = f"{var.name}_{suffix}"
            self.taken.add(name)
            self.names[key] = name
        return self.names[key]

    def const(self, c: Const) -> str:
        if c.dtype == "bool":
            return "True" if c.value else "False"
        if c.dtype == "int32":
            return str(int(c.value))
        if isinstance(c.value, float) and not math.isfinite(c.value):
            return f"{c.dtype}({c.value!r})"
        if c.dtype == "float32":
            return f"{float(c.value)!r}f"
        if c.dtype == "float64":
            return repr(float(c.value))
        return f"{c.dtype}({c.value!r})"

    def operand(self, e: Expr, parent: str, left: bool) -> str:
        text = self.expr(e)
        op = getattr(e, "op", None)
        if isinstance(e, Binary | Compare | Logical) and op in _INFIX and op != "not":
            chained = left and op == parent and parent in _CHAINS or (left and parent == "sub" and op == "add")
            if not chained:
                return f"({text})"
        return text

    def expr(self, e: Expr) -> str:
        if isinstance(e, Var):
            return self.name(e)
        if isinstance(e, Const):
            return self.const(e)
        if isinstance(e, Load):
            return f"{e.buffer.name}[{self.expr(e.index)}]"
        if isinstance(e, Binary | Compare | Logical):
            args = (e.a, e.b) if not isinstance(e, Logical) else e.args
            if e.op == "not":
                return f"!{self.operand(args[0], 'not', False)}"
            if e.op not in _INFIX:
                return f"{e.op}({self.expr(args[0])}, {self.expr(args[1])})"
            return self.operand(args[0], e.op, True) + _INFIX[e.op] + self.operand(args[1], e.op, False)
        if isinstance(e, Select):
            return f"select({self.expr(e.cond)}, {self.expr(e.true_value)}, {self.expr(e.false_value)})"
        if isinstance(e, IfThenElse):
            return f"if_then_else({self.expr(e.cond)}, {self.expr(e.true_value)}, {self.expr(e.false_value)})"
        if isinstance(e, Cast):
            return f"{e.dtype}({self.expr(e.value)})"
        if isinstance(e, Call):
            return f"{e.name}({', '.join(self.expr(arg) for arg in e.args)})"
        if isinstance(e, Let):
            return f"(let {self.name(e.var)} = {self.expr(e.value)} in {self.expr(e.body)})"
        return repr(e)

    def stmt(self, s: Stmt, indent: int, lines: list[str]) -> None:
        pad = "  " * indent
        if isinstance(s, For):
            kind = "" if s.kind == ForKind.SERIAL else f" {s.kind.value}"
            if s.kind == ForKind.THREAD_BINDING:
                kind = f" thread_binding({s.thread_tag})"
            lines.append(
                f"{pad}for ({self.name(s.var)}: {s.var.dtype}, {self.expr(s.min)}, {self.expr(s.extent)}){kind} {{"
            )
            self.stmt(s.body, indent + 1, lines)
            lines.append(f"{pad}}}")
        elif isinstance(s, Store):
            lines.append(f"{pad}{s.buffer.name}[{self.expr(s.index)}] = {self.expr(s.value)}")
        elif isinstance(s, Allocate):
            shape = ", ".join(str(extent) for extent in s.buffer.shape)
            lines.append(f"{pad}allocate {s.buffer.name}: {s.buffer.dtype}[{shape}] {s.buffer.scope} {{")
            self.stmt(s.body, indent + 1, lines)
            lines.append(f"{pad}}}")
        elif isinstance(s, IfThen):
            lines.append(f"{pad}if ({self.expr(s.cond)}) {{")
            self.stmt(s.then_body, indent + 1, lines)
            if s.else_body is not None:
                lines.append(f"{pad}}} else {{")
                self.stmt(s.else_body, indent + 1, lines)
            lines.append(f"{pad}}}")
        elif isinstance(s, LetStmt):
            lines.append(f"{pad}let {self.name(s.var)}: {s.var.dtype} = {self.expr(s.value)}")
            self.stmt(s.body, indent, lines)
        elif isinstance(s, Seq):
            for child in s.stmts:
                self.stmt(child, indent, lines)
        elif isinstance(s, Barrier):
            lines.append(f"{pad}barrier({s.scope})")
        else:
            lines.append(f"{pad}{s!r}")


def format_expr(expr: Expr) -> str:
    return _Printer().expr(expr)


def format_stmt(stmt: Stmt) -> str:
    lines: list[str] = []
    _Printer().stmt(stmt, 0, lines)
    return "\n".join(lines)


def format_func(func: PrimFunc) -> str:
    printer = _Printer()
    params = ", ".join(
        f"{buffer.name}: {buffer.dtype}[{', '.join(str(extent) for extent in buffer.shape)}]" for buffer in func.params
    )
    lines = [f"func {func.name}({params}) {{"]
    printer.stmt(func.body, 1, lines)
    lines.append("}")
    return "\n".join(lines)
