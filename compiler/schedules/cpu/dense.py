"""Matrix products on the CPU: the MatMul/Gemm/batched MatMul template (a register block over the whole k, its knobs
searched) and the MatMulPacked template (B packed into column panels at compile time)."""

from __future__ import annotations

import math

from compiler.compute import tags
from compiler.schedules.cpu.defaults import FMA_CHAINS, HALF_WIDENING_NODES, OUTER_TASKS, WIDEN_PANEL_WORK, fallback
from compiler.schedules.cpu.tiling import (
    divisor_at_most,
    is_ragged,
    lanes,
    limit_registers,
    mentions,
    ragged_tiles,
    tile_or_tail,
    vector_divisor,
    vector_registers,
)
from compiler.schedules.space import ConfigSpace, divisors
from compiler.target import STACK_BUFFER_BYTES, Target
from compiler.te.expr import largest
from compiler.te.schedule import Schedule, Stage
from compiler.te.tensor import TensorLoad, walk


def schedule_dense(schedule: Schedule, dense: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """A tile_m x tile_n register block per step, vectorized along the output row, the k loop outside the block.
    With B transposed (N, K) the compute first sums interleaved partial products; those are vectorized along the
    contiguous k instead, split_k_tile_n rows of B at a time, one output row per block.

    The search may also unroll the k loop by unroll_k, run only the outer tile loop in parallel (so the inner one
    walks its tiles in one thread, in order) and pack the k x tile_n panel of B the block reads into a local buffer:
    with columns outermost and parallel "outer" it is packed once per column tile and read by every row tile.
    Their fallbacks (no unroll, every tile loop parallel, no packing) build what the template built before them."""
    values = fallback("dense", target)
    partial = next((t.op for t in dense.op.input_tensors if getattr(t.op, "tag", "") == tags.DENSE_PARTIAL), None)
    *batch, i, j = output.op.axis
    width = lanes(target, output.op.dtype)
    # the column tile: the largest divisor of whole vectors up to tile_n, or, where none is at least half of it, the
    # fallback's tile with a guarded last tile (not narrowed to one vector: codegen splits a wide vector loop); it
    # narrows only while the block does not fit the registers. The row tile: a divisor near tile_m, else tile_m's
    # balanced tiling with a shorter last tile (tile_or_tail). docs/benchmarks.md, "The dense template's tiles on
    # ragged shapes"
    tile_n = values["tile_n"]
    tile_m = _row_tile(i.extent, values["tile_m"])
    above = tile_m is not None and tile_m > values["tile_m"]
    if above and values["keep_accumulators"]:
        tile_n = max(width, values["tile_m"] * tile_n // tile_m // width * width)
    elif tile_m is None or (above and tile_m * _fitting_vectors(target, tile_m, tile_n, width) < FMA_CHAINS):
        tile_m = tile_or_tail(i.extent, values["tile_m"])
    ragged = partial is None and is_ragged(j.extent, tile_n, width)
    if partial is None:
        tile_n = min(tile_n, _fitting_vectors(target, tile_m, tile_n, width) * width)
    if not ragged:
        tile_n = vector_divisor(j.extent, tile_n, width) or tile_n
    if partial is None:
        most = values["tile_m"] * -(-values["tile_n"] // width)
        filled = _fill_block(target, i.extent, tile_m, -(-tile_n // width), most)
        # the rows' divisors and the fallback's tile (a balanced tiling's, when no divisor suits)
        cfg.define_split("tile_m", i, policy=sorted({*divisors(i.extent), tile_m}), default=filled)
        cfg.define_split("tile_n", j, policy=ragged_tiles(j.extent, width) if ragged else "factors", default=tile_n)
        # a filled block's rows stay a loop: unrolled, LLVM interleaved two k steps of an 11 x 8 block and spilled
        cfg.define_knob("unroll_m", [0, 1], default=0 if filled > tile_m else values["unroll_m"])
        limit_registers(cfg, target, output.op.dtype, ("tile_m",), "tile_n")
        i_outer, i_inner = cfg["tile_m"].apply(schedule, output, i)
        j_outer, j_inner = cfg["tile_n"].apply(schedule, output, j)
    else:
        cfg.define_split("split_k_tile_n", j, default=values["split_k_tile_n"])
        limit_registers(cfg, target, output.op.dtype, ("split_k_tile_n",), partial.axis[-1].extent)
        i_outer, i_inner = output.split(i, 1)
        j_outer, j_inner = cfg["split_k_tile_n"].apply(schedule, output, j)
    cfg.define_reorder("tile_order", [i_outer, j_outer], default=values["tile_order"])
    tiles = cfg["tile_order"].permute([i_outer, j_outer])
    output.reorder(*batch, *tiles, i_inner, j_inner)
    parallel = default_parallel = "tiles"
    if partial is None:
        # "outer" makes the outer tile loop the tasks: a fallback takes it only with tasks enough for the threads
        outer_tasks = math.prod(largest(axis.extent) for axis in batch) * largest(tiles[0].extent)
        if outer_tasks >= OUTER_TASKS:
            default_parallel = values["parallel"]
        cfg.define_knob("parallel", ["tiles", "outer"], default=default_parallel)
        parallel = cfg["parallel"].val
    # panel_loop: the loop an iteration of which is one column tile (with the column tiles outermost and parallel
    # "outer", B's panel stays the same for every row tile inside it)
    if parallel == "tiles":
        fused = panel_loop = row_loop = output.fuse(*batch, *tiles)
        output.parallel(fused)
    else:
        outer = output.fuse(*batch, tiles[0]) if batch else tiles[0]
        output.parallel(outer)
        fused = tiles[1]
        panel_loop = outer if tiles[0] is j_outer else fused
        row_loop = outer if tiles[0] is i_outer else fused
    if partial is None and i.extent % cfg["tile_m"].size[-1]:
        # a shorter last row tile: only it tests its rows
        output.partition(row_loop)
    if ragged:
        # only the last column tile tests its bound: a serial loop over the column tiles is cut before it, a
        # parallel one (holding the column tiles) branches its task on it
        output.partition(panel_loop)
    output.vectorize(j_inner)
    if partial is not None:
        dense.set_scope("local")
        dense.compute_at(output, fused)
        *dbatch, di, dj = dense.op.axis
        dense.reorder(di, dj, *dense.op.reduce_axis)
        stage = schedule[partial]
        stage.set_scope("local")
        stage.compute_at(output, fused)
        pi, pj, lane = stage.op.axis
        (outer,) = stage.op.reduce_axis
        stage.reorder(outer, pi, pj, lane)
        stage.unroll(pj)
        stage.vectorize(lane)
        return
    (k,) = dense.op.reduce_axis
    unrolls = [size for size in (1, 2, 4, 8) if k.extent % size == 0]
    cfg.define_split("unroll_k", k, policy=unrolls, default=max(size for size in unrolls if size <= values["unroll_k"]))
    # packing B's panel pays off once per column tile, not once per task: only with the column tiles outer, in parallel
    cfg.define_knob("pack_b", [0, 1], default=values["pack_b"] if default_parallel == "outer" else 0)
    if cfg["pack_b"].val:
        _pack_panel(schedule, dense, panel_loop, output)
    dense.set_scope("local")
    dense.compute_at(output, fused)
    *dbatch, di, dj = dense.op.axis
    k_axes = [k]
    if cfg["unroll_k"].size[-1] > 1:
        k_axes = list(cfg["unroll_k"].apply(schedule, dense, k))
    dense.reorder(*dbatch, *k_axes, di, dj)
    if len(k_axes) > 1:
        dense.unroll(k_axes[1])
    if cfg["unroll_m"].val:
        dense.unroll(di)
    dense.vectorize(dj)


def schedule_dense_packed(schedule: Schedule, dense: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """A MatMulPacked group (compiler/compute/dense.py, matmul_packed): a register block of tile_m rows by one panel of B,
    made over the whole k and copied out through the group's epilogue. B's panels were packed at compile time, so the
    block reads its panel at unit stride (whatever N is) and A's rows one broadcast element at a time. A last row tile
    shorter than tile_m, and a last panel past N, are pieces of their own (partitioned), so the other tiles test
    nothing. The search may change the rows, the k loop's unrolling, the order of the tile loops and which of them run
    in parallel, and where a narrow weight is widened (_widen_knob: a panel at a time fixes the order, each task a
    panel, so the number of tasks is N / panel); the panel is a layout decision, made by alter_layout. A
    MatMulIntegerPacked (uint8 A by int8 levels four to a word) takes the same template: its k steps a word."""
    values = fallback(tags.DENSE_PACKED, target)
    (k,) = dense.op.reduce_axis
    loads = [node for node in walk(dense.op.body) if isinstance(node, TensorLoad)]
    # B's panel: the packed weight (and its scales) end in the panel's lane; A (even of rank 3) ends in k (or, read a
    # word's four bytes at a time, in 4k + byte)
    weight = next(node.tensor for node in loads if len(node.indices) == 3 and not mentions(node.indices[-1], k))
    panel = weight.shape[-1]
    # the rows are A's last axis before K of more than one element: a sequence-first projection ((tokens, 1, K), as
    # torch's MultiheadAttention exports it) tiles its tokens, not its single-row matrices
    *lead, j = output.op.axis
    row = max((position for position, axis in enumerate(lead) if axis.extent > 1), default=len(lead) - 1)
    i, batch = lead[row], [axis for position, axis in enumerate(lead) if position != row]
    vectors = -(-panel // lanes(target, output.op.dtype))
    widened = next((t.op for t in dense.op.input_tensors if getattr(t.op, "tag", "") == tags.DENSE_WEIGHT), None)
    widen = _widen_knob(cfg, widened, i.extent * math.prod(axis.extent for axis in batch), target)
    most = max(size for size in range(1, i.extent + 1) if size == 1 or _dense_fits_registers(target, size, vectors))
    default = tile_or_tail(i.extent, min(values["tile_m"], most), least=1.0)
    cfg.define_split("tile_m", i, policy=list(range(1, most + 1)), default=default)
    cfg.define_knob("unroll_m", [0, 1], default=values["unroll_m"])
    i_outer, i_inner = cfg["tile_m"].apply(schedule, output, i)
    j_outer, j_inner = output.split(j, panel)
    if widen == "panel":
        # each task a panel (columns outermost), its row tiles in order inside it, all reading the panel widened once
        tiles, parallel = [j_outer, i_outer], "outer"
    else:
        cfg.define_reorder("tile_order", [i_outer, j_outer], default=values["tile_order"])
        tiles = cfg["tile_order"].permute([i_outer, j_outer])
        cfg.define_knob("parallel", ["tiles", "outer"], default=values["parallel"])
        parallel = cfg["parallel"].val
    output.reorder(*batch, *tiles, i_inner, j_inner)
    if parallel == "tiles":
        fused = row_loop = panel_loop = output.fuse(*batch, *tiles)
        output.parallel(fused)
    else:
        outer = output.fuse(*batch, tiles[0]) if batch else tiles[0]
        output.parallel(outer)
        fused = tiles[1]
        row_loop, panel_loop = (outer, fused) if tiles[0] is i_outer else (fused, outer)
    if i.extent % cfg["tile_m"].size[-1]:
        output.partition(row_loop)
    if j.extent % panel:
        output.partition(panel_loop)
    output.vectorize(j_inner)
    if widen == "panel":
        # the epilogue's rows unrolled, so LLVM keeps the block's accumulators in registers: as a loop inside the
        # panel's row-tile loop, they stayed in memory, stored at every k step (a GELU's 768 x 3072: 2.7x slower)
        output.unroll(i_inner)
    dense.set_scope("local")
    dense.compute_at(output, fused)
    if widen == "panel":
        stage = schedule[widened]
        stage.set_scope("local")
        stage.compute_at(output, panel_loop)
        stage.vectorize(stage.op.axis[-1])
    elif widened is not None:
        schedule[widened].compute_inline()
    *dense_lead, columns = dense.op.axis
    rows, dense_batch = dense_lead[row], [axis for position, axis in enumerate(dense_lead) if position != row]
    unrolls = [size for size in (1, 2, 4, 8) if k.extent % size == 0]
    cfg.define_split("unroll_k", k, policy=unrolls, default=max(size for size in unrolls if size <= values["unroll_k"]))
    k_axes = list(cfg["unroll_k"].apply(schedule, dense, k))
    dense.reorder(*dense_batch, *k_axes, rows, columns)
    dense.unroll(k_axes[-1])
    if cfg["unroll_m"].val:
        dense.unroll(rows)
    dense.vectorize(columns)


def _widen_knob(cfg: ConfigSpace, widened, rows: int, target: Target) -> str | None:
    """Where a MatMulPacked's narrow weight is widened (None when it has none): "inline", element by element as the
    product reads it (a decode step's single row streams the narrow bytes), or "panel", a panel at a time into a
    local buffer that all rows' tiles then read as float32 (the widening's shifts, conversions and block scales
    then cost once per panel, not once per row tile). The fallback makes panels where the rows times the widening's
    cost reach WIDEN_PANEL_WORK and the buffer can be a task's own: in threaded wasm a large one is a static array,
    which keeps its loop serial."""
    if widened is None:
        return None
    panel_bytes = math.prod(widened.output(0).shape[1:]) * 4
    shared = target.parallel and target.machine.scratch == "static" and panel_bytes > STACK_BUFFER_BYTES
    # the widening's expression nodes (loads, index arithmetic, conversions, shifts, scales) stand for its cost per
    # element: 5 for a float16 weight, 50 for 4-bit levels in blocks with zero points; a float16 element costs
    # HALF_WIDENING_NODES more where the machine has no half conversions (wasm: integer arithmetic)
    nodes = list(walk(widened.body))
    halves = (
        0
        if target.machine.half_conversions
        else sum(1 for node in nodes if isinstance(node, TensorLoad) and node.tensor.dtype == "float16")
    )
    work = rows * (len(nodes) + HALF_WIDENING_NODES * halves)
    default = "panel" if work >= WIDEN_PANEL_WORK and not shared else "inline"
    cfg.define_knob("widen", ["inline", "panel"], default=default)
    return cfg["widen"].val


def _dense_fits_registers(target: Target, rows: int, vectors: int) -> bool:
    """Whether a dense block of `rows` x `vectors` accumulators fits the vector registers with the vectors of B it
    loads per step and the broadcast of A's element."""
    return rows * vectors + vectors + 1 <= vector_registers(target)


def _fitting_vectors(target: Target, rows: int, columns: int, width: int) -> int:
    """The vectors (of `width` lanes) of a dense block of `rows` whose tile of `columns` is narrowed a vector at a
    time (not below one) until the block fits the registers (_dense_fits_registers)."""
    vectors = -(-columns // width)
    while vectors > 1 and not _dense_fits_registers(target, rows, vectors):
        vectors -= 1
    return vectors


def _fill_block(target: Target, rows: int, tile_m: int, vectors: int, most: int) -> int:
    """The block's rows once its column tile is `vectors` wide. A block of fewer than FMA_CHAINS accumulators waits
    on each multiply-add before the next: narrow columns (8 of 520 in AVX2: 3 x 8, the rows of 33 by at most 6) or a
    tile narrowed to fit (77 x 200: 7 x 8, where 7 x 16 spills) then take the largest divisor of `rows` that keeps
    the block within the fallback's accumulators (`most`) and the registers: faster back to back, not with pauses
    between runs at 2 threads (docs/benchmarks.md, "MatMuls on an AVX2 host")."""
    if tile_m * vectors >= FMA_CHAINS:
        return tile_m
    fitting = [
        size
        for size in range(tile_m + 1, rows + 1)
        if rows % size == 0 and size * vectors <= most and _dense_fits_registers(target, size, vectors)
    ]
    return max(fitting, default=tile_m)


def _row_tile(extent: int, limit: int) -> int | None:
    """A dense block's rows: the largest divisor of `extent` not above `limit` when it is at least half of it, else
    the smallest divisor up to twice `limit` (77 rows by at most 4: 7, where the largest divisor below is 1), else
    None (no divisor suits: 13 rows by at most 6)."""
    tile = divisor_at_most(extent, limit)
    if 2 * tile >= min(limit, extent):
        return tile
    return next((size for size in range(limit + 1, 2 * limit + 1) if extent % size == 0), None)


def _pack_panel(schedule: Schedule, dense: Stage, loop, output: Stage) -> None:
    """Copy the k x tile_n panel of B that the register block reads into a contiguous local buffer, made inside
    `loop` (one copy per iteration of it): the block then reads B at unit stride, whatever B's row length (a
    power-of-two row maps every k of a strip to the same few cache sets)."""
    (k,) = dense.op.reduce_axis
    loads = [node for node in walk(dense.op.body) if isinstance(node, TensorLoad)]
    reads_b = [
        node.tensor
        for node in loads
        if any(mentions(index, k) for index in node.indices[-2:-1]) and mentions(node.indices[-1], dense.op.axis[-1])
    ]
    if not reads_b:
        return
    panel = schedule.cache_read(reads_b[0], "local", [dense.op.output(0)])
    stage = schedule[panel]
    stage.compute_at(output, loop)
    # one vector loop over the panel's columns (the block's tile_n, a ragged row's shorter last tile): a split by a
    # factor of B's whole row (7 of 21 columns) cut an 8-column panel into guarded pieces
    stage.vectorize(stage.op.axis[-1])
