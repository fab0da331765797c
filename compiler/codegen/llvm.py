"""LLVM code generation: PrimFuncs (the loop IR) → one llvmlite module → optimised IR, assembly
and an object file for a Target. link.py turns the object into a .so or .wasm; build.py drives it.

Every kernel is `void name(T0* arg0, T1* arg1, ...)`. Vectorized loops become LLVM vector values,
parallel loops an outlined body run through Tessel's thread pool (thread_pool.c natively, wasm_thread_pool.c in
threaded wasm; link.py links them) when tir/work.py says they do enough work, math a polynomial in IR."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import llvmlite.binding as llvm
from llvmlite import ir

from compiler.codegen.fast_math import FastMath, intrinsic_suffix
from compiler.errors import TargetError
from compiler.target import Target
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
    is_int,
)
from compiler.tir.analysis import affine_coefficient, can_widen, clamped_run, repeated_run
from compiler.tir.fast_math import expand_math
from compiler.tir.nodes import (
    Allocate,
    Barrier,
    Buffer,
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
from compiler.tir.visitor import StmtVisitor, structurally_equal, walk
from compiler.tir.work import stmt_work, worth_parallel

NUM_THREADS_GLOBAL = "tessel_num_threads"
# void tessel_parallel(void (*body)(void *closure, int32_t threads), void *closure, int32_t threads, int64_t work):
# thread_pool.c; work is tir/work.py's estimate (-1: unknown)
PARALLEL_ENTRY = "tessel_parallel"
# void tessel_pool_run(int32_t threads, int64_t work): called as a model's run entry starts, with the work its
# kernels' pooled loops do in all (-1: unknown), so the pool can wake sleeping workers while the first kernels run
RUN_ENTRY = "tessel_pool_run"
# A model's run entry numbers its kernel calls from 1 in `current call`; a failed te.index_check copies the
# number into `failed call`, which the entry returns (0: every index was in range).
CURRENT_CALL_GLOBAL, FAILED_CALL_GLOBAL = "tessel_current_call", "tessel_failed_call"
# chunks of a parallel loop's range per thread, claimed from a shared counter: more balance the load when a
# thread starts late, each costs one atomic add
CHUNKS_PER_THREAD = 4
CONTRACTED = {"add": ir.IRBuilder.fadd, "sub": ir.IRBuilder.fsub, "mul": ir.IRBuilder.fmul}
# Larger allocations go to a static array (wasm) or the heap, kept between calls (kept_heap), so no stack can overflow.
_STACK_LIMIT_BYTES = 64 * 1024
# A vectorized loop wider than this is emitted as a loop: LLVM would split such vectors anyway.
_MAX_LANES = 64

_I1, _I8, _I16, _I32, _I64 = (ir.IntType(bits) for bits in (1, 8, 16, 32, 64))
_F16, _F32, _F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
_PTR = ir.PointerType()
_INT_TYPES = {"int8": _I8, "uint8": _I8, "int16": _I16, "int32": _I32, "int64": _I64}
_UNSIGNED = ("uint8", "bool")
# What this codegen computes itself (tir/fast_math.py expands the rest before emission): exp and log as codegen/
# fast_math.py's polynomials, and natively float64 tanh, erf and pow from the C library.
NATIVE_MATH = ("exp", "log", "sqrt", "rsqrt", "floor", "ceil", "round", "abs")
LIBM_MATH = ("tanh:float64", "erf:float64", "pow:float64")


def value_type(dtype: str) -> ir.Type:
    """The register type: float16 computes in float32, bool is i1."""
    if dtype in _INT_TYPES:
        return _INT_TYPES[dtype]
    return {"float16": _F32, "float32": _F32, "float64": _F64, "bool": _I1}[dtype]


def storage_type(dtype: str, target: Target) -> ir.Type:
    """The memory type: bool is a byte; float16 is i16 bits where the machine has no half conversions."""
    if dtype == "float16":
        return _F16 if target.machine.half_conversions else _I16
    return _I8 if dtype == "bool" else value_type(dtype)


def _vector(ty: ir.Type, lanes: int) -> ir.Type:
    return ir.VectorType(ty, lanes) if lanes else ty


def _lanes(value: ir.Value) -> int:
    return value.type.count if isinstance(value.type, ir.VectorType) else 0


# the constant strides between lanes that a vector load reads as contiguous runs and shuffles (longer ones gather)
STRIDED_LOADS = (2, 3, 4)


def _holds_static_array(body: Stmt) -> bool:
    """Whether `body` allocates a buffer that wasm keeps in a static array (over _STACK_LIMIT_BYTES): one array for
    every thread of a threaded module, so such a loop must stay on one thread."""
    return any(
        isinstance(node, Allocate) and node.buffer.size * max(1, element_bytes(node.buffer.dtype)) > _STACK_LIMIT_BYTES
        for node in walk(body)
    )


class _ModuleContext:
    """What the functions of one module share: the module, its target and its declarations."""

    def __init__(self, target: Target):
        self.target = target
        self.module = ir.Module(name="tessel")
        self.module.triple = target.triple
        self.counter = 0  # makes outlined-function and static-array names unique
        self.pooled_work: dict[str, int] = {}  # per kernel, the work of the loops it hands to the pool (-1: unknown)
        # Parallel loops go to a thread pool natively and in threaded wasm (+atomics: link.py links
        # wasm_thread_pool.c over a shared memory); plain wasm runs them serially.
        self.parallel = target.parallel
        if self.parallel:
            threads = ir.GlobalVariable(self.module, _I32, NUM_THREADS_GLOBAL)
            threads.initializer = ir.Constant(_I32, 0)
            self.num_threads = threads
        self.current_call, self.failed_call = (
            self.status_global(name) for name in (CURRENT_CALL_GLOBAL, FAILED_CALL_GLOBAL)
        )

    def status_global(self, name: str) -> ir.GlobalVariable:
        variable = ir.GlobalVariable(self.module, _I32, name)
        variable.linkage = "internal"
        variable.initializer = ir.Constant(_I32, 0)
        return variable

    def function(self, name: str, return_type: ir.Type, arg_types: list[ir.Type]) -> ir.Function:
        existing = self.module.globals.get(name)
        if existing is not None:
            return existing
        return ir.Function(self.module, ir.FunctionType(return_type, arg_types), name)

    def intrinsic(self, name: str, ty: ir.Type) -> ir.Function:
        arity = 3 if name == "fma" else 2 if name in ("minimum", "maximum", "copysign") else 1
        return self.function(f"llvm.{name}.{intrinsic_suffix(ty)}", ty, [ty] * arity)


class _FunctionEmitter(StmtVisitor):
    """One visitor over a function body (its statements; its expressions dispatch on `expr_<node>`): `vector_var` is
    set while a vectorized loop is widened, and `lets` keeps each bound variable's expression so index analysis can
    see through it."""

    def __init__(self, context: _ModuleContext, function: ir.Function, parallel_depth: int = 0):
        self.context = context
        self.target = context.target
        self.function = function
        entry = function.append_basic_block("entry")
        self.entry = ir.IRBuilder(entry)
        self.builder = ir.IRBuilder(function.append_basic_block("body"))
        scalef = "avx512f" in self.target.feature_set
        self.math = FastMath(self.builder, context.intrinsic, context.function, scalef)
        self.values: dict[Var, ir.Value] = {}
        self.buffers: dict[Buffer, ir.Value] = {}
        self.lets: dict[Var, Expr] = {}
        self.vector_var: Var | None = None
        self.vector_from_zero = False  # the vector loop's lanes count from 0 (lane i is var = i)
        self.parallel_depth = parallel_depth
        self.calls = 0
        self.indexing = False  # an element index is being computed (its integer arithmetic is `nsw`, see index)
        self.widening = False  # its narrower integers are extended to the pointer's 64 bits first (see index)

    def finish(self) -> None:
        self.entry.branch(self.function.blocks[1])
        if isinstance(self.function.function_type.return_type, ir.VoidType):
            self.builder.ret_void()
        else:
            self.builder.ret(self.builder.load(self.context.failed_call, typ=_I32))

    def announce_run(self, kernels: list[str]) -> None:
        """Tell the thread pool, as a run starts, how much work the run's pooled loops do (thread_pool.c,
        tessel_pool_run): nothing when no kernel hands a loop to the pool."""
        works = [self.context.pooled_work[name] for name in kernels if name in self.context.pooled_work]
        if not works:
            return
        work = -1 if min(works) < 0 else sum(works)
        announce = self.context.function(RUN_ENTRY, ir.VoidType(), [_I32, _I64])
        threads = self.builder.load(self.context.num_threads, typ=_I32)
        self.builder.call(announce, [threads, ir.Constant(_I64, work)])

    # ---- helpers -------------------------------------------------------------------------------

    def const(self, value, dtype: str, lanes: int = 0) -> ir.Constant:
        ty = value_type(dtype)
        if dtype == "bool":
            value = int(bool(value))
        elif is_float(dtype):
            value = float(value)
        else:
            value = int(value)
        scalar = ir.Constant(ty, value)
        return ir.Constant(ir.VectorType(ty, lanes), [scalar] * lanes) if lanes else scalar

    def broadcast(self, value: ir.Value, lanes: int) -> ir.Value:
        if not lanes or _lanes(value):
            return value
        if isinstance(value, ir.Constant):
            return ir.Constant(ir.VectorType(value.type, lanes), [value] * lanes)
        b = self.builder
        single = b.insert_element(
            ir.Constant(ir.VectorType(value.type, lanes), ir.Undefined), value, ir.Constant(_I32, 0)
        )
        return b.shuffle_vector(single, single, ir.Constant(ir.VectorType(_I32, lanes), None))

    def match(self, *values: ir.Value) -> list[ir.Value]:
        lanes = max(_lanes(value) for value in values)
        return [self.broadcast(value, lanes) for value in values]

    def call(self, name: str, *args: ir.Value) -> ir.Value:
        return self.builder.call(self.context.intrinsic(name, args[0].type), list(args))

    def pointer(self, buffer: Buffer) -> ir.Value:
        if buffer not in self.buffers:
            raise TargetError(f"buffer {buffer.name!r} is used outside the function or allocation that owns it")
        return self.buffers[buffer]

    def element_pointer(self, buffer: Buffer, index: ir.Value) -> ir.Value:
        return self.builder.gep(self.pointer(buffer), [index], source_etype=storage_type(buffer.dtype, self.target))

    def to_half_and_back(self, value: ir.Value) -> ir.Value:
        """Round a float32 value to float16 precision, keeping the float32 register type."""
        if not self.target.machine.half_conversions:
            return self.math.half_to_float(self.math.float_to_half(value))
        half = self.builder.fptrunc(value, _vector(_F16, _lanes(value)))
        return self.builder.fpext(half, value.type)

    # ---- memory ----------------------------------------------------------------------------------

    def load_scalar(self, buffer: Buffer, index: ir.Value) -> ir.Value:
        lanes = _lanes(index)
        memory_type = _vector(storage_type(buffer.dtype, self.target), lanes)
        pointer = self.element_pointer(buffer, index if not lanes else self.builder.extract_element(index, _zero()))
        raw = self.builder.load(pointer, typ=memory_type, align=element_bytes(buffer.dtype))
        return self.from_memory(raw, buffer.dtype)

    def from_memory(self, raw: ir.Value, dtype: str) -> ir.Value:
        b, lanes = self.builder, _lanes(raw)
        if dtype == "bool":
            return b.icmp_unsigned("!=", raw, ir.Constant(raw.type, None))
        if dtype == "float16":
            if not self.target.machine.half_conversions:
                return self.math.half_to_float(raw)
            return b.fpext(raw, _vector(_F32, lanes))
        return raw

    def to_memory(self, value: ir.Value, dtype: str) -> ir.Value:
        b, lanes = self.builder, _lanes(value)
        if dtype == "bool":
            return b.zext(value, _vector(_I8, lanes))
        if dtype == "float16":
            if not self.target.machine.half_conversions:
                return self.math.float_to_half(value)
            return b.fptrunc(value, _vector(_F16, lanes))
        return value

    @contextmanager
    def indexing_as(self, indexing: bool):
        """Within the block, integer arithmetic is an element index's (`nsw`) or, False, plain wrapping arithmetic."""
        outer, self.indexing = self.indexing, indexing
        try:
            yield
        finally:
            self.indexing = outer

    def index(self, expr: Expr, widen: bool = True) -> ir.Value:
        """An element index, its signed integer adds, subtracts and multiplies flagged `nsw` (no signed wrap): an
        index that wrapped would address outside its buffer, so none does. With the flag LLVM may widen a sum of
        32-bit terms to the 64-bit address piece by piece and hoist the loop-invariant pieces: without it, a dense
        block's k loop recomputed each broadcast row's address (a lea and a sign extension per load, 40
        instructions per 14 multiply-adds).

        With 64-bit pointers the index is computed in 64 bits: its variables, constants and loaded or converted
        integers are extended where they enter it. In 32 bits LLVM kept the sign extension of each address: where it
        hoisted a loop's invariant terms out of a sum it dropped their `nsw`, so a blocked conv's inner loop did a
        lea and a sign extension per weight load (32 of them per 64 multiply-adds on AVX2). A gather's lanes stay
        32-bit (`widen` False): 8 of them fit one AVX2 vgatherdps, where 64-bit lanes took two (odd_transformer's
        Transpose and Reshape 0.018 -> 0.048 ms)."""
        outer = self.widening
        self.widening = widen and self.target.pointer_bytes == 8
        try:
            with self.indexing_as(True):
                return self.expr(expr)
        finally:
            self.widening = outer

    def widened(self, value: ir.Value, dtype: str) -> ir.Value:
        """`value`, an integer of `dtype` inside an index being computed in 64 bits (index), extended to them."""
        if not self.widening or not is_int(dtype) or _width(value.type) >= 64:
            return value
        wide = _vector(_I64, _lanes(value))
        return self.builder.zext(value, wide) if dtype in _UNSIGNED else self.builder.sext(value, wide)

    def load(self, node: Load) -> ir.Value:
        index = self.index(node.index)
        if not _lanes(index):
            return self.load_scalar(node.buffer, index)
        stride = affine_coefficient(node.index, self.vector_var, self.lets)
        if stride == 1:
            return self.load_scalar(node.buffer, index)
        if stride in STRIDED_LOADS:
            return self.load_strided(node.buffer, index, stride)
        clamped = clamped_run(node.index, self.vector_var, self.lets)
        if clamped is not None:
            return self.loadclamped_run(node.buffer, *clamped)
        repeat = repeated_run(node.index, self.vector_var, self.lets) if self.vector_from_zero else None
        if repeat is not None:
            return self.load_repeated(node.buffer, index, repeat)
        return self.gather(node.buffer, self.index(node.index, widen=False))

    def load_repeated(self, buffer: Buffer, index: ir.Value, repeat: int) -> ir.Value:
        """A vector of buffer[start + lane // repeat]: one load of the run it spans, each element shuffled out
        `repeat` times. A 2x nearest Resize's columns were one scalar load per lane (a gather)."""
        b = self.builder
        lanes = _lanes(index)
        span = -(-lanes // repeat)
        if span == 1:
            return self.broadcast(self.load_scalar(buffer, b.extract_element(index, _zero())), lanes)
        run = self.load_scalar(buffer, b.shuffle_vector(index, index, ir.Constant(ir.VectorType(_I32, span), None)))
        picks = ir.Constant(ir.VectorType(_I32, lanes), [lane // repeat for lane in range(lanes)])
        return b.shuffle_vector(run, run, picks)

    def load_strided(self, buffer: Buffer, index: ir.Value, stride: int) -> ir.Value:
        """A vector of buffer[start + stride * lane]: the run of elements from the first lane's to the last one's
        in contiguous loads (the elements past the last lane's masked off, so nothing beyond it is read), then
        every stride-th element picked out. A stride-2 pool's or conv's columns, lane by lane, were one scalar load
        each."""
        b = self.builder
        lanes = _lanes(index)
        span = stride * (lanes - 1) + 1
        total = stride * lanes
        mask = ir.Constant(ir.VectorType(_I1, total), [int(lane < span) for lane in range(total)])
        wide = self.masked_load(buffer, b.extract_element(index, _zero()), mask)
        picks = ir.Constant(ir.VectorType(_I32, lanes), [stride * lane for lane in range(lanes)])
        return self.from_memory(b.shuffle_vector(wide, wide, picks), buffer.dtype)

    def loadclamped_run(
        self, buffer: Buffer, position: Expr, low: int | None, high: int | None, unclamped: Expr
    ) -> ir.Value:
        """A vector of buffer[... clamp(position, low, high) ...] where position steps by one per lane (no bound on
        a side that is None). With no lane clamped (the interior of a padded row) it is one contiguous load. Else
        the lanes inside [low, high] come from one masked load (the others are not touched, so an address before or
        past the buffer is safe) and the clamped lanes take the element at low or at high."""
        b = self.builder
        positions = self.expr(position)
        start = self.expr(unclamped)  # lane i reads start[0] + i before clamping
        start_index = b.extract_element(start, _zero())
        first = b.extract_element(positions, _zero())
        lanes = _lanes(positions)
        kind = positions.type.element

        def bound(value: int, vector: bool = False) -> ir.Constant:
            return ir.Constant(ir.VectorType(kind, lanes), [value] * lanes) if vector else ir.Constant(kind, value)

        checks = []
        if low is not None:
            checks.append(b.icmp_signed(">=", first, bound(low)))
        if high is not None:
            checks.append(b.icmp_signed("<=", b.add(first, bound(lanes - 1)), bound(high)))
        inside = checks[0] if len(checks) == 1 else b.and_(*checks)
        with b.if_else(inside, likely=True) as (contiguous, clamped):
            with contiguous:
                run = self.load_scalar(buffer, start)
                run_block = b.block
            with clamped:
                below = b.icmp_signed("<", positions, bound(low, True)) if low is not None else None
                above = b.icmp_signed(">", positions, bound(high, True)) if high is not None else None
                outside = below if above is None else above if below is None else b.or_(below, above)
                mask = b.not_(outside)
                loaded = self.from_memory(self.masked_load(buffer, start_index, mask), buffer.dtype)

                def element_at(value: int) -> ir.Value:
                    index = b.add(start_index, b.sub(bound(value), first))
                    return self.broadcast(self.load_scalar(buffer, index), lanes)

                if below is None:
                    edges = element_at(high)
                elif above is None:
                    edges = element_at(low)
                else:
                    edges = b.select(below, element_at(low), element_at(high))
                gathered = b.select(mask, loaded, edges)
                gather_block = b.block
        result = b.phi(run.type)
        result.add_incoming(run, run_block)
        result.add_incoming(gathered, gather_block)
        return result

    def masked_load(self, buffer: Buffer, start: ir.Value, mask: ir.Value) -> ir.Value:
        """The raw elements buffer[start + i] of the lanes i where `mask` is set (the others undefined, their
        addresses never read), in pieces of at most one target vector: LLVM 22's wasm backend aborts on a masked
        load of 32 floats, and a native backend splits such a load the same way."""
        b = self.builder
        lanes = _lanes(mask)
        element = storage_type(buffer.dtype, self.target)
        piece = max(1, min(lanes, self.target.vector_bytes // max(1, element_bytes(buffer.dtype))))
        parts = []
        for first in range(0, lanes, piece):
            count = min(piece, lanes - first)
            memory_type = ir.VectorType(element, count)
            function = self.context.function(
                f"llvm.masked.load.{intrinsic_suffix(memory_type)}.p0",
                memory_type,
                [_PTR, _I32, ir.VectorType(_I1, count), memory_type],
            )
            part_mask = mask if count == lanes else _lanes_of(b, mask, first, count)
            pointer = self.element_pointer(buffer, b.add(start, ir.Constant(start.type, first)))
            align = ir.Constant(_I32, element_bytes(buffer.dtype))
            parts.append(b.call(function, [pointer, align, part_mask, ir.Constant(memory_type, None)]))
        return _concatenate(b, parts)

    def gather(self, buffer: Buffer, index: ir.Value) -> ir.Value:
        """A vector of buffer[index[lane]]. Natively, for 4- and 8-byte elements, one llvm.masked.gather (x86's
        vgatherdps and kin; on a target without a gather instruction LLVM's documented lowering is scalar loads): an NCHW16c -> NCHW
        conversion's stride-16 columns 0.088 -> 0.050 ms (yolo_neck's last group), shufflenet_v2's channel shuffle
        0.046 -> 0.029 (1 thread, AVX-512), no group slower beyond the noise. Else, and in wasm, a scalar load per lane."""
        b = self.builder
        lanes = _lanes(index)
        if self.target.machine.gathers and element_bytes(buffer.dtype) in (4, 8):
            return self.from_memory(self.masked_gather(buffer, index), buffer.dtype)
        result = ir.Constant(ir.VectorType(value_type(buffer.dtype), lanes), ir.Undefined)
        for lane in range(lanes):
            element = self.load_scalar(buffer, b.extract_element(index, ir.Constant(_I32, lane)))
            result = b.insert_element(result, element, ir.Constant(_I32, lane))
        return result

    def masked_gather(self, buffer: Buffer, index: ir.Value) -> ir.Value:
        """llvm.masked.gather of every lane's element, the addresses computed as integers (base + index * size)."""
        b = self.builder
        lanes = _lanes(index)
        memory_type = ir.VectorType(storage_type(buffer.dtype, self.target), lanes)
        address_type = ir.IntType(8 * self.target.pointer_bytes)
        if index.type.element.width < address_type.width:
            index = b.sext(index, ir.VectorType(address_type, lanes))
        size = self.broadcast(ir.Constant(address_type, element_bytes(buffer.dtype)), lanes)
        base = self.broadcast(b.ptrtoint(self.pointer(buffer), address_type), lanes)
        pointers = b.inttoptr(b.add(base, b.mul(index, size)), ir.VectorType(_PTR, lanes))
        gather = self.context.function(
            f"llvm.masked.gather.{intrinsic_suffix(memory_type)}.v{lanes}p0",
            memory_type,
            [ir.VectorType(_PTR, lanes), _I32, ir.VectorType(_I1, lanes), memory_type],
        )
        every_lane = ir.Constant(ir.VectorType(_I1, lanes), [1] * lanes)
        align = ir.Constant(_I32, element_bytes(buffer.dtype))
        return b.call(gather, [pointers, align, every_lane, ir.Constant(memory_type, None)])

    def visit_store(self, node: Store) -> None:
        b = self.builder
        index = self.index(node.index)
        lanes = _lanes(index)
        value = self.accumulation(node)
        if value is None:
            value = self.expr(node.value)
        value = self.to_memory(self.broadcast(value, lanes), node.buffer.dtype)
        align = element_bytes(node.buffer.dtype)
        if not lanes:
            b.store(value, self.element_pointer(node.buffer, index), align=align)
        elif affine_coefficient(node.index, self.vector_var, self.lets) == 1:
            b.store(value, self.element_pointer(node.buffer, b.extract_element(index, _zero())), align=align)
        else:
            for lane in range(lanes):
                position = ir.Constant(_I32, lane)
                pointer = self.element_pointer(node.buffer, b.extract_element(index, position))
                b.store(b.extract_element(value, position), pointer, align=align)

    def accumulation(self, node: Store) -> ir.Value | None:
        """buf[i] = buf[i] + v (or *) on floats, the update of a reduction, with LLVM's `reassoc` flag besides
        `contract`: LLVM may then reorder the sum, so its loop vectorizer keeps one partial sum per lane and adds
        them up at the end (softmax's and layernorm's row sums, global pools). None for any other store."""
        value = node.value
        if not (isinstance(value, Binary) and value.op in ("add", "mul") and is_float(value.dtype)):
            return None
        for total, term in ((value.a, value.b), (value.b, value.a)):
            if isinstance(total, Load) and total.buffer is node.buffer and structurally_equal(total.index, node.index):
                left, right = self.match(self.expr(total), self.expr(term))
                return self.float_binary(value.op, left, right, reassociate=True)
        return None

    def visit_allocate(self, node: Allocate) -> None:
        buffer = node.buffer
        memory_type = storage_type(buffer.dtype, self.target)
        nbytes = buffer.size * max(1, element_bytes(buffer.dtype))
        array_type = ir.ArrayType(memory_type, max(1, buffer.size))
        heap = None
        if nbytes <= _STACK_LIMIT_BYTES:
            storage = self.entry.alloca(array_type, name=buffer.name)
            storage.align = 64
            pointer = _opaque(storage)
        elif self.target.machine.scratch == "static":
            # A wasm instance runs one call at a time, so a static array cannot be shared by two calls; nor by two
            # threads: a parallel loop holding one stays serial (_holds_static_array).
            self.context.counter += 1
            storage = ir.GlobalVariable(self.context.module, array_type, f"{buffer.name}.{self.context.counter}")
            storage.linkage = "internal"
            storage.initializer = ir.Constant(array_type, None)
            storage.align = 64
            pointer = _opaque(storage)
        else:
            pointer, heap = self.kept_heap(buffer.name, nbytes)
        self.buffers[buffer] = pointer
        self.visit(node.body)
        if heap is not None:
            self.release_heap(*heap)
        del self.buffers[buffer]

    def kept_heap(self, name: str, nbytes: int) -> tuple[ir.Value, tuple[ir.Value, ir.Value]]:
        """A heap buffer of `nbytes` that outlives the call: a slot of the module keeps the last one given back,
        and a call takes it (swapping in null) or, finding none (the first call, or another thread holds it),
        mallocs its own. A malloc and free per call of a few MB (Winograd's transformed tiles) made glibc grow and
        trim its heap each call, a page fault per 4 KB (unet_small, 2 threads: 3.54 ms against 1.81 with the
        buffers kept). Concurrent callers never share one: each holds its own until it gives it back."""
        self.context.counter += 1
        slot = ir.GlobalVariable(self.context.module, _PTR, f"{name}.kept.{self.context.counter}")
        slot.linkage = "internal"
        slot.initializer = ir.Constant(_PTR, None)
        b = self.builder
        taken = b.atomic_rmw("xchg", slot, ir.Constant(_PTR, None), "acquire")
        before = b.block
        with b.if_then(b.icmp_unsigned("==", taken, ir.Constant(_PTR, None))):
            size_type = ir.IntType(8 * self.target.pointer_bytes)
            made = b.call(self.context.function("malloc", _PTR, [size_type]), [ir.Constant(size_type, nbytes)])
            made_block = b.block
        pointer = b.phi(_PTR)
        pointer.add_incoming(taken, before)
        pointer.add_incoming(made, made_block)
        return pointer, (slot, pointer)

    def release_heap(self, slot: ir.Value, pointer: ir.Value) -> None:
        """Give a kept_heap buffer back to its slot, freeing the one a concurrent caller left there meanwhile."""
        b = self.builder
        left = b.atomic_rmw("xchg", slot, pointer, "acq_rel")
        with b.if_then(b.icmp_unsigned("!=", left, ir.Constant(_PTR, None))):
            b.call(self.context.function("free", ir.VoidType(), [_PTR]), [left])

    # ---- statements ------------------------------------------------------------------------------

    def generic_visit(self, node) -> None:
        raise TypeError(f"codegen cannot handle statement {type(node).__name__}")

    def visit_seq(self, node: Seq) -> None:
        for item in node.stmts:
            self.visit(item)

    def visit_letstmt(self, node: LetStmt) -> None:
        self.bind(node.var, node.value, lambda: self.visit(node.body))

    def visit_barrier(self, node: Barrier) -> None:
        return  # CPU: each thread-bound stage already runs to completion before the next one

    def visit_prefetch(self, node: Prefetch) -> None:
        if not self.target.machine.prefetch:
            return  # e.g. wasm, which has no prefetch instruction
        pointer = self.element_pointer(node.element.buffer, self.index(node.element.index))
        prefetch = self.context.function("llvm.prefetch.p0", ir.VoidType(), [_PTR, _I32, _I32, _I32])
        # a read (0) of data (1) into every cache level (locality 3: x86's prefetcht0; into the second level only,
        # prefetcht1, resnet18's 512-channel convs were 5% slower)
        self.builder.call(prefetch, [pointer, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])

    def visit_kernelcall(self, node: KernelCall) -> None:
        offset_type = ir.IntType(8 * self.target.pointer_bytes)
        pointers = [
            self.builder.gep(self.pointer(buffer), [ir.Constant(offset_type, offset)], source_etype=_I8)
            for buffer, offset in node.args
        ]
        callee = self.context.function(node.func, ir.VoidType(), [_PTR] * len(pointers))
        # Inlining every kernel into the caller would only grow one huge function and the O3 time.
        callee.attributes.add("noinline")
        self.calls += 1
        self.builder.store(ir.Constant(_I32, self.calls), self.context.current_call)
        self.builder.call(callee, pointers)

    def bind(self, var: Var, value: Expr, emit_body):
        self.values[var] = self.expr(value)
        self.lets[var] = value
        try:
            return emit_body()
        finally:
            del self.values[var], self.lets[var]

    def visit_ifthen(self, node: IfThen) -> None:
        cond = self.expr(node.cond)
        if node.else_body is None:
            with self.builder.if_then(cond):
                self.visit(node.then_body)
            return
        with self.builder.if_else(cond) as (then, otherwise):
            with then:
                self.visit(node.then_body)
            with otherwise:
                self.visit(node.else_body)

    def visit_for(self, node: For) -> None:
        start = self.expr(node.min)
        if node.kind == ForKind.VECTORIZED and isinstance(node.extent, Const) and self.vector_var is None:
            lanes = int(node.extent.value)
            if 1 < lanes <= _MAX_LANES and can_widen(node.body, node.var):
                for first, count in _vector_pieces(lanes, self.target.vector_bytes // 4):
                    self.widen(
                        node, self.builder.add(start, ir.Constant(start.type, first), flags=("nsw",)), count, first == 0
                    )
                return
        if node.kind in (ForKind.VECTORIZED, ForKind.UNROLLED) and isinstance(node.extent, Const):
            if int(node.extent.value) <= _MAX_LANES:
                for step in range(int(node.extent.value)):
                    offset = self.builder.add(start, ir.Constant(start.type, step), flags=("nsw",))
                    self.values[node.var] = offset
                    self.visit(node.body)
                    del self.values[node.var]
                return
        extent = self.expr(node.extent)
        if (
            node.kind == ForKind.PARALLEL
            and self.context.parallel
            and self.parallel_depth == 0
            and worth_parallel(node)
            and not (self.target.machine.scratch == "static" and _holds_static_array(node.body))
        ):
            self.parallel_loop(node, start, extent)
            return
        self.serial_loop(node.var, start, ir.Constant(start.type, 0), extent, node.body)

    def serial_loop(self, var: Var, start: ir.Value, begin: ir.Value, end: ir.Value, body: Stmt) -> None:
        """var = start + i for i in [begin, end)."""
        b = self.builder
        header = b.append_basic_block("loop.header")
        inner = b.append_basic_block("loop.body")
        done = b.append_basic_block("loop.end")
        before = b.block
        b.branch(header)
        b.position_at_end(header)
        counter = b.phi(begin.type, name=var.name)
        counter.add_incoming(begin, before)
        b.cbranch(b.icmp_signed("<", counter, end), inner, done)
        b.position_at_end(inner)
        self.values[var] = b.add(start, counter, flags=("nsw",))
        self.visit(body)
        del self.values[var]
        counter.add_incoming(b.add(counter, ir.Constant(counter.type, 1), flags=("nsw",)), b.block)
        b.branch(header)
        b.position_at_end(done)

    def widen(self, node: For, start: ir.Value, lanes: int, first: bool = True) -> None:
        """The body once over `lanes` lanes from `start`; `first`: they begin at the loop's own start."""
        steps = ir.Constant(ir.VectorType(start.type, lanes), list(range(lanes)))
        self.values[node.var] = self.builder.add(self.broadcast(start, lanes), steps, flags=("nsw",))
        self.vector_var = node.var
        self.vector_from_zero = first and isinstance(node.min, Const) and int(node.min.value) == 0
        try:
            self.visit(node.body)
        finally:
            self.vector_var = None
            del self.values[node.var]

    def parallel_loop(self, node: For, start: ir.Value, extent: ir.Value) -> None:
        """Outline the body into fn(closure, threads) and run it through tessel_parallel. The threads claim chunks
        of the iteration range from a shared counter in the closure (CHUNKS_PER_THREAD per thread, of sizes that
        differ by at most one iteration), so a thread
        that starts late (a sleeping worker takes 100-200 us to wake on a virtual machine) does fewer chunks, or
        none: the pool does not wait for a worker that has not joined."""
        free_vars = [v for v in dict.fromkeys(n for n in walk(node.body) if isinstance(n, Var)) if v in self.values]
        buffers = [n.buffer for n in walk(node.body) if isinstance(n, (Load, Store))]
        free_buffers = [buffer for buffer in dict.fromkeys(buffers) if buffer in self.buffers]
        captured = [start, extent, *(self.values[v] for v in free_vars), *(self.buffers[b] for b in free_buffers)]
        counter_field = len(captured)
        closure_type = ir.LiteralStructType([*(value.type for value in captured), _I64])

        context = self.context
        context.counter += 1
        outlined = ir.Function(
            context.module,
            ir.FunctionType(ir.VoidType(), [_PTR, _I32]),
            f"{self.function.name}.parallel.{context.counter}",
        )
        outlined.linkage = "internal"
        # one copy of the body for the pool and for one thread: the same code, so the same results at any count
        outlined.attributes.add("noinline")
        child = _FunctionEmitter(context, outlined, parallel_depth=self.parallel_depth + 1)
        closure = outlined.args[0]
        fields = []
        for position, value in enumerate(captured):
            pointer = child.builder.gep(closure, [_zero(), ir.Constant(_I32, position)], source_etype=closure_type)
            fields.append(child.builder.load(pointer, typ=value.type))
        child_start, child_extent = fields[0], fields[1]
        child.values.update(zip(free_vars, fields[2 : 2 + len(free_vars)]))
        child.lets.update({v: self.lets[v] for v in free_vars if v in self.lets})
        child.buffers.update(zip(free_buffers, fields[2 + len(free_vars) :]))
        cb = child.builder
        index_type = child_extent.type
        threads = cb.sext(outlined.args[1], _I64)
        total = cb.sext(child_extent, _I64) if index_type.width < 64 else child_extent
        pieces = _smin(cb, cb.mul(threads, ir.Constant(_I64, CHUNKS_PER_THREAD)), total)
        counter = cb.gep(closure, [_zero(), ir.Constant(_I32, counter_field)], source_etype=closure_type)
        claim, work, done = (outlined.append_basic_block(name) for name in ("claim", "work", "done"))
        cb.branch(claim)
        cb.position_at_end(claim)
        piece = cb.atomic_rmw("add", counter, ir.Constant(_I64, 1), "monotonic")
        cb.cbranch(cb.icmp_signed("<", piece, pieces), work, done)
        cb.position_at_end(work)
        # Sizes differ by at most one iteration, the longer chunks first: the first total % pieces chunks have one
        # iteration more. Threads of equal speed claim every threads-th chunk, so each gets its share of the longer
        # ones; spread evenly (chunk k ending at (k+1)*total/pieces), 28 iterations were 3, 4, 3, 4... and one of
        # two threads claimed every 4, 16 iterations to the other's 12 (ceil-sized chunks: 7 of 4, the same split).
        size = cb.sdiv(total, pieces)
        longer = cb.srem(total, pieces)
        begin = cb.add(cb.mul(piece, size), _smin(cb, piece, longer))
        end = cb.add(cb.add(begin, size), cb.zext(cb.icmp_signed("<", piece, longer), _I64))
        if index_type.width < 64:
            begin, end = cb.trunc(begin, index_type), cb.trunc(end, index_type)
        child.serial_loop(node.var, child_start, begin, end, node.body)
        cb.branch(claim)
        cb.position_at_end(done)
        child.finish()

        b = self.builder
        closure_value = _opaque(self.entry.alloca(closure_type))
        for position, value in enumerate([*captured, ir.Constant(_I64, 0)]):
            b.store(value, b.gep(closure_value, [_zero(), ir.Constant(_I32, position)], source_etype=closure_type))
        pool = context.function(PARALLEL_ENTRY, ir.VoidType(), [_PTR, _PTR, _I32, _I64])
        work = stmt_work(node)
        known = context.pooled_work.get(self.function.name, 0)
        context.pooled_work[self.function.name] = -1 if work is None or known < 0 else known + work
        num_threads = b.load(context.num_threads, typ=_I32)
        one = ir.Constant(_I32, 1)
        # One thread means no thread pool at all: the body runs on the caller's thread and claims every chunk.
        with b.if_else(b.icmp_signed("==", num_threads, one)) as (serial, pooled):
            with serial:
                b.call(outlined, [closure_value, one])
            with pooled:
                b.call(pool, [outlined, closure_value, num_threads, ir.Constant(_I64, -1 if work is None else work)])

    # ---- expressions -----------------------------------------------------------------------------

    def expr(self, node: Expr) -> ir.Value:
        method = getattr(self, f"expr_{type(node).__name__.lower()}", None)
        if method is None:
            raise TypeError(f"codegen cannot handle expression {type(node).__name__}")
        return method(node)

    def expr_var(self, node: Var) -> ir.Value:
        if node not in self.values:
            raise TargetError(f"variable {node.name!r} is used outside the loop or let that defines it")
        return self.widened(self.values[node], node.dtype)

    def expr_const(self, node: Const) -> ir.Value:
        if self.widening and is_int(node.dtype):
            return ir.Constant(_I64, int(node.value))
        return self.const(node.value, node.dtype)

    def expr_load(self, node: Load) -> ir.Value:
        return self.widened(self.load(node), node.buffer.dtype)

    def expr_let(self, node: Let) -> ir.Value:
        return self.bind(node.var, node.value, lambda: self.expr(node.body))

    def expr_cast(self, node: Cast) -> ir.Value:
        value, source = self.expr(node.value), node.value.dtype
        if self.widening and is_int(source):
            # widened (an unsigned one is never negative); converted to a narrower integer it wraps as in its own width
            source = "int64"
        return self.widened(self.convert(value, source, node.dtype), node.dtype)

    def expr_select(self, node: Select) -> ir.Value:
        cond, true_value, false_value = self.expr(node.cond), self.expr(node.true_value), self.expr(node.false_value)
        if _lanes(cond):
            cond, true_value, false_value = self.match(cond, true_value, false_value)
        else:
            true_value, false_value = self.match(true_value, false_value)
        return self.builder.select(cond, true_value, false_value)

    def expr_ifthenelse(self, node: IfThenElse) -> ir.Value:
        b = self.builder
        cond = self.expr(node.cond)
        with b.if_else(cond) as (then, otherwise):
            with then:
                true_value, true_block = self.expr(node.true_value), b.block
            with otherwise:
                false_value, false_block = self.expr(node.false_value), b.block
        phi = b.phi(true_value.type)
        phi.add_incoming(true_value, true_block)
        phi.add_incoming(false_value, false_block)
        return phi

    def expr_logical(self, node: Logical) -> ir.Value:
        b = self.builder
        if node.op == "not":
            value = self.expr(node.args[0])
            return b.xor(value, self.const(True, "bool", _lanes(value)))
        left, right = self.match(self.expr(node.args[0]), self.expr(node.args[1]))
        return b.and_(left, right) if node.op == "and" else b.or_(left, right)

    def expr_compare(self, node: Compare) -> ir.Value:
        left, right = self.match(self.expr(node.a), self.expr(node.b))
        symbol = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}[node.op]
        dtype = node.a.dtype
        if is_float(dtype):
            if node.op == "ne":
                return self.builder.fcmp_unordered(symbol, left, right)
            return self.builder.fcmp_ordered(symbol, left, right)
        if dtype in _UNSIGNED:
            return self.builder.icmp_unsigned(symbol, left, right)
        return self.builder.icmp_signed(symbol, left, right)

    def expr_binary(self, node: Binary) -> ir.Value:
        left, right = self.match(self.expr(node.a), self.expr(node.b))
        dtype = node.a.dtype
        if is_float(dtype):
            return self.float_binary(node.op, left, right)
        return self.int_binary(node.op, left, right, dtype)

    def float_binary(self, op: str, left: ir.Value, right: ir.Value, reassociate: bool = False) -> ir.Value:
        """float16 values stay float32 here: rounding to half happens at stores and casts only. `reassociate`
        (a reduction's update) lets LLVM reorder a chain of these adds or multiplies."""
        b = self.builder
        if op in CONTRACTED:
            # `contract` lets LLVM fuse a multiply and the add or subtract of its product into one FMA (one
            # rounding instead of two, within every tolerance the tests hold), as C compilers do by default.
            flags = ("contract", "reassoc") if reassociate else ("contract",)
            return CONTRACTED[op](b, left, right, flags=flags)
        if op == "div":
            return b.fdiv(left, right)
        if op in ("min", "max"):
            # minimum/maximum propagate NaN like numpy and ONNX, and are single instructions on wasm. `nsz` lets
            # LLVM ignore the order of -0 and +0, so max(x, 0) (ReLU, Clip) is one vmaxps on x86 that still
            # propagates x's NaN, instead of a max, a NaN compare and a blend.
            intrinsic = self.context.intrinsic("minimum" if op == "min" else "maximum", left.type)
            return b.call(intrinsic, [left, right], fastmath=("nsz",))
        if op == "floordiv":
            return self.call("floor", b.fdiv(left, right))
        if op == "floormod":
            return b.fsub(left, b.fmul(self.call("floor", b.fdiv(left, right)), right))
        if op == "pow":
            return self.float_call("pow", [left, right])
        raise TypeError(f"codegen cannot handle float operator {op!r}")

    def int_binary(self, op: str, left: ir.Value, right: ir.Value, dtype: str) -> ir.Value:
        b = self.builder
        unsigned = dtype in _UNSIGNED
        flags = ("nsw",) if self.indexing and not unsigned else ()
        if op == "add":
            return b.add(left, right, flags=flags)
        if op == "sub":
            return b.sub(left, right, flags=flags)
        if op == "mul":
            return b.mul(left, right, flags=flags)
        if op == "div":
            return b.udiv(left, right) if unsigned else b.sdiv(left, right)
        if op in ("floordiv", "floormod"):
            if unsigned:
                return b.udiv(left, right) if op == "floordiv" else b.urem(left, right)
            quotient, remainder = b.sdiv(left, right), b.srem(left, right)
            zero = ir.Constant(left.type, None)
            # Truncation rounds toward zero; step down when the remainder and divisor differ in sign.
            adjust = b.and_(
                b.icmp_signed("!=", remainder, zero),
                b.icmp_signed("!=", b.icmp_signed("<", remainder, zero), b.icmp_signed("<", right, zero)),
            )
            if op == "floordiv":
                return b.sub(quotient, b.zext(adjust, left.type))
            return b.select(adjust, b.add(remainder, right), remainder)
        if op in ("min", "max"):
            compare = b.icmp_unsigned if unsigned else b.icmp_signed
            return b.select(compare("<" if op == "min" else ">", left, right), left, right)
        raise TypeError(f"codegen cannot handle integer operator {op!r}")

    def float32_math(self, function, *args: ir.Value) -> ir.Value:
        """The polynomials are float32; in wasm, which has no libm, float64 values go through float32 and come
        back."""
        if _element(args[0].type) == _F64:
            narrow = [self.builder.fptrunc(arg, _vector(_F32, _lanes(arg))) for arg in args]
            return self.builder.fpext(function(*narrow), args[0].type)
        return function(*args)

    def libm(self, name: str, args: list[ir.Value]) -> ir.Value:
        """float64 `name` from the C library, lane by lane: float64 models keep float64 accuracy natively (the
        shared library links libm)."""
        b = self.builder
        function = self.context.function(name, _F64, [_F64] * len(args))
        if function.function_type != ir.FunctionType(_F64, [_F64] * len(args)):
            raise TargetError(
                f"a kernel is named {name!r}, as the C library's {name}, which its float64 {name} calls; "
                "give the kernel another name"
            )
        lanes = _lanes(args[0])
        if not lanes:
            return b.call(function, args)
        result = ir.Constant(args[0].type, ir.Undefined)
        for lane in range(lanes):
            position = ir.Constant(_I32, lane)
            value = b.call(function, [b.extract_element(arg, position) for arg in args])
            result = b.insert_element(result, value, position)
        return result

    def float64_call(self, name: str, args: list[ir.Value]) -> ir.Value:
        """exp, log, tanh, erf and pow of float64 values from libm."""
        return self.libm(name, args)

    def index_check(self, index: ir.Value, extent: ir.Value) -> ir.Value:
        """`index` where every lane lies in [0, extent), else 0 for the lanes outside, and the current call's
        number recorded as the run's failure."""
        b = self.builder
        outside = b.or_(b.icmp_signed("<", index, ir.Constant(index.type, None)), b.icmp_signed(">=", index, extent))
        lanes = _lanes(outside)
        anywhere = (
            b.icmp_unsigned("!=", b.bitcast(outside, ir.IntType(lanes)), ir.Constant(ir.IntType(lanes), 0))
            if lanes
            else outside
        )
        with b.if_then(anywhere, likely=False):
            b.store(b.load(self.context.current_call, typ=_I32), self.context.failed_call)
        return b.select(outside, ir.Constant(index.type, None), index)

    def expr_call(self, node: Call) -> ir.Value:
        if node.name == "index_check":
            # the index being checked is data (a Gather's indices): computed as plain, wrapping arithmetic
            with self.indexing_as(False):
                return self.index_check(*self.match(*(self.expr(arg) for arg in node.args)))
        args = self.match(*(self.expr(arg) for arg in node.args))
        dtype = node.args[0].dtype
        if not is_float(dtype):
            if node.name == "abs":
                value = args[0]
                if dtype in _UNSIGNED:
                    return value
                return self.builder.select(
                    self.builder.icmp_signed("<", value, ir.Constant(value.type, None)), self.builder.neg(value), value
                )
            if node.name in ("floor", "ceil", "round"):
                return args[0]
            converted = [self.convert(arg, dtype, "float32") for arg in args]
            return self.convert(self.float_call(node.name, converted), "float32", node.dtype)
        return self.float_call(node.name, args)

    def float_call(self, name: str, args: list[ir.Value]) -> ir.Value:
        b = self.builder
        intrinsics = {"sqrt": "sqrt", "floor": "floor", "ceil": "ceil", "round": "roundeven", "abs": "fabs"}
        if name == "round" and self.target.arch in ("armv7", "arm"):
            return self.math.round_even(args[0])
        if name in intrinsics:
            return self.call(intrinsics[name], args[0])
        if name == "rsqrt":
            root = self.call("sqrt", args[0])
            return b.fdiv(_one_like(root), root)
        polynomials = {"exp": self.math.exp, "log": self.math.log}
        if _element(args[0].type) == _F64 and self.target.machine.libm:
            return self.float64_call(name, args)
        if name not in polynomials:
            raise TypeError(f"codegen cannot handle intrinsic {name!r}")
        return self.float32_math(polynomials[name], *args)

    def convert(self, value: ir.Value, source: str, dest: str) -> ir.Value:
        b, lanes = self.builder, _lanes(value)
        if source == dest:
            return value
        target_type = _vector(value_type(dest), lanes)
        if dest == "bool":
            if is_float(source):
                return b.fcmp_unordered("!=", value, ir.Constant(value.type, None))
            return b.icmp_signed("!=", value, ir.Constant(value.type, None))
        if is_float(dest):
            if is_float(source):
                result = value if value.type == target_type else _float_resize(b, value, target_type)
            elif source in _UNSIGNED:
                result = b.uitofp(value, target_type)
            else:
                result = b.sitofp(value, target_type)
            return self.to_half_and_back(result) if dest == "float16" else result
        if is_float(source):
            return b.fptoui(value, target_type) if dest in _UNSIGNED else b.fptosi(value, target_type)
        source_width, dest_width = _width(value.type), _width(target_type)
        if dest_width < source_width:
            return b.trunc(value, target_type)
        if dest_width > source_width:
            return b.zext(value, target_type) if source in _UNSIGNED else b.sext(value, target_type)
        return value


def _element(ty: ir.Type) -> ir.Type:
    return ty.element if isinstance(ty, ir.VectorType) else ty


def _width(ty: ir.Type) -> int:
    return _element(ty).width


def _float_resize(b: ir.IRBuilder, value: ir.Value, target_type: ir.Type) -> ir.Value:
    if _element(value.type) == _F64 and _element(target_type) == _F32:
        return b.fptrunc(value, target_type)
    return b.fpext(value, target_type)


def _lanes_of(b: ir.IRBuilder, vector: ir.Value, first: int, count: int) -> ir.Value:
    """Lanes first .. first + count - 1 of `vector`, as a vector of `count`."""
    return b.shuffle_vector(vector, vector, ir.Constant(ir.VectorType(_I32, count), list(range(first, first + count))))


def _vector_pieces(lanes: int, native: int) -> list[tuple[int, int]]:
    """(first lane, count) of the vectors a vector loop of `lanes` is emitted as: one when it is at most a `native`
    vector or a power of two wide, else native vectors and the remnant. LLVM kept the accumulators of a 28-lane loop
    (a MatMul's last column tile of 700) in stack memory, moving them lane by lane with vinsertps; as 16 + 12 lanes
    they stay in registers."""
    if lanes <= native or lanes & (lanes - 1) == 0:
        return [(0, lanes)]
    return [(first, min(native, lanes - first)) for first in range(0, lanes, native)]


def _concatenate(b: ir.IRBuilder, parts: list[ir.Value]) -> ir.Value:
    """The vectors of `parts` joined lane after lane."""
    total = sum(_lanes(part) for part in parts)
    result, filled = None, 0
    for part in parts:
        count = _lanes(part)
        # the part widened to `total` lanes, its own at [filled, filled + count)
        spread = [lane - filled if filled <= lane < filled + count else 0 for lane in range(total)]
        widened = b.shuffle_vector(part, part, ir.Constant(ir.VectorType(_I32, total), spread))
        if result is None:
            result = widened
        else:
            pick = [total + lane if filled <= lane < filled + count else lane for lane in range(total)]
            result = b.shuffle_vector(result, widened, ir.Constant(ir.VectorType(_I32, total), pick))
        filled += count
    return result


def _one_like(value: ir.Value) -> ir.Constant:
    if isinstance(value.type, ir.VectorType):
        return ir.Constant(value.type, [ir.Constant(value.type.element, 1.0)] * value.type.count)
    return ir.Constant(value.type, 1.0)


def _opaque(pointer: ir.Value) -> ir.Value:
    """llvmlite's IR layer still tracks pointee types; LLVM 22 has only opaque `ptr`, and so do we."""
    pointer.type = _PTR
    return pointer


def _zero() -> ir.Constant:
    return ir.Constant(_I32, 0)


def _smin(b: ir.IRBuilder, left: ir.Value, right: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", left, right), left, right)


def element_bytes(dtype: str) -> int:
    """Bytes of one element in memory, which is also the alignment kernels may assume for it."""
    return {"float16": 2, "float64": 8, "int64": 8, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}.get(dtype, 4)


def generate_module(funcs: list[PrimFunc], target: Target, texts: dict[str, str] | None = None) -> ir.Module:
    """All `funcs` as external kernels of one module (plus their outlined parallel bodies), and for each of
    `texts` a function of that name returning a pointer to the NUL-terminated ASCII text."""
    context = _ModuleContext(target)
    for name, text in (texts or {}).items():
        data = bytearray(text.encode("ascii") + b"\0")
        constant = ir.GlobalVariable(context.module, ir.ArrayType(_I8, len(data)), f"{name}.text")
        constant.global_constant, constant.linkage = True, "private"
        constant.initializer = ir.Constant(ir.ArrayType(_I8, len(data)), data)
        getter = ir.Function(context.module, ir.FunctionType(_PTR, []), name)
        ir.IRBuilder(getter.append_basic_block()).ret(_opaque(constant))
    # every kernel is declared before any body is emitted, so a body that declares a C library function finds a
    # kernel of the same name whichever comes first (FunctionEmitter.libm refuses the clash)
    # a model's run entry (a list of kernel calls, empty when the outputs are all copied by the host) returns the
    # number of the call that failed
    entries = [
        isinstance(func.body, Seq) and all(isinstance(node, KernelCall) for node in func.body.stmts) for func in funcs
    ]
    functions = [
        ir.Function(
            context.module,
            ir.FunctionType(_I32 if entry else ir.VoidType(), [_PTR] * len(func.params)),
            func.name,
        )
        for func, entry in zip(funcs, entries)
    ]
    # the kernels first, so that each entry knows the work its kernels hand to the pool
    order = sorted(zip(funcs, functions, entries), key=lambda item: item[2])
    for func, function, entry in order:
        function.attributes.add("nounwind")
        emitter = _FunctionEmitter(context, function)
        for argument, buffer in zip(function.args, func.params):
            argument.name = buffer.name
            # Kernel arguments never overlap: the runtimes pass one distinct array per parameter.
            argument.add_attribute("noalias")
            emitter.buffers[buffer] = argument
        if entry:
            emitter.builder.store(ir.Constant(_I32, 0), context.failed_call)
            emitter.announce_run([call.func for call in func.body.stmts])
        # wasm has no C library, so its float64 math is expanded too (over float64 exp and log)
        native = NATIVE_MATH + LIBM_MATH if target.machine.libm else NATIVE_MATH
        emitter.visit(expand_math(func.body, native))
        emitter.finish()
    return context.module


@dataclass(frozen=True)
class CompiledModule:
    """Optimised LLVM IR text, assembly text and object code of one module for `target`."""

    target: Target
    ll: str
    asm: str
    object: bytes


_initialized = False


def target_machine(target: Target) -> llvm.TargetMachine:
    global _initialized
    if not _initialized:
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
        # LLVM 22's loop vectorizer forms interleave groups from accesses like x[(j % 4) * 5 + c] as if
        # j % 4 were j, reading past the buffer (tests/codegen/test_llvm_codegen.py keeps the case).
        # Tessel's schedules vectorize explicitly, so losing interleave groups costs little.
        llvm.set_option("tessel", "-enable-interleaved-mem-accesses=false")
        # No partial unrolling: a schedule unrolls what it means to. LLVM still unrolls a loop of a few constant
        # trips fully (a window's columns, a filled MatMul block's rows), but it also unrolled the k loop around
        # such a block by 2 once its 64-bit addresses made the body smaller, and the two steps' multiply-adds then
        # took a register copy each (odd_transformer, AVX2, 1 thread: 2.41 -> 3.27 ms; 2.47 without it)
        llvm.set_option("tessel", "-unroll-allow-partial=false")
        _initialized = True
    try:
        llvm_target = llvm.Target.from_triple(target.triple)
    except RuntimeError as error:
        raise TargetError(f"LLVM in llvmlite cannot generate code for {target.triple!r}: {error}") from error
    return llvm_target.create_target_machine(
        cpu=target.cpu, features=target.features, opt=3, reloc=target.machine.relocation
    )


def compile_module(module: ir.Module, target: Target) -> CompiledModule:
    """Verify, optimise at O3 (new pass manager, the target's features) and emit code."""
    machine = target_machine(target)
    module.data_layout = str(machine.target_data)
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    tuning.loop_vectorization = True
    tuning.slp_vectorization = True
    passes = llvm.create_pass_builder(machine, tuning)
    passes.getModulePassManager().run(parsed, passes)
    return CompiledModule(target, str(parsed), machine.emit_assembly(parsed), machine.emit_object(parsed))


def compile_funcs(funcs: list[PrimFunc], target: Target, texts: dict[str, str] | None = None) -> CompiledModule:
    return compile_module(generate_module(funcs, target, texts), target)
