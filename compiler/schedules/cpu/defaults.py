"""The CPU templates' fallback knob values and the constants they size their tiles by. Each value is the one a
template builds without a tuning record; docs/benchmarks.md, "Schedule defaults", records what measured it."""

from __future__ import annotations

from compiler.target import Target

# Part of every tuning task's key: bump it when a template's knobs change meaning, so older records stop applying.
# 2: a MatMul whose columns no vector divides splits them by powers of two and has no tile_order
# 3: a MatMul's column tile is whole vectors (or its columns are split like a ragged row); its row tile may be a
#    divisor above the fallback's (77 rows: 7)
# 4: an NCHW conv's ragged rows take tiles of whole vectors
# 5: a MatMul's space adds unroll_k, parallel, pack_b and, on a ragged row, vector multiples as column tiles
# 6: an NCHW[x]c conv's space adds unroll_outer (which of its tile's unrolled loops is outside)
# 7: a native NCHW[x]c conv's space adds prefetch (of the next filter tile)
# 8: a dense NCHW[x]c conv's padding knob covers in_place
# 9: a ragged MatMul's space adds tile_order and parallel
# 10: a MatMul's tile_m may be the fallback's balanced tiling with a shorter last tile (77 rows: 6), not only a
#     divisor
# 12: a MatMul by a param weight is a MatMulPacked with a template of its own ("dense_packed")
# 13: a MatMulPacked of a narrow weight adds widen (inline or a panel at a time, which fixes the tile order and the
#     parallel loop); an int8 one may read its weight four levels a word
SPACE_VERSION = 13


# Each template's fallback config, by knob name. A split's value is the inner size its fallback is at most (the
# largest one that divides the loop); `padding` is where a conv's padded input is read from: "in_place" (the pad is
# inlined and the tile loops partitioned), "rows" or "plane" (a local padded copy of one row tile's rows or one
# channel's plane, made right before its taps read it) or "copy" (one padded copy through memory). Each value's
# measurement is in docs/benchmarks.md, "Schedule defaults", under its key.
DEFAULTS: dict[str, dict[str, object]] = {
    # the vector split of an elementwise or reduction loop, in units of the target's lanes
    "injective": {"vector_lanes": 1},
    "reduce": {"vector_lanes": 1},
    # output channels x output columns held in registers; the pad stage is materialized once
    "conv2d": {"tile_oc": 8, "tile_ow": 16, "unroll_oc": 1},
    # output channels x positions in registers, the taps outside: the fastest of five tiles on audio_conv1d
    "conv1d": {"tile_oc": 8, "tile_ow": 32},
    # tile_oh x tile_ow accumulators; with padding in place only the border tiles test the padding, and the taps are
    # unrolled, or LLVM splits a border tile's accumulators into scalars
    "depthwise_conv2d": {"tile_oh": 2, "tile_ow": 32, "unroll_taps": 1, "padding": "in_place"},
    # an NCHW[x]c conv's register tile: tile_blocks filter blocks x tile_ow output columns, both unrolled, each
    # filter block a vector. `taps` "inner" moves the kernel window inside the loop over a block's input channels
    # (weights read in memory order). A 1 x 1 window takes pointwise_tile_ow x pointwise_tile_blocks where the target
    # gives them (None: the same tile). `unroll_outer` "blocks" keeps the columns' broadcast inputs live across the
    # blocks; "columns" keeps the blocks' weights live instead (fewer registers when there are fewer blocks)
    "conv2d_nchwc": {
        "tile_ow": 14,
        "tile_blocks": 1,
        "taps": "outer",
        "unroll_outer": "blocks",
        "pointwise_tile_ow": None,
        "pointwise_tile_blocks": None,
        # natively, prefetch the next filter tile: in a run every conv's filters come from beyond the cache
        "prefetch": 1,
        # the taps' place (as `taps`) on a row of at most SMALL_ROW columns, tiled by at most SMALL_ROW_TILE, with at
        # most SMALL_ROW_TAPS taps (None: as any other row)
        "small_row_taps": None,
        # read in place: a padded copy is one more pass through memory, read at 2 threads by the other thread
        "padding": "in_place",
    },
    # padding in place: only the border column tiles test the column; "rows" pays where few rows are recomputed
    "depthwise_conv2d_nchwc": {"tile_ow": 8, "tile_blocks": 1, "padding": "in_place"},
    # a MatMul's register block: tile_m rows x tile_n columns over the whole k; tile_order (1, 0) walks the column
    # tiles outermost, so the tiles that share a strip of B follow each other while it is in cache. "parallel",
    # "pack_b" and "unroll_k" are the search's knobs; their fallbacks build what the template built before them
    "dense": {
        "tile_m": 8,
        "tile_n": 32,
        "unroll_m": 1,
        "split_k_tile_n": 8,
        "tile_order": (1, 0),
        "parallel": "tiles",
        "pack_b": 0,
        # the k loop split by at most this (the largest of 1, 2, 4, 8 that divides it), the inner part unrolled
        "unroll_k": 1,
        # 1: a row tile above tile_m (77 rows: 7) takes fewer columns, so the block stays within the registers
        "keep_accumulators": 0,
    },
    # a MatMulPacked's block: tile_m rows x one panel of B (alter_layout's DENSE_PANEL_COLUMNS) over the whole k,
    # the panels outermost so a panel stays in cache while every row tile reads it
    "dense_packed": {"tile_m": 4, "unroll_k": 4, "unroll_m": 1, "tile_order": (1, 0), "parallel": "tiles"},
    # an Attention's tasks: tile_m query rows each, their scores tile_n keys at a time in registers, the output
    # tile_d columns at a time
    "attention": {"tile_m": 4, "tile_n": 16, "tile_d": 16},
    # an NCHW[x]c pool's register tile: tile_ow output columns, each a channel block's vector
    "pool_max": {"tile_ow": 8},
    # a blocked ConvTranspose's register tile: tile_ow output columns, each a filter block's vector
    "conv2d_transpose_nchwc": {"tile_ow": 8},
    # an NCHW pool's register tile along the output row, in target vectors
    "pool_nchw": {"tile_vectors": 2},
    # a plane reduction's (global pool over a contiguous H x W) partial sums, in target vectors
    "plane_reduce": {"partial_vectors": 2},
    # a row reduction's (softmax's max and sum, layer norm's moments) partial results, in target vectors
    "row_reduce": {"partial_vectors": 1},
}


