"""The generic CPU templates, for every stage no tiled template took: elementwise and injective stages (one vector
loop, the rest fused and parallel), layout conversions, padding rows, and reductions (rows and planes split into
vector partials, or computed inside the one stage that reads them)."""

from __future__ import annotations

import math

import compiler.te as te
from compiler.compute import tags
from compiler.schedules.cpu.defaults import fallback
from compiler.schedules.cpu.tiling import lanes, mentions, vector_factor, vectorize_innermost, vectorize_row
from compiler.schedules.dispatch import host_of, lives_in_host
from compiler.schedules.space import ConfigSpace
from compiler.target import Target
from compiler.te.schedule import INLINE, ROOT, Schedule, Stage
from compiler.te.tensor import ComputeOp, IterVar, TensorLoad, walk


def _define_vector_lanes(cfg: ConfigSpace, kind: str, target: Target) -> int:
    """The vector width of a generic template's innermost loop, in target lanes: one knob for every stage of the
    group that the injective and reduction templates schedule."""
    cfg.define_knob("vector_lanes", [1, 2, 4], default=fallback(kind, target)["vector_lanes"])
    return cfg["vector_lanes"].val


def _schedule_injective(stage: Stage, target: Target, cfg: ConfigSpace) -> None:
    """Split the innermost axis by the vector width (when it divides), vectorize it, fuse the rest, parallel. An axis
    of a symbolic extent (but the outermost) ends the fused loop, itself and the axes inside it loops of their own: a
    fused index is divided by the extents inside it, a run-time division per vector where one is symbolic (a decode
    step's KV-cache concat, [1, heads, past + seq, 64], took 8 % of a perf profile of GPT-2 decoding, dividing by past + seq)."""
    axes = list(stage.op.axis)
    if not axes:
        return
    axes[-1] = vectorize_innermost(
        stage, lanes(target, stage.op.dtype) * _define_vector_lanes(cfg, "injective", target)
    )
    fused = next((position for position in range(1, len(axes)) if not isinstance(axes[position].extent, int)), None)
    if fused is not None:
        axes = axes[:fused]
    if len(axes) > 1:
        stage.parallel(stage.fuse(*axes))
    elif axes[0].extent > 1:
        stage.parallel(axes[0])


def _schedule_unblock(stage: Stage, target: Target) -> None:
    """NCHW[x]c -> NCHW: parallel over (batch, channel block, row); inside, each of the block's x channels is one
    output row, a vector loop over its columns that reads the column's x channels, a stride of x apart, from the
    row's x-by-W tile while it is in cache. Fusing all the axes (the generic injective template) made a division
    and a modulo per element and, over a width no vector divides, no vector loop ("Template measurements")."""
    n, c, *rows, w = stage.op.axis  # (N, C, W) for a 1-D value
    block = next(load.tensor.shape[-1] for load in walk(stage.op.body) if isinstance(load, TensorLoad))
    outer, inner = stage.split(c, block)
    stage.reorder(n, outer, *rows, inner, w)
    stage.parallel(stage.fuse(n, outer, *rows))
    width = lanes(target, stage.op.dtype)
    if w.extent >= width:
        columns, vector = stage.split(w, width)
        stage.vectorize(vector)
        if w.extent % width:
            stage.partition(columns)


def _repeats_columns(stage: Stage) -> bool:
    """An NCHW stage that reads a column `w // k` (a nearest Resize by an integer factor): scheduled by rows, its
    vectors read repeated runs (codegen's load_repeated) with no division of a fused index per vector."""
    axes = stage.op.axis
    if len(axes) != 4 or not isinstance(stage.op, ComputeOp):
        return False
    return any(
        isinstance(node, te.expr.Binary)
        and node.op == "floordiv"
        and node.a is axes[-1]
        and isinstance(node.b, te.Const)
        for node in walk(stage.op.body)
    )


def _moves_blocked_columns(stage: Stage) -> bool:
    """An NCHW[x]c stage that reads a blocked input at a column computed from its own (a Resize or a Pad): by rows,
    each row's columns a serial loop of block vectors, its coordinates and blend weights come from the row and the
    column counters. The injective template's one fused loop recomputed the row and column of every vector by
    division (docs/benchmarks.md, "Template measurements")."""
    loads = _blocked_stage_loads(stage)
    column = stage.op.axis[3] if loads else None
    return any(
        len(node.indices) == 5
        and node.indices[3] is not column
        and any(part is column for part in walk(node.indices[3]))
        for node in loads
    )


