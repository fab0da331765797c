"""GPU schedules (WebGPU, OpenCL, CUDA): how each fused group's tensor expressions become thread-bound kernels.

`schedule_group` has the CPU's interface and reads the group through the same dispatch (schedules/dispatch.py): the
anchor reduction by its tag, the epilogue computed at the anchor's tile, a reduction made inside the stage it feeds. Every stage runs under
blockIdx/threadIdx loops, which a CPU target runs serially with the same result (docs/architecture.md, "Thread loops
per stage"), so the templates are checked on llvm. Knobs are declared on a cfg; add_filter keeps configs within
target.device (threads per block, shared bytes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial

import numpy as np

import compiler.te as te
from compiler.compute import tags
from compiler.errors import TargetError
from compiler.schedules.dispatch import (
    Templates,
    host_of,
    inline_injective,
    lives_in_host,
    schedule_with,
    stage_readers,
)
from compiler.schedules.space import ConfigSpace, run_template
from compiler.target import Target
from compiler.te.schedule import INLINE, ROOT, Schedule, Stage
from compiler.te.tensor import ComputeOp, IterVar

# Part of every GPU tuning task's key: bump it when a template's knobs change meaning.
SPACE_VERSION = 5

# Each template's fallback config by knob name, clipped to the target's threads per block. A split's value is the
# inner sizes its fallback is at most.
DEFAULTS: dict[str, dict[str, object]] = {
    # one output element per thread
    "injective": {"num_thread": 256},
    # threads over the outputs, or (cross_thread) one block per output (a softmax's or layer norm's row) whose
    # threads share its reduction; serial_row: the longest reduction the fallback leaves to one thread whatever the
    # rule below says (0: the rule alone, and a row's statistics always shared by a block)
    "reduce": {"num_thread": 256, "serial_row": 0},
    # threads along the output positions, tile_w columns (at most; a divisor of the row) by tile_oc output channels
    # per thread in registers; cache 1 loads each reduction step's operands of the tile into registers once
    # (webgpu's fallback: TARGET_DEFAULTS)
    "conv2d": {"num_thread": 128, "tile_oc": 4, "tile_w": 1, "cache": 0},
    "conv1d": {"num_thread": 128, "tile_oc": 4, "tile_w": 1, "cache": 0},
    # the seeds' schedule: a blocking_h x blocking_w output tile per block over one channel, its input tile and
    # filter in shared memory, num_thread_y x num_thread_x threads (the fallback aims at 2 x 2 outputs per thread),
    # vthread_y x vthread_x virtual threads interleaving each thread's outputs; unroll_steps: the most
    # multiply-adds (unrolled taps x a thread's outputs) the fallback unrolls, whole tap axes from the innermost
    # (None: every tap)
    "depthwise_conv2d": {
        "blocking_h": 32,
        "blocking_w": 32,
        "vthread_y": 1,
        "vthread_x": 1,
        "shared": 1,
        "unroll_steps": None,
    },
    # a block of (threads x register tile) rows and columns, A's and B's tiles of tile_k along k in shared memory;
    # 16-row blocks waste less of a token count that is no multiple of 32, and 64 threads with tile_k 16 halve the
    # barriers per multiply-add of 128 threads with tile_k 8 (docs/gpu.md, "Register tiles for the browser"); cache 1
    # loads each step of k's A column and B row of the register tile into registers once (webgpu's fallback)
    "dense": {"tile_y": (4, 4), "tile_x": (16, 4), "tile_k": 16, "shared": 1, "cache": 0},
    # one output per thread, the window's taps unrolled
    "pool_max": {"num_thread": 128},
    "pool_avg": {"num_thread": 128},
}
# What a target kind's fallback changes in DEFAULTS. WebGPU's measured adapters run a workgroup as SIMD lanes of a
# CPU thread: shared tiles and barriers cost more there than the reads they save (docs/benchmarks.md, "GPU
# TARGET_DEFAULTS"). A conv tile of 4 columns, its operands cached in registers:
_CONV_WEBGPU = {"tile_w": 4, "cache": 1}
# webgpu: rows up to 4096 reduced by one thread each (no barrier tree), at most 64 multiply-adds of taps unrolled, and
# a dense tile cached in registers: each shortens pipeline creation, which dominates there ("GPU TARGET_DEFAULTS")
TARGET_DEFAULTS: dict[str, dict[str, dict[str, object]]] = {
    "webgpu": {
        "reduce": {"serial_row": 4096},
        "dense": {"shared": 0, "cache": 1},
        "depthwise_conv2d": {"shared": 0, "unroll_steps": 64},
        "conv2d": _CONV_WEBGPU,
        "conv1d": _CONV_WEBGPU,
    },
}

THREAD_CHOICES = (32, 64, 128, 256, 512, 1024)
# the thread counts along one axis of a depthwise block and its virtual threads, as in the seeds' grid
AXIS_THREADS = (1, 2, 4, 8, 16, 32)
VTHREADS = (1, 2, 4)
# the output columns one conv thread may hold
TILE_WIDTHS = (1, 2, 4, 8)


def fallback(kind: str, target: Target) -> dict[str, object]:
    """The template's fallback knob values, the thread counts clipped to what one block of `target` may run."""
    values = {**DEFAULTS[kind], **TARGET_DEFAULTS.get(target.kind, {}).get(kind, {})}
    if "num_thread" in values:
        values["num_thread"] = min(values["num_thread"], target.device.max_threads)
    return values