# Laid over DEFAULTS by the target's vector width in bytes (16 also stands for anything narrower); measured as
# DEFAULTS are ("Schedule defaults", under VECTOR_DEFAULTS).
VECTOR_DEFAULTS: dict[int, dict[str, dict[str, object]]] = {
    # wasm SIMD128 and NEON: blocks sized for V8's 16 registers, which spilled the wider ones
    16: {
        # 2 blocks x 7 columns (28 accumulators), the taps inside the channels; a 1 x 1 window 1 block x 4 columns,
        # its short multiply-add chains otherwise spilling; the padding copied, faster in Node than in place
        "conv2d_nchwc": {
            "tile_ow": 7,
            "tile_blocks": 2,
            "taps": "inner",
            "pointwise_tile_ow": 4,
            "pointwise_tile_blocks": 1,
            "padding": "copy",
        },
        # one vector wide
        "depthwise_conv2d": {"tile_oh": 2, "tile_ow": 4},
        # 4 x 8 (XNNPACK's wasm-SIMD GEMM tile): accumulators, B's vectors and the broadcast fit 16 registers
        "dense": {
            "split_k_tile_n": 4,
            "tile_m": 4,
            "tile_n": 8,
            "tile_order": (0, 1),
            "keep_accumulators": 1,
        },
        # 4 rows x a panel of 8 columns, the k loop rolled: V8 spilled the block unrolled by 4
        "dense_packed": {"unroll_k": 1},
        "attention": {"tile_n": 8, "tile_d": 8},
        # not measured: the register budget of the dense block above
        "conv1d": {"tile_oc": 4, "tile_ow": 16},
        # 8 x 16 spills in V8; at most 2 channels x 16 columns
        "conv2d": {"tile_oc": 2, "tile_ow": 16},
    },
    # AVX-512 (32 registers of 16 floats)
    64: {
        # 2 filter blocks x 8 columns, the taps inside the input channels (weights read in memory order)
        "conv2d_nchwc": {"tile_ow": 8, "tile_blocks": 2, "taps": "inner"},
        # 8 rows x 48 columns (24 accumulators, B's 3 vectors and A's broadcast), the k loop unrolled by 4
        "dense": {"tile_n": 48, "unroll_k": 4},
        # 6 rows x a 64-column panel (24 accumulators, B's 4 vectors and A's broadcast)
        "dense_packed": {"tile_m": 6},
        "attention": {"tile_m": 6, "tile_n": 64, "tile_d": 64},
    },
    # AVX2 (16 registers of 8 floats)
    32: {
        # 2 filter blocks x 6 columns, the columns unrolled outside the blocks (12 accumulators, 2 weight vectors and
        # a broadcast); the padding copied; the taps inside the channels on short rows (SMALL_ROW)
        "conv2d_nchwc": {
            "tile_ow": 6,
            "tile_blocks": 2,
            "unroll_outer": "columns",
            "padding": "copy",
            "small_row_taps": "inner",
        },
        # 6 x 16 (12 accumulators); B's panel packed once per column tile, the column tiles the tasks, so a strip of
        # B is not read at a stride that maps it into a few cache sets
        "dense": {"tile_m": 6, "tile_n": 16, "parallel": "outer", "pack_b": 1},
        # 6 rows x a 16-column panel: 12 accumulators, B's 2 vectors and A's broadcast
        "dense_packed": {"tile_m": 6},
        "attention": {"tile_m": 6, "tile_n": 16, "tile_d": 16},
        "depthwise_conv2d": {"tile_oh": 2, "tile_ow": 16},
        # not measured: the dense block's 12 accumulators
        "conv1d": {"tile_oc": 6, "tile_ow": 16},
    },
}