def _blocks_channels(stage: Stage) -> bool:
    """An NCHW[x]c stage that reads an NCHW (or NCW) value at a channel made from its block axis: the LayoutTransform
    into the blocked layout. By rows (parallel over batch, channel block and row), each column's x channels are
    one vector read x planes apart from one base, where the injective template's single fused loop divided the
    fused index into the row and the column for every vector (docs/benchmarks.md, "Template measurements")."""
    loads = _blocked_stage_loads(stage)
    inner = stage.op.axis[4] if loads else None
    return any(len(node.indices) in (3, 4) and any(part is inner for part in walk(node.indices[1])) for node in loads)


def _chooses_by_channel_block(stage: Stage) -> bool:
    """An NCHW[x]c stage whose value a select chooses by its channel block: a Concat of blocked values on channels,
    with what is fused after it (densenet_block's Concat, batch norm and ReLU)."""
    if not _blocked_stage_loads(stage):
        return False
    pending, seen = [stage.op], {id(stage.op)}
    while pending:  # the stage and the inlined stages it reads elementwise (the Concat under the epilogue)
        op = pending.pop()
        block = op.axis[1]
        for node in walk(op.body):
            if isinstance(node, te.expr.Select) and any(part is block for part in walk(node.cond)):
                return True
            producer = node.tensor.op if isinstance(node, TensorLoad) else None
            if (
                isinstance(producer, ComputeOp)
                and id(producer) not in seen
                and stage.schedule[producer].attach_type == INLINE
                and len(node.indices) == 5
                and all(_same_axis(index, axis) for index, axis in zip(node.indices, op.axis))
            ):
                seen.add(id(producer))
                pending.append(producer)
    return False


def _same_axis(index, axis: IterVar) -> bool:
    """Whether `index` reads at `axis` itself (a unit axis's index may already be the constant 0)."""
    return index is axis or (axis.extent == 1 and isinstance(index, te.expr.Const) and index.value == 0)


def _schedule_channel_pieces(stage: Stage, target: Target) -> None:
    """Parallel over (batch, row); inside, the loop over channel blocks partitioned where the selects' tests change
    (each Concat input's blocks), so each piece reads its one input with no select, then the row's columns, each a
    block vector. The injective template's one fused loop tested every input's range and loaded from all of them
    for each vector, after dividing its index into block, row and column (docs/benchmarks.md, "Template
    measurements")."""
    n, block, row, column, inner = stage.op.axis
    vector = vectorize_innermost(stage, lanes(target, stage.op.dtype))
    stage.reorder(n, row, block, column, *([] if vector is inner else [vector]))
    stage.parallel(stage.fuse(n, row))
    stage.partition(block)


def _blocked_stage_loads(stage: Stage) -> list[TensorLoad]:
    """The tensor loads of an NCHW[x]c compute stage (five axes), or none for any other stage."""
    if len(stage.op.axis) != 5 or not isinstance(stage.op, ComputeOp):
        return []
    return [node for node in walk(stage.op.body) if isinstance(node, TensorLoad)]


def schedule_rows(stage: Stage, target: Target) -> None:
    """A padding stage: parallel over its rows, each row a vector loop when its width allows one, else a plain
    loop. Fusing the row axis in too (as _schedule_injective does) would cost a division and a modulo per element
    for the padded rows' odd widths. In a blocked (NCHW[x]c) layout the vector is the channel block and the loop
    over a row's columns is partitioned: the interior columns copy without testing the column."""
    axes = list(stage.op.axis)
    vectorize_innermost(stage, lanes(target, stage.op.dtype))
    if len(axes) == 5:
        stage.parallel(stage.fuse(*axes[:3]))
        stage.partition(axes[3])
    elif len(axes) > 1:
        stage.parallel(stage.fuse(*axes[:-1]))


