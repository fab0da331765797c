"""How a fused group finds its template, shared by every target family (schedules/cpu/, schedules/gpu.py).

A group's schedule starts from its output stages. A whole-group template (Winograd, Attention) is chosen by one stage's
tag; else the group's anchor, the reduction whose tag names a tiled template (compute/tags.py), picks the family's
template for that kind, which schedules the anchor and the one stage that stores it; every other stage goes to the
family's generic templates. A family states what differs as data, a `Templates` entry."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import compiler.te as te
from compiler.compute import tags
from compiler.schedules.space import ConfigSpace
from compiler.target import Target
from compiler.te.schedule import INLINE, ROOT, Schedule, Stage
from compiler.te.tensor import STASH, ComputeOp, TensorLoad, walk

# The anchors' tags: a reduction with one of them has a template of its own
TILED_TAGS = (
    *tags.CONV_TAGS,
    *tags.CONV1D_TAGS,
    tags.DEPTHWISE_CONV2D,
    *tags.BLOCKED_CONV_TAGS,
    *tags.DENSE_TAGS,
    tags.DENSE_PACKED,
    *tags.POOL_TAGS,
    tags.CONV2D_TRANSPOSE_NCHWC,
)


@dataclass(frozen=True)
class Templates:
    """A target family's templates as the dispatch reads them.

    - `whole`: (stage tag, template name, template(schedule, target, cfg)) in the order they are tried: a group with a
      stage of that tag is the template's alone.
    - `anchored`: template kind (template_kind) -> template(schedule, anchor stage, output stage, target, cfg).
    - `prepare(schedule, anchor, kind, target)`: the family's inlining once the anchor is known (anchor and kind None
      when the group has no anchored template).
    - `rest(schedule, readers, target, cfg, done)`: the generic templates for every stage not in `done`."""

    whole: tuple[tuple[str, str, Callable], ...]
    anchored: Mapping[str, Callable]
    prepare: Callable[[Schedule, te.Tensor | None, str | None, Target], None]
    rest: Callable[[Schedule, dict, Target, ConfigSpace, set], None]


def schedule_with(templates: Templates, group, target: Target, cfg: ConfigSpace) -> Schedule:
    """A schedule of `group` (a GroupTE) by a family's `templates`; the template that took it is `cfg.template`."""
    outputs = [tensor for tensor in group.outputs if isinstance(tensor.op, ComputeOp)]
    schedule = te.create_schedule(list(dict.fromkeys(tensor.op for tensor in outputs)))
    add_unread_inputs(schedule, group.inputs)
    for tag, name, template in templates.whole:
        if any(getattr(stage.op, "tag", "") == tag for stage in schedule.stages):
            cfg.template = name
            template(schedule, target, cfg)
            return schedule
    anchor = anchor_reduction(schedule)
    if anchor is not None and anchor.op.tag in tags.POOL_TAGS and len(anchor.op.axis) == 4 and len(outputs) > 1:
        anchor = None  # a max pool's Indices read its padding too: that group keeps the generic schedule
    kind = template_kind(anchor)
    if kind not in templates.anchored:
        kind = anchor = None
    if kind is not None and schedule[anchor].is_output:
        # the anchor writes a register-sized local tile; the output stage copies it out (and does the epilogue)
        anchor = schedule.cache_write(anchor.op.output(0), "local")
    templates.prepare(schedule, anchor, kind, target)
    readers = stage_readers(schedule)
    if kind is not None and len(readers[schedule[anchor]]) == 1:
        output = readers[schedule[anchor]][0]
        if output.attach_type == ROOT and tuple(output.op.shape) == tuple(anchor.shape):
            cfg.template = kind
            templates.anchored[kind](schedule, schedule[anchor], output, target, cfg)
            templates.rest(schedule, readers, target, cfg, {schedule[anchor], output})
            return schedule
    templates.rest(schedule, readers, target, cfg, set())
    return schedule


def add_unread_inputs(schedule: Schedule, inputs: list[te.Tensor]) -> None:
    """The kernel takes every group input (its ABI), even one no output reads (an op that ignores an operand):
    such a placeholder gets a stage so lowering can make it a parameter."""
    for tensor in inputs:
        if tensor.op not in schedule.stage_map:
            stage = Stage(schedule, tensor.op)
            schedule.stages.insert(0, stage)
            schedule.stage_map[tensor.op] = stage