# The largest padded plane (floats) a depthwise conv may copy into a local buffer: beyond it the copy leaves the
# cache and the stack of a worker thread
LOCAL_PAD_FLOATS = 16384


# A blocked conv's short row (fallback "small_row_taps"): at most this many output columns, tiled by at most
# SMALL_ROW_TILE, with a window of at most SMALL_ROW_TAPS taps (AVX2's measurements at VECTOR_DEFAULTS[32])
SMALL_ROW, SMALL_ROW_TILE, SMALL_ROW_TAPS = 25, 5, 9


# A cache line, the unit a prefetch brings in (64 bytes on the x86-64 and AArch64 cores Tessel targets)
CACHE_LINE_BYTES = 64


def fallback(kind: str, target: Target | None = None) -> dict[str, object]:
    """The template's fallback knob values: DEFAULTS, with VECTOR_DEFAULTS for `target`'s vector width laid over."""
    values = dict(DEFAULTS[kind])
    if target is not None:
        values.update(VECTOR_DEFAULTS.get(max(16, target.vector_bytes), {}).get(kind, {}))
    return values


# the fewest tasks a dense fallback's outer tile loop runs in parallel alone ("parallel" "outer"): two threads' share
# within an eighth of each other
OUTER_TASKS = 8


# the independent accumulators that keep two FMA ports busy through a multiply-add's 4-cycle latency
FMA_CHAINS = 8


# a narrow weight is widened a panel at a time into a local buffer, rather than element by element in the product,
# where the dense's rows (of all its leading axes) times the widening's expression nodes reach this
# (schedules/cpu/dense.py, _widen_knob). At one thread, back to back (the whole models' effect at the default thread
# count with pauses is in docs/benchmarks.md, "Quantized models"): 4-bit levels in blocks (50 nodes), 768 x 3072,
# inline 0.22 and 0.42 ms at 4 and 8 rows against 0.42 and 0.52 a panel at a time, 0.81 against 0.74 at 16, 6.7
# against 3.4 at 128; float16 (5 nodes), 768 x 768, inline as fast or faster at 8, 16 and 128 rows (1.01 ms against
# 1.03 at 128)
WIDEN_PANEL_WORK = 1024
# a float16 element's widening without half-conversion instructions (wasm: bit arithmetic on the 16-bit pattern,
# codegen/fast_math.py), in expression nodes: an estimate, not a count, that makes a float16 weight a panel at a time
# from 41 rows (float16 DistilBERT in wasmtime: 513 ms against 1104 inline)
HALF_WIDENING_NODES = 20