def schedule_group(group, target: Target, config: ConfigSpace | Mapping | None = None) -> te.Schedule:
    """A schedule of `group` (a GroupTE) for a GPU target. `config`: a cfg for the template to declare its knobs on
    (afterwards it holds the space), or a record's knob values, or None for the fallback (as on the CPU)."""
    if not target.is_gpu:
        raise TargetError(
            f"GPU schedules are for webgpu, opencl or cuda targets, not {target.kind}; use schedules/cpu/"
        )
    if isinstance(config, ConfigSpace):
        return schedule_with(GPU_TEMPLATES, group, target, config)
    return run_template(partial(schedule_with, GPU_TEMPLATES, group, target), config)[0]


def schedule_small_sizes(group, target: Target, general: ConfigSpace) -> None:
    """No variants for small sizes: GPU targets compile static models only (compile_model refuses symbolic ones)."""
    return None


def _prepare(schedule: Schedule, anchor: te.Tensor | None, kind: str | None, target: Target) -> None:
    """Every injective stage inlined; an output that other stages also read recomputed by them."""
    inline_injective(schedule, set())
    _recompute_read_outputs(schedule)


def _recompute_read_outputs(schedule: Schedule) -> None:
    """An output that other stages of the group also read (layer norm's x - mean, stored and squared) is recomputed
    by them (Schedule.recompute) when it reads nothing but the group's inputs, so the kernel stays one launch
    (tir/gpu.py split_launches would otherwise start a second one at the reader)."""
    for stage in list(schedule.stages):
        op = stage.op
        if not (stage.is_output and isinstance(op, ComputeOp)) or op.reduce_axis or stage.attach_type != ROOT:
            continue
        readers = [other for other in schedule.stages if other is not stage and stage in schedule.producers_of(other)]
        if readers and all(_reads_only_inputs(schedule, producer) for producer in schedule.producers_of(stage)):
            schedule.recompute(op.output(0))


def _reads_only_inputs(schedule: Schedule, stage: Stage) -> bool:
    """Whether `stage` is an input, or an inlined stage that (through other inlined ones) reads only inputs."""
    if not isinstance(stage.op, ComputeOp):
        return True
    return stage.attach_type == INLINE and all(_reads_only_inputs(schedule, p) for p in schedule.producers_of(stage))


# -- binding helpers ------------------------------------------------------------------------------------------------


def _define_threads(cfg: ConfigSpace, kind: str, target: Target) -> int:
    """The threads per block of a template that runs one thread per output (or per reduction lane)."""
    choices = [count for count in THREAD_CHOICES if count <= target.device.max_threads]
    cfg.define_knob("num_thread", choices, default=fallback(kind, target)["num_thread"])
    return cfg["num_thread"].val


def _bind_blocks(stage: Stage, axis: IterVar, target: Target, first: int = 0) -> IterVar:
    """Bind `axis` to blockIdx (x, or y and z from `first`), split over the next grid axis where it is longer than
    the grid allows; the innermost block axis."""
    tags = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
    limit = target.device.max_grid[first]
    if axis.extent > limit and first < 2:
        outer, axis = stage.split(axis, limit)
        stage.bind(outer, te.thread_axis(tags[first + 1]))
    stage.bind(axis, te.thread_axis(tags[first]))
    return axis


def _thread_count(threads: int, extent: int) -> int:
    """The threads a loop of `extent` is split over: at most `threads`, at least one (a split by 0 is invalid, and an
    empty tensor's loops have extent 0)."""
    return max(1, min(threads, extent))


def _bind_threads(stage: Stage, axes: list[IterVar], threads: int, target: Target) -> tuple[IterVar, IterVar]:
    """Fuse `axes` and run them as blocks of `threads` threads (fewer when the axes are shorter); (block, thread)."""
    fused = stage.fuse(*axes) if len(axes) > 1 else axes[0]
    blocks, thread = stage.split(fused, _thread_count(threads, fused.extent))
    stage.bind(thread, te.thread_axis("threadIdx.x"))
    return _bind_blocks(stage, blocks, target), thread


