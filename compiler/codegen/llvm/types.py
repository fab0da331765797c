"""The LLVM types, globals and value helpers that every part of the code generator shares."""

from __future__ import annotations

from llvmlite import ir

from compiler.target import STACK_BUFFER_BYTES, Target
from compiler.tir.nodes import (
    Allocate,
    Stmt,
)
from compiler.tir.visitor import walk

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
_STACK_LIMIT_BYTES = STACK_BUFFER_BYTES


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
