"""Matrix products and attention: Gemm, MatMul, MatMulPacked (B packed into column panels at compile time),
MatMulIntegerPacked (uint8 A by int8 weights packed four to a word: passes/integer_products.py's op) and Attention
(passes/fuse_attention.py's op)."""

from __future__ import annotations

import numpy as np

from compiler.errors import ShapeError
from compiler.graph.ir import TensorType
from compiler.graph.ops.checks import compute_dtype, op_inputs
from compiler.graph.ops.common import broadcast_shapes
from compiler.graph.registry import Pattern, register_op


def _infer_gemm(types, attrs):
    a, b, c = op_inputs("Gemm", types, 2, 3)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ShapeError(f"Gemm needs 2-D A and B, got {list(a.shape)} and {list(b.shape)}")
    rows, inner = a.shape[::-1] if attrs.get("transA", 0) else a.shape
    inner_b, columns = b.shape[::-1] if attrs.get("transB", 0) else b.shape
    if inner != inner_b:
        raise ShapeError(
            f"Gemm inner dimensions differ: A {list(a.shape)} (transA={attrs.get('transA', 0)}) and "
            f"B {list(b.shape)} (transB={attrs.get('transB', 0)})"
        )
    if c is not None and broadcast_shapes(c.shape, (rows, columns)) != (rows, columns):
        raise ShapeError(f"Gemm C of shape {list(c.shape)} does not broadcast to the result ({rows}, {columns})")
    return [TensorType((rows, columns), a.dtype)]


def _gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, **_):
    dtype = compute_dtype(a.dtype)
    a = a.T if transA else a
    b = b.T if transB else b
    result = np.matmul(a.astype(dtype, copy=False), b.astype(dtype, copy=False))
    if alpha != 1.0:
        result = result * np.asarray(alpha, dtype)
    if c is not None and beta != 0.0:
        scaled = c.astype(dtype, copy=False) if beta == 1.0 else c.astype(dtype) * np.asarray(beta, dtype)
        result = result + scaled
    return result.astype(a.dtype, copy=False)


register_op("Gemm", infer=_infer_gemm, pattern=Pattern.OUT_EWISE_FUSABLE, reference=_gemm)


def _matmul_shape(a: tuple[int, ...], b: tuple[int, ...], op: str = "MatMul") -> tuple[int, ...]:
    """numpy.matmul's result shape: 1-D operands are promoted to matrices and their added axis dropped."""
    if not a or not b:
        raise ShapeError(f"{op} needs operands of rank >= 1, got {list(a)} and {list(b)}")
    left = (1, *a) if len(a) == 1 else a
    right = (*b, 1) if len(b) == 1 else b
    if left[-1] != right[-2]:
        raise ShapeError(f"{op} inner dimensions differ: {list(a)} @ {list(b)}")
    batch = broadcast_shapes(left[:-2], right[:-2])
    rows = () if len(a) == 1 else (left[-2],)
    columns = () if len(b) == 1 else (right[-1],)
    return (*batch, *rows, *columns)


def _infer_matmul(types, attrs):
    a, b = op_inputs("MatMul", types, 2, 2)
    if a.dtype != b.dtype:
        raise ShapeError(f"MatMul operands have dtypes {a.dtype} and {b.dtype}; they must agree")
    return [TensorType(_matmul_shape(a.shape, b.shape), a.dtype)]


def _matmul(a, b, **_):
    dtype = compute_dtype(a.dtype)
    return np.asarray(np.matmul(a.astype(dtype, copy=False), b.astype(dtype, copy=False))).astype(a.dtype, copy=False)


register_op("MatMul", infer=_infer_matmul, pattern=Pattern.OUT_EWISE_FUSABLE, reference=_matmul)


def pack_dense_weight(weight: np.ndarray, panel: int) -> np.ndarray:
    """(K, N) -> (ceil(N / panel), K, panel): each panel's K rows of `panel` columns contiguous, so a register block
    reads B at unit stride whatever N is; columns past N are zeros."""
    inner, columns = weight.shape
    padded = np.pad(weight, [(0, 0), (0, -columns % panel)])
    return np.ascontiguousarray(padded.reshape(inner, -1, panel).transpose(1, 0, 2))


def unpack_dense_weight(packed: np.ndarray, columns: int) -> np.ndarray:
    """The (K, N) weight a MatMulPacked's (N / panel, K, panel) weight stands for."""
    panels, inner, panel = packed.shape
    return packed.transpose(1, 0, 2).reshape(inner, panels * panel)[:, :columns]