def _bind_cooperative(stage: Stage, threads_y: int, threads_x: int) -> None:
    """A shared stage filled by the whole block: its elements in row-major runs over threadIdx.x, then threadIdx.y
    (consecutive threads read consecutive addresses), serial beyond."""
    axes = list(stage.op.axis)
    fused = stage.fuse(*axes) if len(axes) > 1 else axes[0]
    rest, thread_x = stage.split(fused, threads_x)
    stage.bind(thread_x, te.thread_axis("threadIdx.x"))
    if threads_y > 1:
        _, thread_y = stage.split(rest, threads_y)
        stage.bind(thread_y, te.thread_axis("threadIdx.y"))


def _shared_bytes(*tiles: tuple[int, str]) -> int:
    return sum(count * np.dtype(dtype).itemsize for count, dtype in tiles)


# -- generic templates ----------------------------------------------------------------------------------------------


def _schedule_rest(schedule: Schedule, readers, target: Target, cfg: ConfigSpace, done: set) -> None:
    """Every stage no template took: a reduction (or stash stage) read by one root stage is made inside that stage's
    block (in shared memory, its reduction shared by the block's threads) or thread (in registers), the rest at the
    root with one thread per output."""
    pending = [s for s in schedule.stages if s not in done and isinstance(s.op, ComputeOp)]
    pending = [s for s in pending if s.attach_type == ROOT and s.relations == [] and not s.bindings]
    hosted = [s for s in pending if lives_in_host(s)]
    attached: dict[Stage, list[Stage]] = {}
    for stage in hosted:
        host = host_of(stage, readers, schedule, set())
        if host is not None and host not in hosted and host in pending:
            attached.setdefault(host, []).append(stage)
    if not cfg.template:
        cfg.template = "reduce" if any(stage.op.reduce_axis for stage in pending) else "injective"
    if not pending:
        return
    threads = _define_threads(cfg, cfg.template if cfg.template in ("injective", "reduce") else "injective", target)
    for stage in pending:
        if stage in attached:
            _schedule_host(schedule, stage, attached[stage], threads, target, cfg)
        elif any(stage in members for members in attached.values()):
            continue
        elif stage.op.reduce_axis:
            _schedule_reduction(schedule, stage, threads, target, cfg)
        elif stage.op.axis:
            _bind_threads(stage, list(stage.op.axis), threads, target)


def _reduce_extent(stage: Stage) -> int:
    return math.prod(iv.extent for iv in stage.op.reduce_axis)


def _share_reduction(schedule: Schedule, stage: Stage, threads: int, host: Stage | None, at: IterVar | None) -> None:
    """A cross-thread reduction: `threads` partial results in shared memory (Schedule.rfactor_tree), each thread's
    lane bound to threadIdx.x, then halved step by step (a tree, one barrier per step) down to the one or two lanes
    the stage combines; computed at `at` of `host` (or, without a host, at the kernel's root)."""
    lanes = _thread_count(threads, _reduce_extent(stage))
    for tensor in schedule.rfactor_tree(stage.op.output(0), lanes):
        partial_stage = schedule[tensor]
        partial_stage.set_scope("shared")
        partial_stage.bind(partial_stage.op.axis[0], te.thread_axis("threadIdx.x"))
        if host is not None:
            partial_stage.compute_at(host, at)


def _define_cross_thread(cfg: ConfigSpace, stages: list[Stage], target: Target) -> bool:
    """Whether the reductions of `stages` are shared by a block's threads (one block per output) rather than made
    one output per thread. The fallback shares a reduction longer than a warp that has more elements to reduce
    than there are outputs, unless the target's serial_row says one thread reduces it alone."""
    outputs = max(math.prod(iv.extent for iv in stage.op.axis) for stage in stages)
    extent = max(_reduce_extent(stage) for stage in stages)
    alone = extent <= fallback("reduce", target)["serial_row"]
    share = int(extent >= target.device.warp_size and extent > outputs and not alone)
    cfg.define_knob("cross_thread", [0, 1], default=share)
    return bool(cfg["cross_thread"].val)


def _schedule_reduction(schedule: Schedule, stage: Stage, threads: int, target: Target, cfg: ConfigSpace) -> None:
    """A root reduction: one thread per output, or (cross_thread) one block per output whose threads each reduce a
    strided share of its elements into shared memory before one of them combines the shares."""
    cross = _define_cross_thread(cfg, [stage], target)
    if not stage.op.axis:
        _share_reduction(schedule, stage, threads, None, None)
    elif not cross:
        _bind_threads(stage, list(stage.op.axis), threads, target)
    else:
        axes = list(stage.op.axis)
        block = _bind_blocks(stage, stage.fuse(*axes) if len(axes) > 1 else axes[0], target)
        _share_reduction(schedule, stage, threads, stage, block)


