"""Tensor-expression computes of the matrix products and attention: Gemm, MatMul (batched too, split-K partials
for a transposed B), MatMulPacked, MatMulIntegerPacked and Attention (graph/ops/dense.py)."""

from __future__ import annotations

from typing import Any

import compiler.te as te
from compiler.compute import tags
from compiler.compute.conv import cast
from compiler.compute.support import Inputs, accumulator
from compiler.graph.ir import TensorType
from compiler.graph.registry import set_compute
from compiler.te.expr import Compare, Const


def _split_lanes(inner: int, widest: int) -> int:
    """How many interleaved partial sums a transposed-B dense keeps: at most `widest` (a target's vector, set by
    alter_layout as the Gemm's split_lanes), dividing K."""
    for lanes in (16, 8, 4):
        if lanes <= widest and inner % lanes == 0 and inner >= 2 * lanes:
            return lanes
    return 1


def gemm(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    a, b, c = (list(inputs) + [None])[:3]
    trans_a, trans_b = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    rows, columns = output_types[0].shape
    inner = a.shape[0] if trans_a else a.shape[1]
    acc = accumulator(a.dtype)
    lanes = _split_lanes(inner, int(attrs.get("split_lanes", 16))) if trans_b else 1

    def left(i, k):
        return (a[k, i] if trans_a else a[i, k]).astype(acc)

    if lanes > 1:
        # B is (N, K): consecutive k are contiguous, consecutive j are not. Each output first sums `lanes`
        # interleaved partial dot products (a vector loop over contiguous k), then adds those up.
        outer = te.reduce_axis((0, inner // lanes), "ko")
        partial = te.compute(
            (rows, columns, lanes),
            lambda i, j, lane: te.sum(
                left(i, outer * lanes + lane) * b[j, outer * lanes + lane].astype(acc), axis=outer
            ),
            name="dense_partial",
            tag=tags.DENSE_PARTIAL,
        )
        lane_axis = te.reduce_axis((0, lanes), "lane")
        result = te.compute(
            (rows, columns), lambda i, j: te.sum(partial[i, j, lane_axis], axis=lane_axis), name="dense", tag=tags.DENSE
        )
    else:
        k = te.reduce_axis((0, inner), "k")

        def body(i, j):
            right = b[j, k] if trans_b else b[k, j]
            return te.sum(left(i, k) * right.astype(acc), axis=k)

        result = te.compute((rows, columns), body, name="dense", tag=tags.DENSE)
    if alpha != 1.0 or (c is not None and beta != 0.0):
        product = result

        def epilogue(i, j):
            value = product[i, j] * alpha if alpha != 1.0 else product[i, j]
            if c is None or beta == 0.0:
                return value
            index = [i, j][2 - c.ndim :]
            addend = c[tuple(0 if c.shape[d] == 1 else index[d] for d in range(c.ndim))].astype(acc)
            return value + (addend * beta if beta != 1.0 else addend)

        result = te.compute((rows, columns), epilogue, name="gemm_epilogue", tag=tags.BROADCAST)
    return [cast(result, a.dtype)]


def matmul(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    a, b = inputs[:2]
    shape = output_types[0].shape
    acc = accumulator(a.dtype)
    k = te.reduce_axis((0, a.shape[-1]), "k")
    if a.ndim == 2 and b.ndim == 2:
        result = te.compute(
            shape, lambda i, j: te.sum(a[i, k].astype(acc) * b[k, j].astype(acc), axis=k), name="dense", tag=tags.DENSE
        )
        return [cast(result, a.dtype)]
    rows = 0 if a.ndim == 1 else 1
    columns = 0 if b.ndim == 1 else 1
    batch_rank = len(shape) - rows - columns

    def operand(tensor, batch, tail):
        lead = tensor.ndim - len(tail)
        own = batch[batch_rank - lead :] if lead else ()
        own = [0 if tensor.shape[d] == 1 else own[d] for d in range(lead)]
        return tensor[(*own, *tail)]

    def body(*index):
        batch = index[:batch_rank]
        row = index[batch_rank] if rows else None
        column = index[batch_rank + rows] if columns else None
        left = operand(a, batch, (k,) if a.ndim == 1 else (row, k))
        right = operand(b, batch, (k,) if b.ndim == 1 else (k, column))
        return te.sum(left.astype(acc) * right.astype(acc), axis=k)

    result = te.compute(shape, body, name="batch_matmul", tag=tags.BATCH_MATMUL)
    return [cast(result, a.dtype)]


def matmul_packed(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    """A by a weight packed into column panels (compiler/graph/ops/dense.py, pack_dense_weight): column j of B is lane
    j % panel of panel j // panel, so a schedule that tiles the columns by the panel reads each panel at unit stride.
    A narrow weight (int8/uint8 levels, 4-bit levels two a byte, float16) is widened element by element as the
    product reads it, its levels shifted by the zero point (input 3, packed as B) and scaled (input 2): a scale per
    block of k as each element is read, a scale per column once per output."""
    a, w, scale, zero = (*inputs, None, None)[:4]
    shape = output_types[0].shape
    acc = accumulator(a.dtype)
    panel = w.shape[-1]
    block = int(attrs.get("block", 0))
    bits = int(attrs.get("bits", 8))
    k = te.reduce_axis((0, a.shape[-1]), "k")

    def weight(p, k, lane):
        """B's element (panel p, row k, lane), widened from its stored dtype; a quantized one shifted by its zero
        point and, when the scale varies along k (blocks), scaled."""
        if bits == 4:  # two levels a byte, the even k in the low half
            byte = w[p, k // 2, lane].astype("int32")
            high = byte / 16  # truncating: the byte is not negative, and no floor's correction is needed
            value = te.select(te.equal(k % 2, 1), high, byte - high * 16).astype(acc)
        else:
            value = w[p, k, lane].astype(acc)
        if scale is not None:
            group = k // block if block else 0
            if zero is not None:
                value = value - zero[p, group, lane].astype(acc)
            if block:
                value = value * scale[p, group, lane].astype(acc)
        return value

    weights = w
    if w.dtype != acc or scale is not None:
        # a stage of its own, which the template inlines or makes a panel at a time (schedules/cpu/dense.py)
        weights = te.compute((w.shape[0], a.shape[-1], panel), weight, name="dense_weight", tag=tags.DENSE_WEIGHT)

    def body(*index):
        *rows, j = index
        return te.sum(a[(*rows, k)].astype(acc) * weights[j // panel, k, j % panel].astype(acc), axis=k)

    result = te.compute(shape, body, name="dense_packed", tag=tags.DENSE_PACKED)
    if scale is not None and not block:
        # one scale per column: applied once per output, in the epilogue, not once per multiply-add
        def scaled(*index):
            j = index[-1]
            return result[index] * scale[j // panel, 0, j % panel].astype(acc)

        result = te.compute(shape, scaled, name="dense_scaled", tag=tags.ELEMWISE)
    return [cast(result, a.dtype)]


def matmul_integer_packed(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    """uint8 A by int8 weights packed four consecutive k to an int32 word (graph/ops/dense.py, pack_byte_words), in
    column panels as MatMulPacked's: an int32 sum of te.dot_bytes over K / 4 (the machine's integer dot product),
    then, once per output, A's zero point times the weight's column sum taken off and the column's scale applied:
    sum((a - zero) * w) * scale = (sum(a * w) - zero * sum(w)) * scale, exact in int32."""
    a, words, scale, column_sums, zero = (*inputs, None, None)[:5]
    shape = output_types[0].shape
    panel = words.shape[-1]
    k = te.reduce_axis((0, words.shape[1]), "k")

    def body(*index):
        *rows, j = index
        activations = [a[(*rows, 4 * k + byte)] for byte in range(4)]
        return te.sum(te.dot_bytes(activations, words[j // panel, k, j % panel]), axis=k)

    result = te.compute(shape, body, name="dense_packed", tag=tags.DENSE_PACKED)

    def scaled(*index):
        j = index[-1]
        value = result[index]
        if zero is not None:
            offset = zero[(0,) * zero.ndim].astype("int32") * column_sums[j // panel, 0, j % panel]
            value = value - offset
        return value.astype("float32") * scale[j // panel, 0, j % panel]

    return [te.compute(shape, scaled, name="dense_scaled", tag=tags.ELEMWISE)]


def attention(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    """softmax(Q Kt * scale + mask) V in stages a schedule can make per tile of query rows: the scores
    ("attention_scores"), their row maximum ("attention_max"), the exponentials ("attention_exp"), their row sum
    ("attention_sum"), the exponentials' product with V ("attention"), divided by the sum as it is stored: each
    output is one division, not one per key. With nan_to_zero a row whose weights are NaN (every key masked) is
    zeros, as Where(IsNaN(p), 0, p) before the product makes it."""
    q, kt, v, mask = (list(inputs) + [None])[:4]
    *batch, rows, depth = q.shape
    columns, width = kt.shape[-1], v.shape[-1]
    acc = accumulator(q.dtype)
    scale = float(attrs.get("scale", 1.0))
    k = te.reduce_axis((0, depth), "k")
    scores = te.compute(
        (*batch, rows, columns),
        lambda *i: te.sum(q[(*i[:-1], k)].astype(acc) * kt[(*i[:-2], k, i[-1])].astype(acc), axis=k),
        name="attention_scores",
        tag=tags.ATTENTION_SCORES,
    )

    def logit(index):
        value = scores[index] * scale if scale != 1.0 else scores[index]
        if mask is None:
            return value
        lead = len(index) - mask.ndim
        return value + mask[tuple(0 if size == 1 else index[lead + d] for d, size in enumerate(mask.shape))].astype(acc)

    first = te.reduce_axis((0, columns), "n")
    largest = te.compute(
        (*batch, rows), lambda *i: te.max(logit((*i, first)), axis=first), name="attention_max", tag=tags.ATTENTION_MAX
    )
    exponentials = te.compute(
        (*batch, rows, columns),
        lambda *i: te.exp(logit(i) - largest[i[:-1]]),
        name="attention_exp",
        tag=tags.ATTENTION_EXP,
    )
    second = te.reduce_axis((0, columns), "n")
    total = te.compute(
        (*batch, rows),
        lambda *i: te.sum(exponentials[(*i, second)], axis=second),
        name="attention_sum",
        tag=tags.ATTENTION_SUM,
    )
    third = te.reduce_axis((0, columns), "n")
    weighted = te.compute(
        (*batch, rows, width),
        lambda *i: te.sum(exponentials[(*i[:-1], third)] * v[(*i[:-2], third, i[-1])].astype(acc), axis=third),
        name="attention",
        tag=tags.ATTENTION,
    )

    def normalised(*i):
        # a row's weights are NaN all together or not at all (its maximum NaN or infinite), and then so is its sum
        value = weighted[i] / total[i[:-1]]
        guarded = Compare("ne", total[i[:-1]], total[i[:-1]])
        return te.select(guarded, Const(0.0, acc), value) if attrs.get("nan_to_zero") else value

    result = te.compute((*batch, rows, width), normalised, name="attention_out", tag=tags.ELEMWISE)
    return [cast(result, q.dtype)]


set_compute("Gemm", gemm)
set_compute("MatMul", matmul)
set_compute("MatMulPacked", matmul_packed)
set_compute("MatMulIntegerPacked", matmul_integer_packed)
set_compute("Attention", attention)
