"""WGSL from the loop IR: each GPU kernel (a PrimFunc whose launch attrs tir/gpu.py set) becomes one compute entry
point of a shader module. Thread-bound loops become the workgroup and invocation ids, shared buffers `var<workgroup>`,
local ones function arrays, barriers `workgroupBarrier()`. The runtime (runtime/webgpu.py) binds what this reports.

Parameters reach memory through regions: an entry point binds one storage buffer per region its parameters live in,
and when several parameters share a region (a model's arena) their element offsets come from a uniform, so a kernel
stays within WebGPU's 8 storage buffers however many tensors it reads, and no binding needs a 256-byte offset. Tensors
narrower than a word (bool, 8/16-bit integers) live in the lanes of u32 words. docs/gpu.md describes all of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from compiler.errors import TargetError
from compiler.tir import (
    Allocate,
    Barrier,
    Binary,
    Buffer,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    For,
    ForKind,
    IfThen,
    IfThenElse,
    Let,
    LetStmt,
    Load,
    Logical,
    PrimFunc,
    Select,
    Seq,
    Stmt,
    Store,
    Var,
)
from compiler.tir.fast_math import expand_math
from compiler.tir.names import UniqueNames
from compiler.tir.nodes import walk_stmts
from compiler.tir.simplify import Bounds, bounds, loop_bounds, simplify, substitute_stmt
from compiler.tir.visitor import StmtVisitor, structural_key

# Register types. 8- and 16-bit integers compute in i32, wrapped to their width after every operation, as the other
# targets compute them.
TYPES = {
    "float32": "f32",
    "float16": "f16",
    "int32": "i32",
    "uint32": "u32",
    "bool": "bool",
    "int8": "i32",
    "uint8": "i32",
    "int16": "i32",
    "uint16": "i32",
}
# Tensors narrower than a word (bool and 8/16-bit integers, laid out as bytes by the memory plan) live in u32 words
# of their region: a read extracts the lanes, a write clears and sets them with atomicAnd/atomicOr, because the other
# lanes of the word may belong to another invocation; a region written that way is array<atomic<u32>> throughout.
# dtype -> (bytes, whether the value is signed)
SUBWORD = {"bool": (1, False), "int8": (1, True), "uint8": (1, False), "int16": (2, True), "uint16": (2, False)}
ATOMIC = "atomic<u32>"
# What a storage buffer may hold: WGSL has no 64-bit, 8-bit or bool storage, and f16 only behind `enable f16;`.
STORAGE_DTYPES = ("float32", "int32", "uint32", "float16", *SUBWORD)
# Math the WGSL builtins compute to float32 accuracy; tir/fast_math.py expands the rest (erf, sigmoid, pow) into these.
NATIVE_MATH = {
    "exp": "exp",
    "log": "log",
    "sqrt": "sqrt",
    "rsqrt": "inverseSqrt",
    "tanh": "tanh",
    "floor": "floor",
    "ceil": "ceil",
    "round": "round",  # half to even, as ONNX's Round
    "abs": "abs",
}
_HARDWARE = {"blockIdx": "block", "threadIdx": "thread"}
# WGSL evaluates a builtin of constants at shader creation and refuses a result that is not finite (log(0.0)), so a
# call of constants is folded here, in float32, and printed as its value (an infinity from bits at run time).
_FOLDED = {
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: np.float32(1) / np.sqrt(x),
    "tanh": np.tanh,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.rint,
    "abs": np.abs,
}
_INFIX = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "eq": "==",
    "ne": "!=",
    "and": "&&",
    "or": "||",
}
# Integer floor division and modulo round toward negative infinity (ONNX's Mod, TE's floordiv), WGSL's `/` and `%`
# toward zero; non-finite floats have no literal, so they are made from bits at run time.
_HELPERS = {
    "floordiv_i32": """fn tessel_floordiv_i32(a: i32, b: i32) -> i32 {
  let q = a / b;
  return select(q, q - 1, (a % b != 0) && ((a < 0) != (b < 0)));
}""",
    "floormod_i32": """fn tessel_floormod_i32(a: i32, b: i32) -> i32 {
  let r = a % b;
  return select(r, r + b, (r != 0) && ((r < 0) != (b < 0)));
}""",
    "index_check": """fn tessel_index_check(index: i32, extent: i32) -> i32 {
  return select(0, index, index >= 0 && index < extent);
}""",
    "special_floats": "var<private> tessel_float_bits: vec3<u32> = vec3<u32>(0x7f800000u, 0xff800000u, 0x7fc00000u);",
}


class WGSLError(TargetError):
    """A kernel that WGSL cannot express: a dtype without storage, a barrier a guard would make non-uniform."""


@dataclass(frozen=True)
class Layout:
    """Where an entry point's parameters live: parameter i in region `regions[i]` (regions are numbered from 0 and
    bound in that order), at an element offset read from the entry's uniform when `offsets`, else at 0."""

    regions: tuple[int, ...]
    offsets: bool = False

    @staticmethod
    def separate(count: int) -> Layout:
        return Layout(tuple(range(count)))

    @staticmethod
    def for_kernel(func: PrimFunc, max_buffers: int) -> Layout:
        """A kernel called on its own: a binding per parameter when they fit in `max_buffers`, else one region for
        the parameters it only reads and one for those it writes."""
        if len(func.params) <= max_buffers:
            return Layout.separate(len(func.params))
        written = written_params(func)
        kinds = [buffer in written for buffer in func.params]
        order = list(dict.fromkeys(kinds))
        return Layout(tuple(order.index(kind) for kind in kinds), offsets=True)


