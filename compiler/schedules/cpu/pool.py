"""Pools with a window, NCHW and NCHW[x]c."""

from __future__ import annotations

from compiler.schedules.cpu.defaults import fallback
from compiler.schedules.cpu.tiling import lanes, limit_registers, vector_factor
from compiler.schedules.dispatch import padding_stage
from compiler.schedules.space import ConfigSpace
from compiler.target import Target
from compiler.te.schedule import Schedule, Stage


def schedule_pool(schedule: Schedule, pool: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    (_pool_nchwc if len(output.op.axis) == 5 else _pool_nchw)(schedule, pool, output, target, cfg)


def _pool_nchw(schedule: Schedule, pool: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """NCHW max or average pool: each task owns (batch, channel, output row), and makes the padded input rows the
    row's windows read right before them, in cache, their interior column vectors cut from the clamped borders.
    Per tile of tile_ow output columns (whole vectors; the last, shorter tile in its own partitioned piece) the
    taps are unrolled around the tile held in registers; strided taps read their columns as contiguous runs
    (codegen's strided loads). The generic reduction schedule gathered every stride-2 tap column by column and
    tested the padding in each (docs/benchmarks.md, "Template measurements")."""
    n, c, oh, ow = output.op.axis
    width = lanes(target, output.op.dtype)
    vectors = [width * count for count in range(1, 5) if width * count <= ow.extent] or [ow.extent]
    cfg.define_split("tile_ow", ow, policy=vectors, default=width * fallback("pool_nchw", target)["tile_vectors"])
    limit_registers(cfg, target, output.op.dtype, (1,), "tile_ow")
    tile = cfg["tile_ow"].size[-1]
    ow_outer, ow_inner = cfg["tile_ow"].apply(schedule, output, ow)
    output.reorder(n, c, oh, ow_outer, ow_inner)
    rows = output.fuse(n, c, oh)
    output.parallel(rows)
    output.vectorize(ow_inner)
    if ow.extent % tile:
        output.partition(ow_outer)
    pool.set_scope("local")
    pool.compute_at(output, ow_outer)
    pn, pc, poh, pow_ = pool.op.axis
    pool.reorder(pn, pc, poh, *pool.op.reduce_axis, pow_)
    for tap in pool.op.reduce_axis:
        pool.unroll(tap)
    pool.vectorize(pow_)
    pad = padding_stage(schedule, pool.op.output(0))
    if pad is not None:
        pad = schedule[pad]
        pad.set_scope("local")
        pad.compute_at(output, rows)
        # vectors along the padded row (a divisor of it, else full vectors and a shorter last one), the row's
        # interior ones cut from its borders, so they copy with plain vector loads and no clamp
        width = lanes(target, pad.op.dtype)
        factor = vector_factor(pad.op.axis[-1].extent, width)
        columns, vector = pad.split(pad.op.axis[-1], factor if 2 * factor >= width else width)
        pad.vectorize(vector)
        pad.partition(columns)


def _pool_nchwc(schedule: Schedule, pool: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """NCHW[x]c max or average pool: each task owns (batch, channel block, output row); per tile of tile_ow columns the
    window's taps are the outer loops and the tile's columns, each a vector over the block, are held in
    registers. The padding (the lowest value) is read in place, the column tiles partitioned."""
    n, outer, oh, ow, inner = output.op.axis
    cfg.define_split("tile_ow", ow, default=fallback("pool_max", target)["tile_ow"])
    limit_registers(cfg, target, output.op.dtype, ("tile_ow",), inner.extent)
    ow_outer, ow_inner = cfg["tile_ow"].apply(schedule, output, ow)
    output.reorder(n, outer, oh, ow_outer, ow_inner, inner)
    output.parallel(output.fuse(n, outer, oh))
    output.vectorize(inner)
    output.partition(ow_outer)
    pool.set_scope("local")
    pool.compute_at(output, ow_outer)
    pn, pouter, poh, pow_, pinner = pool.op.axis
    pool.reorder(pn, pouter, poh, *pool.op.reduce_axis, pow_, pinner)
    for tap in pool.op.reduce_axis:
        pool.unroll(tap)
    pool.unroll(pow_)
    pool.vectorize(pinner)
