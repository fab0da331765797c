"""NCHW[x]c convolutions (ConvNCHWc, alter_layout's blocked layout): the dense and depthwise blocked conv template,
its filter prefetch, and the blocked transposed conv."""

from __future__ import annotations

import math

import compiler.te as te
from compiler.compute import tags
from compiler.schedules.cpu.defaults import CACHE_LINE_BYTES, SMALL_ROW, SMALL_ROW_TAPS, SMALL_ROW_TILE, fallback
from compiler.schedules.cpu.generic import schedule_rows
from compiler.schedules.cpu.tiling import (
    column_tiles,
    divisor_at_most,
    itemsize,
    lanes,
    limit_registers,
    tile_or_tail,
    vector_registers,
)
from compiler.schedules.dispatch import padding_stage
from compiler.schedules.space import ConfigSpace
from compiler.target import Target
from compiler.te.schedule import Schedule, Stage
from compiler.te.tensor import IterVar, TensorLoad, walk


def schedule_blocked_conv(schedule: Schedule, conv: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """NCHW[x]c convolution (group 1 or depthwise): each task owns (batch, filter block, output row); per tile of
    tile_ow columns the conv keeps tile_ow vectors of the block's filters in registers, the taps outside, the
    columns unrolled inside, so every tap is one multiply-add per column on contiguous weights. The epilogue runs
    on the tile before it is stored, still in the blocked layout."""
    values = fallback(conv.op.tag, target)
    n, outer, oh, ow, inner = output.op.axis
    pointwise = conv.op.tag == tags.CONV2D_NCHWC and all(axis.extent == 1 for axis in conv.op.reduce_axis[1:-1])
    pointwise_tile = pointwise and values["pointwise_tile_ow"] is not None
    if pointwise_tile:
        values.update(tile_ow=values["pointwise_tile_ow"], tile_blocks=values["pointwise_tile_blocks"])
    # the column tiles: the row's divisors and its balanced tilings whose last tile is shorter (31 columns:
    # 11 + 11 + 9), the fallback a divisor unless all of them are far below the tile (tile_or_tail)
    # The fallback keeps the accumulators of its full tile (tile_blocks x tile_ow of the defaults), enough
    # multiply-adds in flight to hide their latency: fewer filter blocks than the tile's (3 blocks of 16 channels)
    # take more columns, up to half the vector registers, and a row shorter than the tile takes more filter blocks
    # while they fit the registers (docs/benchmarks.md, "Template measurements")
    accumulators = values["tile_blocks"] * values["tile_ow"]
    blocks = divisor_at_most(outer.extent, values["tile_blocks"])
    block_vectors = -(-inner.extent // lanes(target, output.op.dtype))
    columns = vector_registers(target) // 2 // block_vectors
    # a pointwise tile keeps its columns with a shorter last tile rather than halve them (14 columns in 4, 4, 4, 2;
    # "Template measurements")
    least = 0.75 if pointwise_tile else 0.5
    tile_ow = tile_or_tail(ow.extent, max(values["tile_ow"], min(accumulators // blocks, columns)), least)
    cfg.define_split("tile_ow", ow, policy=column_tiles(ow.extent), default=tile_ow)
    columns_outer = conv.op.tag == tags.CONV2D_NCHWC and values["unroll_outer"] == "columns"
    more_blocks = accumulators // tile_ow
    while more_blocks > blocks and not _fits_registers(target, more_blocks, tile_ow, block_vectors, columns_outer):
        more_blocks -= 1
    cfg.define_split("tile_blocks", outer, default=max(blocks, more_blocks))
    limit_registers(cfg, target, output.op.dtype, ("tile_blocks", "tile_ow"), inner.extent)
    pad = padding_stage(schedule, conv.op.output(0))
    if pad is not None:
        # a dense conv's local rows would be made again for every filter tile: not a choice
        choices = ["in_place", "copy"] if conv.op.tag == tags.CONV2D_NCHWC else ["in_place", "rows", "copy"]
        cfg.define_knob("padding", choices, default=values["padding"])
    block_outer, block_inner = cfg["tile_blocks"].apply(schedule, output, outer)
    ow_outer, ow_inner = cfg["tile_ow"].apply(schedule, output, ow)
    output.reorder(n, block_outer, oh, ow_outer, block_inner, ow_inner, inner)
    rows = output.fuse(n, block_outer, oh)
    output.parallel(rows)
    output.vectorize(inner)
    if ow.extent % cfg["tile_ow"].size[-1]:
        output.partition(ow_outer)
    conv.set_scope("local")
    conv.compute_at(output, ow_outer)
    cn, couter, coh, cow, cinner = conv.op.axis
    reduce_axes = list(conv.op.reduce_axis)
    unrolled = [couter, cow]
    if conv.op.tag == tags.CONV2D_NCHWC:
        window = math.prod(axis.extent for axis in conv.op.reduce_axis[1:-1])
        short_row = ow.extent <= SMALL_ROW and cfg["tile_ow"].size[-1] <= SMALL_ROW_TILE and window <= SMALL_ROW_TAPS
        taps_place = values["small_row_taps"] if short_row and values["small_row_taps"] is not None else values["taps"]
        cfg.define_knob("taps", ["outer", "inner"], default=taps_place)
        if cfg["taps"].val == "inner":
            channel_outer, *taps, channel_inner = reduce_axes
            reduce_axes = [channel_outer, channel_inner, *taps]
        cfg.define_knob("unroll_outer", ["blocks", "columns"], default=values["unroll_outer"])
        if cfg["unroll_outer"].val == "columns":
            unrolled.reverse()
    conv.reorder(cn, coh, *reduce_axes, *unrolled, cinner)
    conv.unroll(couter)
    conv.unroll(cow)
    conv.vectorize(cinner)
    if conv.op.tag == tags.CONV2D_NCHWC and target.machine.prefetch:
        _prefetch_filters(conv, cfg, target, rows, oh.extent, ow_outer, reduce_axes)
    if pad is None:
        return
    padding, pad = cfg["padding"].val, schedule[pad]
    if padding == "in_place":
        pad.compute_inline()
        output.partition(ow_outer)
        if conv.op.tag == tags.CONV2D_NCHWC:
            # the tests of a dense conv's taps come in every input channel's multiply-adds: the rows are cut too (a
            # task's body branches on its row), and in a border row the loop over the window's rows, where a
            # decided-out row's zero products are then dropped (tir/simplify.py). A border column tile keeps its
            # tests: its columns are unrolled and LLVM unrolls the window's short column loop, so they are constants
            # (cutting that loop too gave resnet18 177 copies of a tile's nest to emit against 97, and no speed)
            output.partition(rows)
            conv.partition(conv.op.reduce_axis[1])
        return
    if padding == "rows":
        # the kh padded input rows one output row reads, made right before its taps, in cache
        pad.set_scope("local")
        pad.compute_at(output, rows)
    schedule_rows(pad, target)


def _prefetch_filters(
    conv: Stage, cfg: ConfigSpace, target: Target, rows: IterVar, row_count: int, columns, reduce_axes
) -> None:
    """While a task (a filter tile, an output row) runs, prefetch its share of the next filter tile, so the next
    filters stream in under this tile's multiply-adds instead of stalling the next tile's first row (its later rows
    find them in cache). The tile's rows, their column tiles and the outer reduction loops split the next tile's
    cache lines between their iterations, down to the deepest loop that still gives each iteration a line of its
    own: a few prefetches at a time, since a burst of them at the start of each channel step occupied the line-fill
    buffers the tile's own loads need. A tile's filters are contiguous in the packed weight (output blocks
    outermost)."""
    weights = next(
        node.tensor
        for node in walk(conv.op.body)
        if isinstance(node, TensorLoad) and node.indices[0] is conv.op.axis[1]
    )
    if weights.shape[0] == 1:
        return  # one filter block: every task reads the same filters
    cfg.define_knob("prefetch", [0, 1], default=fallback(conv.op.tag, target)["prefetch"])
    blocks = cfg["tile_blocks"].size[-1]
    tiles = -(-weights.shape[0] // blocks)
    if not cfg["prefetch"].val or tiles == 1:
        return
    tile = blocks * math.prod(weights.shape[1:])
    per_line = max(1, CACHE_LINE_BYTES // itemsize(weights.dtype))
    tile_lines = -(-tile // per_line)
    steps, step = row_count * columns.extent, rows % row_count * columns.extent + columns
    at = reduce_axes[0]
    for position, axis in enumerate(reduce_axes):
        if position and steps * axis.extent > tile_lines:
            break
        steps, step, at = steps * axis.extent, step * axis.extent + axis, axis
    lines = -(-tile_lines // steps)
    following = te.minimum(rows // row_count % tiles + 1, tiles - 1) * tile

    def line_of(line):
        # steps x lines may pass the tile's end (5 rows x 36 taps of 2 lines for AVX2's 288-line tile): the last
        # steps then name its last line again rather than the tile after
        index = step * lines + line
        return following + (index if steps * lines <= tile_lines else te.minimum(index, tile_lines - 1)) * per_line

    conv.prefetch(weights, at, lines, line_of)


def _fits_registers(target: Target, blocks: int, columns: int, block_vectors: int, columns_outer: bool) -> bool:
    """Whether a blocked conv's tile of `blocks` filter blocks x `columns` columns fits the vector registers: its
    accumulators, a weight vector per block and, with more than one block, the broadcast inputs the blocks share:
    each column's, held across the blocks (AVX2's 2 x 7 tile spilled them to the stack), or with the columns
    unrolled outside the blocks (`unroll_outer`) one at a time."""
    broadcasts = 0 if blocks == 1 else 1 if columns_outer else columns
    held = blocks * columns * block_vectors + blocks * block_vectors + broadcasts
    return held <= vector_registers(target)


def schedule_transposed_conv(schedule: Schedule, conv: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """NCHW[x]c ConvTranspose: each task owns (batch, filter block, output row); per tile of tile_ow output columns
    the input channels and the taps of each column's phase are the outer loops and the tile's columns, each a
    vector over the filter block, are held in registers, so one broadcast input value and one weight vector feed
    each multiply-add. The generic reduction schedule kept one vector of accumulators per output position: a chain
    of C dependent multiply-adds (docs/benchmarks.md, "Template measurements")."""
    n, outer, oh, ow, inner = output.op.axis
    cfg.define_split("tile_ow", ow, default=fallback(tags.CONV2D_TRANSPOSE_NCHWC, target)["tile_ow"])
    limit_registers(cfg, target, output.op.dtype, ("tile_ow",), inner.extent)
    ow_outer, ow_inner = cfg["tile_ow"].apply(schedule, output, ow)
    output.reorder(n, outer, oh, ow_outer, ow_inner, inner)
    output.parallel(output.fuse(n, outer, oh))
    output.vectorize(inner)
    conv.set_scope("local")
    conv.compute_at(output, ow_outer)
    cn, couter, coh, cow, cinner = conv.op.axis
    conv.reorder(cn, couter, coh, *conv.op.reduce_axis, cow, cinner)
    conv.unroll(cow)
    conv.vectorize(cinner)
