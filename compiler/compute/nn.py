"""Tensor-expression computes of the nn ops: convolution, Gemm/MatMul, pooling, normalisation, softmax, resize.

Each compute mirrors the numpy reference of its registry entry (`compiler/graph/ops/nn.py`, whose geometry helpers it
reuses) and tags its stages so `compiler/schedules/` can pick a template: the anchors are tagged "conv2d",
"group_conv2d", "depthwise_conv2d", their blocked forms "conv2d_nchwc" and "depthwise_conv2d_nchwc" (ConvNCHWc),
"conv2d_transpose", "dense" (its split-K partial sums "dense_partial"), "batch_matmul", "dense_packed" (MatMulPacked),
Attention's "attention_scores", "attention_max", "attention_exp", "attention_sum" and "attention", the Winograd convs'
"winograd_input", "winograd_gemm" and "winograd_output", "pool_max", "pool_avg",
"global_pool", "softmax", "log_softmax", "layer_norm"; other reductions "reduce", padding stages and
LayoutTransform into NCHW[x]c "injective", back to NCHW "layout_nchw" (a loop order of its own), epilogues
"elemwise"/"broadcast", and a stage made once for several readers
(softmax's exponentials) te.tensor.STASH.
"""

from __future__ import annotations

import math
from typing import Any

import compiler.te as te
from compiler.compute import tags
from compiler.errors import UnsupportedOpError
from compiler.graph.ir import TensorType
from compiler.graph.ops.common import normalize_axes, normalize_axis
from compiler.graph.ops.nn import (
    COORDINATE_MODES,
    NEAREST_MODES,
    RESIZE_MODES,
    attr_string,
    blocked_conv_types,
    blocked_transposed_types,
    conv_geometry,
    pool_geometry,
    resize_plan,
    stash_dtype,
    tiles_of,
    transposed_geometry,
    upsample_attrs,
    winograd_geometry,
    winograd_matrices,
)
from compiler.graph.registry import set_compute
from compiler.te.expr import Compare, Const
from compiler.te.tensor import STASH, identity_element

Inputs = list[te.Tensor | None]


def _unsupported(op: str, what: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"op {op} {what} has no kernel yet; remove it from the model or rewrite it", {op: []})


def _accumulator(dtype: str) -> str:
    """float16 accumulates in float32, as the reference computes it."""
    return "float32" if dtype == "float16" else dtype


def _type(tensor: te.Tensor) -> TensorType:
    return TensorType(tuple(tensor.shape), tensor.dtype)


def _plain_of_blocked(x: te.Tensor) -> TensorType:
    """The NCHW type an NCHW[x]c tensor stands for."""
    return TensorType((x.shape[0], x.shape[1] * x.shape[-1], *x.shape[2:4]), x.dtype)


def _lowest(dtype: str) -> te.Const:
    return identity_element("max", dtype)


def _clamp(index, low: int, high: int):
    return te.maximum(te.minimum(index, high), low)


def _reads_inside(begins, ends) -> bool:
    """Whether a window's reads stay inside its input: no padding before, and none after (a negative end is the
    input's unread last rows, which the reader's indices never reach). Such a pad or crop is the input itself; a
    crop copy cost a strided 1x1 conv a pass over its input (resnet50's 512 -> 1024-channel shortcut on 14 x 14)."""
    return not any(begins) and all(end <= 0 for end in ends)


def pad(x: te.Tensor, begins, ends, fill, name: str) -> te.Tensor:
    """`x` with its trailing spatial axes padded by `begins`/`ends` (negative ends crop). The read is clamped into
    the input so it is always in bounds: the select then stays a plain select that vectorizes."""
    rank = len(begins)
    lead = x.ndim - rank
    if _reads_inside(begins, ends):
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
            source.append(_clamp(position, 0, spatial[axis] - 1))
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
            source.append(_clamp(position, 0, spatial[axis] - 1))
        return te.select(te.all(*inside), x[tuple(source)], te.const(0.0, x.dtype))

    return te.compute(shape, body, name=name, tag=tags.INJECTIVE)


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


# -- Conv ---------------------------------------------------------------------------------------------------------


