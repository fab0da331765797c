"""Tensor-expression computes of the convolutions: Conv (NCHW, grouped, depthwise), ConvNCHWc, Winograd convs,
LayoutTransform, ChannelShuffleNCHWc, ConvTranspose and its blocked form. Each mirrors its op's numpy reference
(compiler/graph/ops/conv.py, whose geometry it reuses) and tags its anchor (compute/tags.py) for the templates."""

from __future__ import annotations

from typing import Any

import compiler.te as te
from compiler.compute import tags
from compiler.compute.support import Inputs, accumulator, clamp, pad, phased_pad, reads_inside, type_of
from compiler.graph.ir import TensorType
from compiler.graph.ops.conv import (
    blocked_conv_types,
    blocked_transposed_types,
    conv_geometry,
    tiles_of,
    transposed_geometry,
    winograd_geometry,
    winograd_matrices,
)
from compiler.graph.registry import set_compute
from compiler.te.expr import Compare, Const


def _conv_reader(x: te.Tensor, window):
    """The padded input of a conv and how a window tap reads it: (padded, read(n, channel, outputs, taps))."""
    strides, dilations = window.strides, window.dilations
    if strides[-1] == 1:
        padded = pad(x, window.pads_begin, window.read_end, 0.0, "pad")

        def read(n, channel, outputs, taps):
            source = [o * s + r * d for o, s, r, d in zip(outputs, strides, taps, dilations)]
            return padded[(n, channel, *source)]

        return padded, read
    stride = strides[-1]
    padded = phased_pad(x, window.pads_begin, window.read_end, stride, "pad")

    def read(n, channel, outputs, taps):
        source = [o * s + r * d for o, s, r, d in zip(outputs[:-1], strides[:-1], taps[:-1], dilations[:-1])]
        offset = taps[-1] * dilations[-1]
        return padded[(n, channel, *source, offset % stride, outputs[-1] + offset // stride)]

    return padded, read


def conv(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    x, w, bias = (list(inputs) + [None, None])[:3]
    group, window = conv_geometry("Conv", type_of(x), type_of(w), attrs)
    rank = len(window.kernel)
    channels, filters = x.shape[1], w.shape[0]
    per_group, filters_per_group = channels // group, filters // group
    acc = accumulator(x.dtype)
    _, read = _conv_reader(x, window)
    taps = [te.reduce_axis((0, k), f"r{axis}") for axis, k in enumerate(window.kernel)]
    depthwise = per_group == 1 and group == channels and group > 1
    suffix = f"conv{rank}d"
    if depthwise:
        multiplier = filters // channels

        def body(n, m, *spatial):
            value = read(n, m // multiplier if multiplier > 1 else m, spatial, taps)
            return te.sum(value.astype(acc) * w[(m, 0, *taps)].astype(acc), axis=taps)

        tag = f"depthwise_{suffix}"
    else:
        channel = te.reduce_axis((0, per_group), "rc")

        def body(n, m, *spatial):
            first = (m // filters_per_group) * per_group + channel if group > 1 else channel
            value = read(n, first, spatial, taps)
            return te.sum(value.astype(acc) * w[(m, channel, *taps)].astype(acc), axis=[channel, *taps])

        tag = suffix if group == 1 else f"group_{suffix}"
    shape = output_types[0].shape
    result = te.compute(shape, body, name="conv", tag=tag)
    return [cast(_plain_bias(result, bias, acc), x.dtype)]


def _plain_bias(result: te.Tensor, bias: te.Tensor | None, acc: str) -> te.Tensor:
    """An NCHW (N, M, spatial...) conv's output with its per-channel bias added, or the output when there is none."""
    if bias is None:
        return result
    return te.compute(
        result.shape,
        lambda n, m, *spatial: result[(n, m, *spatial)] + bias[m].astype(acc),
        name="bias",
        tag=tags.BROADCAST,
    )


def pad_blocked(x: te.Tensor, begins, ends, fill=0.0) -> te.Tensor:
    """An NCHW[x]c tensor padded with `fill` on its two spatial axes (2 and 3 of the 5), reads clamped into the
    input."""
    batch, outer, height, width, block = x.shape
    if reads_inside(begins, ends):
        return x
    sizes = (height, width)
    shape = (batch, outer, height + begins[0] + ends[0], width + begins[1] + ends[1], block)

    def body(n, c, row, column, inner):
        inside, source = [], []
        for axis, index in enumerate((row, column)):
            position = index - begins[axis]
            if begins[axis] > 0:
                inside.append(position >= 0)
            if ends[axis] > 0:
                inside.append(position < sizes[axis])
            source.append(clamp(position, 0, sizes[axis] - 1))
        value = x[n, c, source[0], source[1], inner]
        return te.select(te.all(*inside), value, te.as_expr(fill, x.dtype)) if inside else value

    return te.compute(shape, body, name="pad", tag=tags.INJECTIVE)


def conv_nchwc(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    """A 2-D convolution in NCHW[x]c (depthwise, or groups of whole blocks) over a packed weight
    (M / x, C / group, kh, kw, x). The innermost axis of the result is the filter block: a vector over it loads the
    block's weights contiguously and broadcasts one input value (or loads the matching input channels, depthwise)."""
    x, w, bias, scale, column_sums, zero = (list(inputs) + [None] * 5)[:6]
    integer = w.dtype == "int32"  # uint8 input by int8 levels four channels to a word (graph/ops/conv.py)
    plain_x, plain_w = blocked_conv_types(type_of(x), type_of(w), attrs)
    if scale is not None:  # int8/uint8 levels, widened as read (or summed in integers) and scaled once per output
        plain_w = TensorType(plain_w.shape, plain_x.dtype)
    group, window = conv_geometry("ConvNCHWc", plain_x, plain_w, attrs)
    acc = accumulator(plain_x.dtype)
    # the integer form's padding is the zero point: its products are then taken off with the rest (column sums)
    fill = (zero[(0,) * zero.ndim] if zero is not None else 0) if integer else 0.0
    padded = pad_blocked(x, window.pads_begin, window.read_end, fill)
    taps = [te.reduce_axis((0, k), f"r{axis}") for axis, k in enumerate(window.kernel)]
    (stride_h, stride_w), (dilation_h, dilation_w) = window.strides, window.dilations
    shape = output_types[0].shape
    block = shape[-1]

    def source(row, column):
        return row * stride_h + taps[0] * dilation_h, column * stride_w + taps[1] * dilation_w

    if group > 1 and plain_w.shape[1] == 1:

        def body(n, outer, row, column, inner):
            value = padded[(n, outer, *source(row, column), inner)].astype(acc)
            return te.sum(value * w[outer, 0, taps[0], taps[1], inner].astype(acc), axis=taps)

        tag = tags.DEPTHWISE_CONV2D_NCHWC
    else:
        # a group's input blocks: group g reads blocks g * group_blocks ... (g + 1) * group_blocks - 1, and its
        # filters fill the output blocks g * filter_blocks ... (group 1: one group of them all)
        input_block = x.shape[-1]
        group_blocks = x.shape[1] // group
        filter_blocks = shape[1] // group
        channel_outer = te.reduce_axis((0, group_blocks), "rco")
        # the integer form sums a word (four channels) a step
        words = input_block // 4 if integer else input_block
        channel_inner = te.reduce_axis((0, words), "rci")

        def body(n, outer, row, column, inner):
            first = channel_outer if group == 1 else (outer // filter_blocks) * group_blocks + channel_outer
            weight = w[outer, channel_outer * words + channel_inner, taps[0], taps[1], inner]
            reduced = [channel_outer, *taps, channel_inner]
            if integer:
                inputs = [padded[(n, first, *source(row, column), 4 * channel_inner + byte)] for byte in range(4)]
                return te.sum(te.dot_bytes(inputs, weight), axis=reduced)
            value = padded[(n, first, *source(row, column), channel_inner)].astype(acc)
            return te.sum(value * weight.astype(acc), axis=reduced)

        tag = tags.CONV2D_NCHWC
    result = te.compute(shape, body, name="conv", tag=tag)
    if integer:
        integers = result

        def shifted(n, outer, row, column, inner):
            value = integers[n, outer, row, column, inner]
            if zero is not None:
                value = value - zero[(0,) * zero.ndim].astype("int32") * column_sums[outer * block + inner]
            return value.astype(acc)

        result = te.compute(shape, shifted, name="conv_shifted", tag=tags.BROADCAST)
    if scale is not None:
        result = te.compute(
            shape,
            lambda n, outer, row, column, inner: (
                result[n, outer, row, column, inner] * scale[outer * block + inner].astype(acc)
            ),
            name="conv_scaled",
            tag=tags.BROADCAST,
        )
    return [cast(_blocked_bias(result, bias, block, acc), plain_x.dtype)]


def conv_winograd(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    """A 3x3 stride-1 conv by F(m x m, 3 x 3) over filters transformed at compile time, U (alpha^2, C, M), alpha =
    m + 2, in three stages: "winograd_input" V[e, tile, c] = (B^T d B)[e] of each tile's alpha x alpha inputs d;
    "winograd_gemm" M[e] = V[e] U[e], one (tiles x C) x (C x M) matmul per point e; "winograd_output" the m x m
    outputs of each tile, A^T M A. The transforms' constant matrices are written out term by term, each point (or
    output position) a select on its index, which a schedule partitioning (or unrolling) that index's loop folds to
    its own few adds: F(4, 3) makes 36 products per 16 outputs and channel pair where the window makes 144.

    The input is NCHW[x]c (ConvWinogradNCHWc, the CPU's) or NCHW (ConvWinograd, the GPU's); the last row and column
    of tiles may reach past the output, reading zeros past the padding. ConvWinograd makes each transform in two
    halves, so that a thread making a tile's points in registers computes each product of B^T d B (A^T M A) once:
    "winograd_rows" B^T d (alpha x alpha per tile and channel) before the input transform, "winograd_columns" A^T M
    (m x alpha per tile and filter) before the output one. Written whole, F(4, 3)'s 36 points of a tile took 484
    terms, which SwiftShader took 2.9 s to compile."""
    x, u, bias = (list(inputs) + [None, None])[:3]
    blocked = x.ndim == 5
    op = "ConvWinogradNCHWc" if blocked else "ConvWinograd"
    tile, pads, (rows, columns) = winograd_geometry(type_of(x), type_of(u), attrs, op)
    bt, _, at = winograd_matrices(tile)
    alpha, acc = tile + 2, accumulator(x.dtype)
    batch, input_block = x.shape[0], x.shape[-1] if blocked else 1
    points, channels, filters = u.shape
    tile_columns = tiles_of(columns, tile)
    tiles = tiles_of(rows, tile) * tile_columns
    ends = (pads[2] + tiles_of(rows, tile) * tile - rows, pads[3] + tile_columns * tile - columns)
    padded = pad_blocked(x, pads[:2], ends) if blocked else pad(x, pads[:2], ends, 0.0, "pad")

    def value(position, channel, i, j):
        n, rest = position // tiles, position % tiles
        row, column = rest // tile_columns * tile + i, rest % tile_columns * tile + j
        if blocked:
            return padded[n, channel // input_block, row, column, channel % input_block].astype(acc)
        return padded[n, channel, row, column].astype(acc)

    def whole_point(point, position, channel):
        """A point of B^T d B, term by term (blocked)."""
        cases = [
            _linear(
                [(bt[a][i] * bt[b][j], value(position, channel, i, j)) for i in range(alpha) for j in range(alpha)], acc
            )
            for a in range(alpha)
            for b in range(alpha)
        ]
        return _select_case([point], cases)

    def point_of_halves(point, position, channel):
        """A point of B^T d B from B^T d, the stage "winograd_rows" (plain)."""
        a, b = point // alpha, point % alpha
        return _select_case(
            [b], [_linear([(line[j], half[a, j, position, channel]) for j in range(alpha)], acc) for line in bt]
        )

    if not blocked:
        half = te.compute(
            (alpha, alpha, batch * tiles, channels),
            lambda a, j, position, channel: _select_case(
                [a], [_linear([(line[i], value(position, channel, i, j)) for i in range(alpha)], acc) for line in bt]
            ),
            name="winograd_rows",
            tag=tags.WINOGRAD_ROWS,
        )
    transform_input = whole_point if blocked else point_of_halves
    v = te.compute((points, batch * tiles, channels), transform_input, name="winograd_input", tag=tags.WINOGRAD_INPUT)
    k = te.reduce_axis((0, channels), "rc")
    m = te.compute(
        (points, batch * tiles, filters),
        lambda point, position, f: te.sum(v[point, position, k] * u[point, k, f].astype(acc), axis=k),
        name="winograd_gemm",
        tag=tags.WINOGRAD_GEMM,
    )

    def transform_output(n, channel, row, column):
        position = n * tiles + row // tile * tile_columns + column // tile
        cases = [
            [
                _linear(
                    [
                        (at[p][a] * at[q][b], m[a * alpha + b, position, channel])
                        for a in range(alpha)
                        for b in range(alpha)
                    ],
                    acc,
                )
                for q in range(tile)
            ]
            for p in range(tile)
        ]
        return _select_case([row % tile, column % tile], cases)

    shape = output_types[0].shape
    if blocked:
        block = shape[-1]
        y = te.compute(
            shape,
            lambda n, outer, row, column, inner: transform_output(n, outer * block + inner, row, column),
            name="winograd_output",
            tag=tags.WINOGRAD_OUTPUT,
        )
        return [cast(_blocked_bias(y, bias, block, acc), x.dtype)]
    half_out = te.compute(
        (tile, alpha, batch * tiles, filters),
        lambda p, b, position, f: _select_case(
            [p], [_linear([(line[a], m[a * alpha + b, position, f]) for a in range(alpha)], acc) for line in at]
        ),
        name="winograd_columns",
        tag=tags.WINOGRAD_COLUMNS,
    )

    def plain_output(n, f, row, column):
        position = n * tiles + row // tile * tile_columns + column // tile
        return _select_case(
            [column % tile],
            [_linear([(line[b], half_out[row % tile, b, position, f]) for b in range(alpha)], acc) for line in at],
        )

    y = te.compute(shape, plain_output, name="winograd_output", tag=tags.WINOGRAD_OUTPUT)
    return [cast(_plain_bias(y, bias, acc), x.dtype)]


def _linear(terms, dtype: str):
    """The sum of coefficient x value over `terms`, zero coefficients left out and +-1 as an add or subtract."""
    total = None
    for coefficient, value in terms:
        if coefficient == 0:
            continue
        negative = coefficient < 0
        scaled = value if abs(coefficient) == 1 else value * te.const(float(abs(coefficient)), dtype)
        if total is None:
            total = -scaled if negative else scaled
        else:
            total = total - scaled if negative else total + scaled
    return total if total is not None else te.const(0.0, dtype)


def _select_case(indices, cases):
    """cases[i][j]... for the index values `indices`, as chains of selects `index <= k`: the tests that partitioning
    the indices' loops (Stage.partition) cuts into one piece per value, each with its selects folded."""
    if not indices:
        return cases
    index, rest = te.as_expr(indices[0]), indices[1:]
    result = _select_case(rest, cases[-1])
    for position in range(len(cases) - 2, -1, -1):
        result = te.select(index <= position, _select_case(rest, cases[position]), result)
    return result


def _blocked_bias(result: te.Tensor, bias: te.Tensor | None, block: int, acc: str) -> te.Tensor:
    """A blocked (N, C/x, H, W, x) conv's output with its per-channel bias added, or the output when there is none."""
    if bias is None:
        return result
    return te.compute(
        result.shape,
        lambda n, outer, row, column, inner: (
            result[n, outer, row, column, inner] + bias[outer * block + inner].astype(acc)
        ),
        name="bias",
        tag=tags.BROADCAST,
    )


def layout_transform(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    (x,) = inputs[:1]
    shape = output_types[0].shape
    if len(shape) == 5:
        block, channels = shape[-1], x.shape[1]

        def body(n, outer, h, w, inner):
            channel = outer * block + inner
            source = (n, te.minimum(channel, channels - 1), *((w,) if x.ndim == 3 else (h, w)))
            if channels % block == 0:
                return x[(n, channel, *source[2:])]
            # the channels past the last whole block are zeros
            return te.select(channel < channels, x[source], te.const(0.0, x.dtype))

        return [te.compute(shape, body, name="nchwc", tag=tags.INJECTIVE)]
    block = x.shape[-1]
    if len(shape) == 3:  # a 1-D value, blocked as a row of height 1
        return [te.compute(shape, lambda n, c, w: x[n, c // block, 0, w, c % block], name="nchw", tag=tags.LAYOUT_NCHW)]
    return [te.compute(shape, lambda n, c, h, w: x[n, c // block, h, w, c % block], name="nchw", tag=tags.LAYOUT_NCHW)]


def channel_shuffle_nchwc(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    """Output channel o = ob * x + lane is input channel (o % g) * (C / g) + o // g, with g dividing x and x dividing
    C / g: block (lane % g) * (C / g / x) + ob // g, lane (ob % g) * (x / g) + lane // g. One load per group, each
    `start + lane // g` (a run each lane of which repeats g times: codegen's load_repeated), and a select on lane % g;
    through NCHW the shuffle was a division chain and a gather per element."""
    (x,) = inputs[:1]
    groups = int(attrs["groups"])
    block = x.shape[-1]
    stride = x.shape[1] // groups  # blocks per group

    def body(n, outer, h, w, lane):
        column = (outer % groups) * (block // groups) + lane // groups
        value = x[n, (groups - 1) * stride + outer // groups, h, w, column]
        for group in reversed(range(groups - 1)):
            value = te.select(
                Compare("eq", lane % groups, Const(group, "int32")),
                x[n, group * stride + outer // groups, h, w, column],
                value,
            )
        return value

    return [te.compute(output_types[0].shape, body, name="shuffle", tag=tags.INJECTIVE)]


def cast(tensor: te.Tensor, dtype: str) -> te.Tensor:
    if tensor.dtype == dtype:
        return tensor
    return te.compute(tensor.shape, lambda *i: tensor[i].astype(dtype), name="cast", tag=tags.ELEMWISE)


def _transposed_taps(geometry, spatial):
    """The reduce axes of a transposed conv's taps and how an output position reads through them:
    read(outputs) -> (conditions, input positions, taps). Output o takes input i through tap t where
    i * stride + t * dilation == o + pad. With dilation 1 (and no negative pad) only the taps of o's phase
    (t = (o + pad) mod stride + stride * j) can meet that, so the loop runs over ceil(k / stride) of them, not all k
    with a test each (a 2x2 stride-2 upsampling reads one tap per output, not four)."""
    axes, kinds = [], []
    for axis, kernel in enumerate(geometry.kernel):
        stride, phased = geometry.strides[axis], geometry.dilations[axis] == 1 and geometry.pads_begin[axis] >= 0
        phased = phased and stride > 1
        axes.append(te.reduce_axis((0, -(-kernel // stride) if phased else kernel), f"r{axis}"))
        kinds.append(phased)

    def read(outputs):
        conditions, source, taps = [], [], []
        for axis, (tap_axis, phased) in enumerate(zip(axes, kinds)):
            stride, kernel = geometry.strides[axis], geometry.kernel[axis]
            shifted = outputs[axis] + geometry.pads_begin[axis]
            if phased:
                tap = shifted % stride + tap_axis * stride
                position = shifted // stride - tap_axis
                conditions += [tap < kernel] if kernel % stride else []
                conditions.append(position >= 0)
            else:
                tap = tap_axis
                offset = shifted - tap_axis * geometry.dilations[axis]
                position = offset // stride if stride > 1 else offset
                if stride > 1:
                    conditions.append(te.Compare("eq", offset % stride, te.const(0)))
                conditions.append(offset >= 0)
            conditions.append(position < spatial[axis])
            source.append(clamp(position, 0, spatial[axis] - 1))
            taps.append(clamp(tap, 0, kernel - 1) if phased and kernel % stride else tap)
        return conditions, source, taps

    return axes, read


def conv_transpose(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    x, w, bias = (list(inputs) + [None, None])[:3]
    group, geometry = transposed_geometry(type_of(x), type_of(w), attrs)
    per_group = x.shape[1] // group
    filters_per_group = w.shape[1]
    acc = accumulator(x.dtype)
    channel = te.reduce_axis((0, per_group), "rc")
    taps, read = _transposed_taps(geometry, x.shape[2:])

    def body(n, m, *outputs):
        conditions, source, tap = read(outputs)
        first = (m // filters_per_group) * per_group + channel
        value = x[(n, first, *source)].astype(acc) * w[(first, m % filters_per_group, *tap)].astype(acc)
        return te.sum(te.select(te.all(*conditions), value, 0.0), axis=[channel, *taps])

    shape = output_types[0].shape
    result = te.compute(shape, body, name="conv_transpose", tag=f"conv{len(taps)}d_transpose")
    if bias is not None:
        plain = result
        result = te.compute(
            shape, lambda n, m, *s: plain[(n, m, *s)] + bias[m].astype(acc), name="bias", tag=tags.BROADCAST
        )
    return [cast(result, x.dtype)]


def conv_transpose_nchwc(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    """A group-1 ConvTranspose in NCHW[x]c over a packed (M / x, C, kh, kw, x) weight: the innermost axis is the
    filter block, so a vector over it loads the block's weights contiguously and broadcasts one input value."""
    x, w, bias = (list(inputs) + [None, None])[:3]
    plain_x, plain_w = blocked_transposed_types(type_of(x), type_of(w))
    _, geometry = transposed_geometry(plain_x, plain_w, attrs)
    acc = accumulator(x.dtype)
    input_block = x.shape[-1]
    channel_outer = te.reduce_axis((0, x.shape[1]), "rco")
    channel_inner = te.reduce_axis((0, input_block), "rci")
    taps, read = _transposed_taps(geometry, x.shape[2:4])
    shape = output_types[0].shape
    block = shape[-1]

    def body(n, outer, row, column, inner):
        conditions, source, tap = read((row, column))
        value = x[(n, channel_outer, *source, channel_inner)].astype(acc)
        weight = w[(outer, channel_outer * input_block + channel_inner, *tap, inner)].astype(acc)
        return te.sum(te.select(te.all(*conditions), value * weight, 0.0), axis=[channel_outer, *taps, channel_inner])

    result = te.compute(shape, body, name="conv_transpose", tag=tags.CONV2D_TRANSPOSE_NCHWC)
    return [cast(_blocked_bias(result, bias, block, acc), x.dtype)]


set_compute("Conv", conv)
set_compute("ConvNCHWc", conv_nchwc)
set_compute("ConvWinogradNCHWc", conv_winograd)
set_compute("ConvWinograd", conv_winograd)
set_compute("LayoutTransform", layout_transform)
set_compute("ChannelShuffleNCHWc", channel_shuffle_nchwc)
set_compute("ConvTranspose", conv_transpose)
set_compute("ConvTransposeNCHWc", conv_transpose_nchwc)