@dataclass(frozen=True)
class EntryPoint:
    """What the runtime binds for one entry point: per region its binding number, access and element type; the
    uniform's binding (and its size in bytes) when the layout has offsets; the launch."""

    name: str
    kernel: str
    regions: tuple[dict, ...]
    param_regions: tuple[int, ...]
    offsets_binding: int | None
    offsets_bytes: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    workgroup_bytes: int = 0
    status_binding: int | None = None

    def as_json(self) -> dict:
        """The form a manifest and runtime/webgpu.py read."""
        return {
            "name": self.name,
            "kernel": self.kernel,
            "regions": [dict(region) for region in self.regions],
            "param_regions": list(self.param_regions),
            "offsets_binding": self.offsets_binding,
            "offsets_bytes": self.offsets_bytes,
            "grid": list(self.grid),
            "block": list(self.block),
            "workgroup_bytes": self.workgroup_bytes,
            "status_binding": self.status_binding,
        }


@dataclass(frozen=True)
class ShaderModule:
    code: str
    entries: tuple[EntryPoint, ...]
    uses_f16: bool


def launch_of(func: PrimFunc) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    launch = getattr(func, "attrs", {}).get("launch")
    if launch is None:
        raise WGSLError(
            f"kernel {func.name!r} has no launch dimensions: GPU kernels come from schedules/gpu.py and "
            "tir/gpu.py's lower_gpu, which sets them"
        )
    return tuple(launch["grid"]), tuple(launch["block"])


def written_params(func: PrimFunc) -> set[Buffer]:
    stored = {stmt.buffer for stmt in walk_stmts(func.body) if isinstance(stmt, Store)}
    return {buffer for buffer in func.params if buffer in stored}


def _wgsl_type(dtype: str, what: str) -> str:
    if dtype not in TYPES:
        raise WGSLError(
            f"{what} has dtype {dtype}, which WGSL (target webgpu) does not have: WebGPU has 32-bit integers and "
            "floats (and f16 with shader-f16); compile this model for llvm, wasm, opencl or cuda"
        )
    return TYPES[dtype]


def _wrapped(text: str, dtype: str) -> str:
    """An i32 holding an 8- or 16-bit integer's result, wrapped to that width (two's complement, as in C)."""
    if dtype not in SUBWORD or dtype == "bool":
        return text
    size, signed = SUBWORD[dtype]
    if signed:
        return f"(({text} << {32 - 8 * size}u) >> {32 - 8 * size}u)"
    return f"({text} & {hex((1 << 8 * size) - 1)}i)"


def _float_literal(value: float, dtype: str) -> str:
    if math.isnan(value):
        return "bitcast<f32>(tessel_float_bits.z)"
    if math.isinf(value):
        return f"bitcast<f32>(tessel_float_bits.{'x' if value > 0 else 'y'})"
    if dtype == "float16":
        return f"{float(np.float16(value))!r}h"
    return f"{float(np.float32(value))!r}f"