def pack_nibbles(levels: np.ndarray) -> np.ndarray:
    """(P, K, ...) levels below 16 -> (P, ceil(K / 2), ...) bytes: level k in the low half of byte k // 2 when k
    is even, in the high half when odd (a packed weight's (P, K, panel), an embedding table's (V, W))."""
    pads = [(0, levels.shape[1] % 2 if axis == 1 else 0) for axis in range(levels.ndim)]
    padded = np.pad(levels, pads).astype(np.uint8)
    return np.ascontiguousarray(padded[:, 0::2] | (padded[:, 1::2] << 4))


def unpack_nibbles(packed: np.ndarray, inner: int) -> np.ndarray:
    """pack_nibbles's levels, the first `inner` along axis 1."""
    both = np.stack([packed & 15, packed >> 4], axis=2)
    return both.reshape(packed.shape[0], -1, packed.shape[2])[:, :inner]


# The weights a MatMulPacked of float32 A may read narrow, each element widened as it is read.
NARROW_WEIGHT_DTYPES = ("int8", "uint8", "float16")


def _infer_matmul_packed(types, attrs):
    a, w, scale, zero = op_inputs("MatMulPacked", types, 2, 4)
    columns = int(attrs.get("columns", 0))
    bits = int(attrs.get("bits", 8))
    stored = -(-a.shape[-1] // 2) if bits == 4 else a.shape[-1] if a.shape else 0
    if bits not in (4, 8) or (bits == 4 and w.dtype != "uint8"):
        raise ShapeError(f"MatMulPacked stores 8-bit or (uint8) 4-bit levels, not {bits}-bit {w.dtype}")
    if len(a.shape) < 2 or len(w.shape) != 3 or w.shape[1] != stored:
        raise ShapeError(
            f"MatMulPacked needs A of rank >= 2 and a packed (N / panel, K, panel) weight with A's K, got "
            f"{list(a.shape)} and {list(w.shape)}"
        )
    if not (w.shape[0] - 1) * w.shape[2] < columns <= w.shape[0] * w.shape[2]:
        raise ShapeError(f"MatMulPacked's columns={columns} does not fit its weight's panels {list(w.shape)}")
    narrow = a.dtype == "float32" and w.dtype in NARROW_WEIGHT_DTYPES
    if a.dtype != w.dtype and not narrow:
        raise ShapeError(f"MatMulPacked operands have dtypes {a.dtype} and {w.dtype}; they must agree")
    block = int(attrs.get("block", 0))
    groups = -(-a.shape[-1] // block) if block else 1
    for part, what in ((scale, "scale"), (zero, "zero point")):
        if part is not None and part.shape != (w.shape[0], groups, w.shape[2]):
            raise ShapeError(
                f"MatMulPacked's {what} must be packed as {[w.shape[0], groups, w.shape[2]]}, not {list(part.shape)}"
            )
    if zero is not None and scale is None:
        raise ShapeError("MatMulPacked takes a zero point only with a scale")
    return [TensorType((*a.shape[:-1], columns), a.dtype)]


def _matmul_packed(a, w, scale=None, zero=None, *, columns, block=0, bits=8, **_):
    w = unpack_nibbles(w, a.shape[-1]) if bits == 4 else w
    weight = unpack_dense_weight(w, columns).astype(np.float32)
    if scale is not None:
        groups = np.arange(weight.shape[0]) // block if block else np.zeros(weight.shape[0], np.int64)
        if zero is not None:
            weight = weight - unpack_dense_weight(zero, columns).astype(np.float32)[groups]
        weight = weight * unpack_dense_weight(scale, columns)[groups]
    return _matmul(a, weight.astype(a.dtype))


register_op("MatMulPacked", infer=_infer_matmul_packed, pattern=Pattern.OUT_EWISE_FUSABLE, reference=_matmul_packed)


def pack_byte_words(levels: np.ndarray, panel: int) -> np.ndarray:
    """(K, N) int8 levels, K a multiple of 4 -> (ceil(N / panel), K / 4, panel) int32 words: the word of column j and
    group g holds the levels of k = 4g .. 4g + 3, lowest byte first, as te.dot_bytes reads them (little-endian, as
    every CPU target is). Columns past N are zeros."""
    packed = pack_dense_weight(levels.astype(np.int8), panel)
    panels, inner, _ = packed.shape
    grouped = packed.reshape(panels, inner // 4, 4, panel).transpose(0, 1, 3, 2)
    return np.ascontiguousarray(grouped).view("<i4").reshape(panels, inner // 4, panel)


def unpack_byte_words(words: np.ndarray, columns: int) -> np.ndarray:
    """The (K, N) int8 levels of pack_byte_words' words."""
    panels, groups, panel = words.shape
    levels = np.ascontiguousarray(words).astype("<i4").view(np.int8).reshape(panels, groups, panel, 4)
    return unpack_dense_weight(levels.transpose(0, 1, 3, 2).reshape(panels, 4 * groups, panel), columns)


def _infer_matmul_integer_packed(types, attrs):
    a, words, scale, column_sums, zero = op_inputs("MatMulIntegerPacked", types, 3, 5)
    columns = int(attrs.get("columns", 0))
    if a.dtype != "uint8" or words.dtype != "int32" or scale.dtype != "float32":
        raise ShapeError(
            f"MatMulIntegerPacked takes uint8 A, int32 weight words and float32 scales, got {a.dtype}, {words.dtype} "
            f"and {scale.dtype}"
        )
    if len(a.shape) < 2 or len(words.shape) != 3 or 4 * words.shape[1] != a.shape[-1]:
        raise ShapeError(
            f"MatMulIntegerPacked needs A of rank >= 2 and (N / panel, K / 4, panel) weight words with A's K, got "
            f"{list(a.shape)} and {list(words.shape)}"
        )
    if not (words.shape[0] - 1) * words.shape[2] < columns <= words.shape[0] * words.shape[2]:
        raise ShapeError(
            f"MatMulIntegerPacked's columns={columns} does not fit its weight's panels {list(words.shape)}"
        )
    panels = (words.shape[0], 1, words.shape[2])
    if scale.shape != panels or (column_sums is not None and column_sums.shape != panels):
        raise ShapeError(f"MatMulIntegerPacked's scales and column sums must be packed as {list(panels)}")
    if (column_sums is None) != (zero is None) or (zero is not None and (zero.dtype != "uint8" or zero.size != 1)):
        raise ShapeError("MatMulIntegerPacked takes A's zero point (one uint8) with its weight's int32 column sums")
    return [TensorType((*a.shape[:-1], columns), "float32")]


def _matmul_integer_packed(a, words, scale, column_sums=None, zero=None, *, columns, **_):
    accumulator = np.matmul(a.astype(np.int64), unpack_byte_words(words, columns).astype(np.int64))
    if zero is not None:
        accumulator -= int(zero.reshape(-1)[0]) * unpack_dense_weight(column_sums, columns).astype(np.int64)
    return accumulator.astype(np.int32).astype(np.float32) * unpack_dense_weight(scale, columns)


register_op(
    "MatMulIntegerPacked",
    infer=_infer_matmul_integer_packed,
    pattern=Pattern.OUT_EWISE_FUSABLE,
    reference=_matmul_integer_packed,
)


def attention_types(q: TensorType, kt: TensorType, v: TensorType) -> tuple[int, ...]:
    """The scores' shape (..., M, N) of an Attention over Q (..., M, D), Kt (..., D, N) and V (..., N, Dv), which share
    their leading axes; ShapeError otherwise."""
    ranks = {len(q.shape), len(kt.shape), len(v.shape)}
    if len(ranks) != 1 or min(ranks) < 2 or not q.shape[:-2] == kt.shape[:-2] == v.shape[:-2]:
        raise ShapeError(
            f"Attention needs Q, Kt and V of one rank with the same leading axes, got {list(q.shape)}, "
            f"{list(kt.shape)} and {list(v.shape)}"
        )
    if q.shape[-1] != kt.shape[-2] or kt.shape[-1] != v.shape[-2]:
        raise ShapeError(
            f"Attention's products do not chain: Q {list(q.shape)}, Kt {list(kt.shape)}, V {list(v.shape)}"
        )
    return (*q.shape[:-1], kt.shape[-1])


def _infer_attention(types, attrs):
    q, kt, v, mask = op_inputs("Attention", types, 3, 4)
    scores = attention_types(q, kt, v)
    if mask is not None and broadcast_shapes(mask.shape, scores) != scores:
        raise ShapeError(f"Attention's mask {list(mask.shape)} does not broadcast to its scores {list(scores)}")
    if len({t.dtype for t in (q, kt, v, mask) if t is not None}) != 1:
        raise ShapeError("Attention's operands must share one dtype")
    return [TensorType((*q.shape[:-1], v.shape[-1]), q.dtype)]


def _attention(q, kt, v, mask=None, *, scale=1.0, nan_to_zero=0, **_):
    dtype = compute_dtype(q.dtype)
    scores = np.matmul(q.astype(dtype), kt.astype(dtype))
    if scale != 1.0:
        scores = scores * np.asarray(scale, dtype)
    if mask is not None:
        scores = scores + mask.astype(dtype)
    with np.errstate(invalid="ignore"):
        exps = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights = exps / exps.sum(axis=-1, keepdims=True)
    if nan_to_zero:
        weights = np.where(np.isnan(weights), np.asarray(0, dtype), weights)
    return np.matmul(weights, v.astype(dtype)).astype(q.dtype)


register_op("Attention", infer=_infer_attention, pattern=Pattern.OPAQUE, reference=_attention)