def _schedule_reduction(stage: Stage, target: Target, cfg: ConfigSpace) -> IterVar | None:
    """Parallel over the outer data axes, the reduce loops next, and the innermost data axis as a vector loop
    inside them, so each reduction step updates a vector of accumulators. The parallel loop, if any."""
    axes = list(stage.op.axis)
    reduce_axes = list(stage.op.reduce_axis)
    width = lanes(target, stage.op.dtype) * _define_vector_lanes(cfg, "reduce", target)
    inner = None
    if axes and axes[-1].extent > 1:
        factor = vector_factor(axes[-1].extent, width)
        if factor > 1:
            outer, inner = stage.split(axes[-1], factor)
            axes[-1] = outer
    stage.reorder(*axes, *reduce_axes, *([inner] if inner is not None else []))
    if inner is not None:
        stage.vectorize(inner)
    if len(axes) > 1:
        axes = [stage.fuse(*axes)]
    if axes and (len(stage.op.axis) > 1 or axes[0].extent > 1):
        stage.parallel(axes[0])
        return axes[0]
    return None


def _order_attached_reduction(stage: Stage, vector_axis: bool) -> None:
    """An attached reduction's loops: data axes, then the reduce axes, then (vectorized) the innermost data axis,
    whose region is the reader's vector tile."""
    axes = list(stage.op.axis)
    reduce_axes = list(stage.op.reduce_axis)
    if vector_axis and axes:
        stage.reorder(*axes[:-1], *reduce_axes, axes[-1])
        stage.vectorize(axes[-1])


def schedule_rest(schedule: Schedule, readers, target: Target, cfg: ConfigSpace, done: set) -> None:
    """Every stage no template took: a reduction (or stash stage) read by one root stage is computed inside that
    stage's loops (at its vector tile when the shapes agree, at its row loop when the reduction keeps size-1 axes),
    the rest at the root with the generic templates."""
    pending = [s for s in schedule.stages if s not in done and isinstance(s.op, ComputeOp)]
    pending = [s for s in pending if s.attach_type == ROOT and s.relations == [] and not s.annotations]
    partials = {stage: _factor_plane(schedule, stage, target, cfg) for stage in pending if _is_plane_reduction(stage)}
    hosted = [s for s in pending if lives_in_host(s)]
    attached: dict[Stage, list[Stage]] = {}
    for stage in hosted:
        host = host_of(stage, readers, schedule, set())
        if host is not None and host not in hosted and host in pending:
            attached.setdefault(host, []).append(stage)
    for members in attached.values():
        for member in members:
            if member not in partials and _is_row_reduction(member):
                partials[member] = factor_row(schedule, member, target, cfg)
    if not cfg.template:
        cfg.template = "reduce" if any(stage.op.reduce_axis for stage in pending) else "injective"
    for stage in pending:
        if stage in attached:
            _schedule_host(stage, attached[stage], target, cfg)
            for member in attached[stage]:
                if member in partials:
                    schedule_partials(partials[member], stage, member.attach_ivar)
        elif any(stage in members for members in attached.values()):
            continue
        elif stage.op.reduce_axis:
            parallel = _schedule_reduction(stage, target, cfg)
            if stage in partials and parallel is not None:
                schedule_partials(partials[stage], stage, parallel)
        elif stage.op.tag == tags.LAYOUT_NCHW:
            _schedule_unblock(stage, target)
        elif _repeats_columns(stage) or _moves_blocked_columns(stage) or _blocks_channels(stage):
            schedule_rows(stage, target)
        elif _chooses_by_channel_block(stage):
            _schedule_channel_pieces(stage, target)
        else:
            _schedule_injective(stage, target, cfg)


def _is_plane_reduction(stage: Stage) -> bool:
    """A reduction over the last axes of one input (a global pool or ReduceMean over H x W in NCHW) that keeps the
    others: per output its domain is one contiguous run of memory, long enough for vectors of partial sums."""
    op = stage.op
    if not op.reduce_axis or len(op.reduce_axis) < 2 or not all(d == 1 for d in op.shape[2:]):
        return False
    loads = [node for node in walk(op.body) if isinstance(node, TensorLoad)]
    if len(loads) != 1 or len(loads[0].tensor.shape) != len(op.shape):
        return False
    reduce_vars = list(op.reduce_axis)
    axes = loads[0].indices[len(op.shape) - len(reduce_vars) :]
    extents = [axis.extent for axis in op.reduce_axis]
    return all(isinstance(e, int) for e in extents) and all(a is v for a, v in zip(axes, reduce_vars, strict=True))