def _wgsl_name(name: str) -> str:
    # One leading underscore keeps every IR name clear of WGSL's keywords, its reserved words, the builtins a
    # declaration would shadow (max, exp) and this module's own names, none of which start with one.
    return "_" + ("".join(c if c.isascii() and c.isalnum() else "_" for c in name).strip("_") or "v")


class _EntryWriter(StmtVisitor):
    """Writes one entry point: a statement visits to its lines at the current indent, an expression visits
    to its text; `helpers` collects the module-scope helper functions its body calls."""

    def __init__(self, func: PrimFunc, name: str, layout: Layout, helpers: set[str]):
        self.func, self.layout, self.helpers = func, layout, helpers
        # the entry point's WGSL name: a kernel may be called `fn` or `main`
        self.entry = "entry_" + "".join(c if c.isascii() and c.isalnum() else "_" for c in name)
        self.name = UniqueNames(_wgsl_name)
        self.lines: list[str] = []
        self.indent = 1
        self.grid, self.block = launch_of(func)
        self.uses_f16 = False
        self.params = {buffer: position for position, buffer in enumerate(func.params)}
        self.written = written_params(func)
        # ranges of the variables in scope, so a division or modulo of a value known not negative is WGSL's own
        self.env: dict[Var, Bounds] = {}
        self.arms = 0  # depth of select arms being printed
        self.uses_status = False
        self.region_types = self._region_types()

    # ---- names and types ----------------------------------------------------------------------------------------

    def type(self, dtype: str, what: str) -> str:
        if dtype == "float16":
            self.uses_f16 = True
        return _wgsl_type(dtype, what)

    def _region_types(self) -> dict[int, str]:
        """A region holding one dtype is an array of it; mixed 32-bit dtypes share an array<u32> and bitcast."""
        dtypes: dict[int, set[str]] = {}
        for buffer, region in zip(self.func.params, self.layout.regions):
            if buffer.dtype not in STORAGE_DTYPES:
                raise WGSLError(
                    f"buffer {buffer.name!r} of kernel {self.func.name!r} has dtype {buffer.dtype}, which WGSL "
                    "(target webgpu) cannot store: WebGPU storage holds float32, int32, uint32 and float16; compile "
                    "this model for llvm, wasm, opencl or cuda"
                )
            dtypes.setdefault(region, set()).add(buffer.dtype)
        types = {}
        written = {self.layout.regions[self.params[buffer]] for buffer in self.written}
        for region, kinds in dtypes.items():
            if kinds & set(SUBWORD):
                if "float16" in kinds:
                    raise WGSLError(f"kernel {self.func.name!r} keeps float16 and byte tensors in one region")
                types[region] = ATOMIC if region in written else "u32"
            elif len(kinds) == 1:
                types[region] = self.type(next(iter(kinds)), "a buffer")
            elif "float16" in kinds:
                raise WGSLError(f"kernel {self.func.name!r} keeps float16 and 32-bit tensors in one region")
            else:
                types[region] = "u32"
        return types

    def region_name(self, region: int) -> str:
        return f"{self.entry}_region_{region}"

    # ---- expressions --------------------------------------------------------------------------------------------

    def emit(self, text: str) -> None:
        self.lines.append("  " * self.indent + text)

    def element(self, buffer: Buffer, index: Expr) -> str:
        """The element index of a global buffer's `index` in its region."""
        base = f"{self.name(buffer)}_base + " if self.layout.offsets else ""
        return f"{base}{self.visit(index)}"

    def address(self, buffer: Buffer, index: Expr) -> str:
        if buffer.scope != "global":
            return f"{self.name(buffer)}[{self.visit(index)}]"
        return f"{self.region_of(buffer)}[{self.element(buffer, index)}]"

    def region_of(self, buffer: Buffer) -> str:
        return self.region_name(self.layout.regions[self.params[buffer]])

    def region_type(self, buffer: Buffer) -> str:
        return self.region_types[self.layout.regions[self.params[buffer]]]

    def lanes(self, buffer: Buffer, index: Expr) -> tuple[str, str]:
        """The word index and the bit shift of a narrow element, bound to lets before the statement being written."""
        size = SUBWORD[buffer.dtype][0]
        byte = self.fresh("byte")
        element = self.element(buffer, index)
        self.emit(f"let {byte}: i32 = {f'({element}) * {size}i' if size > 1 else element};")
        return f"({byte} >> 2u)", f"(u32({byte} & 3i) * 8u)"

    def fresh(self, base: str) -> str:
        """A new name no IR variable has (those start with one underscore)."""
        return self.name.fresh(f"tessel_{base}")

    def visit_load(self, node: Load) -> str:
        buffer = node.buffer
        if buffer.scope != "global":
            return self.address(buffer, node.index)
        atomic = self.region_type(buffer) == ATOMIC
        if buffer.dtype in SUBWORD:
            size, signed = SUBWORD[buffer.dtype]
            word, shift = self.lanes(buffer, node.index)
            word_text = f"{self.region_of(buffer)}[{word}]"
            raw = f"(({f'atomicLoad(&{word_text})' if atomic else word_text} >> {shift}) & {hex((1 << 8 * size) - 1)}u)"
            if buffer.dtype == "bool":
                return f"({raw} != 0u)"
            if signed:
                unused = 32 - 8 * size
                return f"((i32({raw}) << {unused}u) >> {unused}u)"
            return f"i32({raw})"
        text = self.address(buffer, node.index)
        if atomic:
            text = f"atomicLoad(&{text})"
        if self.region_type(buffer) not in (TYPES[buffer.dtype], ATOMIC) or atomic and buffer.dtype != "uint32":
            return f"bitcast<{TYPES[buffer.dtype]}>({text})"
        return text

    def visit_store(self, node: Store) -> None:
        buffer = node.buffer
        value = self.visit(node.value)
        if buffer.scope != "global":
            self.emit(f"{self.address(buffer, node.index)} = {value};")
            return
        if buffer.dtype in SUBWORD:
            size = SUBWORD[buffer.dtype][0]
            word, shift = self.lanes(buffer, node.index)
            target = f"&{self.region_of(buffer)}[{word}]"
            mask = f"{hex((1 << 8 * size) - 1)}u"
            # the value first: it may read the lane being cleared (an accumulation)
            bits = self.fresh("lane")
            lane = f"select(0u, 1u, {value})" if buffer.dtype == "bool" else f"(u32({value}) & {mask})"
            self.emit(f"let {bits}: u32 = {lane};")
            self.emit(f"atomicAnd({target}, ~({mask} << {shift}));")
            self.emit(f"atomicOr({target}, {bits} << {shift});")
            return
        if self.region_type(buffer) == ATOMIC:
            self.emit(f"atomicStore(&{self.address(buffer, node.index)}, bitcast<u32>({value}));")
            return
        if self.region_type(buffer) != TYPES[buffer.dtype]:
            value = f"bitcast<u32>({value})"
        self.emit(f"{self.address(buffer, node.index)} = {value};")

    def visit_const(self, node: Const) -> str:
        if node.dtype == "bool":
            return "true" if node.value else "false"
        if node.dtype in ("float32", "float16"):
            if node.dtype == "float16":
                self.uses_f16 = True
            if not math.isfinite(node.value):
                self.helpers.add("special_floats")
            return _float_literal(float(node.value), node.dtype)
        value = int(node.value)
        if node.dtype == "uint32":
            return f"{value & 0xFFFFFFFF}u"
        self.type(node.dtype, f"constant {value}")
        if value == -(2**31):
            return "(-2147483647i - 1i)"
        return f"{value}i" if value >= 0 else f"({value}i)"

    def visit_var(self, node: Var) -> str:
        return self.name(node)

    def visit_compare(self, node: Compare) -> str:
        if node.op == "ne" and node.a.dtype == "float32" and structural_key(node.a) == structural_key(node.b):
            # x != x is IsNaN, but WGSL lets a compiler assume there are no NaNs and fold it away: test the bits
            return f"((bitcast<u32>({self.visit(node.a)}) & 0x7fffffffu) > 0x7f800000u)"
        return f"({self.visit(node.a)} {_INFIX[node.op]} {self.visit(node.b)})"

    def visit_logical(self, node: Logical) -> str:
        if node.op == "not":
            return f"!({self.visit(node.args[0])})"
        return f"({self.visit(node.args[0])} {_INFIX[node.op]} {self.visit(node.args[1])})"

    def visit_select(self, node: Select | IfThenElse) -> str:
        # Both branches are evaluated: WebGPU clamps every out-of-bounds access, so a guarded read is harmless.
        cond = self.visit(node.cond)
        self.arms += 1
        true, false = self.visit(node.true_value), self.visit(node.false_value)
        self.arms -= 1
        return f"select({false}, {true}, {cond})"

    visit_ifthenelse = visit_select

    def visit_let(self, node: Let) -> str:
        # WGSL has no let expressions: the binding goes before the statement being written, which sees every
        # variable the value reads.
        value = self.visit(node.value)
        self.env[node.var] = bounds(node.value, self.env)
        self.emit(f"let {self.name(node.var)}: {self.type(node.var.dtype, 'a let')} = {value};")
        return self.visit(node.body)

    def visit_binary(self, node: Binary) -> str:
        return _wrapped(self.binary_value(node), node.dtype)

    def binary_value(self, node: Binary) -> str:
        a, b = self.visit(node.a), self.visit(node.b)
        dtype = node.dtype
        if node.op in ("add", "sub", "mul", "div"):
            return f"({a} {_INFIX[node.op]} {b})"
        if node.op in ("min", "max"):
            if dtype == "bool":
                return f"({a} {'&&' if node.op == 'min' else '||'} {b})"
            return f"{node.op}({a}, {b})"
        floating = dtype in ("float32", "float16")
        if node.op in ("floordiv", "floormod") and not floating:
            low, divisor = bounds(node.a, self.env)[0], bounds(node.b, self.env)
            if low is not None and low >= 0 and divisor[0] is not None and divisor[0] > 0:
                return f"({a} {'/' if node.op == 'floordiv' else '%'} {b})"
        if node.op == "floordiv":
            if floating:
                return f"floor({a} / {b})"
            return self.helper("floordiv", dtype, a, b)
        if node.op == "floormod":
            if floating:
                return f"({a} - floor({a} / {b}) * {b})"
            return self.helper("floormod", dtype, a, b)
        if node.op == "pow" and floating:
            return f"pow({a}, {b})"
        raise WGSLError(f"WGSL codegen cannot handle operator {node.op!r}")

    def helper(self, kind: str, dtype: str, *args: str) -> str:
        if TYPES.get(dtype) != "i32":
            self.type(dtype, f"{kind} operand")
            raise WGSLError(f"WGSL codegen has no {kind} for {dtype}")
        self.helpers.add(f"{kind}_i32")
        return f"tessel_{kind}_i32({', '.join(args)})"

    def index_check(self, index: str, extent: str) -> str:
        """The index where it lies in [0, extent), else 0. In a model's kernel (which has a uniform) an index outside
        also records the dispatch's call number in the status word, which the run raises as RunError; not under a
        select's arm, which is evaluated even where it is not taken."""
        if self.arms or not self.layout.offsets:
            self.helpers.add("index_check")
            return f"tessel_index_check({index}, {extent})"
        self.uses_status = True
        name = self.fresh("index")
        inside = f"({name} >= 0i && {name} < {extent})"
        self.emit(f"let {name}: i32 = {index};")
        call = len(self.func.params)
        number = f"u32({self.entry}_offsets[{call // 4}][{call % 4}])"
        self.emit(f"if (!{inside}) {{ atomicMax(&{self.entry}_status[0], {number}); }}")
        return f"select(0i, {name}, {inside})"

    def visit_cast(self, node: Cast) -> str:
        value = self.visit(node.value)
        source = node.value.dtype
        if node.dtype == "bool":
            zero = self.visit_const(Const(0, source)) if source != "bool" else "false"
            return f"({value} != {zero})"
        target = self.type(node.dtype, "a cast")
        self.type(source, "a cast's operand")
        return _wrapped(f"{target}({value})", node.dtype)

    def visit_call(self, node: Call) -> str:
        args = [self.visit(arg) for arg in node.args]
        if node.name == "index_check":
            return self.index_check(*args)
        dtype = node.args[0].dtype
        if dtype not in ("float32", "float16"):
            if node.name == "abs" and TYPES.get(dtype) == "i32":
                return _wrapped(f"abs({args[0]})", dtype)
            if node.name in ("floor", "ceil", "round", "abs"):
                return args[0]
            converted = ", ".join(f"f32({arg})" for arg in args)
            return f"{self.type(node.dtype, 'a call')}({NATIVE_MATH.get(node.name, node.name)}({converted}))"
        if node.name not in NATIVE_MATH:
            raise WGSLError(f"WGSL has no {node.name}; tir/fast_math.py expands it before code generation")
        if all(isinstance(arg, Const) for arg in node.args):
            with np.errstate(all="ignore"):
                value = _FOLDED[node.name](np.array(node.args[0].value, np.float32))
            return self.visit_const(Const(float(value), node.dtype))
        return f"{NATIVE_MATH[node.name]}({', '.join(args)})"

    # ---- statements ---------------------------------------------------------------------------------------------

    def visit_seq(self, node: Seq) -> None:
        for child in node.stmts:
            self.visit(child)

    def visit_ifthen(self, node: IfThen) -> None:
        self.emit(f"if ({self.visit(node.cond)}) {{")
        self.block_of(node.then_body)
        if node.else_body is not None:
            self.emit("} else {")
            self.block_of(node.else_body)
        self.emit("}")

    def visit_letstmt(self, node: LetStmt) -> None:
        value = self.visit(node.value)
        self.env[node.var] = bounds(node.value, self.env)
        self.emit(f"let {self.name(node.var)}: {self.type(node.var.dtype, 'a let')} = {value};")
        self.visit(node.body)

    def visit_barrier(self, node: Barrier) -> None:
        self.emit("workgroupBarrier();" if node.scope == "shared" else "storageBarrier();")

    def generic_visit(self, node: Stmt | Expr) -> None:
        where = f" in kernel {self.func.name!r}" if isinstance(node, Stmt) else ""
        raise WGSLError(f"WGSL codegen cannot print {type(node).__name__}{where}")

    def block_of(self, body: Stmt) -> None:
        self.indent += 1
        self.visit(body)
        self.indent -= 1

    def visit_for(self, node: For) -> None:
        var = self.name(node.var)
        start, extent = self.visit(node.min), self.visit(node.extent)
        zero = isinstance(node.min, Const) and node.min.value == 0
        end = extent if zero else f"{start} + {extent}"
        if node.kind == ForKind.UNROLLED and _unrollable(node):
            self.unroll(node)
            return
        if node.kind != ForKind.THREAD_BINDING:
            self.env[node.var] = loop_bounds(node.min, node.extent, self.env)
            self.emit(f"for (var {var}: i32 = {start}; {var} < {end}; {var}++) {{")
            self.block_of(node.body)
            self.emit("}")
            return
        family, axis = node.thread_tag.split(".")
        if family not in _HARDWARE:
            raise WGSLError(f"kernel {self.func.name!r}: thread tag {node.thread_tag} is not a hardware index")
        launched = (self.grid if family == "blockIdx" else self.block)["xyz".index(axis)]
        self.env[node.var] = loop_bounds(node.min, Const(launched, "int32"), self.env)
        self.emit("{")
        self.indent += 1
        index = f"i32({_HARDWARE[family]}.{axis})"
        self.emit(f"let {var}: i32 = {index if zero else f'{start} + {index}'};")
        if isinstance(node.extent, Const) and int(node.extent.value) >= launched:
            self.visit(node.body)
        else:
            if any(isinstance(child, Barrier) for child in walk_stmts(node.body)):
                raise WGSLError(
                    f"kernel {self.func.name!r}: a {node.thread_tag} loop of extent {extent} under a launch of "
                    f"{launched} needs a guard, and a barrier under it would not be reached by every invocation; "
                    "give the loops of one thread tag the same extent in the schedule"
                )
            self.emit(f"if ({var} < {end}) {{")
            self.block_of(node.body)
            self.emit("}")
        self.indent -= 1
        self.emit("}")

    def unroll(self, node: For) -> None:
        """An unrolled loop as one block per iteration, its variable a constant there: a register tile's indices
        become literals, so the shader compiler can keep the tile in registers (SwiftShader and lavapipe neither
        unroll a WGSL loop nor promote a dynamically indexed function array: they spill it to memory)."""
        for step in range(int(node.extent.value)):
            value = Const(int(node.min.value) + step, node.var.dtype)
            body = simplify(substitute_stmt(node.body, {node.var: value}), self.env)
            self.emit("{")
            self.block_of(body)
            self.emit("}")

    def visit_allocate(self, node: Allocate) -> None:
        buffer = node.buffer
        element = self.type(buffer.dtype, f"buffer {buffer.name!r}")
        name = self.name(buffer)
        if buffer.scope == "shared":
            # workgroup variables live at module scope; `shared` collects them for the module's header
            self.shared.append(f"var<workgroup> {self.entry}_{name}: array<{element}, {buffer.size}>;")
            # WGSL lays out an array of 2-byte f16 or 4-byte scalars densely; bools take 4 bytes
            self.workgroup_bytes += buffer.size * (2 if element == "f16" else 4)
            self.name.names[id(buffer)] = f"{self.entry}_{name}"
        else:
            self.emit(f"var {name}: array<{element}, {buffer.size}>;")
        self.visit(node.body)

    # ---- the entry point ----------------------------------------------------------------------------------------

    def write(self) -> tuple[str, EntryPoint]:
        self.shared: list[str] = []
        self.workgroup_bytes = 0
        for buffer in self.func.params:
            self.name(buffer)
        if self.layout.offsets:
            for position, buffer in enumerate(self.func.params):
                self.emit(f"let {self.name(buffer)}_base: i32 = {self.entry}_offsets[{position // 4}][{position % 4}];")
        self.visit(expand_math(self.func.body, NATIVE_MATH))
        body = self.lines
        header, regions = [], []
        count = max(self.layout.regions, default=-1) + 1
        for region in range(count):
            members = [buffer for buffer, slot in zip(self.func.params, self.layout.regions) if slot == region]
            access = "read_write" if any(buffer in self.written for buffer in members) else "read"
            header.append(
                f"@group(0) @binding({region}) var<storage, {access}> {self.region_name(region)}: "
                f"array<{self.region_types[region]}>;"
            )
            regions.append({"binding": region, "access": access, "type": self.region_types[region]})
        offsets_binding, offsets_bytes, status_binding = None, 0, None
        if self.layout.offsets:
            offsets_binding = count
            # an element offset per parameter, then the dispatch's call number
            words = math.ceil((len(self.func.params) + 1) / 4)
            offsets_bytes = 16 * words
            header.append(f"@group(0) @binding({count}) var<uniform> {self.entry}_offsets: array<vec4<i32>, {words}>;")
        if self.uses_status:
            status_binding = count + 1
            status = f"var<storage, read_write> {self.entry}_status: array<atomic<u32>>;"
            header.append(f"@group(0) @binding({status_binding}) {status}")
        header += self.shared
        size = ", ".join(str(extent) for extent in self.block)
        signature = (
            f"@compute @workgroup_size({size})\nfn {self.entry}(@builtin(workgroup_id) block: vec3<u32>, "
            "@builtin(local_invocation_id) thread: vec3<u32>) {"
        )
        text = "\n".join([*header, signature, *body, "}"])
        entry = EntryPoint(
            self.entry,
            self.func.name,
            tuple(regions),
            self.layout.regions,
            offsets_binding,
            offsets_bytes,
            self.grid,
            self.block,
            self.workgroup_bytes,
            status_binding,
        )
        return text, entry