def _schedule_host(
    schedule: Schedule, host: Stage, members: list[Stage], threads: int, target: Target, cfg: ConfigSpace
) -> None:
    """`host` with the stages it alone reads made inside it. When they have its shape and are not shared
    (cross_thread), each thread makes its element of them in registers. Otherwise (softmax, layer norm: a row's
    statistics; a mean) the axes every member keeps whole are blocks, the rest (the row) threads, and the members
    are made per block in shared memory, their reductions shared by the block's threads; or (cross_thread 0) each
    thread makes one row: its statistics in registers, serially, and a member as long as the row recomputed where
    it is read (no barrier at all)."""
    axes = list(host.op.axis)
    kept = [all(m.op.shape[d] == axes[d].extent for m in members) for d in range(len(axes))]
    reductions = [member for member in members if member.op.reduce_axis]
    if all(kept) and not (reductions and _define_cross_thread(cfg, reductions, target)):
        _, thread = _bind_threads(host, axes, threads, target)
        for member in members:
            member.set_scope("local")
            member.compute_at(host, thread)
        return
    outer_axes = [axis for axis, keep in zip(axes, kept) if keep]
    inner_axes = [axis for axis, keep in zip(axes, kept) if not keep]
    host.reorder(*outer_axes, *inner_axes)
    if outer_axes and not all(kept) and not _define_share_rows(cfg, host, kept, target):
        _, thread = _bind_threads(host, outer_axes, threads, target)
        for member in members:
            if member.op.reduce_axis or _row_bytes(member, kept) == np.dtype(member.op.dtype).itemsize:
                member.set_scope("local")
                member.compute_at(host, thread)
            else:
                member.compute_inline()
        return
    row = None
    if inner_axes:
        row = host.fuse(*inner_axes) if len(inner_axes) > 1 else inner_axes[0]
    if outer_axes:
        block = host.fuse(*outer_axes) if len(outer_axes) > 1 else outer_axes[0]
    else:
        block, row = host.split(row, nparts=1)
    block = _bind_blocks(host, block, target)
    if row is not None:
        _, thread = host.split(row, _thread_count(threads, row.extent))
        host.bind(thread, te.thread_axis("threadIdx.x"))
    for member in members:
        if not member.op.reduce_axis and _row_bytes(member, kept) > target.device.shared_bytes // 2:
            member.compute_inline()  # a row too long to hold in shared memory is recomputed by each reader
            continue
        member.set_scope("shared")
        member.compute_at(host, block)
        if member.op.reduce_axis:
            _share_reduction(schedule, member, threads, host, block)
        else:
            # threads over the axes the block does not fix: fusing in the fixed ones (one element each per block)
            # would make the region inference bound them by the thread split's rounded-up extent
            fixed = [axis for axis, keep in zip(member.op.axis, kept) if keep]
            row_axes = [axis for axis, keep in zip(member.op.axis, kept) if not keep]
            member.reorder(*fixed, *row_axes)
            fused = member.fuse(*row_axes) if len(row_axes) > 1 else row_axes[0]
            _, member_thread = member.split(fused, _thread_count(threads, fused.extent))
            member.bind(member_thread, te.thread_axis("threadIdx.x"))


def _define_share_rows(cfg: ConfigSpace, host: Stage, kept: list[bool], target: Target) -> bool:
    """Whether a block's threads share each row of `host` (cross_thread 1) rather than one thread making a row. The
    fallback shares rows longer than the target's serial_row (every row, where it is 0)."""
    row = math.prod(axis.extent for axis, keep in zip(host.op.axis, kept) if not keep)
    share = int(row > fallback("reduce", target)["serial_row"])
    cfg.define_knob("cross_thread", [0, 1], default=share)
    return bool(cfg["cross_thread"].val)


def _row_bytes(stage: Stage, kept: list[bool]) -> int:
    """The bytes of `stage` one block holds: its axes the block does not fix."""
    count = math.prod(axis.extent for axis, keep in zip(stage.op.axis, kept) if not keep)
    return count * np.dtype(stage.op.dtype).itemsize


# -- anchor templates -----------------------------------------------------------------------------------------------


