"""Convolutions: Conv, its NCHW[x]c forms (LayoutTransform, ChannelShuffleNCHWc, ConvNCHWc), Winograd convs
(ConvWinogradNCHWc) and ConvTranspose (and its blocked form): shape rules, patterns and numpy references (im2col +
matmul), and the weight layouts alter_layout and the Winograd pass build."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from compiler.errors import ShapeError
from compiler.graph.ir import TensorType
from compiler.graph.ops.checks import compute_dtype, float_input, op_inputs
from compiler.graph.ops.window import Window, auto_pads, explicit_pads, spatial_attr, window_of, window_view
from compiler.graph.registry import Pattern, register_op


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
    return group, window_of(op, tuple(x.shape[2:]), kernel, attrs)


def _infer_conv(types, attrs):
    x, w, bias = op_inputs("Conv", types, 2, 3)
    float_input("Conv", x)
    group, window = conv_geometry("Conv", x, w, attrs)
    if bias is not None and bias.shape != (w.shape[0],):
        raise ShapeError(f"Conv bias has shape {list(bias.shape)}; it needs ({w.shape[0]},), one per filter")
    return [TensorType((x.shape[0], w.shape[0], *window.output), x.dtype)]


def _conv(x, w, bias=None, *, group=1, **attrs):
    group = int(group)
    _, window = conv_geometry(
        "Conv", TensorType(x.shape, str(x.dtype)), TensorType(w.shape, str(w.dtype)), {**attrs, "group": group}
    )
    dtype = compute_dtype(x.dtype)
    batch, channels = x.shape[:2]
    filters, rank = w.shape[0], len(window.kernel)
    view = window_view(x.astype(dtype, copy=False), window, 0)
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
    (x,) = op_inputs("LayoutTransform", types, 1, 1)
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
    (x,) = op_inputs("ChannelShuffleNCHWc", types, 1, 1)
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
    """The NCHW input and OIHW weight types a ConvNCHWc stands for (float32 ones for int32 weight words: the conv
    on the levels they hold); ShapeError unless it is a 2-D conv with group 1, a depthwise one (group = channels = filters) whose input and filter blocks agree, or one whose groups
    hold whole blocks of input channels and of filters."""
    if len(x.shape) != 5 or len(w.shape) != 5:
        raise ShapeError(
            f"ConvNCHWc needs an NCHW[x]c input and a packed (M/x, C/group, kh, kw, x) weight, "
            f"got {list(x.shape)} and {list(w.shape)}"
        )
    plain_x = TensorType((x.shape[0], x.shape[1] * x.shape[-1], *x.shape[2:4]), x.dtype)
    plain_w = TensorType(unpack_weight(w.shape), w.dtype)
    if w.dtype == "int32":  # int8 levels four input channels to a word (pack_conv_words): a float32 conv on levels
        plain_x = TensorType(plain_x.shape, "float32")
        plain_w = TensorType((plain_w.shape[0], 4 * plain_w.shape[1], *plain_w.shape[2:]), "float32")
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
    x, w, bias, scale, column_sums, zero = op_inputs("ConvNCHWc", types, 2, 6)
    if w.dtype == "int32":
        return _infer_integer_conv(x, w, bias, scale, column_sums, zero, attrs)
    if column_sums is not None or zero is not None:
        raise ShapeError("ConvNCHWc takes column sums and a zero point only with int32 weight words")
    plain_x, plain_w = blocked_conv_types(x, w, attrs)
    if scale is not None:
        # a narrow weight: int8/uint8 levels, widened and scaled per output channel by the kernel
        if w.dtype not in ("int8", "uint8") or x.dtype != "float32" or scale.shape != (plain_w.shape[0],):
            raise ShapeError(
                f"ConvNCHWc with a scale takes int8/uint8 levels of a float32 conv and one scale per filter "
                f"({plain_w.shape[0]}); got {w.dtype} levels and a scale of shape {list(scale.shape)}"
            )
        plain_w = TensorType(plain_w.shape, x.dtype)
    return _blocked_output(plain_x, plain_w, bias, attrs, w.shape[-1])


def _blocked_output(plain_x: TensorType, plain_w: TensorType, bias, attrs, block: int) -> list[TensorType]:
    """The NCHW[block]c output type of the plain conv a ConvNCHWc stands for."""
    (plain,) = _infer_conv([plain_x, plain_w, bias], attrs)
    return [TensorType((plain.shape[0], plain.shape[1] // block, *plain.shape[2:], block), plain.dtype)]


def _infer_integer_conv(x, w, bias, scale, column_sums, zero, attrs):
    """A group-1 ConvNCHWc of uint8 activations by int8 levels packed four input channels to an int32 word
    (pack_conv_words), a scale and column sum per filter, A's zero point: float32 output
    ((sum of products - zero * column sum) * scale + bias)."""
    plain_x, plain_w = blocked_conv_types(x, w, attrs)
    filters = (plain_w.shape[0],)
    if x.dtype != "uint8" or int(attrs.get("group", 1)) != 1 or x.shape[-1] % 4:
        raise ShapeError(
            f"ConvNCHWc with int32 weight words takes uint8 input in blocks of a multiple of 4 channels, group 1; "
            f"got {x.dtype} input {list(x.shape)}, group {attrs.get('group', 1)}"
        )
    if scale is None or scale.shape != filters or (column_sums is not None and column_sums.shape != filters):
        raise ShapeError(f"ConvNCHWc with int32 weight words takes a scale and column sums per filter ({filters[0]})")
    if (column_sums is None) != (zero is None) or (zero is not None and (zero.dtype != "uint8" or zero.size != 1)):
        raise ShapeError("ConvNCHWc takes the input's zero point (one uint8) with its weight's int32 column sums")
    return _blocked_output(plain_x, plain_w, bias, attrs, w.shape[-1])


def pack_conv_words(packed: np.ndarray) -> np.ndarray:
    """A packed (M/x, C, kh, kw, x) int8 weight, C a multiple of 4 -> (M/x, C/4, kh, kw, x) int32 words, word g
    holding channels 4g .. 4g + 3 lowest byte first (te.dot_bytes' order)."""
    blocks, channels, *rest = packed.shape
    grouped = packed.astype(np.int8).reshape(blocks, channels // 4, 4, *rest)
    return np.ascontiguousarray(np.moveaxis(grouped, 2, -1)).view("<i4").reshape(blocks, channels // 4, *rest)


def unpack_conv_words(words: np.ndarray) -> np.ndarray:
    """pack_conv_words' packed int8 weight."""
    levels = np.ascontiguousarray(words).astype("<i4").view(np.int8).reshape(*words.shape, 4)
    blocks, groups, *rest = words.shape
    return np.moveaxis(levels, -1, 2).reshape(blocks, 4 * groups, *rest)


def _conv_nchwc(x, w, bias=None, scale=None, column_sums=None, zero=None, **attrs):
    if w.dtype == np.int32:
        # sum((x - zero) * w): the same as the kernel's sum(x * w) - zero * sum(w) over zero-point padding
        levels = unpack_conv_words(w)
        weight = np.moveaxis(levels, -1, 1).reshape(unpack_weight(levels.shape)).astype(np.float64)
        shifted = unblock_channels(x).astype(np.float64) - (0 if zero is None else float(zero.reshape(-1)[0]))
        accumulator = _conv(shifted, weight, None, **attrs).astype(np.float32)
        result = accumulator * scale.astype(np.float32).reshape(1, -1, 1, 1)
        if bias is not None:
            result = result + bias.astype(np.float32).reshape(1, -1, 1, 1)
        return block_channels(result, w.shape[-1])
    weight = np.moveaxis(w, -1, 1).reshape(unpack_weight(w.shape))
    if scale is not None:
        weight = weight.astype(np.float32) * scale.astype(np.float32).reshape(-1, *[1] * (weight.ndim - 1))
    return block_channels(_conv(unblock_channels(x), weight, bias, **attrs), w.shape[-1])


register_op("ConvNCHWc", infer=_infer_conv_nchwc, pattern=Pattern.OUT_EWISE_FUSABLE, reference=_conv_nchwc)


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
        x, u, bias = op_inputs(op, types, 2, 3)
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
    alpha, dtype = tile + 2, compute_dtype(x.dtype)
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
    strides = spatial_attr(op, attrs, "strides", rank, 1)
    dilations = spatial_attr(op, attrs, "dilations", rank, 1)
    output_padding = tuple(int(p) for p in attrs.get("output_padding") or (0,) * rank)
    if len(output_padding) != rank:
        raise ShapeError(f"{op} output_padding={list(output_padding)} needs {rank} values")
    auto_pad = auto_pads(op, attrs)
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
        begins, ends = explicit_pads(op, attrs, rank) if auto_pad == "NOTSET" else ((0,) * rank, (0,) * rank)
        output = tuple(f - b - e for f, b, e in zip(full, begins, ends))
    if any(o < 1 for o in output):
        raise ShapeError(f"{op} output spatial shape {list(output)} is empty; check pads and output_shape")
    return group, TransposedGeometry(kernel, strides, dilations, begins, output)


def _infer_conv_transpose(types, attrs):
    x, w, bias = op_inputs("ConvTranspose", types, 2, 3)
    float_input("ConvTranspose", x)
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
    dtype = compute_dtype(x.dtype)
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
    x, w, bias = op_inputs("ConvTransposeNCHWc", types, 2, 3)
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