def conv(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    x, w, bias = (list(inputs) + [None, None])[:3]
    group, window = conv_geometry("Conv", _type(x), _type(w), attrs)
    rank = len(window.kernel)
    channels, filters = x.shape[1], w.shape[0]
    per_group, filters_per_group = channels // group, filters // group
    acc = _accumulator(x.dtype)
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
    return [_cast(_plain_bias(result, bias, acc), x.dtype)]


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


def _pad_blocked(x: te.Tensor, begins, ends, fill=0.0) -> te.Tensor:
    """An NCHW[x]c tensor padded with `fill` on its two spatial axes (2 and 3 of the 5), reads clamped into the
    input."""
    batch, outer, height, width, block = x.shape
    if _reads_inside(begins, ends):
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
            source.append(_clamp(position, 0, sizes[axis] - 1))
        value = x[n, c, source[0], source[1], inner]
        return te.select(te.all(*inside), value, te.as_expr(fill, x.dtype)) if inside else value

    return te.compute(shape, body, name="pad", tag=tags.INJECTIVE)


def conv_nchwc(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    """A 2-D convolution in NCHW[x]c (depthwise, or groups of whole blocks) over a packed weight
    (M / x, C / group, kh, kw, x). The innermost axis of the result is the filter block: a vector over it loads the
    block's weights contiguously and broadcasts one input value (or loads the matching input channels, depthwise)."""
    x, w, bias = (list(inputs) + [None, None])[:3]
    plain_x, plain_w = blocked_conv_types(_type(x), _type(w), attrs)
    group, window = conv_geometry("ConvNCHWc", plain_x, plain_w, attrs)
    acc = _accumulator(x.dtype)
    padded = _pad_blocked(x, window.pads_begin, window.read_end)
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
        channel_inner = te.reduce_axis((0, input_block), "rci")

        def body(n, outer, row, column, inner):
            first = channel_outer if group == 1 else (outer // filter_blocks) * group_blocks + channel_outer
            value = padded[(n, first, *source(row, column), channel_inner)].astype(acc)
            weight = w[outer, channel_outer * input_block + channel_inner, taps[0], taps[1], inner].astype(acc)
            return te.sum(value * weight, axis=[channel_outer, *taps, channel_inner])

        tag = tags.CONV2D_NCHWC
    result = te.compute(shape, body, name="conv", tag=tag)
    return [_cast(_blocked_bias(result, bias, block, acc), x.dtype)]


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
    tile, pads, (rows, columns) = winograd_geometry(_type(x), _type(u), attrs, op)
    bt, _, at = winograd_matrices(tile)
    alpha, acc = tile + 2, _accumulator(x.dtype)
    batch, input_block = x.shape[0], x.shape[-1] if blocked else 1
    points, channels, filters = u.shape
    tile_columns = tiles_of(columns, tile)
    tiles = tiles_of(rows, tile) * tile_columns
    ends = (pads[2] + tiles_of(rows, tile) * tile - rows, pads[3] + tile_columns * tile - columns)
    padded = _pad_blocked(x, pads[:2], ends) if blocked else pad(x, pads[:2], ends, 0.0, "pad")

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
        return [_cast(_blocked_bias(y, bias, block, acc), x.dtype)]
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
    return [_cast(_plain_bias(y, bias, acc), x.dtype)]


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


def max_pool_nchwc(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    """MaxPool over the spatial axes of an NCHW[x]c tensor: a vector over the channel block loads contiguously."""
    (x,) = inputs[:1]
    window = pool_geometry("MaxPoolNCHWc", _plain_of_blocked(x), attrs)
    padded = _pad_blocked(x, window.pads_begin, window.read_end, _lowest(x.dtype))
    taps = [te.reduce_axis((0, k), f"r{axis}") for axis, k in enumerate(window.kernel)]

    def body(n, outer, row, column, inner):
        source = _window_source(window, (row, column), taps)
        return te.max(padded[(n, outer, *source, inner)], axis=taps)

    return [te.compute(output_types[0].shape, body, name="max_pool", tag=tags.POOL_MAX)]


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


def _cast(tensor: te.Tensor, dtype: str) -> te.Tensor:
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
            source.append(_clamp(position, 0, spatial[axis] - 1))
            taps.append(_clamp(tap, 0, kernel - 1) if phased and kernel % stride else tap)
        return conditions, source, taps

    return axes, read


def conv_transpose(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    x, w, bias = (list(inputs) + [None, None])[:3]
    group, geometry = transposed_geometry(_type(x), _type(w), attrs)
    per_group = x.shape[1] // group
    filters_per_group = w.shape[1]
    acc = _accumulator(x.dtype)
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
    return [_cast(result, x.dtype)]


def conv_transpose_nchwc(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    """A group-1 ConvTranspose in NCHW[x]c over a packed (M / x, C, kh, kw, x) weight: the innermost axis is the
    filter block, so a vector over it loads the block's weights contiguously and broadcasts one input value."""
    x, w, bias = (list(inputs) + [None, None])[:3]
    plain_x, plain_w = blocked_transposed_types(_type(x), _type(w))
    _, geometry = transposed_geometry(plain_x, plain_w, attrs)
    acc = _accumulator(x.dtype)
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
    return [_cast(_blocked_bias(result, bias, block, acc), x.dtype)]


# -- Gemm and MatMul ------------------------------------------------------------------------------------------------


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
    acc = _accumulator(a.dtype)
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
    return [_cast(result, a.dtype)]


def matmul(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    a, b = inputs[:2]
    shape = output_types[0].shape
    acc = _accumulator(a.dtype)
    k = te.reduce_axis((0, a.shape[-1]), "k")
    if a.ndim == 2 and b.ndim == 2:
        result = te.compute(
            shape, lambda i, j: te.sum(a[i, k].astype(acc) * b[k, j].astype(acc), axis=k), name="dense", tag=tags.DENSE
        )
        return [_cast(result, a.dtype)]
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
    return [_cast(result, a.dtype)]


def matmul_packed(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    """A by a weight packed into column panels (compiler/graph/ops/nn.py, pack_dense_weight): column j of B is lane
    j % panel of panel j // panel, so a schedule that tiles the columns by the panel reads each panel at unit stride."""
    a, w = inputs[:2]
    shape = output_types[0].shape
    acc = _accumulator(a.dtype)
    panel = w.shape[-1]
    k = te.reduce_axis((0, a.shape[-1]), "k")

    def body(*index):
        *rows, j = index
        return te.sum(a[(*rows, k)].astype(acc) * w[j // panel, k, j % panel].astype(acc), axis=k)

    result = te.compute(shape, body, name="dense_packed", tag=tags.DENSE_PACKED)
    return [_cast(result, a.dtype)]


def attention(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    """softmax(Q Kt * scale + mask) V in stages a schedule can make per tile of query rows: the scores
    ("attention_scores"), their row maximum ("attention_max"), the exponentials ("attention_exp"), their row sum
    ("attention_sum"), the exponentials' product with V ("attention"), divided by the sum as it is stored: each
    output is one division, not one per key. With nan_to_zero a row whose weights are NaN (every key masked) is
    zeros, as Where(IsNaN(p), 0, p) before the product makes it."""
    q, kt, v, mask = (list(inputs) + [None])[:4]
    *batch, rows, depth = q.shape
    columns, width = kt.shape[-1], v.shape[-1]
    acc = _accumulator(q.dtype)
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
    return [_cast(result, q.dtype)]


# -- pooling --------------------------------------------------------------------------------------------------------


def _window_source(window, spatial, taps):
    return [o * s + r * d for o, s, r, d in zip(spatial, window.strides, taps, window.dilations)]


def max_pool(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    (x,) = inputs[:1]
    window = pool_geometry("MaxPool", _type(x), attrs)
    taps = [te.reduce_axis((0, k), f"r{axis}") for axis, k in enumerate(window.kernel)]
    padded = pad(x, window.pads_begin, window.read_end, _lowest(x.dtype), "pad")

    def body(n, c, *spatial):
        return te.max(padded[(n, c, *_window_source(window, spatial, taps))], axis=taps)

    values = te.compute(output_types[0].shape, body, name="max_pool", tag=tags.POOL_MAX)
    if len(output_types) == 1:
        return [values]
    return [values, _argmax_indices(x, padded, values, window, int(attrs.get("storage_order", 0)))]


def _argmax_indices(x: te.Tensor, padded: te.Tensor, values: te.Tensor, window, storage_order: int) -> te.Tensor:
    """MaxPool's Indices: the first tap (row-major over the window, as numpy's argmax) holding the maximum, as a
    flat index into the unpadded input (its spatial axes row-major, or column-major with storage_order=1)."""
    kernel, rank = window.kernel, len(window.kernel)
    spatial_sizes = x.shape[2:]
    taps = [te.reduce_axis((0, k), f"t{axis}") for axis, k in enumerate(kernel)]
    count = math.prod(kernel)

    def first_tap(n, c, *spatial):
        ordinal = taps[0]
        for axis in range(1, rank):
            ordinal = ordinal * kernel[axis] + taps[axis]
        value = padded[(n, c, *_window_source(window, spatial, taps))]
        hit = te.Compare("eq", value, values[(n, c, *spatial)])
        return te.min(te.select(hit, ordinal, te.const(count)), axis=taps)

    tap = te.compute(values.shape, first_tap, name="max_pool_tap", tag=tags.REDUCE)
    if storage_order:
        strides = [math.prod(spatial_sizes[:axis]) for axis in range(rank)]
    else:
        strides = [math.prod(spatial_sizes[axis + 1 :]) for axis in range(rank)]

    def index(n, c, *spatial):
        ordinal = tap[(n, c, *spatial)]
        flat = (n * x.shape[1] + c).astype("int64") * math.prod(spatial_sizes)
        for axis in reversed(range(rank)):
            offset = ordinal % kernel[axis] if axis else ordinal
            ordinal = ordinal // kernel[axis]
            position = spatial[axis] * window.strides[axis] - window.pads_begin[axis] + offset * window.dilations[axis]
            flat = flat + position.astype("int64") * strides[axis]
        return flat

    return te.compute(values.shape, index, name="max_pool_indices", tag=tags.ELEMWISE)


def _count(base, kernel: int, dilation: int, low: int, high: int):
    """How many taps r in [0, kernel) put base + r * dilation inside [low, high): a closed form, so the
    divisor of an average pool costs a few integer ops per output, not a loop."""
    smallest = te.maximum((low - base + dilation - 1) // dilation, 0)
    largest = te.minimum((high - 1 - base) // dilation, kernel - 1)
    return te.maximum(largest - smallest + 1, 0)


def _average_pool(blocked: bool):
    """AveragePool over NCHW, or (blocked) over the spatial axes of NCHW[x]c, where a vector over the channel
    block loads contiguously; the divisor is each window's count of counted positions."""

    def compute(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
        (x,) = inputs[:1]
        plain = _plain_of_blocked(x) if blocked else _type(x)
        window = pool_geometry("AveragePool", plain, attrs)
        include_pad = bool(int(attrs.get("count_include_pad", 0)))
        acc = _accumulator(x.dtype)
        rank = len(window.kernel)
        taps = [te.reduce_axis((0, k), f"r{axis}") for axis, k in enumerate(window.kernel)]
        shape = output_types[0].shape
        if blocked:
            padded = _pad_blocked(x, window.pads_begin, window.read_end)

            def read(n, c, rest):
                return padded[(n, c, *_window_source(window, rest[:rank], taps), *rest[rank:])]

        else:
            padded = pad(x, window.pads_begin, window.read_end, 0.0, "pad")

            def read(n, c, rest):
                return padded[(n, c, *_window_source(window, rest, taps))]

        def body(n, c, *rest):
            return te.sum(read(n, c, rest).astype(acc), axis=taps)

        sums = te.compute(shape, body, name="pool_sum", tag=tags.POOL_AVG)
        sizes = plain.shape[2:]

        def divide(*index):
            count = None
            for axis, o in enumerate(index[2 : 2 + rank]):
                begin = window.pads_begin[axis]
                low = -begin if include_pad else 0
                high = sizes[axis] + window.declared_end[axis] if include_pad else sizes[axis]
                base = o * window.strides[axis] - begin
                term = _count(base, window.kernel[axis], window.dilations[axis], low, high)
                count = term if count is None else count * term
            return (sums[index] / count.astype(acc)).astype(x.dtype)

        return [te.compute(shape, divide, name="average_pool", tag=tags.ELEMWISE)]

    return compute


def _power(value, p: float):
    """|value| ** p, with the common orders as plain arithmetic rather than exp/log."""
    magnitude = te.abs(value)
    if p == 1:
        return magnitude
    if p == 2:
        return value * value
    return te.pow(magnitude, float(p))


def _root(value, p: float):
    if p == 1:
        return value
    if p == 2:
        return te.sqrt(value)
    return te.pow(value, 1.0 / p)


def lp_pool(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    (x,) = inputs[:1]
    p = float(attrs.get("p", 2))
    window = pool_geometry("LpPool", _type(x), attrs)
    acc = _accumulator(x.dtype)
    padded = pad(x, window.pads_begin, window.read_end, 0.0, "pad")
    taps = [te.reduce_axis((0, k), f"r{axis}") for axis, k in enumerate(window.kernel)]
    shape = output_types[0].shape

    def body(n, c, *spatial):
        value = padded[(n, c, *_window_source(window, spatial, taps))].astype(acc)
        return te.sum(_power(value, p), axis=taps)

    sums = te.compute(shape, body, name="lp_pool_sum", tag=tags.POOL_AVG)
    return [te.compute(shape, lambda *i: _root(sums[i], p).astype(x.dtype), name="lp_pool", tag=tags.ELEMWISE)]


def global_lp_pool(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    (x,) = inputs[:1]
    p = float(attrs.get("p", 2))
    acc = _accumulator(x.dtype)
    taps = [te.reduce_axis((0, size), f"r{axis}") for axis, size in enumerate(x.shape[2:])]
    shape = output_types[0].shape
    sums = te.compute(
        shape,
        lambda n, c, *_: te.sum(_power(x[(n, c, *taps)].astype(acc), p), axis=taps),
        name="global_lp_sum",
        tag=tags.GLOBAL_POOL,
    )
    return [te.compute(shape, lambda *i: _root(sums[i], p).astype(x.dtype), name="global_lp_pool", tag=tags.ELEMWISE)]


def _global_pool(combiner: str):
    def compute(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
        (x,) = inputs[:1]
        acc = _accumulator(x.dtype)
        spatial = x.shape[2:]
        taps = [te.reduce_axis((0, size), f"r{axis}") for axis, size in enumerate(spatial)]
        shape = output_types[0].shape
        if combiner == "max":
            return [
                te.compute(
                    shape, lambda n, c, *_: te.max(x[(n, c, *taps)], axis=taps), name="global_max", tag=tags.GLOBAL_POOL
                )
            ]
        sums = te.compute(
            shape,
            lambda n, c, *_: te.sum(x[(n, c, *taps)].astype(acc), axis=taps),
            name="global_sum",
            tag=tags.GLOBAL_POOL,
        )
        count = math.prod(spatial)
        return [
            te.compute(
                shape, lambda *i: (sums[i] / float(count)).astype(x.dtype), name="global_average", tag=tags.ELEMWISE
            )
        ]

    return compute


# -- normalisation --------------------------------------------------------------------------------------------------


def _channel(tensor: te.Tensor, c, dtype: str):
    return tensor[c].astype(dtype)


def batch_norm(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    x, scale, bias, mean, variance = inputs[:5]
    epsilon = float(attrs.get("epsilon", 1e-5))
    acc = _accumulator(x.dtype)

    def body(n, c, *rest):
        value = x[(n, c, *rest)].astype(acc) - _channel(mean, c, acc)
        value = value / te.sqrt(_channel(variance, c, acc) + epsilon)
        return (value * _channel(scale, c, acc) + _channel(bias, c, acc)).astype(x.dtype)

    return [te.compute(x.shape, body, name="batch_norm", tag=tags.BROADCAST)]


def _moments(x: te.Tensor, axes: tuple[int, ...], dtype: str, name: str):
    """Mean and variance of `x` over `axes`, kept as size-1 axes: two reductions (mean first, then the centred
    squares, which is how the reference computes it and stays accurate)."""
    shape = tuple(1 if d in axes else size for d, size in enumerate(x.shape))
    count = float(math.prod(x.shape[d] for d in axes))

    def reader(index, reduce_vars):
        iterator = iter(reduce_vars)
        return tuple(next(iterator) if d in axes else index[d] for d in range(x.ndim))

    def reduce_vars():
        return [te.reduce_axis((0, x.shape[d]), f"r{d}") for d in axes]

    first = reduce_vars()
    sums = te.compute(
        shape, lambda *i: te.sum(x[reader(i, first)].astype(dtype), axis=first), name=f"{name}_sum", tag=tags.REDUCE
    )
    mean = te.compute(shape, lambda *i: sums[i] / count, name=f"{name}_mean", tag=tags.ELEMWISE)
    second = reduce_vars()

    def squares(*i):
        centred = x[reader(i, second)].astype(dtype) - mean[i]
        return te.sum(centred * centred, axis=second)

    squared = te.compute(shape, squares, name=f"{name}_squares", tag=tags.REDUCE)
    variance = te.compute(shape, lambda *i: squared[i] / count, name=f"{name}_variance", tag=tags.ELEMWISE)
    return mean, variance


def _kept(index, axes):
    return tuple(0 if d in axes else value for d, value in enumerate(index))


def layer_norm(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    x, scale, bias = (list(inputs) + [None])[:3]
    axis = normalize_axis(attrs.get("axis", -1), x.ndim, "LayerNormalization axis")
    epsilon = float(attrs.get("epsilon", 1e-5))
    stash = stash_dtype(x.dtype)
    axes = tuple(range(axis, x.ndim))
    mean, variance = _moments(x, axes, stash, "layer_norm")
    inverse = te.compute(
        mean.shape, lambda *i: 1.0 / te.sqrt(variance[i] + epsilon), name="inverse_std", tag=tags.ELEMWISE
    )

    def trailing(tensor, index):
        own = index[x.ndim - tensor.ndim :]
        return tensor[tuple(0 if tensor.shape[d] == 1 else own[d] for d in range(tensor.ndim))].astype(stash)

    def body(*i):
        value = (x[i].astype(stash) - mean[_kept(i, axes)]) * inverse[_kept(i, axes)] * trailing(scale, i)
        if bias is not None:
            value = value + trailing(bias, i)
        return value.astype(x.dtype)

    result = te.compute(x.shape, body, name="layer_norm", tag=tags.LAYER_NORM)
    return [result, mean, inverse][: len(output_types)]


def instance_norm(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    x, scale, bias = inputs[:3]
    epsilon = float(attrs.get("epsilon", 1e-5))
    acc = _accumulator(x.dtype)
    axes = tuple(range(2, x.ndim))
    mean, variance = _moments(x, axes, acc, "instance_norm")

    def body(*i):
        kept = _kept(i, axes)
        value = (x[i].astype(acc) - mean[kept]) / te.sqrt(variance[kept] + epsilon)
        return (value * _channel(scale, i[1], acc) + _channel(bias, i[1], acc)).astype(x.dtype)

    return [te.compute(x.shape, body, name="instance_norm", tag=tags.LAYER_NORM)]


def group_norm(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    x, scale, bias = inputs[:3]
    groups = int(attrs["num_groups"])
    epsilon = float(attrs.get("epsilon", 1e-5))
    stash = stash_dtype(x.dtype)
    batch, channels, spatial = x.shape[0], x.shape[1], x.shape[2:]
    per_group = channels // groups
    count = float(per_group * math.prod(spatial))

    def reduce_vars():
        return [te.reduce_axis((0, per_group), "rc"), *(te.reduce_axis((0, s), f"r{d}") for d, s in enumerate(spatial))]

    def member(n, g, axes):
        return x[(n, g * per_group + axes[0], *axes[1:])].astype(stash)

    first = reduce_vars()
    sums = te.compute(
        (batch, groups), lambda n, g: te.sum(member(n, g, first), axis=first), name="group_sum", tag=tags.REDUCE
    )
    mean = te.compute((batch, groups), lambda n, g: sums[n, g] / count, name="group_mean", tag=tags.ELEMWISE)
    second = reduce_vars()

    def squares(n, g):
        centred = member(n, g, second) - mean[n, g]
        return te.sum(centred * centred, axis=second)

    squared = te.compute((batch, groups), squares, name="group_squares", tag=tags.REDUCE)

    def per_channel(tensor, c):
        return tensor[c if tensor.shape[0] == channels else c // per_group].astype(stash)

    def body(n, c, *rest):
        g = c // per_group
        value = (x[(n, c, *rest)].astype(stash) - mean[n, g]) / te.sqrt(squared[n, g] / count + epsilon)
        return (value * per_channel(scale, c) + per_channel(bias, c)).astype(x.dtype)

    return [te.compute(x.shape, body, name="group_norm", tag=tags.LAYER_NORM)]


def mean_variance_norm(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    (x,) = inputs[:1]
    axes = tuple(normalize_axes(attrs.get("axes", (0, 2, 3)), x.ndim))
    acc = _accumulator(x.dtype)
    shape = tuple(1 if d in axes else size for d, size in enumerate(x.shape))
    count = float(math.prod(x.shape[d] for d in axes))

    def moment(power: int, name: str):
        axis_vars = [te.reduce_axis((0, x.shape[d]), f"r{d}") for d in axes]

        def body(*index):
            iterator = iter(axis_vars)
            value = x[tuple(next(iterator) if d in axes else index[d] for d in range(x.ndim))].astype(acc)
            return te.sum(value * value if power == 2 else value, axis=axis_vars)

        return te.compute(shape, body, name=name, tag=tags.REDUCE)

    sums, squares = moment(1, "mvn_sum"), moment(2, "mvn_squares")

    def body(*i):
        kept = _kept(i, axes)
        mean = sums[kept] / count
        # E[x^2] - E[x]^2 as ONNX defines it, clamped at 0 against rounding
        variance = te.maximum(squares[kept] / count - mean * mean, 0.0)
        return ((x[i].astype(acc) - mean) / (te.sqrt(variance) + 1e-9)).astype(x.dtype)

    return [te.compute(x.shape, body, name="mean_variance_norm", tag=tags.LAYER_NORM)]


def lp_norm(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    (x,) = inputs[:1]
    axis = normalize_axis(attrs.get("axis", -1), x.ndim, "LpNormalization axis")
    p = int(attrs.get("p", 2))
    acc = _accumulator(x.dtype)
    shape = tuple(1 if d == axis else size for d, size in enumerate(x.shape))
    k = te.reduce_axis((0, x.shape[axis]), "k")

    def sums(*index):
        return te.sum(_power(x[tuple(k if d == axis else v for d, v in enumerate(index))].astype(acc), p), axis=k)

    total = te.compute(shape, sums, name="lp_norm_sum", tag=tags.REDUCE)

    def body(*i):
        norm = _root(total[_kept(i, (axis,))], p)
        zero = te.Compare("eq", norm, te.const(0.0, acc))
        return te.select(zero, te.const(0.0, acc), x[i].astype(acc) / te.select(zero, 1.0, norm)).astype(x.dtype)

    return [te.compute(x.shape, body, name="lp_norm", tag=tags.LAYER_NORM)]


def lrn(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    (x,) = inputs[:1]
    size = int(attrs["size"])
    alpha, beta, bias = float(attrs.get("alpha", 1e-4)), float(attrs.get("beta", 0.75)), float(attrs.get("bias", 1.0))
    acc = _accumulator(x.dtype)
    before = (size - 1) // 2
    channels = x.shape[1]
    window = te.reduce_axis((0, size), "rc")

    def sums(n, c, *rest):
        source = c - before + window
        value = x[(n, _clamp(source, 0, channels - 1), *rest)].astype(acc)
        inside = te.all(source >= 0, source < channels)
        return te.sum(te.select(inside, value * value, 0.0), axis=window)

    total = te.compute(x.shape, sums, name="lrn_sum", tag=tags.REDUCE)

    def body(*i):
        denominator = te.pow(total[i] * (alpha / size) + bias, beta)
        return (x[i].astype(acc) / denominator).astype(x.dtype)

    return [te.compute(x.shape, body, name="lrn", tag=tags.ELEMWISE)]


# -- Softmax and LogSoftmax -----------------------------------------------------------------------------------------


def _softmax(logarithm: bool):
    def compute(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
        (x,) = inputs[:1]
        axis = normalize_axis(attrs.get("axis", -1), x.ndim, "Softmax axis")
        acc = _accumulator(x.dtype)
        shape = tuple(1 if d == axis else size for d, size in enumerate(x.shape))
        first = te.reduce_axis((0, x.shape[axis]), "k")

        def at(index, k):
            return tuple(k if d == axis else value for d, value in enumerate(index))

        largest = te.compute(
            shape, lambda *i: te.max(x[at(i, first)].astype(acc), axis=first), name="softmax_max", tag=tags.REDUCE
        )
        second = te.reduce_axis((0, x.shape[axis]), "k")
        if logarithm:
            # the output needs no exp: exp(x - max) is made once, inside the sum
            def exp_sum(*i):
                return te.sum(te.exp(x[at(i, second)].astype(acc) - largest[i]), axis=second)

            total = te.compute(shape, exp_sum, name="softmax_sum", tag=tags.REDUCE)
        else:
            # exp(x - max) is read by the sum and by the output: a STASH stage, made once per row (schedules keep
            # it in a local buffer) instead of being computed twice
            exponentials = te.compute(
                x.shape, lambda *i: te.exp(x[i].astype(acc) - largest[at(i, 0)]), name="softmax_exp", tag=STASH
            )
            total = te.compute(
                shape, lambda *i: te.sum(exponentials[at(i, second)], axis=second), name="softmax_sum", tag=tags.REDUCE
            )

        def body(*i):
            if logarithm:
                shifted = x[i].astype(acc) - largest[at(i, 0)]
                return (shifted - te.log(total[at(i, 0)])).astype(x.dtype)
            return (exponentials[i] / total[at(i, 0)]).astype(x.dtype)

        tag = "log_softmax" if logarithm else "softmax"
        return [te.compute(x.shape, body, name=tag, tag=tag)]

    return compute


# -- Resize and Upsample --------------------------------------------------------------------------------------------


def _position(mode: str, target, size: int, output: int, scale: float, region):
    """The input coordinate (float64) of output index `target` along one axis, as the reference's
    _source_positions computes it."""
    t = target.astype("float64")
    length = scale * size
    if mode == "align_corners":
        return te.const(0.0, "float64") if length == 1 else t * ((size - 1) / (length - 1))
    if mode == "asymmetric":
        return t / scale
    if mode == "pytorch_half_pixel":
        return te.const(-0.5, "float64") if length == 1 else (t + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = size / 2 * (1 - output / length)
        return (t + 0.5) / scale - 0.5 + offset
    if mode == "tf_crop_and_resize":
        start, end = region or (0.0, 1.0)
        if length == 1:
            return te.const((end - start) * (size - 1) / 2 + start * (size - 1), "float64")
        return t * ((end - start) * (size - 1) / (length - 1)) + start * (size - 1)
    return (t + 0.5) / scale - 0.5


def _nearest(position, rounding: str, size: int):
    below = te.floor(position)
    fraction = position - below
    if rounding == "round_prefer_floor":
        chosen = te.select(fraction > 0.5, below + 1.0, below)
    elif rounding == "round_prefer_ceil":
        chosen = te.select(fraction >= 0.5, below + 1.0, below)
    elif rounding == "floor":
        chosen = below
    else:
        chosen = te.ceil(position)
    return _clamp(chosen.astype("int32"), 0, size - 1)


def _integer_position(mode: str, target, size: int, output: int, scale: float, region):
    """The input coordinate of output index `target` as (below, numerator, denominator), position = below +
    numerator / denominator with 0 <= numerator < denominator, in int32 arithmetic: for an integer upscale
    (output = size * k) under asymmetric or half-pixel coordinates, where it is exact; else None. Integer index math
    vectorizes where _position's float64 floor per lane does not."""
    factor = round(scale)
    unchanged = region is None or (math.isclose(region[0], 0.0) and math.isclose(region[1], 1.0))
    if factor < 1 or not math.isclose(scale, factor) or output != size * factor or not unchanged:
        return None
    if mode == "asymmetric":
        return target // factor, target % factor, factor
    if mode == "half_pixel" or (mode == "pytorch_half_pixel" and output > 1):
        # (t + 0.5) / k - 0.5 = (2t + 1 - k) / 2k
        shifted = target * 2 + (1 - factor)
        return shifted // (2 * factor), shifted % (2 * factor), 2 * factor
    return None


def _integer_nearest(below, numerator, denominator: int, rounding: str, size: int):
    if rounding == "round_prefer_floor":
        below = te.select(numerator * 2 > denominator, below + 1, below)
    elif rounding == "round_prefer_ceil":
        below = te.select(numerator * 2 >= denominator, below + 1, below)
    elif rounding == "ceil":
        below = te.select(numerator > 0, below + 1, below)
    return _clamp(below, 0, size - 1)


def _resize_with(x: te.Tensor, attrs: dict[str, Any], shape) -> te.Tensor:
    plan = resize_plan(tuple(x.shape), attrs)
    mode = attr_string(attrs, "mode", "nearest", RESIZE_MODES)
    coordinates = attr_string(attrs, "coordinate_transformation_mode", "half_pixel", COORDINATE_MODES)
    rounding = attr_string(attrs, "nearest_mode", "round_prefer_floor", NEAREST_MODES)
    if int(attrs.get("antialias", 0)) and mode != "nearest" and any(s < 1 for s in plan.scales):
        raise _unsupported("Resize", "with antialias=1 when downscaling")
    if mode != "nearest" and not x.dtype.startswith("float"):
        raise _unsupported("Resize", f"in {mode} mode on {x.dtype}")
    cubic_a = float(attrs.get("cubic_coeff_a", -0.75))
    exclude_outside = bool(int(attrs.get("exclude_outside", 0)))
    extrapolation = float(attrs.get("extrapolation_value", 0.0))
    resized = []
    for axis, (size, output, scale) in enumerate(zip(x.shape, plan.output, plan.scales)):
        region = plan.roi[axis] if plan.roi else None
        unchanged = region is None or (math.isclose(region[0], 0.0) and math.isclose(region[1], 1.0))
        if not (output == size and math.isclose(scale, 1.0) and unchanged):
            resized.append((axis, size, output, scale, region))
    # linear weights of integer upscales are multiples of 1 / 2k: a float32 input blends in float32, as onnxruntime
    # does (float64 lanes made the 2x bilinear upsampling of unet_small twice the work); other positions keep float64
    exact = mode == "linear" and all(
        _integer_position(coordinates, 0, size, output, scale, region) is not None
        for _, size, output, scale, region in resized
    )
    blend = x.dtype if exact and x.dtype == "float32" else "float64"

    def body(*index):
        outside = []
        per_axis = {}
        for axis, size, output, scale, region in resized:
            exact = (
                None if mode == "cubic" else _integer_position(coordinates, index[axis], size, output, scale, region)
            )
            if exact is not None:
                below, numerator, denominator = exact
                if mode == "nearest":
                    per_axis[axis] = [(_integer_nearest(below, numerator, denominator, rounding, size), None)]
                else:
                    fraction = numerator.astype(blend) / float(denominator)
                    per_axis[axis] = [
                        (_clamp(below, 0, size - 1), 1.0 - fraction),
                        (_clamp(below + 1, 0, size - 1), fraction),
                    ]
                continue
            position = _position(coordinates, index[axis], size, output, scale, region)
            if coordinates == "tf_crop_and_resize":
                outside += [position < 0.0, position > float(size - 1)]
            if mode == "nearest":
                per_axis[axis] = [(_nearest(position, rounding, size), None)]
            elif mode == "linear":
                below = te.floor(position)
                fraction = position - below
                first = below.astype("int32")
                per_axis[axis] = [
                    (_clamp(first, 0, size - 1), 1.0 - fraction),
                    (_clamp(first + 1, 0, size - 1), fraction),
                ]
            else:
                per_axis[axis] = _cubic_taps(position, size, cubic_a, exclude_outside)
        terms = [([], None)]
        for axis, choices in per_axis.items():
            terms = [
                (
                    indices + [(axis, index_expr)],
                    weight if factor is None else factor if weight is None else weight * factor,
                )
                for indices, weight in terms
                for index_expr, factor in choices
            ]
        value = None
        for indices, weight in terms:
            source = list(index)
            for axis, index_expr in indices:
                source[axis] = index_expr
            load = x[tuple(source)]
            term = load if weight is None else load.astype(blend) * weight
            value = term if value is None else value + term
        value = value.astype(x.dtype)
        if outside:
            value = te.select(te.any(*outside), te.const(extrapolation, x.dtype), value)
        return value

    return te.compute(shape, body, name="resize", tag=tags.INJECTIVE)


def _cubic_taps(position, size: int, a: float, exclude_outside: bool) -> list:
    """(input index, weight) of the 4 taps of cubic interpolation at `position` on an axis of `size`: the
    Keys kernel with coefficient a at distances 1 + t, t, 1 - t, 2 - t (t the fractional part), indices clamped
    to the axis (edge pixels repeat), or with exclude_outside the taps past the edges weighted 0 and the rest
    renormalized, as ONNX's reference does."""
    below = te.floor(position)
    fraction = position - below
    first = below.astype("int32")
    taps = []
    for offset, distance in ((-1, fraction + 1.0), (0, fraction), (1, 1.0 - fraction), (2, 2.0 - fraction)):
        if offset in (0, 1):
            weight = ((a + 2) * distance - (a + 3)) * distance * distance + 1.0
        else:
            weight = ((a * distance - 5 * a) * distance + 8 * a) * distance - 4 * a
        taps.append((first + offset, weight))
    if exclude_outside:
        taps = [(tap, te.select(te.all(tap >= 0, tap < size), weight, 0.0)) for tap, weight in taps]
        total = taps[0][1] + taps[1][1] + taps[2][1] + taps[3][1]
        total = te.select(total == 0.0, 1.0, total)
        taps = [(tap, weight / total) for tap, weight in taps]
    return [(_clamp(tap, 0, size - 1), weight) for tap, weight in taps]


def resize(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    return [_resize_with(inputs[0], attrs, output_types[0].shape)]


def upsample(inputs: Inputs, attrs: dict[str, Any], output_types: list[TensorType]) -> list[te.Tensor]:
    return [_resize_with(inputs[0], upsample_attrs(attrs), output_types[0].shape)]


set_compute("Conv", conv)
set_compute("ConvNCHWc", conv_nchwc)
set_compute("ConvWinogradNCHWc", conv_winograd)
set_compute("ConvWinograd", conv_winograd)
set_compute("LayoutTransform", layout_transform)
set_compute("ChannelShuffleNCHWc", channel_shuffle_nchwc)
set_compute("MaxPoolNCHWc", max_pool_nchwc)
set_compute("ConvTranspose", conv_transpose)
set_compute("ConvTransposeNCHWc", conv_transpose_nchwc)
set_compute("Gemm", gemm)
set_compute("MatMul", matmul)
set_compute("MatMulPacked", matmul_packed)
set_compute("Attention", attention)
set_compute("MaxPool", max_pool)
set_compute("AveragePool", _average_pool(blocked=False))
set_compute("AveragePoolNCHWc", _average_pool(blocked=True))
set_compute("GlobalAveragePool", _global_pool("sum"))
set_compute("GlobalMaxPool", _global_pool("max"))
set_compute("BatchNormalization", batch_norm)
set_compute("LayerNormalization", layer_norm)
set_compute("InstanceNormalization", instance_norm)
set_compute("LRN", lrn)
set_compute("GroupNormalization", group_norm)
set_compute("MeanVarianceNormalization", mean_variance_norm)
set_compute("LpNormalization", lp_norm)
set_compute("LpPool", lp_pool)
set_compute("GlobalLpPool", global_lp_pool)
set_compute("Softmax", _softmax(logarithm=False))
set_compute("LogSoftmax", _softmax(logarithm=True))
set_compute("Resize", resize)
set_compute("Upsample", upsample)
