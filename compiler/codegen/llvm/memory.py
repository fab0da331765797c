"""How the function emitter reads and writes buffers: pointers, scalar and vector loads (repeated, strided,
clamped runs, masked, gathers), stores, accumulations and allocations (stack, static arrays, kept heap slots)."""

from __future__ import annotations

from contextlib import contextmanager

from llvmlite import ir

from compiler.codegen.fast_math import intrinsic_suffix
from compiler.codegen.llvm.types import (
    _F16,
    _F32,
    _I1,
    _I8,
    _I32,
    _I64,
    _PTR,
    _STACK_LIMIT_BYTES,
    _UNSIGNED,
    STRIDED_LOADS,
    _concatenate,
    _lanes,
    _lanes_of,
    _opaque,
    _vector,
    _width,
    _zero,
    element_bytes,
    storage_type,
    value_type,
)
from compiler.errors import TargetError
from compiler.te.expr import (
    Binary,
    Expr,
    is_float,
    is_int,
)
from compiler.tir.analysis import affine_coefficient, clamped_run, repeated_run
from compiler.tir.nodes import (
    Allocate,
    Buffer,
    Load,
    Store,
)
from compiler.tir.visitor import structurally_equal


class MemoryEmitter:
    """Buffers for FunctionEmitter (a mixin: its state is the emitter's)."""

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
