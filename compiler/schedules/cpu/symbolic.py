"""The CPU template of a group with symbolic sizes (issue 40 §1): correct for every size in the ranges, simple first.

Every injective stage but the outputs is inlined. Each remaining stage runs its data axes with the innermost one
vectorized when it is a fixed size that whole vectors divide, the others fused into one parallel loop (a symbolic
extent makes a fused loop of a run-time length), and its reduction axes inside, before the vector loop. A reduction
that one stage reads (a MatMul under its epilogue, a softmax's max and sum) is computed inside that stage's parallel
loop, for the row it needs, so no intermediate is laid out whole.

The dispatch's templates schedule a symbolic group first, planning its tiles for the sizes' layout extents
(schedules/cpu/__init__.py, planning_sizes); this one takes the groups a template cannot plan (one that needs a fixed
extent for its factoring, say): docs/symbolic.md, "Schedules".
"""

from __future__ import annotations

from compiler.schedules.cpu.tiling import lanes, vector_factor
from compiler.schedules.dispatch import host_of, inline_injective, lives_in_host, stage_readers
from compiler.schedules.space import ConfigSpace
from compiler.target import Target
from compiler.te.schedule import INLINE, Schedule, Stage
from compiler.te.tensor import ComputeOp


def is_symbolic(group) -> bool:
    """Whether any stage or input of a GroupTE has a dimension that is not an int (a size known at run time)."""
    tensors = [*group.inputs, *group.stages]
    return any(not isinstance(extent, int) for tensor in tensors for extent in tensor.shape)


def _static_vector(stage: Stage, target: Target):
    """The innermost data axis split into a vectorized inner loop when it has a fixed extent, else None."""
    axis = stage.op.axis[-1] if stage.op.axis else None
    if axis is None or not isinstance(axis.extent, int) or axis.extent < 2:
        return None
    factor = vector_factor(axis.extent, lanes(target, stage.op.dtype))
    if factor <= 1:
        return None
    return stage.split(axis, factor)


def _schedule_stage(stage: Stage, target: Target, attached: bool):
    """Loops for one stage: [fused data axes (parallel unless attached), reduce axes, vector lanes]; the outer loop."""
    data = list(stage.op.axis)
    split = _static_vector(stage, target)
    vector = None
    if split is not None:
        data[-1], vector = split
    reduce = list(stage.op.reduce_axis)
    stage.reorder(*data, *reduce, *([vector] if vector is not None else []))
    if vector is not None:
        stage.vectorize(vector)
    if not data:
        return None
    outer = stage.fuse(*data) if len(data) > 1 else data[0]
    if not attached:
        stage.parallel(outer)
    return outer


def schedule_symbolic(schedule: Schedule, target: Target, cfg: ConfigSpace) -> None:
    cfg.template = "symbolic"
    inline_injective(schedule, set())
    readers = stage_readers(schedule)
    stages = [s for s in schedule.stages if isinstance(s.op, ComputeOp) and s.attach_type != INLINE]
    hosts = {}
    for stage in stages:
        if lives_in_host(stage):
            host = host_of(stage, readers, schedule, set())
            if host is not None and host.op.axis:
                hosts[stage] = host
    outers = {}
    for stage in stages:
        if stage not in hosts:
            outers[stage] = _schedule_stage(stage, target, attached=False)
    for stage, host in hosts.items():
        _schedule_stage(stage, target, attached=True)
        if outers.get(host) is not None:
            stage.compute_at(host, outers[host])
