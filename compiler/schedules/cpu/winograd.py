"""The Winograd conv template: the input transform by rows, the per-point matmuls by the dense template."""

from __future__ import annotations

import math

from compiler.compute import tags
from compiler.schedules.cpu.dense import schedule_dense
from compiler.schedules.cpu.generic import schedule_rows
from compiler.schedules.dispatch import padding_stage
from compiler.schedules.space import ConfigSpace
from compiler.target import Target
from compiler.te.schedule import Schedule
from compiler.te.tensor import ComputeOp


def schedule_winograd(schedule: Schedule, target: Target, cfg: ConfigSpace) -> None:
    """A ConvWinogradNCHWc group (compiler/compute/conv.py, conv_winograd). Its padded input is copied by rows
    (read in place, each of a tile's loads kept its padding's select; "Template measurements" in docs/benchmarks.md). The input transform runs parallel over (tile, channel block), a
    vector over the block. The matmuls are the dense template's (and its knobs), batched over the points. The output
    transform is inlined into the group's outputs, parallel over their rows of tiles, a vector over the filter
    block. The loops over a tile's points and over its output positions are partitioned: cut into one piece per
    value, in which each select on them is decided, so each value is its own few adds."""
    by_tag = {stage.op.tag: stage for stage in schedule.stages if isinstance(stage.op, ComputeOp)}
    transform, gemm = by_tag[tags.WINOGRAD_INPUT], by_tag[tags.WINOGRAD_GEMM]
    pad = padding_stage(schedule, transform.op.output(0))
    for stage in schedule.stages:
        op = stage.op
        kept = stage is transform or op is pad
        if isinstance(op, ComputeOp) and not op.reduce_axis and not stage.is_output and not kept:
            stage.compute_inline()
    if pad is not None:
        schedule_rows(schedule[pad], target)
    point, position, channel = transform.op.axis
    block = next(t for t in transform.op.input_tensors if len(t.shape) == 5).shape[-1]
    outer, inner = transform.split(channel, block)
    transform.reorder(position, outer, point, inner)
    transform.partition(point)
    transform.vectorize(inner)
    transform.parallel(transform.fuse(position, outer))
    local = schedule.cache_write(gemm.op.output(0), "local")
    schedule_dense(schedule, schedule[local], gemm, target, cfg)
    tile = round(math.sqrt(transform.op.axis[0].extent)) - 2
    for stage in schedule.stages:
        if stage.is_output and isinstance(stage.op, ComputeOp) and len(stage.op.axis) == 5:
            n, outer, row, column, inner = stage.op.axis
            row_outer, row_inner = stage.split(row, tile)
            column_outer, column_inner = stage.split(column, tile)
            stage.reorder(n, outer, row_outer, column_outer, row_inner, column_inner, inner)
            stage.partition(row_inner)
            stage.partition(column_inner)
            stage.vectorize(inner)
            stage.parallel(stage.fuse(n, outer, row_outer))