# The most iterations of one unrolled loop that are printed out one by one; a longer one stays a WGSL loop.
UNROLL_LIMIT = 64


def _unrollable(loop: For) -> bool:
    return isinstance(loop.min, Const) and isinstance(loop.extent, Const) and loop.extent.value <= UNROLL_LIMIT


def generate_wgsl(kernels: list[tuple[PrimFunc, str, Layout]], shader_f16: bool = False) -> ShaderModule:
    """One shader module holding an entry point per (kernel, entry name, layout). float16 needs `shader_f16` (the
    adapter's feature); without it a float16 kernel is refused."""
    helpers: set[str] = set()
    parts, entries, uses_f16 = [], [], False
    for func, name, layout in kernels:
        if len(layout.regions) != len(func.params):
            raise WGSLError(f"kernel {func.name!r}: the layout places {len(layout.regions)} of {len(func.params)}")
        writer = _EntryWriter(func, name, layout, helpers)
        text, entry = writer.write()
        parts.append(text)
        entries.append(entry)
        uses_f16 = uses_f16 or writer.uses_f16
    if uses_f16 and not shader_f16:
        raise WGSLError(
            "a kernel computes in float16, which WebGPU has only behind the shader-f16 feature that target webgpu "
            "does not assume (every adapter must run its bundles): compile the model in float32"
        )
    prelude = ["enable f16;"] if uses_f16 else []
    prelude += [_HELPERS[name] for name in sorted(helpers)]
    return ShaderModule("\n\n".join([*prelude, *parts]) + "\n", tuple(entries), uses_f16)


