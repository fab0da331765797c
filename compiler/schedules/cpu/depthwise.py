"""The NCHW depthwise conv template: row x column tiles of accumulators, the padding read in place."""

from __future__ import annotations

import math

from compiler.schedules.cpu.defaults import LOCAL_PAD_FLOATS, fallback
from compiler.schedules.cpu.generic import schedule_rows
from compiler.schedules.cpu.tiling import define_row_tile, lanes, limit_registers, partition_tail
from compiler.schedules.dispatch import padding_stage
from compiler.schedules.space import ConfigSpace
from compiler.target import Target
from compiler.te.schedule import Schedule, Stage


def schedule_depthwise(schedule: Schedule, conv: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """A 2-D output tile per step (tile_oh x tile_ow), vectorized along the row, parallel over batch x channels;
    the window taps are the outer loops of the tile's accumulation. The padding is read in place, the loops over
    row and column tiles partitioned so only the border tiles test it (or padded rows are made per tile, or a
    channel's padded plane per channel, or the whole padded input once)."""
    values = fallback("depthwise_conv2d", target)
    n, c, oh, ow = output.op.axis
    cfg.define_split("tile_oh", oh, default=values["tile_oh"])
    define_row_tile(cfg, "tile_ow", ow, values["tile_ow"], lanes(target, output.op.dtype))
    cfg.define_knob("unroll_taps", [0, 1], default=values["unroll_taps"])
    limit_registers(cfg, target, output.op.dtype, ("tile_oh",), "tile_ow")
    pad = padding_stage(schedule, conv.op.output(0))
    if pad is not None:
        options = ["in_place", "copy"]
        if pad.shape[1] == output.op.shape[1]:
            options.append("rows")
            if math.prod(pad.shape[2:]) <= LOCAL_PAD_FLOATS:
                options.append("plane")
        cfg.define_knob("padding", options, default=values["padding"])
    oh_outer, oh_inner = cfg["tile_oh"].apply(schedule, output, oh)
    ow_outer, ow_inner = cfg["tile_ow"].apply(schedule, output, ow)
    output.reorder(n, c, oh_outer, ow_outer, oh_inner, ow_inner)
    channels = output.fuse(n, c)
    output.parallel(channels)
    output.vectorize(ow_inner)
    partition_tail(output, ow_outer, ow.extent, cfg["tile_ow"].size[-1])
    conv.set_scope("local")
    conv.compute_at(output, ow_outer)
    cn, cc, coh, cow = conv.op.axis
    conv.reorder(cn, cc, *conv.op.reduce_axis, coh, cow)
    if cfg["unroll_taps"].val:
        for tap in conv.op.reduce_axis:
            conv.unroll(tap)
    if cfg["tile_oh"].size[-1] > 1:
        conv.unroll(coh)
    conv.vectorize(cow)
    if pad is None:
        return
    padding, pad = cfg["padding"].val, schedule[pad]
    if padding == "in_place":
        pad.compute_inline()
        output.partition(oh_outer)
        output.partition(ow_outer)
        return
    if padding != "copy":
        # the padded rows one row tile reads (or one channel's padded plane), filled right before its taps read
        # them, stay in cache
        pad.set_scope("local")
        pad.compute_at(output, oh_outer if padding == "rows" else channels)
    schedule_rows(pad, target)