def _factor_plane(schedule: Schedule, stage: Stage, target: Target, cfg: ConfigSpace) -> Stage | None:
    """rfactor a plane reduction into partial_vectors vectors (at most, and at most half the plane) of partial sums, lane t summing the plane's elements
    t, t + width, ... (contiguous loads), which the stage then adds up: one scalar chain of H x W adds ran at one add
    per 4 cycles (its latency) where a vector loop makes 16-64 per cycle."""
    width = lanes(target, stage.op.dtype)
    cfg.define_knob("partial_vectors", [1, 2, 4], default=fallback("plane_reduce", target)["partial_vectors"])
    total = math.prod(axis.extent for axis in stage.op.reduce_axis)
    vectors = min(cfg["partial_vectors"].val, total // (2 * width))  # a short plane (7 x 7) keeps one vector
    if vectors < 1:
        return None
    return schedule[schedule.rfactor(stage.op.output(0), width * vectors)]


def _is_row_reduction(stage: Stage) -> bool:
    """A reduction over one axis that every load it makes reads as its innermost index (softmax's max and sum over
    the last axis, layer norm's moments): per output its domain is one contiguous row."""
    op = stage.op
    if len(op.reduce_axis) != 1 or not isinstance(op.reduce_axis[0].extent, int):
        return False
    (k,) = op.reduce_axis
    for load in (node for node in walk(op.body) if isinstance(node, TensorLoad)):
        uses = [index for index in load.indices if mentions(index, k)]
        if uses and (len(uses) != 1 or load.indices[-1] is not k):
            return False
    return True


def factor_row(schedule: Schedule, stage: Stage, target: Target, cfg: ConfigSpace) -> Stage | None:
    """rfactor a row reduction into partial_vectors vectors of partials (lane t combining the row's elements t,
    t + factor, ...: contiguous vector loads), as _factor_plane does for planes; a row under two vectors keeps its
    scalar loop. Softmax over 77 or 128 scores had a scalar max and a scalar sum per row, one per add latency."""
    width = lanes(target, stage.op.dtype)
    cfg.define_knob("row_vectors", [1, 2], default=fallback("row_reduce", target)["partial_vectors"])
    total = stage.op.reduce_axis[0].extent
    vectors = min(cfg["row_vectors"].val, total // (2 * width))
    if vectors < 1:
        return None
    return schedule[schedule.rfactor(stage.op.output(0), width * vectors)]


def schedule_partials(partial: Stage | None, host: Stage, axis) -> None:
    """The partial sums as a local buffer made at the host's parallel loop: the lane axis innermost and vectorized."""
    if partial is None:
        return
    lane, *axes = partial.op.axis
    (step,) = partial.op.reduce_axis
    partial.set_scope("local")
    partial.compute_at(host, axis)
    partial.reorder(*axes, step, lane)
    partial.vectorize(lane)
    partial.partition(step)


def _schedule_host(host: Stage, members: list[Stage], target: Target, cfg: ConfigSpace) -> None:
    """`host` parallel over the axes every member keeps whole, with the members (local buffers) computed inside
    that loop: per vector tile when they have the host's shape, per row (softmax, layer norm) otherwise."""
    axes = list(host.op.axis)
    kept = [all(m.op.shape[d] == axes[d].extent for m in members) for d in range(len(axes))]
    width = lanes(target, host.op.dtype)
    if all(kept):
        outer = vectorize_innermost(host, width)
        vectorized = outer is not axes[-1]
        axes[-1] = outer
        fused = host.fuse(*axes) if len(axes) > 1 else axes[0]
        host.parallel(fused)
        for member in members:
            member.set_scope("local")
            member.compute_at(host, fused)
            _order_attached_reduction(member, vectorized)
        return
    outer_axes = [axis for axis, keep in zip(axes, kept) if keep]
    inner_axes = [axis for axis, keep in zip(axes, kept) if not keep]
    if not outer_axes:
        for member in members:
            _schedule_reduction(member, target, cfg)
        _schedule_injective(host, target, cfg)
        return
    host.reorder(*outer_axes, *inner_axes)
    fused = host.fuse(*outer_axes) if len(outer_axes) > 1 else outer_axes[0]
    host.parallel(fused)
    if inner_axes[-1] is axes[-1]:
        vectorize_row(host, width)
    for member in members:
        member.set_scope("local")
        member.compute_at(host, fused)
        if not member.op.reduce_axis:
            vectorize_row(member, width)
