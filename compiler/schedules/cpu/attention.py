"""The Attention template (passes/fuse_attention.py's op): per task a few query rows, their scores in registers and
their softmax in vector partials, the product with V last."""

from __future__ import annotations

from compiler.compute import tags
from compiler.schedules.cpu.defaults import fallback
from compiler.schedules.cpu.generic import factor_row, schedule_partials
from compiler.schedules.cpu.tiling import lanes, limit_registers, ragged_tiles, tile_or_tail, vectorize_row
from compiler.schedules.space import ConfigSpace
from compiler.target import Target
from compiler.te.schedule import Schedule
from compiler.te.tensor import ComputeOp


def schedule_attention(schedule: Schedule, target: Target, cfg: ConfigSpace) -> None:
    """An Attention group (compiler/compute/dense.py, attention): parallel over (batch, tiles of tile_m query rows). Per task,
    in local buffers: the tile's scores against every key, tile_n keys at a time in registers over the head's depth
    (the dense template's block); their row maxima, exponentials and row sums (vectors of partials, as a softmax's);
    then the output, tile_d columns at a time in registers over the keys, divided by the row's sum as it is stored.
    A shorter last row, key or column tile is a piece of its own."""
    values = fallback(tags.ATTENTION, target)
    by_tag = {stage.op.tag: stage for stage in schedule.stages if isinstance(stage.op, ComputeOp)}
    (output,) = (stage for stage in schedule.stages if stage.is_output)
    block, scores, largest = by_tag[tags.ATTENTION], by_tag[tags.ATTENTION_SCORES], by_tag[tags.ATTENTION_MAX]
    exponentials, total = by_tag[tags.ATTENTION_EXP], by_tag[tags.ATTENTION_SUM]
    partials = [factor_row(schedule, stage, target, cfg) for stage in (largest, total)]
    width = lanes(target, output.op.dtype)
    *batch, i, d = output.op.axis
    columns = scores.op.axis[-1]
    rows = tile_or_tail(i.extent, values["tile_m"], least=1.0)
    cfg.define_split("tile_m", i, policy=list(range(1, min(i.extent, 16) + 1)), default=rows)
    keys = ragged_tiles(columns.extent, width)
    cfg.define_split("tile_n", columns, policy=keys, default=max(size for size in keys if size <= values["tile_n"]))
    depths = ragged_tiles(d.extent, width)
    cfg.define_split("tile_d", d, policy=depths, default=max(size for size in depths if size <= values["tile_d"]))
    limit_registers(cfg, target, output.op.dtype, ("tile_m",), "tile_n")
    limit_registers(cfg, target, output.op.dtype, ("tile_m",), "tile_d")
    i_outer, i_inner = cfg["tile_m"].apply(schedule, output, i)
    d_outer, d_inner = cfg["tile_d"].apply(schedule, output, d)
    output.reorder(*batch, i_outer, d_outer, i_inner, d_inner)
    tasks = output.fuse(*batch, i_outer) if batch else i_outer
    output.parallel(tasks)
    if i.extent % cfg["tile_m"].size[-1]:
        output.partition(tasks)
    if d.extent % cfg["tile_d"].size[-1]:
        output.partition(d_outer)
    output.vectorize(d_inner)
    for stage in (scores, largest, exponentials, total):
        stage.set_scope("local")
        stage.compute_at(output, tasks)
    for lanes_stage, reduction in zip(partials, (largest, total)):
        # made per row inside the reduction's row loop: a buffer of the tile's rows would put a row's lanes apart
        schedule_partials(lanes_stage, reduction, reduction.op.axis[-1])
    *_, score_rows, score_columns = scores.op.axis
    (k,) = scores.op.reduce_axis
    keys_outer, keys_inner = cfg["tile_n"].apply(schedule, scores, score_columns)
    scores.reorder(keys_outer, k, score_rows, keys_inner)
    scores.unroll(score_rows)
    scores.vectorize(keys_inner)
    if columns.extent % cfg["tile_n"].size[-1]:
        scores.partition(keys_outer)
    vectorize_row(exponentials, width)
    block.set_scope("local")
    block.compute_at(output, d_outer)
    *_, block_rows, block_columns = block.op.axis
    (n,) = block.op.reduce_axis
    block.reorder(n, block_rows, block_columns)
    block.unroll(block_rows)
    block.vectorize(block_columns)
