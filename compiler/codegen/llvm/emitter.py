"""The function emitter: one PrimFunc's statements as LLVM IR (loops serial, vector or outlined to the thread
pool, allocations, calls), over the module context every function of a module shares."""

from __future__ import annotations

from llvmlite import ir

from compiler.codegen.fast_math import FastMath, intrinsic_suffix
from compiler.codegen.llvm.dot import DotEmitter
from compiler.codegen.llvm.exprs import ExprEmitter
from compiler.codegen.llvm.memory import MemoryEmitter
from compiler.codegen.llvm.types import (
    _I8,
    _I32,
    _I64,
    _MAX_LANES,
    _PTR,
    CHUNKS_PER_THREAD,
    CURRENT_CALL_GLOBAL,
    FAILED_CALL_GLOBAL,
    NUM_THREADS_GLOBAL,
    PARALLEL_ENTRY,
    RUN_ENTRY,
    _holds_static_array,
    _lanes,
    _opaque,
    _smin,
    _vector_pieces,
    _zero,
    value_type,
)
from compiler.target import Target
from compiler.te.expr import (
    Const,
    Expr,
    Var,
    is_float,
)
from compiler.tir.analysis import can_widen
from compiler.tir.nodes import (
    Barrier,
    Buffer,
    For,
    ForKind,
    IfThen,
    KernelCall,
    LetStmt,
    Load,
    Prefetch,
    Seq,
    Stmt,
    Store,
)
from compiler.tir.visitor import StmtVisitor, walk
from compiler.tir.work import stmt_work, worth_parallel


class ModuleContext:
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


class FunctionEmitter(StmtVisitor, MemoryEmitter, ExprEmitter, DotEmitter):
    """One visitor over a function body (its statements; its expressions dispatch on `expr_<node>`): `vector_var` is
    set while a vectorized loop is widened, and `lets` keeps each bound variable's expression so index analysis can
    see through it."""

    def __init__(self, context: ModuleContext, function: ir.Function, parallel_depth: int = 0):
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
        child = FunctionEmitter(context, outlined, parallel_depth=self.parallel_depth + 1)
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
