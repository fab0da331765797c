"""NCHW convolutions on the CPU: the register-blocked direct conv2d and conv1d templates."""

from __future__ import annotations

from compiler.schedules.cpu.defaults import fallback
from compiler.schedules.cpu.tiling import define_row_tile, lanes, limit_registers, partition_tail
from compiler.schedules.space import ConfigSpace
from compiler.target import Target
from compiler.te.schedule import Schedule, Stage


def schedule_conv2d(schedule: Schedule, conv: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """Register-blocked direct convolution: each task owns (batch, oc block, output row); per column tile the
    conv accumulates tile_oc x tile_ow outputs over input channels and the kernel window, vectorized along the
    output row, and the epilogue is applied to that tile before it is stored."""
    values = fallback("conv2d", target)
    n, oc, oh, ow = output.op.axis
    cfg.define_split("tile_oc", oc, default=values["tile_oc"])
    define_row_tile(cfg, "tile_ow", ow, values["tile_ow"], lanes(target, output.op.dtype))
    cfg.define_knob("unroll_oc", [0, 1], default=values["unroll_oc"])
    limit_registers(cfg, target, output.op.dtype, ("tile_oc",), "tile_ow")
    oc_outer, oc_inner = cfg["tile_oc"].apply(schedule, output, oc)
    ow_outer, ow_inner = cfg["tile_ow"].apply(schedule, output, ow)
    output.reorder(n, oc_outer, oh, ow_outer, oc_inner, ow_inner)
    output.parallel(output.fuse(n, oc_outer, oh))
    output.vectorize(ow_inner)
    partition_tail(output, ow_outer, ow.extent, cfg["tile_ow"].size[-1])
    conv.set_scope("local")
    conv.compute_at(output, ow_outer)
    cn, coc, coh, cow = conv.op.axis
    conv.reorder(cn, coh, *conv.op.reduce_axis, coc, cow)
    if cfg["unroll_oc"].val:
        conv.unroll(coc)
    conv.vectorize(cow)


def schedule_conv1d(schedule: Schedule, conv: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """Register-blocked 1-D convolution: each task owns (batch, oc block); per tile of output positions the conv
    accumulates tile_oc x tile_ow outputs over input channels and taps (the taps a long kernel has outside, the tile
    inside, so each tap is one vector load of contiguous input, or of one stride phase, and tile_oc broadcast
    weights), vectorized along the positions. The position split is a power of two: a long signal's length rarely
    has a fitting divisor (3981 = 3 x 1327), so its last tile is guarded, the loop over tiles partitioned so only
    that tile tests it."""
    values = fallback("conv1d", target)
    n, oc, ow = output.op.axis
    # a tail tile wider than one vector is a slow odd-width vector loop (LLVM keeps its accumulators in memory), so
    # the fallback halves the tile until the tail fits one vector (docs/benchmarks.md, "Template measurements")
    width, tile_ow = lanes(target, output.op.dtype), values["tile_ow"]
    while tile_ow > width and ow.extent % tile_ow > width:
        tile_ow //= 2
    cfg.define_split("tile_oc", oc, default=values["tile_oc"])
    cfg.define_split("tile_ow", ow, policy="power2", default=tile_ow)
    limit_registers(cfg, target, output.op.dtype, ("tile_oc",), "tile_ow")
    oc_outer, oc_inner = cfg["tile_oc"].apply(schedule, output, oc)
    ow_outer, ow_inner = cfg["tile_ow"].apply(schedule, output, ow)
    output.reorder(n, oc_outer, ow_outer, oc_inner, ow_inner)
    output.parallel(output.fuse(n, oc_outer))
    output.partition(ow_outer)
    output.vectorize(ow_inner)
    conv.set_scope("local")
    conv.compute_at(output, ow_outer)
    cn, coc, cow = conv.op.axis
    conv.reorder(cn, *conv.op.reduce_axis, coc, cow)
    conv.unroll(coc)
    conv.vectorize(cow)
