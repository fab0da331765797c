"""Sliding windows (convolutions and pools): kernel, strides, dilations and pads read from an op's attributes,
auto_pad resolved, and the padded strided views the numpy references compute over."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from compiler.errors import ShapeError


@dataclass(frozen=True)
class Window:
    """How a kernel slides over the spatial axes: its geometry, the padding before the input, the padding after it
    that the windows actually read (larger than declared in ceil_mode, smaller when the tail is never reached), and
    the declared padding after (which count_include_pad counts)."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    read_end: tuple[int, ...]
    declared_end: tuple[int, ...]
    output: tuple[int, ...]

    @property
    def extents(self) -> tuple[int, ...]:
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))


def spatial_attr(op: str, attrs: dict[str, Any], name: str, rank: int, default: int) -> tuple[int, ...]:
    values = attrs.get(name)
    if values is None or len(values) == 0:
        return (default,) * rank
    values = tuple(int(v) for v in values)
    if len(values) != rank:
        raise ShapeError(f"{op} attribute {name}={list(values)} needs {rank} values, one per spatial axis")
    if any(v < 1 for v in values):
        raise ShapeError(f"{op} attribute {name}={list(values)} must be positive")
    return values


def explicit_pads(op: str, attrs: dict[str, Any], rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    pads = attrs.get("pads")
    if pads is None or len(pads) == 0:
        return (0,) * rank, (0,) * rank
    pads = tuple(int(p) for p in pads)
    if len(pads) != 2 * rank:
        raise ShapeError(f"{op} attribute pads={list(pads)} needs {2 * rank} values (all begins, then all ends)")
    if any(p < 0 for p in pads):
        raise ShapeError(f"{op} attribute pads={list(pads)} must not be negative")
    return pads[:rank], pads[rank:]


def auto_pads(op: str, attrs: dict[str, Any]) -> str:
    auto_pad = attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise ShapeError(f"{op} auto_pad={auto_pad!r} is unknown; use NOTSET, SAME_UPPER, SAME_LOWER or VALID")
    return auto_pad


def window_of(op: str, spatial: tuple[int, ...], kernel: tuple[int, ...], attrs: dict[str, Any]) -> Window:
    """The window geometry of Conv and the pools: ONNX's output-size rules for auto_pad, explicit pads and
    ceil_mode (where a window that would start inside the end padding is dropped)."""
    rank = len(spatial)
    strides = spatial_attr(op, attrs, "strides", rank, 1)
    dilations = spatial_attr(op, attrs, "dilations", rank, 1)
    auto_pad = auto_pads(op, attrs)
    ceil_mode = bool(attrs.get("ceil_mode", 0))
    declared_begin, declared_end = explicit_pads(op, attrs, rank)
    begins, ends, read_ends, outputs = [], [], [], []
    for axis in range(rank):
        size, stride = spatial[axis], strides[axis]
        extent = (kernel[axis] - 1) * dilations[axis] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            output = -(-size // stride)
            total = max(0, (output - 1) * stride + extent - size)
            begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            end = total - begin
        elif auto_pad == "VALID":
            begin = end = 0
            output = (size - extent) // stride + 1
        else:
            begin, end = declared_begin[axis], declared_end[axis]
            span = size + begin + end - extent
            if ceil_mode:
                output = -(-span // stride) + 1
                if (output - 1) * stride >= size + begin:
                    output -= 1
            else:
                output = span // stride + 1
        if output < 1 or size + begin + end < extent:
            raise ShapeError(
                f"{op} kernel of extent {extent} does not fit spatial axis {axis} of size {size} "
                f"(padded {begin}+{end}); use a larger input, more padding or a smaller kernel"
            )
        begins.append(begin)
        ends.append(end)
        read_ends.append((output - 1) * stride + extent - size - begin)
        outputs.append(output)
    return Window(kernel, strides, dilations, tuple(begins), tuple(read_ends), tuple(ends), tuple(outputs))


def _padded(x: np.ndarray, window: Window, fill) -> np.ndarray:
    """`x` padded (or cropped) on its trailing spatial axes to exactly the extent its windows read."""
    rank = len(window.kernel)
    lead = x.ndim - rank
    pad_width = [(0, 0)] * lead + [(b, max(e, 0)) for b, e in zip(window.pads_begin, window.read_end)]
    if any(b or e for b, e in pad_width):
        x = np.pad(x, pad_width, mode="constant", constant_values=fill)
    crop = tuple(slice(0, x.shape[lead + a] + min(e, 0)) for a, e in enumerate(window.read_end))
    return x[(Ellipsis, *crop)]


def window_view(x: np.ndarray, window: Window, fill) -> np.ndarray:
    """A strided view (..., *output, *kernel) of every window of `x` over its trailing spatial axes."""
    rank = len(window.kernel)
    padded = _padded(x, window, fill)
    axes = tuple(range(padded.ndim - rank, padded.ndim))
    view = sliding_window_view(padded, window.extents, axis=axes)
    steps = tuple(slice(None, None, s) for s in window.strides) + tuple(slice(None, None, d) for d in window.dilations)
    return view[(Ellipsis, *steps)]
