"""What the nn family's computes share: their inputs unpacked, the dtype they accumulate in, clamped and
bounds-tested reads, and the padding stages (plain and phased) that convs and pools read their windows from."""

from __future__ import annotations

import compiler.te as te
from compiler.compute import tags
from compiler.errors import UnsupportedOpError
from compiler.graph.ir import TensorType
from compiler.te.tensor import identity_element

Inputs = list[te.Tensor | None]


def unsupported(op: str, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"op {op} {what} has no kernel yet; remove it from the model or rewrite it", {op: []})


def accumulator(dtype: str) -> str:
    """float16 accumulates in float32, as the reference computes it."""
    return "float32" if dtype == "float16" else dtype


def type_of(tensor: te.Tensor) -> TensorType:
    return TensorType(tuple(tensor.shape), tensor.dtype)


def plain_of_blocked(x: te.Tensor) -> TensorType:
    """The NCHW type an NCHW[x]c tensor stands for."""
    return TensorType((x.shape[0], x.shape[1] * x.shape[-1], *x.shape[2:4]), x.dtype)


def lowest(dtype: str) -> te.Const:
    return identity_element("max", dtype)


def clamp(index, low: int, high: int):
    return te.maximum(te.minimum(index, high), low)


def reads_inside(begins, ends) -> bool:
    """Whether a window's reads stay inside its input: no padding before, and none after (a negative end is the
    input's unread last rows, which the reader's indices never reach). Such a pad or crop is the input itself; a
    crop copy cost a strided 1x1 conv a pass over its input (resnet50's 512 -> 1024-channel shortcut on 14 x 14)."""
    return not any(begins) and all(end <= 0 for end in ends)


def pad(x: te.Tensor, begins, ends, fill, name: str) -> te.Tensor:
    """`x` with its trailing spatial axes padded by `begins`/`ends` (negative ends crop). The read is clamped into
    the input so it is always in bounds: the select then stays a plain select that vectorizes."""
    rank = len(begins)
    lead = x.ndim - rank
    if reads_inside(begins, ends):
        return x
    spatial = x.shape[lead:]
    shape = (*x.shape[:lead], *(size + b + e for size, b, e in zip(spatial, begins, ends)))
    fill = te.as_expr(fill, x.dtype)

    def body(*index):
        inside, source = [], list(index[:lead])
        for axis in range(rank):
            position = index[lead + axis] - begins[axis]
            if begins[axis] > 0:
                inside.append(position >= 0)
            if ends[axis] > 0:
                inside.append(position < spatial[axis])
            source.append(clamp(position, 0, spatial[axis] - 1))
        value = x[tuple(source)]
        return te.select(te.all(*inside), value, fill) if inside else value

    return te.compute(shape, body, name=name, tag=tags.INJECTIVE)


def phased_pad(x: te.Tensor, begins, ends, stride: int, name: str) -> te.Tensor:
    """`x` zero-padded like `pad`, with its last axis split by `stride` into (phase, column): element
    [..., phase, q] is padded column q * stride + phase. A strided window then reads consecutive columns of one
    phase for consecutive outputs, so the conv's vector loop loads contiguously instead of gathering."""
    rank = len(begins)
    lead = x.ndim - rank
    spatial = x.shape[lead:]
    padded_width = spatial[-1] + begins[-1] + ends[-1]
    shape = (
        *x.shape[:lead],
        *(size + b + e for size, b, e in zip(spatial[:-1], begins[:-1], ends[:-1])),
        stride,
        -(-padded_width // stride),
    )

    def body(*index):
        inside, source = [], list(index[:lead])
        positions = [index[lead + axis] - begins[axis] for axis in range(rank - 1)]
        positions.append(index[-1] * stride + index[-2] - begins[-1])
        for axis, position in enumerate(positions):
            inside += [position >= 0, position < spatial[axis]]
            source.append(clamp(position, 0, spatial[axis] - 1))
        return te.select(te.all(*inside), x[tuple(source)], te.const(0.0, x.dtype))

    return te.compute(shape, body, name=name, tag=tags.INJECTIVE)
