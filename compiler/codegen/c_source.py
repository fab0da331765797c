"""C-like GPU source from the loop IR of `tir/gpu.py` kernels: one printer, and a `Dialect` table per language
(`codegen/opencl.py`, `codegen/cuda.py`) giving qualifiers, index spellings, the barrier, memory spaces, types and
math names. A bundle's code file (kernels.cl, kernels.cu) is `generate_source` of all its kernels."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from compiler.errors import GpuKernelError
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
    Var,
    is_float,
)
from compiler.tir.names import UniqueNames
from compiler.tir.nodes import (
    Allocate,
    Barrier,
    Buffer,
    For,
    ForKind,
    IfThen,
    LetStmt,
    Load,
    PrimFunc,
    Seq,
    Stmt,
    Store,
    walk_stmts,
)
from compiler.tir.visitor import StmtVisitor

# C and both dialects' reserved words and builtins a buffer or loop variable may not be printed as
_RESERVED = frozenset(
    """auto break case char const continue default do double else enum extern float for goto if inline int long
    register restrict return short signed sizeof static struct switch typedef union unsigned void volatile while bool
    true false half uchar ushort uint ulong kernel global local constant private read_only write_only image2d_t
    sampler_t event_t size_t threadIdx blockIdx blockDim gridDim warpSize min max exp log sqrt rsqrt tanh erf floor
    ceil rint fabs pow sin cos sinf cosf barrier new delete class this template typename namespace operator asm""".split()
)
_INFIX = {"add": "+", "sub": "-", "mul": "*", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_NARROW_INTS = ("int8", "uint8", "int16")
_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}


@dataclass(frozen=True)
class Dialect:
    """What differs between the C-like GPU languages; the printer holds everything else.

    - `kernel`: the qualifiers before a kernel's return type; `launch(block)` the attribute giving its block size.
    - `function`: the qualifiers of a helper function.
    - `global_space`/`shared_space`: the qualifier of a global pointer / a block's shared array.
    - `restrict`: the no-alias qualifier of a pointer parameter.
    - `indices`: each grid tag's spelling; `barrier`: the block barrier statement.
    - `types`: each dtype's register type; `storage`: where memory holds another type (bool as bytes, float16).
    - `half_load`/`half_store`: float16 global memory, as format strings over buffer, index and value;
      `half_round`: a float rounded to float16 precision (a Cast to float16, a store to a non-global half buffer).
    - `math`: the function names for (float32, float64) of each intrinsic.
    - `literals`: the spelling of infinity and NaN per float type, and `long_suffix` of an int64 literal.
    - `offset_arguments`: kernels take (buffer, element offset) pairs instead of pointers (OpenCL binds whole buffers).
    - `prelude`: the lines every source starts with; `extensions[dtype]` the lines a source that uses dtype needs
      first (a pragma, float16 conversions).
    """

    name: str
    kernel: str
    launch: Callable[[list[int]], str]
    function: str
    global_space: str
    shared_space: str
    restrict: str
    indices: dict[str, str]
    barrier: str
    types: dict[str, str]
    storage: dict[str, str]
    half_load: str
    half_store: str
    half_round: str
    math: dict[str, tuple[str, str]]
    literals: dict[tuple[str, str], str]
    long_suffix: str
    offset_arguments: bool
    prelude: str
    extensions: dict[str, str]


def c_name(name: str) -> str:
    """`name` as a C identifier: other characters become `_`, and a reserved word gets a prefix."""
    text = re.sub(r"\W", "_", name, flags=re.ASCII) or "v"
    if text[0].isdigit() or text in _RESERVED or text.startswith("tessel_") or text.startswith("__"):
        text = f"v_{text}"
    return text


def _suffix(type_name: str) -> str:
    return type_name.replace(" ", "_")


class _Printer(StmtVisitor):
    """Prints one source: an expression visits to its text, a statement visits to its lines at `self.indent`."""

    def __init__(self, dialect: Dialect):
        self.dialect = dialect
        self.name = UniqueNames(c_name)
        self.helpers: dict[str, str] = {}
        self.lines: list[str] = []
        self.indent = 1
        # declarations of the expression lets of the statement being printed, and the if_then_else arms around
        # the expression being printed
        self.pending: list[str] = []
        self.lets: dict[int, Let] = {}
        self.arms: list[str] = []

    # ---- names and types ------------------------------------------------------------------------------------

    def type(self, dtype: str) -> str:
        if dtype in self.dialect.extensions:
            self.helper(f"extension {dtype}", self.dialect.extensions[dtype])
        return self.dialect.types[dtype]

    def memory_type(self, buffer: Buffer) -> str:
        value = self.type(buffer.dtype)
        if buffer.dtype == "float16" and buffer.scope != "global":
            return value  # float, rounded to half at every store, as the CPU keeps it
        return self.dialect.storage.get(buffer.dtype, value)

    def helper(self, name: str, text: str) -> str:
        self.helpers.setdefault(name, text)
        return name

    # ---- expressions ----------------------------------------------------------------------------------------

    def visit_const(self, node: Const) -> str:
        dtype, value = node.dtype, node.value
        if dtype == "bool":
            return "true" if value else "false"
        if is_float(dtype):
            width = "float64" if dtype == "float64" else "float32"
            if math.isinf(value):
                return ("-" if value < 0 else "") + self.dialect.literals[(width, "inf")]
            if math.isnan(value):
                return self.dialect.literals[(width, "nan")]
            text = repr(float(value))
            return f"{text}f" if width == "float32" else text
        value = int(value)
        suffix = self.dialect.long_suffix if dtype == "int64" else ""
        if dtype in _BITS and value == -(2 ** (_BITS[dtype] - 1)):
            # the literal of the most negative value would not fit its type before the minus applies
            text = f"(-{-value - 1}{suffix} - 1{suffix})"
        else:
            text = f"{value}{suffix}" if value >= 0 else f"(-{-value}{suffix})"
        if dtype not in ("int32", "int64"):
            return f"(({self.type(dtype)}){text})"
        return text

    def visit_var(self, node: Var) -> str:
        return self.name(node)

    def visit_compare(self, node: Compare) -> str:
        return f"({self.visit(node.a)} {_INFIX[node.op]} {self.visit(node.b)})"

    def visit_logical(self, node: Logical) -> str:
        if node.op == "not":
            return f"(!{self.visit(node.args[0])})"
        joiner = " && " if node.op == "and" else " || "
        return "(" + joiner.join(self.visit(arg) for arg in node.args) + ")"

    def visit_select(self, node: Select) -> str:
        return f"({self.visit(node.cond)} ? {self.visit(node.true_value)} : {self.visit(node.false_value)})"

    def visit_ifthenelse(self, node: IfThenElse) -> str:
        cond = self.visit(node.cond)
        self.arms.append(cond)
        true_value = self.visit(node.true_value)
        self.arms[-1] = f"(!{cond})"
        false_value = self.visit(node.false_value)
        self.arms.pop()
        return f"({cond} ? {true_value} : {false_value})"

    def visit_cast(self, node: Cast) -> str:
        return self.cast(self.visit(node.value), node.value.dtype, node.dtype)

    def visit_let(self, node: Let) -> str:
        """C has no expression let: the value becomes a declaration before the statement (`self.pending`). Under
        an if_then_else arm it is computed only where that arm is taken, since the arm may guard its reads."""
        if id(node) not in self.lets:
            value = self.visit(node.value)
            if self.arms:
                zero = self.visit_const(Const(False if node.var.dtype == "bool" else 0, node.var.dtype))
                value = f"({' && '.join(self.arms)}) ? {value} : {zero}"
            self.pending.append(f"const {self.type(node.var.dtype)} {self.name(node.var)} = {value};")
            self.lets[id(node)] = node
        return self.visit(node.body)

    def visit_load(self, node: Load) -> str:
        buffer, index = node.buffer, self.visit(node.index)
        if buffer.dtype == "float16" and buffer.scope == "global":
            return self.dialect.half_load.format(buffer=self.name(buffer), index=index)
        text = f"{self.name(buffer)}[{index}]"
        return f"({text} != 0)" if buffer.dtype == "bool" else text

    def cast(self, text: str, source: str, dest: str) -> str:
        if source == dest:
            return text
        if dest == "bool":
            return f"({text} != 0)"
        if dest == "float16":
            value = text if is_float(source) and source != "float64" else f"(({self.type('float32')}){text})"
            return self.dialect.half_round.format(value=value)
        return f"(({self.type(dest)}){text})"

    def visit_binary(self, node: Binary) -> str:
        dtype, op = node.dtype, node.op
        a, b = self.visit(node.a), self.visit(node.b)
        if is_float(dtype):
            return self.float_binary(op, a, b, dtype)
        if op in _INFIX:
            text = f"({a} {_INFIX[op]} {b})"
        elif op == "div" or (op in ("floordiv", "floormod") and dtype.startswith("u")):
            text = f"({a} {'%' if op == 'floormod' else '/'} {b})"
        elif op in ("floordiv", "floormod"):
            text = f"{self.floor_division(op, dtype)}({a}, {b})"
        elif op in ("min", "max"):
            text = f"{self.int_extreme(op, dtype)}({a}, {b})"
        elif op == "pow":
            power = f"{self.math('pow', 'float32')}(({self.type('float32')}){a}, ({self.type('float32')}){b})"
            text = f"(({self.type(dtype)}){self.math('round', 'float32')}({power}))"
        else:
            raise GpuKernelError(f"{self.dialect.name} codegen cannot print the integer operator {op!r}")
        # C computes narrow integers in int: wrap to the IR's width after every operation, as the CPU does
        return f"(({self.type(dtype)}){text})" if dtype in _NARROW_INTS else text

    def float_binary(self, op: str, a: str, b: str, dtype: str) -> str:
        if op in _INFIX:
            return f"({a} {_INFIX[op]} {b})"
        if op == "div":
            return f"({a} / {b})"
        floor = self.math("floor", dtype)
        if op == "floordiv":
            return f"{floor}({a} / {b})"
        if op == "floormod":
            return f"{self.float_floormod(dtype)}({a}, {b})"
        if op in ("min", "max"):
            return f"{self.float_extreme(op, dtype)}({a}, {b})"
        if op == "pow":
            return f"{self.math('pow', dtype)}({a}, {b})"
        raise GpuKernelError(f"{self.dialect.name} codegen cannot print the float operator {op!r}")

    def math(self, name: str, dtype: str) -> str:
        return self.dialect.math[name][1 if dtype == "float64" else 0]

    def value_dtype(self, dtype: str) -> str:
        return "float64" if dtype == "float64" else "float32"

    def float_extreme(self, op: str, dtype: str) -> str:
        """min/max that return NaN when either operand is NaN, like numpy, ONNX and the CPU targets (C's fmin and
        fmax return the other operand)."""
        value = self.type(self.value_dtype(dtype))
        name = f"tessel_{op}_{value}"
        test = "<" if op == "min" else ">"
        body = f"return (a {test} b || a != a) ? a : b;"
        return self.helper(name, f"{self.dialect.function} {value} {name}({value} a, {value} b) {{ {body} }}")

    def float_floormod(self, dtype: str) -> str:
        value = self.type(self.value_dtype(dtype))
        name = f"tessel_floormod_{value}"
        body = f"return a - {self.math('floor', dtype)}(a / b) * b;"
        return self.helper(name, f"{self.dialect.function} {value} {name}({value} a, {value} b) {{ {body} }}")

    def int_extreme(self, op: str, dtype: str) -> str:
        value = self.type(dtype)
        name = f"tessel_{op}_{_suffix(value)}"
        body = f"return a {'<' if op == 'min' else '>'} b ? a : b;"
        return self.helper(name, f"{self.dialect.function} {value} {name}({value} a, {value} b) {{ {body} }}")

    def floor_division(self, op: str, dtype: str) -> str:
        """Signed floor division and modulo: C truncates, so step down where remainder and divisor differ in sign."""
        value = self.type(dtype)
        name = f"tessel_{op}_{_suffix(value)}"
        adjust = "r != 0 && ((r < 0) != (b < 0))"
        if op == "floordiv":
            body = f"{value} q = a / b, r = a % b; return ({adjust}) ? ({value})(q - 1) : q;"
        else:
            body = f"{value} r = a % b; return ({adjust}) ? ({value})(r + b) : r;"
        return self.helper(name, f"{self.dialect.function} {value} {name}({value} a, {value} b) {{ {body} }}")

    def visit_call(self, node: Call) -> str:
        args = [self.visit(arg) for arg in node.args]
        if node.name == "index_check":
            name = self.helper(
                "tessel_index_check",
                f"{self.dialect.function} int tessel_index_check(int index, int extent) "
                "{ return (index >= 0 && index < extent) ? index : 0; }",
            )
            return f"{name}({args[0]}, {args[1]})"
        source = node.args[0].dtype
        if not is_float(source):
            if node.name == "abs":
                return (
                    args[0]
                    if source.startswith("u") or source == "bool"
                    else f"({args[0]} < 0 ? -{args[0]} : {args[0]})"
                )
            if node.name in ("floor", "ceil", "round"):
                return args[0]
            as_float = [self.cast(arg, source, "float32") for arg in args]
            return self.cast(self.float_call(node.name, as_float, "float32"), "float32", node.dtype)
        return self.float_call(node.name, args, source)

    def float_call(self, name: str, args: list[str], dtype: str) -> str:
        if name == "sigmoid":
            one = "1.0" if dtype == "float64" else "1.0f"
            return f"({one} / ({one} + {self.math('exp', dtype)}(-{args[0]})))"
        if name not in self.dialect.math:
            raise GpuKernelError(f"{self.dialect.name} codegen has no function for the intrinsic {name!r}")
        return f"{self.math(name, dtype)}({', '.join(args)})"

    # ---- statements -----------------------------------------------------------------------------------------

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.indent + line)

    def exprs(self, *nodes: Expr) -> list[str]:
        """The text of one statement's expressions; their lets are left in `self.pending` for `open_lets`."""
        self.pending, self.lets = [], {}
        return [self.visit(node) for node in nodes]

    def open_lets(self) -> bool:
        """Open a block for the pending let declarations, if any, and print the statement inside it."""
        if not self.pending:
            return False
        self.emit("{")
        self.indent += 1
        for line in self.pending:
            self.emit(line)
        self.pending = []
        return True

    def close_lets(self, opened: bool) -> None:
        if opened:
            self.indent -= 1
            self.emit("}")

    def block_of(self, body: Stmt) -> None:
        self.indent += 1
        self.visit(body)
        self.indent -= 1

    def visit_seq(self, node: Seq) -> None:
        for child in node.stmts:
            self.visit(child)

    def visit_ifthen(self, node: IfThen) -> None:
        (cond,) = self.exprs(node.cond)
        opened = self.open_lets()
        self.emit(f"if ({cond}) {{")
        self.block_of(node.then_body)
        if node.else_body is not None:
            self.emit("} else {")
            self.block_of(node.else_body)
        self.emit("}")
        self.close_lets(opened)

    def visit_letstmt(self, node: LetStmt) -> None:
        (value,) = self.exprs(node.value)
        opened = self.open_lets()
        self.emit("{")
        self.indent += 1
        self.emit(f"const {self.type(node.var.dtype)} {self.name(node.var)} = {value};")
        self.visit(node.body)
        self.indent -= 1
        self.emit("}")
        self.close_lets(opened)

    def visit_allocate(self, node: Allocate) -> None:
        if node.buffer.scope == "local":
            self.emit("{")
            self.indent += 1
            self.emit(f"{self.memory_type(node.buffer)} {self.name(node.buffer)}[{node.buffer.size}];")
            self.visit(node.body)
            self.indent -= 1
            self.emit("}")
        else:  # shared arrays are declared at the kernel's top (OpenCL allows them nowhere else)
            self.visit(node.body)

    def visit_barrier(self, node: Barrier) -> None:
        self.emit(self.dialect.barrier)

    def generic_visit(self, node: Stmt | Expr) -> None:
        kind = "statement" if isinstance(node, Stmt) else "expression"
        raise GpuKernelError(f"{self.dialect.name} codegen cannot print the {kind} {type(node).__name__}")

    def visit_store(self, node: Store) -> None:
        buffer = node.buffer
        index, value = self.exprs(node.index, node.value)
        opened = self.open_lets()
        if buffer.dtype == "float16" and buffer.scope == "global":
            self.emit(self.dialect.half_store.format(buffer=self.name(buffer), index=index, value=value) + ";")
        else:
            if buffer.dtype == "float16":
                value = self.dialect.half_round.format(value=value)
            elif buffer.dtype == "bool":
                value = f"(({self.memory_type(buffer)}){value})"
            self.emit(f"{self.name(buffer)}[{index}] = {value};")
        self.close_lets(opened)

    def visit_for(self, node: For) -> None:
        var = self.name(node.var)
        if node.kind == ForKind.THREAD_BINDING:
            # tir/gpu.py made this loop span its tag's launch extent: the hardware index is the variable
            self.emit("{")
            self.indent += 1
            self.emit(f"const int {var} = (int){self.dialect.indices[node.thread_tag]};")
            self.visit(node.body)
            self.indent -= 1
            self.emit("}")
            return
        low, extent = self.exprs(node.min, node.extent)
        opened = self.open_lets()
        end = extent if isinstance(node.min, Const) and node.min.value == 0 else f"{low} + {extent}"
        if node.kind in (ForKind.UNROLLED, ForKind.VECTORIZED):
            # a vectorized loop stays a loop of scalars, unrolled: correct first, vector types later
            self.emit("#pragma unroll")
        self.emit(f"for (int {var} = {low}; {var} < {end}; ++{var}) {{")
        self.block_of(node.body)
        self.emit("}")
        self.close_lets(opened)

    # ---- kernels --------------------------------------------------------------------------------------------

    def kernel(self, func: PrimFunc) -> list[str]:
        launch = func.attrs.get("launch")
        if launch is None:
            raise GpuKernelError(
                f"kernel {func.name} has no launch dimensions; lower it with tir/gpu.py lower_gpu before "
                f"{self.dialect.name} codegen"
            )
        dialect = self.dialect
        stored = {node.buffer for node in walk_stmts(func.body) if isinstance(node, Store)}
        params, views = [], []
        for buffer in func.params:
            const = "" if buffer in stored else "const "
            pointer = f"{dialect.global_space}{const}{self.memory_type(buffer)}* {dialect.restrict}"
            name = self.name(buffer)
            self.name.taken.update((f"{name}_base", f"{name}_offset"))
            if dialect.offset_arguments:
                params += [f"{pointer}{name}_base", f"const int {name}_offset"]
                views.append(f"{pointer}{name} = {name}_base + {name}_offset;")
            else:
                params.append(f"{pointer}{name}")
        lines = [f"{dialect.kernel} {dialect.launch(launch['block'])}void {c_name(func.name)}({', '.join(params)}) {{"]
        lines += [f"  {view}" for view in views]
        for node in walk_stmts(func.body):
            if isinstance(node, Allocate) and node.buffer.scope == "shared":
                buffer = node.buffer
                lines.append(f"  {dialect.shared_space}{self.memory_type(buffer)} {self.name(buffer)}[{buffer.size}];")
        self.lines, self.indent = [], 1
        self.visit(func.body)
        return [*lines, *self.lines, "}"]


def generate_source(funcs: list[PrimFunc], dialect: Dialect) -> str:
    """One source text holding every kernel of `funcs` (each lowered by `lower_gpu`), named as `c_name` of its name."""
    printer = _Printer(dialect)
    bodies: list[str] = []
    for func in funcs:
        printer.name = UniqueNames(c_name)
        bodies += ["", *printer.kernel(func)]
    return "\n".join([dialect.prelude.rstrip("\n"), *printer.helpers.values(), *bodies]) + "\n"
