"""The CPU schedules (x86-64, AArch64, ARMv7 and wasm): how each fused group's tensor expressions become parallel,
vectorized loops.

`schedule_group` reads a GroupTE (compiler/compute/group.py) through the shared dispatch (schedules/dispatch.py):
Winograd and Attention groups by their stages' tags, else the anchor reduction's kind picks a template of TEMPLATES,
one module per family (conv, depthwise, blocked_conv, dense, pool, winograd, attention), and every other stage goes
to the generic templates (generic.py). Each template declares its knobs on a cfg (compiler/schedules/space.py) and reads
their values back; without a tuning record they take the fallbacks of defaults.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import compiler.te as te
from compiler.compute import PLAN_LARGEST, PLAN_SMALLEST, planning_sizes, tags
from compiler.errors import SymbolicSizeError
from compiler.schedules.cpu.attention import schedule_attention
from compiler.schedules.cpu.blocked_conv import schedule_blocked_conv, schedule_transposed_conv
from compiler.schedules.cpu.conv import schedule_conv1d, schedule_conv2d
from compiler.schedules.cpu.defaults import DEFAULTS, SPACE_VERSION, VECTOR_DEFAULTS, fallback
from compiler.schedules.cpu.dense import schedule_dense, schedule_dense_packed
from compiler.schedules.cpu.depthwise import schedule_depthwise
from compiler.schedules.cpu.generic import schedule_rest, schedule_rows
from compiler.schedules.cpu.pool import schedule_pool
from compiler.schedules.cpu.symbolic import is_symbolic, schedule_symbolic
from compiler.schedules.cpu.tiling import divisor_at_most, lanes, tile_or_tail, vector_factor, vector_registers
from compiler.schedules.cpu.winograd import schedule_winograd
from compiler.schedules.dispatch import Templates, add_unread_inputs, inline_injective, padding_stage, schedule_with
from compiler.schedules.space import ConfigSpace, run_template
from compiler.target import Target
from compiler.te.schedule import Schedule

# Template kind (dispatch.template_kind) -> the template that schedules a group anchored by it
TEMPLATES = {
    tags.CONV2D: schedule_conv2d,
    tags.CONV1D: schedule_conv1d,
    tags.DEPTHWISE_CONV2D: schedule_depthwise,
    tags.CONV2D_NCHWC: schedule_blocked_conv,
    tags.DEPTHWISE_CONV2D_NCHWC: schedule_blocked_conv,
    tags.DENSE: schedule_dense,
    tags.DENSE_PACKED: schedule_dense_packed,
    tags.POOL_MAX: schedule_pool,
    tags.POOL_AVG: schedule_pool,
    tags.CONV2D_TRANSPOSE_NCHWC: schedule_transposed_conv,
}


def anchor_weights(anchor: te.Tensor | None, kind: str | None) -> list[te.Tensor]:
    """A MatMulPacked's widened narrow weight, which its template places (schedule_dense_packed)."""
    if kind != tags.DENSE_PACKED:
        return []
    return [tensor for tensor in anchor.op.input_tensors if getattr(tensor.op, "tag", "") == tags.DENSE_WEIGHT]


def _prepare(schedule: Schedule, anchor: te.Tensor | None, kind: str | None, target: Target) -> None:
    """Inline every injective stage but a conv's (or an NCHW pool's) padded input, which stays a stage of its own so
    the template's inner loop reads a plain buffer; where the template does not place it, its rows are scheduled."""
    nchw_pool = kind in tags.POOL_TAGS and len(anchor.op.axis) == 4
    keep: set[int] = set()
    if kind in (tags.CONV2D, tags.CONV1D, tags.DEPTHWISE_CONV2D, *tags.BLOCKED_CONV_TAGS) or nchw_pool:
        pad = padding_stage(schedule, anchor)
        if pad is not None:
            keep.add(id(pad))
    inline_injective(schedule, keep | {id(t.op) for t in anchor_weights(anchor, kind)})
    for stage in schedule.stages:
        if id(stage.op) in keep and kind not in (tags.DEPTHWISE_CONV2D, *tags.BLOCKED_CONV_TAGS) and not nchw_pool:
            schedule_rows(stage, target)


CPU_TEMPLATES = Templates(
    whole=(
        (tags.WINOGRAD_GEMM, "winograd", schedule_winograd),
        (tags.ATTENTION, tags.ATTENTION, schedule_attention),
    ),
    anchored=TEMPLATES,
    prepare=_prepare,
    rest=schedule_rest,
)


# the templates whose register blocks tile a symbolic axis: planned for its largest value, a small one fills a block
# with padding (a decode step's one row in a MatMulPacked's 6-row block streamed the weights 30 % slower)
SMALL_SIZE_TEMPLATES = frozenset({tags.DENSE_PACKED})


def _schedule(group, target: Target, cfg: ConfigSpace, sizes: str = PLAN_LARGEST) -> te.Schedule:
    """The dispatch's templates. A group with symbolic sizes takes them too, its templates choosing tiles for the
    sizes' largest values (planning_sizes; or `sizes` PLAN_SMALLEST, the smallest); where one cannot (it needs a fixed
    extent), the symbolic template."""
    if not is_symbolic(group):
        return schedule_with(CPU_TEMPLATES, group, target, cfg)
    try:
        with planning_sizes(sizes):
            return schedule_with(CPU_TEMPLATES, group, target, cfg)
    except (SymbolicSizeError, te.TEError, TypeError, AttributeError, ValueError):
        # a template that needs a fixed extent somewhere (a constant reduce for its factoring, an int's method): the
        # symbolic template, which is correct for every size, on a fresh cfg
        cfg.__init__(cfg.values)
    outputs = [tensor for tensor in group.outputs if isinstance(tensor.op, te.ComputeOp)]
    schedule = te.create_schedule(list(dict.fromkeys(tensor.op for tensor in outputs)))
    add_unread_inputs(schedule, group.inputs)
    schedule_symbolic(schedule, target, cfg)
    return schedule


def schedule_group(group, target: Target, config: ConfigSpace | Mapping | None = None) -> te.Schedule:
    """A schedule of `group` (a GroupTE) for a CPU target. `config`: a cfg for the template to declare its knobs on
    (afterwards it holds the space), or a record's knob values (name -> JSON value: values that do not fit the
    template warn, and the fallback is built), or None for the fallback."""
    if isinstance(config, ConfigSpace):
        return _schedule(group, target, config)
    return run_template(partial(_schedule, group, target), config)[0]


def schedule_small_sizes(group, target: Target, general: ConfigSpace) -> tuple[te.Schedule, ConfigSpace] | None:
    """A symbolic group's variant for its sizes' smallest values (a decode step's single row), beside the schedule
    `general` configured, which plans for their largest; the kernel runs it when the sizes it reads are at their
    smallest (tir/variants.by_smallest_sizes). None where the group's template is not one of SMALL_SIZE_TEMPLATES,
    or plans the same."""
    if general.template not in SMALL_SIZE_TEMPLATES or not is_symbolic(group):
        return None
    cfg = ConfigSpace()
    schedule = _schedule(group, target, cfg, PLAN_SMALLEST)
    if cfg.template != general.template or cfg.current.to_json() == general.current.to_json():
        return None
    return schedule, cfg


__all__ = [
    "DEFAULTS",
    "SPACE_VERSION",
    "TEMPLATES",
    "VECTOR_DEFAULTS",
    "divisor_at_most",
    "fallback",
    "lanes",
    "schedule_group",
    "schedule_small_sizes",
    "tile_or_tail",
    "vector_factor",
    "vector_registers",
]