def anchor_reduction(schedule: Schedule) -> te.Tensor | None:
    """The reduction whose tag names a tiled template, else None (generic templates then apply)."""
    for stage in schedule.stages:
        op = stage.op
        if not (isinstance(op, ComputeOp) and op.reduce_axis and op.tag in TILED_TAGS):
            continue
        if op.tag in tags.POOL_TAGS and len(op.axis) not in (4, 5):
            continue  # 1-D and 3-D pools keep the generic reduction schedule
        if len(op.axis) in (2, 4, 5) or op.tag in (*tags.CONV1D_TAGS, tags.DENSE_PACKED):
            return op.output(0)
        if op.tag == "batch_matmul" and len(op.axis) > 2:
            return op.output(0)
    return None


def template_kind(anchor: te.Tensor | None) -> str | None:
    if anchor is None:
        return None
    if anchor.op.tag in tags.DENSE_TAGS:
        return "dense"
    if anchor.op.tag in tags.CONV1D_TAGS:
        return "conv1d"
    return "conv2d" if anchor.op.tag in tags.CONV_TAGS else anchor.op.tag


def padding_stage(schedule: Schedule, anchor: te.Tensor):
    """The conv's padded input, when the compute made one: kept as its own stage so the conv's inner loop reads
    a plain buffer (a select in the vector loop would cost a compare per multiply-add)."""
    for tensor in anchor.op.input_tensors:
        op = tensor.op
        if isinstance(op, ComputeOp) and op.tag == tags.INJECTIVE and not op.reduce_axis:
            return op
    return None


def inline_injective(schedule: Schedule, keep: set[int]) -> None:
    for stage in schedule.stages:
        op = stage.op
        if isinstance(op, ComputeOp) and not op.reduce_axis and not stage.is_output and id(op) not in keep:
            if op.tag == STASH:
                continue
            if stage.scope == "global":
                stage.compute_inline()


def stage_readers(schedule: Schedule) -> dict[Stage, list[Stage]]:
    """For every stage, the non-inlined stages that read it (through any chain of inlined stages)."""
    found: dict[Stage, list[Stage]] = {stage: [] for stage in schedule.stages}

    def reads(stage: Stage, seen: set[int]) -> list[Stage]:
        result = []
        for node in walk(stage.op.body) if isinstance(stage.op, ComputeOp) else ():
            if isinstance(node, TensorLoad):
                producer = schedule[node.tensor]
                if id(producer) in seen:
                    continue
                seen.add(id(producer))
                result.append(producer)
                if producer.attach_type == INLINE:
                    result += reads(producer, seen)
        return result

    for stage in schedule.stages:
        if stage.attach_type == INLINE or not isinstance(stage.op, ComputeOp):
            continue
        for producer in reads(stage, set()):
            if producer.attach_type != INLINE and stage not in found[producer]:
                found[producer].append(stage)
    return found


def lives_in_host(stage: Stage) -> bool:
    """Reductions and stash stages (made once for several readers) that no one outside the group reads are made
    inside the loops of the stage they feed."""
    return bool(stage.op.reduce_axis or stage.op.tag == STASH) and not stage.is_output


def host_of(stage: Stage, readers, schedule: Schedule, seen: set[int]) -> Stage | None:
    """The single root stage that `stage`'s value ends up in: its only reader, or the host of readers that are
    themselves reductions attached to the same host (softmax's max is read by its sum and its output)."""
    hosts = set()
    for reader in readers[stage]:
        if lives_in_host(reader) and id(reader) not in seen:
            seen.add(id(reader))
            hosts.add(host_of(reader, readers, schedule, seen))
        else:
            hosts.add(reader)
    if len(hosts) != 1:
        return None
    host = hosts.pop()
    if host is None or host.op.reduce_axis or not host.op.axis or len(host.op.axis) != len(stage.op.axis):
        return None
    if any(r not in (1, h) for r, h in zip(stage.op.shape, host.op.shape)):
        return None
    return host