def model_shader(
    kernels: list[PrimFunc], dispatches: list[dict], uniform_alignment: int = 256, shader_f16: bool = False
) -> tuple[ShaderModule, list[dict]]:
    """The shader module of a whole model and its dispatch list, completed for WebGPU. `dispatches` is the shared
    GPU dispatch list (kernel, bindings: per parameter its region, index and byte offset, grid, block). Each
    kernel gets an entry point per pattern in which its calls place parameters in regions (usually one), each
    region bound whole once; each dispatch gains its entry point, the regions it binds in binding order, and the
    element offsets its parameters start at (byte offset over the parameter's element size), which the runtime writes
    once into a uniform buffer at `uniform_offset` (a multiple of `uniform_alignment`)."""
    by_name = {func.name: func for func in kernels}
    entries: dict[tuple[str, tuple[int, ...]], str] = {}
    planned: list[tuple[PrimFunc, str, Layout]] = []
    patterns = []
    for dispatch in dispatches:
        func = by_name[dispatch["kernel"]]
        keys = [(binding["region"], binding["index"]) for binding in dispatch["bindings"]]
        regions = list(dict.fromkeys(keys))
        pattern = tuple(regions.index(key) for key in keys)
        if (func.name, pattern) not in entries:
            name = func.name if not any(kernel == func.name for kernel, _ in entries) else f"{func.name}_{len(entries)}"
            entries[func.name, pattern] = name
            planned.append((func, name, Layout(pattern, offsets=True)))
        patterns.append((entries[func.name, pattern], regions))
    module = generate_wgsl(planned, shader_f16)
    described = {name: entry for (_, name, _), entry in zip(planned, module.entries)}
    completed, uniform_offset = [], 0
    for dispatch, (name, regions) in zip(dispatches, patterns):
        entry = described[name]
        words = []
        for binding, param in zip(dispatch["bindings"], by_name[dispatch["kernel"]].params):
            size = np.dtype(param.dtype).itemsize
            if binding["offset"] % size:
                raise WGSLError(
                    f"kernel {dispatch['kernel']!r} reads {binding['region']} at byte {binding['offset']}, which is "
                    f"not a whole {size}-byte element"
                )
            words.append(binding["offset"] // size)
        completed.append(
            {
                **dispatch,
                "entry": entry.name,
                "regions": [{"region": region, "index": index} for region, index in regions],
                "uniform_offset": uniform_offset,
                "element_offsets": words,
            }
        )
        # each dispatch's words start on an alignment boundary (a kernel of more than 63 parameters spans several)
        uniform_offset += max(1, math.ceil(entry.offsets_bytes / uniform_alignment)) * uniform_alignment
    return module, completed


def limits_used(module: ShaderModule, buffer_bytes: list[int]) -> dict:
    """The WebGPU limits (the spec's names) a bundle needs, so an executor can compare them with its adapter's
    before it loads anything; each is within the spec's defaults for a bundle compiled for target webgpu."""
    entries = module.entries
    return {
        "maxStorageBuffersPerShaderStage": max(
            (len(entry.regions) + (entry.status_binding is not None) for entry in entries), default=0
        ),
        "maxUniformBuffersPerShaderStage": int(any(entry.offsets_binding is not None for entry in entries)),
        "maxComputeInvocationsPerWorkgroup": max((math.prod(entry.block) for entry in entries), default=1),
        "maxComputeWorkgroupSizeX": max((entry.block[0] for entry in entries), default=1),
        "maxComputeWorkgroupSizeY": max((entry.block[1] for entry in entries), default=1),
        "maxComputeWorkgroupSizeZ": max((entry.block[2] for entry in entries), default=1),
        "maxComputeWorkgroupsPerDimension": max((max(entry.grid) for entry in entries), default=1),
        "maxComputeWorkgroupStorageSize": max((entry.workgroup_bytes for entry in entries), default=0),
        "maxStorageBufferBindingSize": max(buffer_bytes, default=0),
        "maxBufferSize": max(buffer_bytes, default=0),
    }
