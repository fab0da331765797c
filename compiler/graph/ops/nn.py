"""Ops of the nn family: convolution, dense layers, normalisation, softmax, pooling and resize.

Each op registers its shape rule, fusion pattern and numpy reference (ONNX opset-21 semantics); the frontend
builds nodes of these ops, the passes read their patterns, and the kernel stage checks its computes against the
references, which are vectorised (im2col + matmul, strided window views) so whole CNNs run in a second or two.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from compiler.errors import ShapeError, UnsupportedOpError
from compiler.graph.ir import TensorType
from compiler.graph.ops.common import broadcast_shapes, normalize_axes, normalize_axis
from compiler.graph.registry import Pattern, register_op

FLOAT_DTYPES = ("float16", "float32", "float64")


# -- shared checks ------------------------------------------------------------------------------------------------


def _inputs(op: str, types: list[TensorType | None], required: int, total: int) -> list[TensorType | None]:
    """`types` padded with None to `total`; ShapeError when one of the first `required` is missing."""
    if len(types) > total:
        raise ShapeError(f"{op} takes at most {total} inputs, got {len(types)}")
    types = list(types) + [None] * (total - len(types))
    for index in range(required):
        if types[index] is None:
            raise ShapeError(f"{op} needs input {index}; give the node at least {required} inputs")
    return types


def _float_input(op: str, value: TensorType, what: str = "input") -> None:
    if value.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"{op} {what} has dtype {value.dtype}; it needs one of {', '.join(FLOAT_DTYPES)}")


def _output_count(attrs: dict[str, Any]) -> int:
    return int(attrs.get("_outputs", 1))


def _single_output(op: str, attrs: dict[str, Any]) -> None:
    if _output_count(attrs) > 1:
        raise UnsupportedOpError(
            f"{op} with {_output_count(attrs)} outputs is not supported (only its first output is); "
            "remove the extra outputs from the node",
            {op: []},
        )


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    """float16 math loses too much in float16 itself, so it runs in float32 and is cast back."""
    return np.dtype(np.float32) if dtype == np.float16 else np.dtype(dtype)


# -- sliding windows (Conv, ConvTranspose, pooling) -----------------------------------------------------------------


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


def _spatial_attr(op: str, attrs: dict[str, Any], name: str, rank: int, default: int) -> tuple[int, ...]:
    values = attrs.get(name)
    if values is None or len(values) == 0:
        return (default,) * rank
    values = tuple(int(v) for v in values)
    if len(values) != rank:
        raise ShapeError(f"{op} attribute {name}={list(values)} needs {rank} values, one per spatial axis")
    if any(v < 1 for v in values):
        raise ShapeError(f"{op} attribute {name}={list(values)} must be positive")
    return values


def _explicit_pads(op: str, attrs: dict[str, Any], rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    pads = attrs.get("pads")
    if pads is None or len(pads) == 0:
        return (0,) * rank, (0,) * rank
    pads = tuple(int(p) for p in pads)
    if len(pads) != 2 * rank:
        raise ShapeError(f"{op} attribute pads={list(pads)} needs {2 * rank} values (all begins, then all ends)")
    if any(p < 0 for p in pads):
        raise ShapeError(f"{op} attribute pads={list(pads)} must not be negative")
    return pads[:rank], pads[rank:]


def _auto_pad(op: str, attrs: dict[str, Any]) -> str:
    auto_pad = attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise ShapeError(f"{op} auto_pad={auto_pad!r} is unknown; use NOTSET, SAME_UPPER, SAME_LOWER or VALID")
    return auto_pad


def _window(op: str, spatial: tuple[int, ...], kernel: tuple[int, ...], attrs: dict[str, Any]) -> Window:
    """The window geometry of Conv and the pools: ONNX's output-size rules for auto_pad, explicit pads and
    ceil_mode (where a window that would start inside the end padding is dropped)."""
    rank = len(spatial)
    strides = _spatial_attr(op, attrs, "strides", rank, 1)
    dilations = _spatial_attr(op, attrs, "dilations", rank, 1)
    auto_pad = _auto_pad(op, attrs)
    ceil_mode = bool(attrs.get("ceil_mode", 0))
    declared_begin, declared_end = _explicit_pads(op, attrs, rank)
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


def _window_view(x: np.ndarray, window: Window, fill) -> np.ndarray:
    """A strided view (..., *output, *kernel) of every window of `x` over its trailing spatial axes."""
    rank = len(window.kernel)
    padded = _padded(x, window, fill)
    axes = tuple(range(padded.ndim - rank, padded.ndim))
    view = sliding_window_view(padded, window.extents, axis=axes)
    steps = tuple(slice(None, None, s) for s in window.strides) + tuple(slice(None, None, d) for d in window.dilations)
    return view[(Ellipsis, *steps)]


# -- Conv -------------------------------------------------------------------------------------------------------


def conv_geometry(op: str, x: TensorType, w: TensorType, attrs: dict[str, Any]) -> tuple[int, Window]:
    if len(x.shape) < 3 or len(w.shape) != len(x.shape):
        raise ShapeError(
            f"{op} needs input (N, C, spatial...) and weight (M, C/group, kernel...) of the same rank >= 3, "
            f"got {list(x.shape)} and {list(w.shape)}"
        )
    group = int(attrs.get("group", 1))
    channels, filters = x.shape[1], w.shape[0]
    if group < 1 or channels % group or filters % group or w.shape[1] * group != channels:
        raise ShapeError(
            f"{op} with group={group}: input has {channels} channels and weight {list(w.shape)}; "
            f"channels and filters must divide by group and weight dim 1 must be channels/group"
        )
    kernel = tuple(w.shape[2:])
    declared = attrs.get("kernel_shape")
    if declared is not None and tuple(int(k) for k in declared) != kernel:
        raise ShapeError(f"{op} kernel_shape={list(declared)} disagrees with weight shape {list(w.shape)}")
    return group, _window(op, tuple(x.shape[2:]), kernel, attrs)


def _infer_conv(types, attrs):
    x, w, bias = _inputs("Conv", types, 2, 3)
    _float_input("Conv", x)
    group, window = conv_geometry("Conv", x, w, attrs)
    if bias is not None and bias.shape != (w.shape[0],):
        raise ShapeError(f"Conv bias has shape {list(bias.shape)}; it needs ({w.shape[0]},), one per filter")
    return [TensorType((x.shape[0], w.shape[0], *window.output), x.dtype)]


def _conv(x, w, bias=None, *, group=1, **attrs):
    group = int(group)
    _, window = conv_geometry(
        "Conv", TensorType(x.shape, str(x.dtype)), TensorType(w.shape, str(w.dtype)), {**attrs, "group": group}
    )
    dtype = _compute_dtype(x.dtype)
    batch, channels = x.shape[:2]
    filters, rank = w.shape[0], len(window.kernel)
    view = _window_view(x.astype(dtype, copy=False), window, 0)
    # im2col: (N, G, C/G * kernel, pixels), contracted with (G, M/G, C/G * kernel) as one batched matmul
    view = view.reshape(batch, group, channels // group, *window.output, *window.kernel)
    spatial_axes = tuple(range(3, 3 + rank))
    kernel_axes = tuple(range(3 + rank, 3 + 2 * rank))
    patch = channels // group * math.prod(window.kernel)
    columns = view.transpose(0, 1, 2, *kernel_axes, *spatial_axes).reshape(
        batch, group, patch, math.prod(window.output)
    )
    weights = w.astype(dtype, copy=False).reshape(group, filters // group, -1)
    result = np.matmul(weights, columns).reshape(batch, filters, *window.output)
    if bias is not None:
        result += bias.astype(dtype, copy=False).reshape(filters, *(1,) * rank)
    return result.astype(x.dtype, copy=False)


register_op("Conv", infer=_infer_conv, pattern=Pattern.OUT_EWISE_FUSABLE, reference=_conv)


# -- blocked layouts (NCHW[x]c) made by the alter_layout pass -------------------------------------------------------
# An NCHW[x]c tensor (N, C / x, H, W, x) holds channel c at [n, c // x, h, w, c % x]: the x channels a CPU kernel
# computes in one vector are adjacent. A packed conv weight (M / x, C / group, kh, kw, x) likewise holds filter m at
# [m // x, ..., m % x].


def _blocked_layout(op: str, text: str) -> int:
    """The channel block of a layout named "NCHW" or "NCW" (0) or "NCHW<x>c". A 1-D value (N, C, W) is blocked as
    (N, C / x, 1, W, x): a row of height 1."""
    digits = text[4:-1] if text.startswith("NCHW") and text.endswith("c") else ""
    if text in ("NCHW", "NCW"):
        return 0
    if not digits.isdigit() or int(digits) < 1:
        raise ShapeError(f"{op} layout {text!r} is neither NCHW nor NCHW<x>c with a whole x")
    return int(digits)


def block_channels(x: np.ndarray, block: int) -> np.ndarray:
    """NCHW -> NCHW[block]c, channels past the last whole block padded with zeros."""
    batch, channels, *spatial = x.shape
    padded = -(-channels // block) * block
    if padded != channels:
        x = np.pad(x, [(0, 0), (0, padded - channels), *[(0, 0)] * len(spatial)])
    return np.ascontiguousarray(np.moveaxis(x.reshape(batch, padded // block, block, *spatial), 2, -1))


def unblock_channels(x: np.ndarray, channels: int | None = None) -> np.ndarray:
    """NCHW[x]c -> NCHW, keeping the first `channels` (all when None)."""
    plain = np.moveaxis(x, -1, 2).reshape(x.shape[0], x.shape[1] * x.shape[-1], *x.shape[2:-1])
    return np.ascontiguousarray(plain if channels is None else plain[:, :channels])


def _infer_layout_transform(types, attrs):
    """`channels` (optional) is the NCHW side's channel count when it is not whole blocks: the blocked side holds
    it padded with zeros to the next whole block."""
    (x,) = _inputs("LayoutTransform", types, 1, 1)
    source = _blocked_layout("LayoutTransform", str(attrs.get("src", "")))
    target = _blocked_layout("LayoutTransform", str(attrs.get("dst", "")))
    channels = attrs.get("channels")
    if (source == 0) == (target == 0):
        raise ShapeError(
            f"LayoutTransform goes from NCHW to NCHW<x>c or back, got src={attrs.get('src')!r} dst={attrs.get('dst')!r}"
        )
    plain_rank = 3 if "NCW" in (attrs.get("src"), attrs.get("dst")) else 4
    if source == 0:
        if len(x.shape) != plain_rank or (x.shape[1] % target and channels != x.shape[1]):
            raise ShapeError(
                f"LayoutTransform to NCHW{target}c needs ({'N, C, W' if plain_rank == 3 else 'N, C, H, W'}) with C "
                f"divisible by {target}, or the channels attribute equal to C to pad it"
            )
        spatial = (1, *x.shape[2:]) if plain_rank == 3 else x.shape[2:]
        return [TensorType((x.shape[0], -(-x.shape[1] // target), *spatial, target), x.dtype)]
    if len(x.shape) != 5 or x.shape[-1] != source:
        raise ShapeError(
            f"LayoutTransform from NCHW{source}c needs (N, C/{source}, H, W, {source}), got {list(x.shape)}"
        )
    whole = x.shape[1] * source
    if channels is not None and not whole - source < int(channels) <= whole:
        raise ShapeError(f"LayoutTransform channels={channels} must lie in the last block of {list(x.shape)}")
    if plain_rank == 3 and x.shape[2] != 1:
        raise ShapeError(f"LayoutTransform to NCW needs a blocked row of height 1, got {list(x.shape)}")
    spatial = x.shape[3:4] if plain_rank == 3 else x.shape[2:4]
    return [TensorType((x.shape[0], whole if channels is None else int(channels), *spatial), x.dtype)]


def _layout_transform(x, *, src, dst, channels=None, **_):
    target = _blocked_layout("LayoutTransform", dst)
    if target:
        return block_channels(x[:, :, None] if src == "NCW" else x, target)
    plain = unblock_channels(x, channels)
    return plain[:, :, 0] if dst == "NCW" else plain


register_op("LayoutTransform", infer=_infer_layout_transform, pattern=Pattern.INJECTIVE, reference=_layout_transform)


def _infer_channel_shuffle(types, attrs):
    """ShuffleNet's channel shuffle of a blocked value (N, C / x, H, W, x): output channel j * g + q is input channel
    q * (C / g) + j. Only the case whose blocked form is one load per group needs a kernel of its own: g divides
    x and x divides C / g (any other shuffle stays Reshape -> Transpose -> Reshape in NCHW)."""
    (x,) = _inputs("ChannelShuffleNCHWc", types, 1, 1)
    groups = int(attrs.get("groups", 0))
    if len(x.shape) != 5 or groups < 2:
        raise ShapeError(f"ChannelShuffleNCHWc needs (N, C/x, H, W, x) and groups >= 2, got {list(x.shape)}, {groups}")
    block, channels = x.shape[-1], x.shape[1] * x.shape[-1]
    if block % groups or channels % groups or (channels // groups) % block:
        raise ShapeError(
            f"ChannelShuffleNCHWc with {groups} groups needs them to divide the block {block} and the block to divide "
            f"C / groups ({channels} channels)"
        )
    return [x]


def _channel_shuffle(x, *, groups, **_):
    plain = unblock_channels(x)
    batch, channels, *spatial = plain.shape
    shuffled = plain.reshape(batch, groups, channels // groups, *spatial).swapaxes(1, 2).reshape(plain.shape)
    return block_channels(shuffled, x.shape[-1])


register_op("ChannelShuffleNCHWc", infer=_infer_channel_shuffle, pattern=Pattern.INJECTIVE, reference=_channel_shuffle)


def unpack_weight(packed_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The (M, C / group, kernel...) shape a packed weight of `packed_shape` stands for."""
    return (packed_shape[0] * packed_shape[-1], *packed_shape[1:-1])


