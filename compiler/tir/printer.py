"""Text form of the loop IR, stable and readable: what tests compare and `kernel.source("tir")` shows (a model's run
entry too: its KernelCalls print as `kernel(buffer + byte offset, ...)`).

Vars that share a name get `_1`, `_2`... suffixes in order of appearance, so the text is unambiguous.
Integer `/` truncates (C division); floor division prints as `floordiv(a, b)` and `floormod(a, b)`.
"""

from __future__ import annotations

import math

from compiler.te.expr import Binary, Call, Cast, Compare, Const, Expr, IfThenElse, Let, Logical, Select, Var
from compiler.tir.names import UniqueNames
from compiler.tir.nodes import (
    Allocate,
    Barrier,
    For,
    ForKind,
    IfThen,
    KernelCall,
    LetStmt,
    Load,
    Prefetch,
    PrimFunc,
    Seq,
    Stmt,
    Store,
)
from compiler.tir.visitor import StmtVisitor

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


class _Printer(StmtVisitor):
    """Expressions visit to their text; statements append their lines at the current indent."""

    def __init__(self, indent: int = 0):
        self.name = UniqueNames()
        self.indent = indent
        self.lines: list[str] = []

    def line(self, text: str) -> None:
        self.lines.append(f"{'  ' * self.indent}{text}")

    def block(self, body: Stmt) -> None:
        self.indent += 1
        self.visit(body)
        self.indent -= 1

    def operand(self, e: Expr, parent: str, left: bool) -> str:
        text = self.visit(e)
        op = getattr(e, "op", None)
        if isinstance(e, Binary | Compare | Logical) and op in _INFIX and op != "not":
            chained = left and op == parent and parent in _CHAINS or (left and parent == "sub" and op == "add")
            if not chained:
                return f"({text})"
        return text

    # ---- expressions

    def generic_visit(self, node) -> str | None:
        if isinstance(node, Stmt):
            self.line(repr(node))
            return None
        return repr(node)

    def visit_var(self, e: Var) -> str:
        return self.name(e)

    def visit_const(self, c: Const) -> str:
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

    def visit_load(self, e: Load) -> str:
        return f"{e.buffer.name}[{self.visit(e.index)}]"

    def visit_binary(self, e: Binary | Compare) -> str:
        return self.operator(e.op, (e.a, e.b))

    visit_compare = visit_binary

    def visit_logical(self, e: Logical) -> str:
        return self.operator(e.op, e.args)

    def operator(self, op: str, args) -> str:
        if op == "not":
            return f"!{self.operand(args[0], 'not', False)}"
        if op not in _INFIX:
            return f"{op}({self.visit(args[0])}, {self.visit(args[1])})"
        return self.operand(args[0], op, True) + _INFIX[op] + self.operand(args[1], op, False)

    def visit_select(self, e: Select) -> str:
        return f"select({self.visit(e.cond)}, {self.visit(e.true_value)}, {self.visit(e.false_value)})"

    def visit_ifthenelse(self, e: IfThenElse) -> str:
        return f"if_then_else({self.visit(e.cond)}, {self.visit(e.true_value)}, {self.visit(e.false_value)})"

    def visit_cast(self, e: Cast) -> str:
        return f"{e.dtype}({self.visit(e.value)})"

    def visit_call(self, e: Call) -> str:
        return f"{e.name}({', '.join(self.visit(arg) for arg in e.args)})"

    def visit_let(self, e: Let) -> str:
        return f"(let {self.name(e.var)} = {self.visit(e.value)} in {self.visit(e.body)})"

    # ---- statements

    def visit_for(self, s: For) -> None:
        kind = "" if s.kind == ForKind.SERIAL else f" {s.kind.value}"
        if s.kind == ForKind.THREAD_BINDING:
            kind = f" thread_binding({s.thread_tag})"
        self.line(f"for ({self.name(s.var)}: {s.var.dtype}, {self.visit(s.min)}, {self.visit(s.extent)}){kind} {{")
        self.block(s.body)
        self.line("}")

    def visit_store(self, s: Store) -> None:
        self.line(f"{s.buffer.name}[{self.visit(s.index)}] = {self.visit(s.value)}")

    def visit_allocate(self, s: Allocate) -> None:
        shape = ", ".join(str(extent) for extent in s.buffer.shape)
        self.line(f"allocate {s.buffer.name}: {s.buffer.dtype}[{shape}] {s.buffer.scope} {{")
        self.block(s.body)
        self.line("}")

    def visit_ifthen(self, s: IfThen) -> None:
        self.line(f"if ({self.visit(s.cond)}) {{")
        self.block(s.then_body)
        if s.else_body is not None:
            self.line("} else {")
            self.block(s.else_body)
        self.line("}")

    def visit_letstmt(self, s: LetStmt) -> None:
        self.line(f"let {self.name(s.var)}: {s.var.dtype} = {self.visit(s.value)}")
        self.visit(s.body)

    def visit_seq(self, s: Seq) -> None:
        for child in s.stmts:
            self.visit(child)

    def visit_barrier(self, s: Barrier) -> None:
        self.line(f"barrier({s.scope})")

    def visit_prefetch(self, s: Prefetch) -> None:
        self.line(f"prefetch({self.visit(s.element)})")

    def visit_kernelcall(self, s: KernelCall) -> None:
        self.line(f"{s.func}({', '.join(f'{buffer.name} + {offset}' for buffer, offset in s.args)})")


def format_expr(expr: Expr) -> str:
    return _Printer().visit(expr)


def format_stmt(stmt: Stmt) -> str:
    printer = _Printer()
    printer.visit(stmt)
    return "\n".join(printer.lines)


def format_func(func: PrimFunc) -> str:
    params = ", ".join(
        f"{buffer.name}: {buffer.dtype}[{', '.join(str(extent) for extent in buffer.shape)}]" for buffer in func.params
    )
    printer = _Printer(indent=1)
    printer.visit(func.body)
    return "\n".join([f"func {func.name}({params}) {{", *printer.lines, "}"])