def _conv(schedule: Schedule, conv: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """Direct convolution (group 1 or grouped, 1-D or 2-D, NCHW): each thread owns a register tile of tile_w
    neighbouring output columns of one row by tile_oc output channels, so every input value it loads feeds tile_oc
    multiply-adds and every weight tile_w; consecutive threads take consecutive column runs, the block num_thread
    runs of one channel tile; the epilogue runs on the thread's tile before it is stored."""
    kind = cfg.template
    values = fallback(kind, target)
    n, oc, *spatial = output.op.axis
    threads = _define_threads(cfg, kind, target)
    cfg.define_split("tile_oc", oc, default=values["tile_oc"])
    columns = spatial[-1]
    # the fallback's run is the widest of its choices that divides the row, so no run crosses a row's end
    widths = [width for width in TILE_WIDTHS if width <= max(1, columns.extent)]
    width = max((w for w in widths if columns.extent % w == 0 and w <= values["tile_w"]), default=1)
    cfg.define_knob("tile_w", widths, default=width)
    # cache 1: per reduction step, the tile's input values and weights are loaded once into registers, so each
    # multiply-add reads registers only (without it each of the tile's multiply-adds loads both operands itself).
    # Not for a grouped conv: a channel tile crossing a group's end reads two groups' inputs, and the cached span
    # between them (62 values for odd_convnet's 3-group conv) made SwiftShader's GPU process fail to compile it.
    grouped = conv.op.tag.startswith("group_")
    cfg.define_knob("cache", [0] if grouped else [0, 1], default=0 if grouped else values["cache"])
    caches = []
    if cfg["cache"].val:
        caches = [schedule.cache_read(t, "local", [conv.op.output(0)]) for t in dict.fromkeys(conv.op.input_tensors)]
    oc_outer, oc_inner = cfg["tile_oc"].apply(schedule, output, oc)
    runs, column = output.split(columns, cfg["tile_w"].val)
    outer = [*spatial[:-1], runs]
    positions = output.fuse(*outer) if len(outer) > 1 else outer[0]
    blocks, thread = output.split(positions, _thread_count(threads, positions.extent))
    output.reorder(n, oc_outer, blocks, thread, column, oc_inner)
    output.bind(thread, te.thread_axis("threadIdx.x"))
    output.unroll(column)
    output.unroll(oc_inner)
    _bind_blocks(output, output.fuse(n, oc_outer, blocks), target)
    conv.set_scope("local")
    conv.compute_at(output, thread)
    cn, coc, *cspatial = conv.op.axis
    conv.reorder(cn, *cspatial[:-1], *conv.op.reduce_axis, cspatial[-1], coc)
    conv.unroll(cspatial[-1])
    conv.unroll(coc)
    for cache in caches:
        stage = schedule[cache]
        stage.compute_at(conv, conv.op.reduce_axis[-1])
        for axis in stage.op.axis:
            stage.unroll(axis)


def _depthwise_conv2d(schedule: Schedule, conv: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """The seeds' depthwise schedule: a block computes a blocking_h x blocking_w tile of one channel, with the input
    tile it reads (padding included) and the channel's filter copied into shared memory by all its threads first;
    num_thread_y x num_thread_x threads, each computing (blocking / threads / vthreads) outputs per virtual thread
    in registers, vthread_y x vthread_x virtual threads interleaving them so neighbouring threads read neighbouring
    columns."""
    values = fallback("depthwise_conv2d", target)
    n, c, oh, ow = output.op.axis
    cfg.define_split("blocking_h", oh, default=values["blocking_h"])
    cfg.define_split("blocking_w", ow, default=values["blocking_w"])
    block_h, block_w = cfg["blocking_h"].size[-1], cfg["blocking_w"].size[-1]
    choices_y = sorted({*AXIS_THREADS, *(d for d in range(1, 33) if oh.extent % d == 0)})
    choices_x = sorted({*AXIS_THREADS, *(d for d in range(1, 33) if ow.extent % d == 0)})
    limit = target.device.max_threads
    threads_x = _per_thread_default(choices_x, block_w, limit)
    threads_y = _per_thread_default(choices_y, block_h, limit // threads_x)
    cfg.define_knob("num_thread_y", choices_y, default=threads_y)
    cfg.define_knob("num_thread_x", choices_x, default=threads_x)
    cfg.define_knob("vthread_y", list(VTHREADS), default=values["vthread_y"])
    cfg.define_knob("vthread_x", list(VTHREADS), default=values["vthread_x"])

    data, filters = _depthwise_operands(conv)
    taps = [iv.extent for iv in conv.op.reduce_axis]
    # a column-strided conv reads a phased input (5-D, compiler/compute/support.py), whose tile the region inference cannot
    # tighten: it reads the input from global memory, only the filter is shared
    tiled = len(data.shape) == 4
    stride = _row_stride(data, oh.extent, taps[0]) if tiled else 0

    def fits(config) -> bool:
        rows, columns = config["blocking_h"].size[-1], config["blocking_w"].size[-1]
        ty, tx = config["num_thread_y"].val, config["num_thread_x"].val
        vy, vx = config["vthread_y"].val, config["vthread_x"].val
        tile = ((rows - 1) * stride + taps[0]) * (columns - 1 + taps[1]) if tiled else 0
        return (
            ty * tx <= limit
            and rows % (ty * vy) == 0
            and columns % (tx * vx) == 0
            and (
                not config["shared"].val
                or _shared_bytes((tile, data.dtype), (math.prod(taps), filters.dtype)) <= target.device.shared_bytes
            )
        )

    cfg.define_knob("shared", [0, 1], default=values["shared"])
    cfg.add_filter(fits)
    caches = []
    if cfg["shared"].val:
        caches = [schedule.cache_read(filters, "shared", [conv.op.output(0)])]
        if tiled:
            caches.insert(0, schedule.cache_read(data, "shared", [conv.op.output(0)]))
    threads_y, threads_x = cfg["num_thread_y"].val, cfg["num_thread_x"].val
    row_blocks, rows = cfg["blocking_h"].apply(schedule, output, oh)
    column_blocks, columns = cfg["blocking_w"].apply(schedule, output, ow)
    virtual_y, rows = output.split(rows, nparts=cfg["vthread_y"].val)
    thread_y, rows = output.split(rows, nparts=threads_y)
    virtual_x, columns = output.split(columns, nparts=cfg["vthread_x"].val)
    thread_x, columns = output.split(columns, nparts=threads_x)
    output.reorder(n, c, row_blocks, column_blocks, virtual_y, virtual_x, thread_y, thread_x, rows, columns)
    _bind_blocks(output, output.fuse(n, c), target, first=1)
    tile = output.fuse(row_blocks, column_blocks)
    output.bind(tile, te.thread_axis("blockIdx.x"))
    output.bind(virtual_y, te.thread_axis("vthread"))
    output.bind(virtual_x, te.thread_axis("vthread"))
    output.bind(thread_y, te.thread_axis("threadIdx.y"))
    output.bind(thread_x, te.thread_axis("threadIdx.x"))
    conv.set_scope("local")
    conv.compute_at(output, thread_x)
    cn, cc, crows, ccolumns = conv.op.axis
    conv.reorder(cn, cc, *conv.op.reduce_axis, crows, ccolumns)
    # unroll_taps: how many tap axes, from the innermost, are unrolled (the rest stay loops)
    taps_axes = list(conv.op.reduce_axis)
    outputs = block_h * block_w // (threads_y * threads_x)
    cfg.define_knob(
        "unroll_taps",
        list(range(len(taps_axes) + 1)),
        default=_unrolled_axes([iv.extent for iv in taps_axes], outputs, values["unroll_steps"]),
    )
    for tap in taps_axes[len(taps_axes) - cfg["unroll_taps"].val :]:
        conv.unroll(tap)
    for cache in caches:
        stage = schedule[cache]
        stage.compute_at(output, tile)
        _bind_cooperative(stage, threads_y, threads_x)


def _unrolled_axes(extents: list[int], outputs: int, steps: int | None) -> int:
    """How many of the axes of `extents`, from the innermost, are unrolled when each step of them does `outputs`
    multiply-adds and at most `steps` may be unrolled (None: all of them)."""
    count, unrolled = 0, outputs
    for extent in reversed(extents):
        unrolled *= extent
        if steps is not None and unrolled > steps:
            break
        count += 1
    return count


def _per_thread_default(choices: list[int], block: int, limit: int) -> int:
    """The seeds' 2 x 2 outputs per thread: the most threads along an axis that divide its blocking and leave each
    thread two outputs or more (one on blocks narrower than 16, whose threads would otherwise idle)."""
    most = block // 2 if block >= 16 else block
    fitting = [count for count in choices if block % count == 0 and count <= min(most, limit)]
    return max(fitting, default=1)


def _depthwise_operands(conv: Stage):
    """(the padded input or the input, the filter) a depthwise conv reads: the filter has one input channel."""
    tensors = list(conv.op.input_tensors)
    filters = next(t for t in tensors if len(t.shape) == 4 and t.shape[1] == 1 and t is not tensors[0])
    data = next(t for t in tensors if t is not filters)
    return data, filters


def _row_stride(data, rows: int, taps: int) -> int:
    """The conv's row stride, from the padded input's rows, the output's and the filter's."""
    return max(1, (data.shape[2] - taps) // (rows - 1)) if rows > 1 else 1


def _dense(schedule: Schedule, dense: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """Dense / batch matmul: a block computes (threads_y x regs_y) rows by (threads_x x regs_x) columns, each thread a
    regs_y x regs_x tile of accumulators in registers; per step of tile_k along k the block first copies the A and B
    tiles that step reads into shared memory, all threads together, then every thread reads them from there; with
    cache, each thread first copies the A column and B row its tile reads at a step of k into registers. A Gemm
    with B transposed sums interleaved partial products (its compute's dense_partial): those are made per output in
    registers, from global memory."""
    values = fallback("dense", target)
    *batch, i, j = output.op.axis
    partial_op = next((t.op for t in dense.op.input_tensors if getattr(t.op, "tag", "") == tags.DENSE_PARTIAL), None)
    # powers of two, the last tile guarded: a prime extent (77 tokens, 37 rows) would leave one thread per row
    cfg.define_split("tile_y", i, num_outputs=3, policy="power2", default=values["tile_y"])
    # read from global memory, a block of columns that divides the row count guards no multiply-add
    columns = values["tile_x"] if values["shared"] else _dividing_tile(j.extent, values["tile_x"])
    cfg.define_split("tile_x", j, num_outputs=3, policy="power2", default=columns)
    limit = target.device.max_threads
    operands = list(dict.fromkeys(dense.op.input_tensors)) if partial_op is None else []
    if partial_op is None:
        cfg.define_split("tile_k", dense.op.reduce_axis[0], policy="power2", default=values["tile_k"])
        cfg.define_knob("shared", [0, 1], default=values["shared"])
        cfg.define_knob("cache", [0, 1], default=values["cache"])

    def fits(config) -> bool:
        (_, ty, ry), (_, tx, rx) = config["tile_y"].size, config["tile_x"].size
        if partial_op is not None or not config["shared"].val:
            return ty * tx <= limit
        step = config["tile_k"].size[-1]
        tiles = [(ty * ry * step, operands[0].dtype), (tx * rx * step, operands[-1].dtype)]
        return ty * tx <= limit and _shared_bytes(*tiles) <= target.device.shared_bytes

    cfg.add_filter(fits)
    shared = partial_op is None and cfg["shared"].val
    caches = [schedule.cache_read(t, "shared", [dense.op.output(0)]) for t in operands] if shared else []
    i_block, i_thread, i_inner = cfg["tile_y"].apply(schedule, output, i)
    j_block, j_thread, j_inner = cfg["tile_x"].apply(schedule, output, j)
    output.reorder(*batch, i_block, j_block, i_thread, j_thread, i_inner, j_inner)
    if batch:
        _bind_blocks(output, output.fuse(*batch) if len(batch) > 1 else batch[0], target, first=2)
    _bind_blocks(output, i_block, target, first=1)
    output.bind(j_block, te.thread_axis("blockIdx.x"))
    output.bind(i_thread, te.thread_axis("threadIdx.y"))
    output.bind(j_thread, te.thread_axis("threadIdx.x"))
    output.unroll(i_inner)
    output.unroll(j_inner)
    dense.set_scope("local")
    dense.compute_at(output, j_thread)
    *dbatch, di, dj = dense.op.axis
    if partial_op is not None:
        dense.reorder(*dbatch, di, dj, dense.op.reduce_axis[0])
        partial_stage = schedule[partial_op]
        partial_stage.set_scope("local")
        partial_stage.compute_at(dense, dj)
        return
    k_outer, k_inner = cfg["tile_k"].apply(schedule, dense, dense.op.reduce_axis[0])
    dense.reorder(*dbatch, k_outer, k_inner, di, dj)
    dense.unroll(di)
    dense.unroll(dj)
    threads_y, threads_x = cfg["tile_y"].size[1], cfg["tile_x"].size[1]
    for cache in caches:
        stage = schedule[cache]
        stage.compute_at(dense, k_outer)
        _bind_cooperative(stage, threads_y, threads_x)
    if cfg["cache"].val:
        for tensor in caches or operands:
            stage = schedule[schedule.cache_read(tensor, "local", [dense.op.output(0)])]
            stage.compute_at(dense, k_inner)
            for axis in stage.op.axis:
                stage.unroll(axis)


def _dividing_tile(extent: int, tile: tuple[int, int]) -> tuple[int, int]:
    """`tile` (threads, registers per thread) shrunk to the widest power of two that divides `extent`, registers
    first kept: the fallback's columns of a dense template without shared tiles. A block that overhangs the last
    columns guards each of its multiply-adds, inside the k loop (odd_transformer's Linear layers, 200 and 700 columns: a run on
    SwiftShader took 996 ms with 64-column blocks, 395 ms with blocks of 8 and 4 columns; docs/gpu.md)."""
    threads, registers = tile
    width = max(size for size in (1, 2, 4, 8, 16, 32, 64, 128) if size <= threads * registers and extent % size == 0)
    if width == threads * registers:
        return tile
    registers = min(registers, width)
    return (width // registers, registers)


def _winograd(schedule: Schedule, target: Target, cfg: ConfigSpace) -> None:
    """A ConvWinograd group (compiler/compute/conv.py, conv_winograd) in three launches. The input transform: one thread
    per (tile, channel), which copies its tile's padded inputs into registers, makes B^T d there, then the tile's
    points. The matmuls: the dense template (and its knobs), batched over the points. The output transform, inlined
    into the group's outputs with their epilogue: one thread per tile of one filter, which copies the tile's
    products into registers, makes A^T M there, then the tile's outputs. Only the loop over the rows of a constant
    matrix is unrolled in each step (its select then decided): a thread's other loops stay loops, since SwiftShader's
    time to create a pipeline grows with the code (resnet18: 10.3 s with every loop unrolled)."""
    by_tag = {stage.op.tag: stage for stage in schedule.stages if isinstance(stage.op, ComputeOp)}
    transform, gemm = by_tag[tags.WINOGRAD_INPUT], by_tag[tags.WINOGRAD_GEMM]
    rows, columns = by_tag[tags.WINOGRAD_ROWS], by_tag[tags.WINOGRAD_COLUMNS]
    for stage in schedule.stages:
        op = stage.op
        kept = stage in (transform, rows, columns)
        if isinstance(op, ComputeOp) and not op.reduce_axis and not stage.is_output and not kept:
            stage.compute_inline()
    outputs = [
        stage
        for stage in schedule.stages
        if stage.is_output and isinstance(stage.op, ComputeOp) and stage.attach_type == ROOT and not stage.relations
    ]
    # A^T M (and the products it reads) in registers where one output stage reads it; read by several, it is a
    # launch of its own
    reader = [stage for stage in outputs if stage_readers(schedule)[columns] == [stage]]
    products = schedule.cache_read(gemm.op.output(0), "local", [columns.op.output(0)]) if reader else None
    (padded,) = rows.op.input_tensors
    tile_inputs = schedule.cache_read(padded, "local", [rows.op.output(0)])
    threads = _define_threads(cfg, "injective", target)
    tile = columns.op.axis[0].extent
    alpha = tile + 2
    point, position, channel = transform.op.axis
    transform.reorder(position, channel, point)
    _, thread = _bind_threads(transform, [position, channel], threads, target)
    _, point_column = transform.split(point, alpha)
    transform.unroll(point_column)
    _in_registers(schedule[tile_inputs], transform, thread)
    _in_registers(rows, transform, thread, unrolled=rows.op.axis[0])
    local = schedule.cache_write(gemm.op.output(0), "local")
    _dense(schedule, schedule[local], gemm, target, cfg)
    for stage in outputs:
        n, filters, row, column = stage.op.axis
        row_outer, row_inner = stage.split(row, tile)
        column_outer, column_inner = stage.split(column, tile)
        stage.reorder(n, filters, row_outer, column_outer, row_inner, column_inner)
        _, thread = _bind_threads(stage, [n, filters, row_outer, column_outer], threads, target)
        stage.unroll(column_inner)
        if reader == [stage]:
            _in_registers(schedule[products], stage, thread)
            _in_registers(columns, stage, thread, unrolled=columns.op.axis[0])
    if not reader:
        _bind_threads(columns, list(columns.op.axis), threads, target)


def _in_registers(stage: Stage, host: Stage, thread: IterVar, unrolled: IterVar | None = None) -> None:
    """`stage` computed by each thread of `host` into registers, its loop over `unrolled` (when given) innermost and
    unrolled."""
    stage.set_scope("local")
    stage.compute_at(host, thread)
    if unrolled is not None:
        stage.reorder(*[axis for axis in stage.op.axis if axis is not unrolled], unrolled)
        stage.unroll(unrolled)


def _pool(schedule: Schedule, pool: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """Max or average pool (NCHW): one output per thread, its window's taps unrolled, the padding read in place."""
    threads = _define_threads(cfg, cfg.template, target)
    _, thread = _bind_threads(output, list(output.op.axis), threads, target)
    pool.set_scope("local")
    pool.compute_at(output, thread)
    for tap in pool.op.reduce_axis:
        pool.unroll(tap)


TEMPLATES = {
    "conv2d": _conv,
    "conv1d": _conv,
    "depthwise_conv2d": _depthwise_conv2d,
    "dense": _dense,
    "pool_max": _pool,
    "pool_avg": _pool,
}


GPU_TEMPLATES = Templates(
    whole=((tags.WINOGRAD_GEMM, "winograd", _winograd),), anchored=TEMPLATES, prepare=_prepare, rest=_schedule_rest
)

__all__ = [
    "DEFAULTS",
    "SPACE_VERSION",
    "TARGET_DEFAULTS",
    "TEMPLATES",
    "fallback",
    "schedule_group",
    "schedule_small_sizes",
]