def blocked_conv_types(x: TensorType, w: TensorType, attrs: dict[str, Any]) -> tuple[TensorType, TensorType]:
    """The NCHW input and OIHW weight types a ConvNCHWc stands for; ShapeError unless it is a 2-D conv with
    group 1, a depthwise one (group = channels = filters) whose input and filter blocks agree, or one whose groups
    hold whole blocks of input channels and of filters."""
    if len(x.shape) != 5 or len(w.shape) != 5:
        raise ShapeError(
            f"ConvNCHWc needs an NCHW[x]c input and a packed (M/x, C/group, kh, kw, x) weight, "
            f"got {list(x.shape)} and {list(w.shape)}"
        )
    plain_x = TensorType((x.shape[0], x.shape[1] * x.shape[-1], *x.shape[2:4]), x.dtype)
    plain_w = TensorType(unpack_weight(w.shape), w.dtype)
    group = int(attrs.get("group", 1))
    depthwise = group == plain_x.shape[1] == plain_w.shape[0] and x.shape[-1] == w.shape[-1]
    whole_blocks = x.shape[1] % group == 0 and w.shape[0] % group == 0
    if group != 1 and not depthwise and not whole_blocks:
        raise ShapeError(
            f"ConvNCHWc with group={group} must be depthwise (group = channels = filters, one block size) or have "
            f"whole blocks of channels and filters per group; input {list(x.shape)}, weight {list(w.shape)}"
        )
    return plain_x, plain_w


def _infer_conv_nchwc(types, attrs):
    x, w, bias = _inputs("ConvNCHWc", types, 2, 3)
    plain_x, plain_w = blocked_conv_types(x, w, attrs)
    (plain,) = _infer_conv([plain_x, plain_w, bias], attrs)
    block = w.shape[-1]
    return [TensorType((plain.shape[0], plain.shape[1] // block, *plain.shape[2:], block), plain.dtype)]


def _conv_nchwc(x, w, bias=None, **attrs):
    weight = np.moveaxis(w, -1, 1).reshape(unpack_weight(w.shape))
    return block_channels(_conv(unblock_channels(x), weight, bias, **attrs), w.shape[-1])


register_op("ConvNCHWc", infer=_infer_conv_nchwc, pattern=Pattern.OUT_EWISE_FUSABLE, reference=_conv_nchwc)


# -- ConvWinogradNCHWc (CPU) and ConvWinograd (GPU): a 3x3 stride-1 conv by Winograd's minimal filtering F(m x m, 3 x 3)


def winograd_matrices(tile: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """B^T, G and A^T of F(tile, 3) (Lavin and Gray 2016, interpolation points 0, +-1, +-2 and infinity): a row of
    `tile` outputs of a 3-tap correlation is A^T [(G g) * (B^T d)] for the tile + 2 inputs d and the taps g."""
    if tile == 2:
        bt = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
        g = [[1, 0, 0], [1 / 2, 1 / 2, 1 / 2], [1 / 2, -1 / 2, 1 / 2], [0, 0, 1]]
        at = [[1, 1, 1, 0], [0, 1, -1, -1]]
    elif tile == 4:
        bt = [
            [4, 0, -5, 0, 1, 0],
            [0, -4, -4, 1, 1, 0],
            [0, 4, -4, -1, 1, 0],
            [0, -2, -1, 2, 1, 0],
            [0, 2, -1, -2, 1, 0],
            [0, 4, 0, -5, 0, 1],
        ]
        g = [
            [1 / 4, 0, 0],
            [-1 / 6, -1 / 6, -1 / 6],
            [-1 / 6, 1 / 6, -1 / 6],
            [1 / 24, 1 / 12, 1 / 6],
            [1 / 24, -1 / 12, 1 / 6],
            [0, 0, 1],
        ]
        at = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]
    else:
        raise ShapeError(f"Winograd convs have tiles of 2 or 4 outputs, got tile={tile}")
    return np.array(bt, np.float64), np.array(g, np.float64), np.array(at, np.float64)


def winograd_weight(weight: np.ndarray, tile: int) -> np.ndarray:
    """An (M, C, 3, 3) conv weight as F(tile, 3)'s transformed filters U = G g G^T, laid out (alpha^2, C, M) with
    alpha = tile + 2: for each of the alpha x alpha points, the C x M matrix its tiles are multiplied by."""
    _, g, _ = winograd_matrices(tile)
    alpha = tile + 2
    u = np.einsum("ak,mckl,bl->abcm", g, weight.astype(np.float64), g)
    return np.ascontiguousarray(u.reshape(alpha * alpha, *u.shape[2:]).astype(weight.dtype))


def winograd_geometry(
    x: TensorType, u: TensorType, attrs: dict[str, Any], op: str = "ConvWinogradNCHWc"
) -> tuple[int, tuple[int, ...], tuple[int, int]]:
    """A Winograd conv's tile, pads (top, left, bottom, right) and output rows and columns; ShapeError unless the
    input is NCHW[x]c (ConvWinogradNCHWc) or NCHW (ConvWinograd) and the weight (alpha^2, C, M) of its tile. The
    output needs no whole number of tiles: the last row and column of tiles reach past it into zeros (tiles_of)."""
    tile, pads = int(attrs.get("tile", 0)), tuple(int(p) for p in attrs.get("pads", (0, 0, 0, 0)))
    alpha = tile + 2
    if tile not in (2, 4):
        raise ShapeError(f"{op} has tiles of 2 or 4 outputs, got tile={tile}")
    if len(pads) != 4:
        raise ShapeError(f"{op} needs pads (top, left, bottom, right), got {list(pads)}")
    blocked = op == "ConvWinogradNCHWc"
    channels = x.shape[1] * x.shape[4] if blocked and len(x.shape) == 5 else x.shape[1]
    if (
        len(x.shape) != (5 if blocked else 4)
        or len(u.shape) != 3
        or u.shape[0] != alpha * alpha
        or u.shape[1] != channels
    ):
        raise ShapeError(
            f"{op} with tile={tile} needs an {'NCHW[x]c' if blocked else 'NCHW'} input and a ({alpha * alpha}, C, M) "
            f"weight, got {list(x.shape)} and {list(u.shape)}"
        )
    rows, columns = x.shape[2] + pads[0] + pads[2] - 2, x.shape[3] + pads[1] + pads[3] - 2
    if rows <= 0 or columns <= 0:
        raise ShapeError(f"{op} with pads={list(pads)} on {list(x.shape)} makes an empty output, {rows} x {columns}")
    return tile, pads, (rows, columns)


def tiles_of(size: int, tile: int) -> int:
    """The tiles along an output axis of `size`: the last one may reach past it."""
    return -(-size // tile)


def _infer_conv_winograd(op: str):
    def infer(types, attrs):
        x, u, bias = _inputs(op, types, 2, 3)
        _, _, (rows, columns) = winograd_geometry(x, u, attrs, op)
        filters = u.shape[2]
        if bias is not None and bias.shape != (filters,):
            raise ShapeError(f"{op} bias has shape {list(bias.shape)}; it needs ({filters},)")
        if op == "ConvWinograd":
            return [TensorType((x.shape[0], filters, rows, columns), x.dtype)]
        block = int(attrs.get("block", 0))
        if block < 1 or filters % block:
            raise ShapeError(f"{op}'s block={block} must divide its {filters} filters")
        return [TensorType((x.shape[0], filters // block, rows, columns, block), x.dtype)]

    return infer


def _conv_winograd(x, u, bias=None, **attrs):
    """The conv by the same algorithm in numpy: each tile's B^T d B, one matmul per point, A^T m A. An NCHW[x]c
    input (5-D) makes ConvWinogradNCHWc's blocked output, an NCHW one ConvWinograd's."""
    blocked = x.ndim == 5
    op = "ConvWinogradNCHWc" if blocked else "ConvWinograd"
    tile, pads, (rows, columns) = winograd_geometry(
        TensorType(x.shape, str(x.dtype)), TensorType(u.shape, str(u.dtype)), attrs, op
    )
    bt, _, at = winograd_matrices(tile)
    alpha, dtype = tile + 2, _compute_dtype(x.dtype)
    down, across = tiles_of(rows, tile), tiles_of(columns, tile)
    # the last tiles' inputs past the padding are zeros
    extra = (down * tile - rows, across * tile - columns)
    plain = np.pad(
        (unblock_channels(x) if blocked else x).astype(dtype),
        [(0, 0), (0, 0), (pads[0], pads[2] + extra[0]), (pads[1], pads[3] + extra[1])],
    )
    tiles = sliding_window_view(plain, (alpha, alpha), axis=(2, 3))[:, :, ::tile, ::tile][:, :, :down, :across]
    v = np.einsum("ai,ncxyij,bj->abnxyc", bt.astype(dtype), tiles, bt.astype(dtype))
    shape = v.shape
    m = np.matmul(v.reshape(alpha * alpha, -1, shape[-1]), u.astype(dtype)).reshape(*shape[:-1], u.shape[2])
    y = np.einsum("pa,abnxym,qb->nmxpyq", at.astype(dtype), m, at.astype(dtype))
    y = y.reshape(x.shape[0], -1, down * tile, across * tile)[:, :, :rows, :columns]
    if bias is not None:
        y = y + bias.astype(dtype)[:, None, None]
    y = y.astype(x.dtype)
    return block_channels(y, int(attrs["block"])) if blocked else y


register_op(
    "ConvWinogradNCHWc",
    infer=_infer_conv_winograd("ConvWinogradNCHWc"),
    pattern=Pattern.OUT_EWISE_FUSABLE,
    reference=_conv_winograd,
)
register_op(
    "ConvWinograd",
    infer=_infer_conv_winograd("ConvWinograd"),
    pattern=Pattern.OUT_EWISE_FUSABLE,
    reference=_conv_winograd,
)


# -- ConvTranspose ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TransposedGeometry:
    """Where ConvTranspose's full (unpadded) result is cropped: output[i] = full[i + pads_begin]."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    output: tuple[int, ...]


def transposed_geometry(x: TensorType, w: TensorType, attrs: dict[str, Any]) -> tuple[int, TransposedGeometry]:
    op = "ConvTranspose"
    if len(x.shape) < 3 or len(w.shape) != len(x.shape):
        raise ShapeError(
            f"{op} needs input (N, C, spatial...) and weight (C, M/group, kernel...) of the same rank >= 3, "
            f"got {list(x.shape)} and {list(w.shape)}"
        )
    group = int(attrs.get("group", 1))
    if group < 1 or x.shape[1] % group or w.shape[0] != x.shape[1]:
        raise ShapeError(
            f"{op} with group={group}: input has {x.shape[1]} channels and weight {list(w.shape)}; "
            f"weight dim 0 must equal the channels, which must divide by group"
        )
    spatial = tuple(x.shape[2:])
    rank = len(spatial)
    kernel = tuple(w.shape[2:])
    strides = _spatial_attr(op, attrs, "strides", rank, 1)
    dilations = _spatial_attr(op, attrs, "dilations", rank, 1)
    output_padding = tuple(int(p) for p in attrs.get("output_padding") or (0,) * rank)
    if len(output_padding) != rank:
        raise ShapeError(f"{op} output_padding={list(output_padding)} needs {rank} values")
    auto_pad = _auto_pad(op, attrs)
    full = tuple(
        s * (n - 1) + p + (k - 1) * d + 1 for n, s, p, k, d in zip(spatial, strides, output_padding, kernel, dilations)
    )
    requested = attrs.get("output_shape")
    if requested is not None and len(requested) > 0:
        output = tuple(int(v) for v in requested)[-rank:]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        output = tuple(n * s for n, s in zip(spatial, strides))
    else:
        output = None
    if output is not None:
        totals = [f - o for f, o in zip(full, output)]
        if auto_pad == "SAME_UPPER":
            begins = tuple(t // 2 for t in totals)
        else:
            begins = tuple(t - t // 2 for t in totals)
    else:
        begins, ends = _explicit_pads(op, attrs, rank) if auto_pad == "NOTSET" else ((0,) * rank, (0,) * rank)
        output = tuple(f - b - e for f, b, e in zip(full, begins, ends))
    if any(o < 1 for o in output):
        raise ShapeError(f"{op} output spatial shape {list(output)} is empty; check pads and output_shape")
    return group, TransposedGeometry(kernel, strides, dilations, begins, output)


def _infer_conv_transpose(types, attrs):
    x, w, bias = _inputs("ConvTranspose", types, 2, 3)
    _float_input("ConvTranspose", x)
    group, geometry = transposed_geometry(x, w, attrs)
    filters = w.shape[1] * group
    if bias is not None and bias.shape != (filters,):
        raise ShapeError(f"ConvTranspose bias has shape {list(bias.shape)}; it needs ({filters},)")
    return [TensorType((x.shape[0], filters, *geometry.output), x.dtype)]


def _conv_transpose(x, w, bias=None, *, group=1, **attrs):
    group = int(group)
    _, geometry = transposed_geometry(
        TensorType(x.shape, str(x.dtype)), TensorType(w.shape, str(w.dtype)), {**attrs, "group": group}
    )
    dtype = _compute_dtype(x.dtype)
    batch, channels = x.shape[:2]
    spatial, kernel, rank = x.shape[2:], geometry.kernel, len(geometry.kernel)
    filters = w.shape[1] * group
    # every input pixel times every kernel tap, (N, G, M/G * kernel, pixels), then scattered tap by tap
    weights = w.astype(dtype, copy=False).reshape(group, channels // group, -1).transpose(0, 2, 1)
    inputs = x.astype(dtype, copy=False).reshape(batch, group, channels // group, -1)
    columns = np.matmul(weights, inputs).reshape(batch, filters, *kernel, *spatial)
    front = tuple(max(0, -b) for b in geometry.pads_begin)
    starts = tuple(b + f for b, f in zip(geometry.pads_begin, front))
    extent = tuple(
        max(s * (n - 1) + (k - 1) * d + 1 + f, start + o)
        for n, s, k, d, f, start, o in zip(
            spatial, geometry.strides, kernel, geometry.dilations, front, starts, geometry.output
        )
    )
    full = np.zeros((batch, filters, *extent), dtype)
    for tap in itertools.product(*(range(k) for k in kernel)):
        target = tuple(
            slice(f + t * d, f + t * d + s * (n - 1) + 1, s)
            for f, t, d, s, n in zip(front, tap, geometry.dilations, geometry.strides, spatial)
        )
        full[(Ellipsis, *target)] += columns[(slice(None), slice(None), *tap)]
    result = full[(Ellipsis, *(slice(start, start + o) for start, o in zip(starts, geometry.output)))]
    if bias is not None:
        result = result + bias.astype(dtype, copy=False).reshape(filters, *(1,) * rank)
    return np.ascontiguousarray(result).astype(x.dtype, copy=False)


register_op("ConvTranspose", infer=_infer_conv_transpose, pattern=Pattern.OUT_EWISE_FUSABLE, reference=_conv_transpose)


def pack_transposed_weight(weight: np.ndarray, block: int) -> np.ndarray:
    """A group-1 ConvTranspose weight (C, M, kernel...) -> (M / block, C, kernel..., block)."""
    channels, filters, *kernel = weight.shape
    blocked = weight.reshape(channels, filters // block, block, *kernel)
    return np.ascontiguousarray(np.moveaxis(np.moveaxis(blocked, 1, 0), 2, -1))


def _unpack_transposed_weight(w: np.ndarray) -> np.ndarray:
    return np.moveaxis(np.moveaxis(w, -1, 1), 2, 0).reshape(w.shape[1], w.shape[0] * w.shape[-1], *w.shape[2:-1])


def blocked_transposed_types(x: TensorType, w: TensorType) -> tuple[TensorType, TensorType]:
    """The NCHW input and (C, M, kh, kw) weight types a ConvTransposeNCHWc stands for."""
    if len(x.shape) != 5 or len(w.shape) != 5 or w.shape[1] != x.shape[1] * x.shape[-1]:
        raise ShapeError(
            "ConvTransposeNCHWc needs an NCHW[x]c input and a packed (M/x, C, kh, kw, x) weight of its C, "
            f"got {list(x.shape)} and {list(w.shape)}"
        )
    plain_x = TensorType((x.shape[0], x.shape[1] * x.shape[-1], *x.shape[2:4]), x.dtype)
    return plain_x, TensorType((w.shape[1], w.shape[0] * w.shape[-1], *w.shape[2:4]), w.dtype)


def _infer_conv_transpose_nchwc(types, attrs):
    x, w, bias = _inputs("ConvTransposeNCHWc", types, 2, 3)
    if int(attrs.get("group", 1)) != 1:
        raise ShapeError("ConvTransposeNCHWc has group 1 only")
    (plain,) = _infer_conv_transpose([*blocked_transposed_types(x, w), bias], attrs)
    block = w.shape[-1]
    return [TensorType((plain.shape[0], plain.shape[1] // block, *plain.shape[2:], block), plain.dtype)]


def _conv_transpose_nchwc(x, w, bias=None, **attrs):
    plain = _conv_transpose(unblock_channels(x), _unpack_transposed_weight(w), bias, **attrs)
    return block_channels(plain, w.shape[-1])


# a group-1 ConvTranspose in NCHW[x]c over a weight packed as (M / x, C, kh, kw, x), made by alter_layout
register_op(
    "ConvTransposeNCHWc",
    infer=_infer_conv_transpose_nchwc,
    pattern=Pattern.OUT_EWISE_FUSABLE,
    reference=_conv_transpose_nchwc,
)


# -- Gemm and MatMul ------------------------------------------------------------------------------------------------


def _infer_gemm(types, attrs):
    a, b, c = _inputs("Gemm", types, 2, 3)
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
    dtype = _compute_dtype(a.dtype)
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
    a, b = _inputs("MatMul", types, 2, 2)
    if a.dtype != b.dtype:
        raise ShapeError(f"MatMul operands have dtypes {a.dtype} and {b.dtype}; they must agree")
    return [TensorType(_matmul_shape(a.shape, b.shape), a.dtype)]


def _matmul(a, b, **_):
    dtype = _compute_dtype(a.dtype)
    return np.asarray(np.matmul(a.astype(dtype, copy=False), b.astype(dtype, copy=False))).astype(a.dtype, copy=False)


register_op("MatMul", infer=_infer_matmul, pattern=Pattern.OUT_EWISE_FUSABLE, reference=_matmul)


# -- MatMulPacked (CPU): a MatMul whose constant B was packed into column panels at compile time ----------------------


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


def _infer_matmul_packed(types, attrs):
    a, w = _inputs("MatMulPacked", types, 2, 2)
    columns = int(attrs.get("columns", 0))
    if len(a.shape) < 2 or len(w.shape) != 3 or a.shape[-1] != w.shape[1]:
        raise ShapeError(
            f"MatMulPacked needs A of rank >= 2 and a packed (N / panel, K, panel) weight with A's K, got "
            f"{list(a.shape)} and {list(w.shape)}"
        )
    if not (w.shape[0] - 1) * w.shape[2] < columns <= w.shape[0] * w.shape[2]:
        raise ShapeError(f"MatMulPacked's columns={columns} does not fit its weight's panels {list(w.shape)}")
    if a.dtype != w.dtype:
        raise ShapeError(f"MatMulPacked operands have dtypes {a.dtype} and {w.dtype}; they must agree")
    return [TensorType((*a.shape[:-1], columns), a.dtype)]


def _matmul_packed(a, w, *, columns, **_):
    return _matmul(a, unpack_dense_weight(w, columns))


register_op("MatMulPacked", infer=_infer_matmul_packed, pattern=Pattern.OUT_EWISE_FUSABLE, reference=_matmul_packed)


# -- Attention (CPU): softmax(Q Kt * scale + mask) V as one op, made by compiler/passes/fuse_attention.py ---------------


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
    q, kt, v, mask = _inputs("Attention", types, 3, 4)
    scores = attention_types(q, kt, v)
    if mask is not None and broadcast_shapes(mask.shape, scores) != scores:
        raise ShapeError(f"Attention's mask {list(mask.shape)} does not broadcast to its scores {list(scores)}")
    if len({t.dtype for t in (q, kt, v, mask) if t is not None}) != 1:
        raise ShapeError("Attention's operands must share one dtype")
    return [TensorType((*q.shape[:-1], v.shape[-1]), q.dtype)]


def _attention(q, kt, v, mask=None, *, scale=1.0, nan_to_zero=0, **_):
    dtype = _compute_dtype(q.dtype)
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


# -- normalisation ------------------------------------------------------------------------------------------------


def _channel_vector(op: str, value: TensorType | None, channels: int, what: str) -> None:
    if value is not None and value.shape != (channels,):
        raise ShapeError(f"{op} {what} has shape {list(value.shape)}; it needs ({channels},), one per channel")


def _infer_batch_norm(types, attrs):
    op = "BatchNormalization"
    if int(attrs.get("training_mode", 0)):
        raise UnsupportedOpError(
            f"{op} with training_mode=1 is not supported; export the model in inference mode (model.eval())",
            {op: []},
        )
    _single_output(op, attrs)
    x, scale, bias, mean, variance = _inputs(op, types, 5, 5)
    _float_input(op, x)
    if len(x.shape) < 2:
        raise ShapeError(f"{op} input needs shape (N, C, ...), got {list(x.shape)}")
    for value, what in ((scale, "scale"), (bias, "bias"), (mean, "mean"), (variance, "var")):
        _channel_vector(op, value, x.shape[1], what)
    return [TensorType(x.shape, x.dtype)]


def _batch_norm(x, scale, bias, mean, variance, *, epsilon=1e-5, **_):
    dtype = _compute_dtype(x.dtype)
    shape = (x.shape[1],) + (1,) * (x.ndim - 2)
    mean, variance, scale, bias = (v.astype(dtype, copy=False).reshape(shape) for v in (mean, variance, scale, bias))
    result = (x.astype(dtype, copy=False) - mean) / np.sqrt(variance + np.asarray(epsilon, dtype)) * scale + bias
    return result.astype(x.dtype, copy=False)


register_op("BatchNormalization", infer=_infer_batch_norm, pattern=Pattern.BROADCAST, reference=_batch_norm)


def _infer_instance_norm(types, attrs):
    op = "InstanceNormalization"
    x, scale, bias = _inputs(op, types, 3, 3)
    _float_input(op, x)
    if len(x.shape) < 3:
        raise ShapeError(f"{op} input needs shape (N, C, spatial...), got {list(x.shape)}")
    _channel_vector(op, scale, x.shape[1], "scale")
    _channel_vector(op, bias, x.shape[1], "bias")
    return [TensorType(x.shape, x.dtype)]


def _instance_norm(x, scale, bias, *, epsilon=1e-5, **_):
    dtype = _compute_dtype(x.dtype)
    data = x.astype(dtype, copy=False)
    axes = tuple(range(2, x.ndim))
    mean = data.mean(axis=axes, keepdims=True)
    variance = np.square(data - mean).mean(axis=axes, keepdims=True)
    shape = (x.shape[1],) + (1,) * (x.ndim - 2)
    normalised = (data - mean) / np.sqrt(variance + np.asarray(epsilon, dtype))
    result = normalised * scale.astype(dtype).reshape(shape) + bias.astype(dtype).reshape(shape)
    return result.astype(x.dtype, copy=False)


register_op("InstanceNormalization", infer=_infer_instance_norm, pattern=Pattern.OPAQUE, reference=_instance_norm)


def stash_dtype(dtype: str) -> str:
    return "float64" if dtype == "float64" else "float32"


def _infer_layer_norm(types, attrs):
    op = "LayerNormalization"
    x, scale, bias = _inputs(op, types, 2, 3)
    _float_input(op, x)
    axis = normalize_axis(attrs.get("axis", -1), len(x.shape), f"{op} axis")
    normalised = x.shape[axis:]
    for value, what in ((scale, "scale"), (bias, "bias")):
        if value is not None and broadcast_shapes(value.shape, normalised) != tuple(normalised):
            raise ShapeError(f"{op} {what} of shape {list(value.shape)} does not broadcast to {list(normalised)}")
    count = _output_count(attrs)
    if count > 3:
        raise ShapeError(f"{op} has at most 3 outputs (Y, Mean, InvStdDev), got {count}")
    statistics = TensorType((*x.shape[:axis], *(1,) * (len(x.shape) - axis)), stash_dtype(x.dtype))
    return [TensorType(x.shape, x.dtype), statistics, statistics][:count]


def _layer_norm(x, scale, bias=None, *, axis=-1, epsilon=1e-5, _outputs=1, **_):
    axis = normalize_axis(axis, x.ndim, "LayerNormalization axis")
    stash = np.dtype(stash_dtype(str(x.dtype)))
    data = x.astype(stash, copy=False)
    axes = tuple(range(axis, x.ndim))
    mean = data.mean(axis=axes, keepdims=True)
    centred = data - mean
    inverse_std = 1 / np.sqrt(np.square(centred).mean(axis=axes, keepdims=True) + np.asarray(epsilon, stash))
    result = centred * inverse_std * scale.astype(stash, copy=False)
    if bias is not None:
        result = result + bias.astype(stash, copy=False)
    outputs = [result.astype(x.dtype, copy=False), mean, inverse_std]
    return outputs[: int(_outputs)] if int(_outputs) > 1 else outputs[0]


register_op("LayerNormalization", infer=_infer_layer_norm, pattern=Pattern.OPAQUE, reference=_layer_norm)


def _infer_lrn(types, attrs):
    (x,) = _inputs("LRN", types, 1, 1)
    _float_input("LRN", x)
    if len(x.shape) < 3:
        raise ShapeError(f"LRN input needs shape (N, C, spatial...), got {list(x.shape)}")
    if "size" not in attrs or int(attrs["size"]) < 1:
        raise ShapeError("LRN needs a positive size attribute (the number of channels to sum over)")
    return [TensorType(x.shape, x.dtype)]


def _lrn(x, *, size, alpha=1e-4, beta=0.75, bias=1.0, **_):
    size = int(size)
    dtype = _compute_dtype(x.dtype)
    squares = np.square(x.astype(dtype, copy=False))
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    padded = np.pad(squares, [(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2))
    sums = sliding_window_view(padded, size, axis=1).sum(axis=-1)
    result = x.astype(dtype, copy=False) / (np.asarray(bias, dtype) + np.asarray(alpha / size, dtype) * sums) ** beta
    return result.astype(x.dtype, copy=False)


register_op("LRN", infer=_infer_lrn, pattern=Pattern.OPAQUE, reference=_lrn)


def _infer_group_norm(types, attrs):
    op = "GroupNormalization"
    x, scale, bias = _inputs(op, types, 3, 3)
    _float_input(op, x)
    if len(x.shape) < 2:
        raise ShapeError(f"{op} input needs shape (N, C, ...), got {list(x.shape)}")
    groups = int(attrs.get("num_groups", 0))
    if groups < 1 or x.shape[1] % groups:
        raise ShapeError(f"{op} num_groups={groups} must be positive and divide the {x.shape[1]} channels")
    for value, what in ((scale, "scale"), (bias, "bias")):
        if value.shape not in ((x.shape[1],), (groups,)):
            raise ShapeError(f"{op} {what} has shape {list(value.shape)}; it needs ({x.shape[1]},), one per channel")
    return [TensorType(x.shape, x.dtype)]


def _group_norm(x, scale, bias, *, num_groups, epsilon=1e-5, **_):
    groups, channels = int(num_groups), x.shape[1]
    stash = np.dtype(stash_dtype(str(x.dtype)))
    data = x.astype(stash, copy=False).reshape(x.shape[0], groups, -1)
    mean = data.mean(axis=-1, keepdims=True)
    variance = np.square(data - mean).mean(axis=-1, keepdims=True)
    normalised = ((data - mean) / np.sqrt(variance + np.asarray(epsilon, stash))).reshape(x.shape)
    # opset 18 gave scale and bias one value per group; opset 21 gives one per channel
    scale, bias = (np.repeat(v, channels // groups) if v.shape[0] != channels else v for v in (scale, bias))
    shape = (channels,) + (1,) * (x.ndim - 2)
    result = normalised * scale.astype(stash).reshape(shape) + bias.astype(stash).reshape(shape)
    return result.astype(x.dtype, copy=False)


register_op("GroupNormalization", infer=_infer_group_norm, pattern=Pattern.OPAQUE, reference=_group_norm)


def _infer_mean_variance_norm(types, attrs):
    op = "MeanVarianceNormalization"
    (x,) = _inputs(op, types, 1, 1)
    _float_input(op, x)
    normalize_axes(attrs.get("axes", (0, 2, 3)), len(x.shape))
    return [TensorType(x.shape, x.dtype)]


def _mean_variance_norm(x, *, axes=(0, 2, 3), **_):
    axes = normalize_axes(axes, x.ndim)
    dtype = _compute_dtype(x.dtype)
    data = x.astype(dtype, copy=False)
    mean = data.mean(axis=axes, keepdims=True)
    # ONNX defines it as E[x^2] - E[x]^2; rounding can make that slightly negative for constant slices
    variance = np.maximum(np.square(data).mean(axis=axes, keepdims=True) - np.square(mean), 0)
    return ((data - mean) / (np.sqrt(variance) + np.asarray(1e-9, dtype))).astype(x.dtype, copy=False)


register_op(
    "MeanVarianceNormalization",
    infer=_infer_mean_variance_norm,
    pattern=Pattern.OPAQUE,
    reference=_mean_variance_norm,
)


def _infer_lp_norm(types, attrs):
    op = "LpNormalization"
    (x,) = _inputs(op, types, 1, 1)
    _float_input(op, x)
    normalize_axis(attrs.get("axis", -1), len(x.shape), f"{op} axis")
    if int(attrs.get("p", 2)) not in (1, 2):
        raise ShapeError(f"{op} p={attrs.get('p')} is not supported; ONNX allows p=1 or p=2")
    return [TensorType(x.shape, x.dtype)]


def _lp_norm(x, *, axis=-1, p=2, **_):
    dtype = _compute_dtype(x.dtype)
    data = x.astype(dtype, copy=False)
    if int(p) == 1:
        norm = np.abs(data).sum(axis=axis, keepdims=True)
    else:
        norm = np.sqrt(np.square(data).sum(axis=axis, keepdims=True))
    # a zero vector stays zero rather than becoming 0/0
    result = np.where(norm == 0, 0, data / np.where(norm == 0, 1, norm))
    return result.astype(x.dtype, copy=False)


register_op("LpNormalization", infer=_infer_lp_norm, pattern=Pattern.OPAQUE, reference=_lp_norm)


# -- Softmax and LogSoftmax -----------------------------------------------------------------------------------------


def _infer_softmax(op: str):
    def infer(types, attrs):
        (x,) = _inputs(op, types, 1, 1)
        _float_input(op, x)
        normalize_axis(attrs.get("axis", -1), len(x.shape), f"{op} axis")
        return [TensorType(x.shape, x.dtype)]

    return infer


def _shifted(x, axis: int) -> np.ndarray:
    """x minus its maximum along `axis`, in the compute dtype. An infinite maximum gives inf - inf = NaN, which is
    the answer ONNX's own reference gives for such a row, so numpy's warning about it is silenced."""
    dtype = _compute_dtype(x.dtype)
    with np.errstate(invalid="ignore"):
        return x.astype(dtype, copy=False) - x.max(axis=axis, keepdims=True).astype(dtype, copy=False)


def _softmax(x, *, axis=-1, **_):
    exponentials = np.exp(_shifted(x, axis))
    return (exponentials / exponentials.sum(axis=axis, keepdims=True)).astype(x.dtype, copy=False)


def _log_softmax(x, *, axis=-1, **_):
    shifted = _shifted(x, axis)
    return (shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))).astype(x.dtype, copy=False)


register_op("Softmax", infer=_infer_softmax("Softmax"), pattern=Pattern.OPAQUE, reference=_softmax)
register_op("LogSoftmax", infer=_infer_softmax("LogSoftmax"), pattern=Pattern.OPAQUE, reference=_log_softmax)


# -- pooling ------------------------------------------------------------------------------------------------------


def pool_geometry(op: str, x: TensorType, attrs: dict[str, Any]) -> Window:
    if len(x.shape) < 3:
        raise ShapeError(f"{op} input needs shape (N, C, spatial...), got {list(x.shape)}")
    rank = len(x.shape) - 2
    if attrs.get("kernel_shape") is None:
        raise ShapeError(f"{op} needs the kernel_shape attribute")
    kernel = _spatial_attr(op, attrs, "kernel_shape", rank, 1)
    return _window(op, tuple(x.shape[2:]), kernel, attrs)


def _infer_max_pool(types, attrs):
    (x,) = _inputs("MaxPool", types, 1, 1)
    if x.dtype not in (*FLOAT_DTYPES, "int8", "uint8"):
        raise ShapeError(f"MaxPool input has dtype {x.dtype}; it needs a float, int8 or uint8 tensor")
    window = pool_geometry("MaxPool", x, attrs)
    count = _output_count(attrs)
    if count > 2:
        raise ShapeError(f"MaxPool has at most 2 outputs (Y, Indices), got {count}")
    shape = (*x.shape[:2], *window.output)
    return [TensorType(shape, x.dtype), TensorType(shape, "int64")][:count]


def _lowest(dtype: np.dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _max_pool(x, *, storage_order=0, _outputs=1, **attrs):
    window = pool_geometry("MaxPool", TensorType(x.shape, str(x.dtype)), attrs)
    rank = len(window.kernel)
    view = _window_view(x, window, _lowest(x.dtype))
    kernel_axes = tuple(range(-rank, 0))
    if int(_outputs) < 2:
        return np.ascontiguousarray(view.max(axis=kernel_axes))
    flat = view.reshape(*view.shape[:-rank], -1)
    best = flat.argmax(axis=-1)
    values = np.take_along_axis(flat, best[..., None], axis=-1)[..., 0]
    taps = np.unravel_index(best, window.kernel)
    spatial = x.shape[2:]
    # Indices count over the unpadded input, row-major (storage_order 0) or column-major over spatial axes
    strides = [math.prod(spatial[axis + 1 :]) for axis in range(rank)]
    if int(storage_order):
        strides = [math.prod(spatial[:axis]) for axis in range(rank)]
    index = np.arange(x.shape[0] * x.shape[1], dtype=np.int64).reshape(*x.shape[:2], *(1,) * rank) * math.prod(spatial)
    for axis in range(rank):
        positions = np.arange(window.output[axis], dtype=np.int64) * window.strides[axis] - window.pads_begin[axis]
        positions = positions.reshape(positions.shape + (1,) * (rank - 1 - axis))
        index = index + (positions + taps[axis] * window.dilations[axis]) * strides[axis]
    return [values, index.astype(np.int64)]


register_op("MaxPool", infer=_infer_max_pool, pattern=Pattern.OUT_EWISE_FUSABLE, reference=_max_pool)


def _plain_of_blocked(op: str, x: TensorType) -> TensorType:
    if len(x.shape) != 5:
        raise ShapeError(f"{op} needs an NCHW[x]c input (N, C/x, H, W, x), got {list(x.shape)}")
    return TensorType((x.shape[0], x.shape[1] * x.shape[-1], *x.shape[2:4]), x.dtype)


def _register_blocked_pool(op: str, infer_plain, reference_plain) -> None:
    """`op`NCHWc: the pool `op` (its values only) over the spatial axes of an NCHW[x]c tensor, made by the
    alter_layout pass between blocked convolutions."""
    name = f"{op}NCHWc"

    def infer(types, attrs):
        (x,) = _inputs(name, types, 1, 1)
        _single_output(name, attrs)
        (plain,) = infer_plain([_plain_of_blocked(name, x)], attrs)
        block = x.shape[-1]
        return [TensorType((plain.shape[0], plain.shape[1] // block, *plain.shape[2:], block), plain.dtype)]

    def reference(x, **attrs):
        return block_channels(reference_plain(unblock_channels(x), **attrs), x.shape[-1])

    register_op(name, infer=infer, pattern=Pattern.OUT_EWISE_FUSABLE, reference=reference)


_register_blocked_pool("MaxPool", _infer_max_pool, _max_pool)


def _infer_average_pool(types, attrs):
    (x,) = _inputs("AveragePool", types, 1, 1)
    _float_input("AveragePool", x)
    _single_output("AveragePool", attrs)
    window = pool_geometry("AveragePool", x, attrs)
    return [TensorType((*x.shape[:2], *window.output), x.dtype)]


def _average_pool(x, *, count_include_pad=0, **attrs):
    window = pool_geometry("AveragePool", TensorType(x.shape, str(x.dtype)), attrs)
    rank = len(window.kernel)
    dtype = _compute_dtype(x.dtype)
    kernel_axes = tuple(range(-rank, 0))
    sums = _window_view(x.astype(dtype, copy=False), window, 0).sum(axis=kernel_axes)
    # which padded positions a window counts: the input, plus the declared pads when count_include_pad is set,
    # never the extra tail that ceil_mode reads
    counted = np.ones(x.shape[2:], dtype)
    if int(count_include_pad):
        counted = np.pad(counted, list(zip(window.pads_begin, window.declared_end)), constant_values=1)
        inner = Window(
            window.kernel,
            window.strides,
            window.dilations,
            (0,) * rank,
            tuple(e - d for e, d in zip(window.read_end, window.declared_end)),
            (0,) * rank,
            window.output,
        )
        counts = _window_view(counted, inner, 0).sum(axis=kernel_axes)
    else:
        counts = _window_view(counted, window, 0).sum(axis=kernel_axes)
    return (sums / counts).astype(x.dtype, copy=False)


register_op("AveragePool", infer=_infer_average_pool, pattern=Pattern.OUT_EWISE_FUSABLE, reference=_average_pool)
_register_blocked_pool("AveragePool", _infer_average_pool, _average_pool)


def _infer_global_pool(op: str):
    def infer(types, attrs):
        (x,) = _inputs(op, types, 1, 1)
        _float_input(op, x)
        if len(x.shape) < 3:
            raise ShapeError(f"{op} input needs shape (N, C, spatial...), got {list(x.shape)}")
        return [TensorType((*x.shape[:2], *(1,) * (len(x.shape) - 2)), x.dtype)]

    return infer


def _global_average_pool(x, **_):
    axes = tuple(range(2, x.ndim))
    return x.mean(axis=axes, keepdims=True, dtype=_compute_dtype(x.dtype)).astype(x.dtype, copy=False)


def _global_max_pool(x, **_):
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


register_op(
    "GlobalAveragePool",
    infer=_infer_global_pool("GlobalAveragePool"),
    pattern=Pattern.REDUCE,
    reference=_global_average_pool,
)
register_op(
    "GlobalMaxPool", infer=_infer_global_pool("GlobalMaxPool"), pattern=Pattern.REDUCE, reference=_global_max_pool
)


def _infer_lp_pool(types, attrs):
    (x,) = _inputs("LpPool", types, 1, 1)
    _float_input("LpPool", x)
    window = pool_geometry("LpPool", x, attrs)
    return [TensorType((*x.shape[:2], *window.output), x.dtype)]


def _lp_pool(x, *, p=2, **attrs):
    window = pool_geometry("LpPool", TensorType(x.shape, str(x.dtype)), attrs)
    dtype = _compute_dtype(x.dtype)
    powers = np.abs(x.astype(dtype, copy=False)) ** np.asarray(p, dtype)
    sums = _window_view(powers, window, 0).sum(axis=tuple(range(-len(window.kernel), 0)))
    return (sums ** np.asarray(1 / p, dtype)).astype(x.dtype, copy=False)


register_op("LpPool", infer=_infer_lp_pool, pattern=Pattern.OUT_EWISE_FUSABLE, reference=_lp_pool)


def _global_lp_pool(x, *, p=2, **_):
    dtype = _compute_dtype(x.dtype)
    powers = np.abs(x.astype(dtype, copy=False)) ** np.asarray(p, dtype)
    sums = powers.sum(axis=tuple(range(2, x.ndim)), keepdims=True)
    return (sums ** np.asarray(1 / p, dtype)).astype(x.dtype, copy=False)


register_op("GlobalLpPool", infer=_infer_global_pool("GlobalLpPool"), pattern=Pattern.REDUCE, reference=_global_lp_pool)


def _unpooled_shape(x: TensorType, attrs: dict[str, Any]) -> tuple[int, ...]:
    """The shape MaxUnpool scatters into: the inverse of MaxPool's output-size rule."""
    op = "MaxUnpool"
    rank = len(x.shape) - 2
    if rank < 1 or attrs.get("kernel_shape") is None:
        raise ShapeError(f"{op} needs input (N, C, spatial...) and kernel_shape, got {list(x.shape)}")
    kernel = _spatial_attr(op, attrs, "kernel_shape", rank, 1)
    strides = _spatial_attr(op, attrs, "strides", rank, 1)
    begins, ends = _explicit_pads(op, attrs, rank)
    spatial = tuple((n - 1) * s + k - b - e for n, s, k, b, e in zip(x.shape[2:], strides, kernel, begins, ends))
    return (*x.shape[:2], *spatial)


def _infer_max_unpool(types, attrs):
    x, indices = _inputs("MaxUnpool", types, 2, 2)
    if indices.shape != x.shape or indices.dtype != "int64":
        raise ShapeError(f"MaxUnpool indices {indices} must be int64 with the input's shape {list(x.shape)}")
    requested = attrs.get("output_shape")
    shape = tuple(int(v) for v in requested) if requested is not None else _unpooled_shape(x, attrs)
    if len(shape) != len(x.shape):
        raise ShapeError(f"MaxUnpool output_shape {list(shape)} needs {len(x.shape)} values")
    return [TensorType(shape, x.dtype)]


def _max_unpool(x, indices, *, output_shape=None, **attrs):
    inferred = _unpooled_shape(TensorType(x.shape, str(x.dtype)), attrs)
    scattered = np.zeros(math.prod(inferred), x.dtype)
    scattered[indices.reshape(-1)] = x.reshape(-1)
    if output_shape is None:
        return scattered.reshape(inferred)
    # like ONNX's reference, indices address the inferred shape, which then sits at the start of output_shape
    result = np.zeros(tuple(int(v) for v in output_shape), x.dtype)
    overlap = tuple(slice(0, min(a, b)) for a, b in zip(inferred, result.shape))
    result[overlap] = scattered.reshape(inferred)[overlap]
    return result


register_op(
    "MaxUnpool",
    infer=_infer_max_unpool,
    pattern=Pattern.OPAQUE,
    reference=_max_unpool,
    const_inputs=((2, "output_shape"),),
)


# -- Resize and Upsample --------------------------------------------------------------------------------------------

RESIZE_MODES = ("nearest", "linear", "cubic")
COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@dataclass(frozen=True)
class ResizePlan:
    """Per axis of the input: the output size, the scale that maps output coordinates back to the input, and the
    region of interest (start, end) that tf_crop_and_resize crops, as fractions of the axis."""

    output: tuple[int, ...]
    scales: tuple[float, ...]
    roi: tuple[tuple[float, float], ...] | None


def _given(value) -> tuple | None:
    """A const input as a tuple, or None when it is absent or empty (ONNX's way to leave one out)."""
    if value is None:
        return None
    values = tuple(np.asarray(value).reshape(-1).tolist())
    return values or None


ASPECT_POLICIES = ("stretch", "not_larger", "not_smaller")


def attr_string(attrs: dict[str, Any], name: str, default: str, allowed: tuple[str, ...], op: str = "Resize") -> str:
    value = attrs.get(name, default)
    value = value.decode() if isinstance(value, bytes) else str(value)
    if value not in allowed:
        raise ShapeError(f"{op} {name}={value!r} is not supported; use one of {', '.join(allowed)}")
    return value


def resize_plan(shape: tuple[int, ...], attrs: dict[str, Any]) -> ResizePlan:
    rank = len(shape)
    axes = attrs.get("axes")
    axes = tuple(range(rank)) if axes is None or len(axes) == 0 else tuple(normalize_axis(a, rank) for a in axes)
    scales, sizes, roi = _given(attrs.get("scales")), _given(attrs.get("sizes")), _given(attrs.get("roi"))
    if (scales is None) == (sizes is None):
        raise ShapeError("Resize needs exactly one of scales and sizes, given as constant inputs")
    given = scales if scales is not None else sizes
    if len(given) != len(axes):
        raise ShapeError(
            f"Resize {'scales' if scales else 'sizes'} {list(given)} needs {len(axes)} values, one per axis"
        )
    if sizes is not None:
        output = list(shape)
        for axis, size in zip(axes, sizes):
            output[axis] = int(size)
        factors = [output[a] / shape[a] if shape[a] else 1.0 for a in range(rank)]
        policy = attr_string(attrs, "keep_aspect_ratio_policy", "stretch", ASPECT_POLICIES)
        if policy != "stretch":
            chosen = (min if policy == "not_larger" else max)(factors[a] for a in axes)
            factors = [chosen if a in axes else 1.0 for a in range(rank)]
            output = [int(chosen * shape[a] + 0.5) if a in axes else shape[a] for a in range(rank)]
    else:
        factors = [1.0] * rank
        for axis, scale in zip(axes, scales):
            if scale <= 0:
                raise ShapeError(f"Resize scales {list(scales)} must be positive")
            factors[axis] = float(scale)
        output = [int(factor * size) for factor, size in zip(factors, shape)]
    regions = None
    if roi is not None:
        if len(roi) != 2 * len(axes):
            raise ShapeError(f"Resize roi {list(roi)} needs {2 * len(axes)} values (all starts, then all ends)")
        starts, ends = [0.0] * rank, [1.0] * rank
        for index, axis in enumerate(axes):
            starts[axis], ends[axis] = float(roi[index]), float(roi[len(axes) + index])
        regions = tuple(zip(starts, ends))
    return ResizePlan(tuple(output), tuple(factors), regions)


def _infer_resize(types, attrs):
    (x,) = _inputs("Resize", types, 1, 1)
    attr_string(attrs, "mode", "nearest", RESIZE_MODES)
    attr_string(attrs, "coordinate_transformation_mode", "half_pixel", COORDINATE_MODES)
    attr_string(attrs, "nearest_mode", "round_prefer_floor", NEAREST_MODES)
    return [TensorType(resize_plan(x.shape, attrs).output, x.dtype)]


def _source_positions(
    mode: str, size: int, output: int, scale: float, region: tuple[float, float] | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Each output index's coordinate in the input (float64), and for tf_crop_and_resize which fall outside it.
    Like ONNX, the modes that special-case a length-1 output compare the unrounded length scale * size."""
    target = np.arange(output, dtype=np.float64)
    length = scale * size
    if mode == "align_corners":
        return (np.zeros(output) if length == 1 else target * (size - 1) / (length - 1)), None
    if mode == "asymmetric":
        return target / scale, None
    if mode == "pytorch_half_pixel":
        return (np.full(output, -0.5) if length == 1 else (target + 0.5) / scale - 0.5), None
    if mode == "half_pixel_symmetric":
        offset = size / 2 * (1 - output / length)
        return offset + (target + 0.5) / scale - 0.5, None
    if mode == "tf_crop_and_resize":
        start, end = region or (0.0, 1.0)
        if length == 1:
            positions = np.full(output, (end - start) * (size - 1) / 2)
        else:
            positions = target * (end - start) * (size - 1) / (length - 1)
        positions = positions + start * (size - 1)
        return positions, (positions < 0) | (positions > size - 1)
    return (target + 0.5) / scale - 0.5, None


def _nearest_indices(positions: np.ndarray, rounding: str, size: int) -> np.ndarray:
    below = np.floor(positions)
    fraction = positions - below
    if rounding == "round_prefer_floor":
        chosen = below + (fraction > 0.5)
    elif rounding == "round_prefer_ceil":
        chosen = below + (fraction >= 0.5)
    elif rounding == "floor":
        chosen = below
    else:
        chosen = np.ceil(positions)
    return np.clip(chosen, 0, size - 1).astype(np.intp)


def _cubic_kernel(distance: np.ndarray, a: float) -> np.ndarray:
    d = np.abs(distance)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _interpolation_taps(
    positions: np.ndarray, size: int, scale: float, mode: str, attrs: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray]:
    """The input indices (clamped to the axis) and weights that make each output of linear/cubic interpolation.
    With antialias a downscale stretches the kernel by 1/scale so every input pixel contributes."""
    support = 1 if mode == "linear" else 2
    stretch = min(scale, 1.0) if int(attrs.get("antialias", 0)) else 1.0
    first = math.floor(-support / stretch) + 1
    taps = np.floor(positions).astype(np.int64)[:, None] + np.arange(first, 2 - first)[None, :]
    distances = (taps - positions[:, None]) * stretch
    if mode == "linear":
        weights = np.clip(1 - np.abs(distances), 0, 1)
    else:
        weights = _cubic_kernel(distances, float(attrs.get("cubic_coeff_a", -0.75)))
    if stretch != 1.0:
        weights = weights / weights.sum(axis=1, keepdims=True)
    if int(attrs.get("exclude_outside", 0)):
        weights = np.where((taps < 0) | (taps >= size), 0.0, weights)
        totals = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(totals == 0, 1.0, totals)
    return np.clip(taps, 0, size - 1).astype(np.intp), weights


def _resize(x, *_, **attrs):
    plan = resize_plan(x.shape, attrs)
    mode = attr_string(attrs, "mode", "nearest", RESIZE_MODES)
    coordinates = attr_string(attrs, "coordinate_transformation_mode", "half_pixel", COORDINATE_MODES)
    rounding = attr_string(attrs, "nearest_mode", "round_prefer_floor", NEAREST_MODES)
    extrapolation = float(attrs.get("extrapolation_value", 0.0))
    result = x if mode == "nearest" else x.astype(np.float64)
    for axis, (size, output, scale) in enumerate(zip(x.shape, plan.output, plan.scales)):
        region = plan.roi[axis] if plan.roi else None
        unchanged_region = region is None or (math.isclose(region[0], 0.0) and math.isclose(region[1], 1.0))
        if output == size and math.isclose(scale, 1.0) and unchanged_region:
            continue
        positions, outside = _source_positions(coordinates, size, output, scale, region)
        if mode == "nearest":
            result = np.take(result, _nearest_indices(positions, rounding, size), axis=axis)
        else:
            taps, weights = _interpolation_taps(positions, size, scale, mode, attrs)
            gathered = np.take(result, taps, axis=axis)
            result = (gathered * weights.reshape(weights.shape + (1,) * (x.ndim - axis - 1))).sum(axis=axis + 1)
        if outside is not None and outside.any():
            mask = outside.reshape(outside.shape + (1,) * (x.ndim - axis - 1))
            result = np.where(mask, np.asarray(extrapolation, result.dtype), result)
    if result.dtype == x.dtype:
        return np.ascontiguousarray(result)
    if x.dtype.kind in "iu":
        limits = np.iinfo(x.dtype)
        result = np.clip(np.round(result), limits.min, limits.max)
    return result.astype(x.dtype)


register_op(
    "Resize",
    infer=_infer_resize,
    pattern=Pattern.INJECTIVE,
    reference=_resize,
    const_inputs=((1, "roi"), (2, "scales"), (3, "sizes")),
)


def upsample_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """Upsample (opset 7-9) is Resize with asymmetric coordinates, nearest rounding down, and scales only."""
    mode = attr_string(attrs, "mode", "nearest", ("nearest", "linear", "bilinear"), "Upsample")
    return {
        "scales": attrs.get("scales"),
        "mode": "linear" if mode == "bilinear" else mode,
        "coordinate_transformation_mode": "asymmetric",
        "nearest_mode": "floor",
    }


def _infer_upsample(types, attrs):
    if _given(attrs.get("scales")) is None:
        raise ShapeError("Upsample needs its scales, as a constant input or attribute")
    return _infer_resize(types[:1], upsample_attrs(attrs))


def _upsample(x, *_, **attrs):
    return _resize(x, **upsample_attrs(attrs))


register_op(
    "Upsample", infer=_infer_upsample, pattern=Pattern.INJECTIVE, reference=_upsample, const_inputs=((1, "scales"),)
)
