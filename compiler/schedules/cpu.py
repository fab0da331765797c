"""Default CPU schedules: how each fused group's tensor expressions become parallel, vectorized loops.

`schedule_group` reads a GroupTE (compiler/ops/group.py), inlines its injective stages, picks a template by the tag
of its anchor reduction (conv2d, depthwise_conv2d, their NCHW[x]c forms, dense, or a generic reduction / injective
template; a Winograd conv's group, found by its matmul stage, has a template of its own) and hands the schedule to
`compiler.build`. Each template declares its knobs on a cfg (compiler/tune/space.py) and reads their values back;
without a tuning record they take the fallbacks of DEFAULTS and VECTOR_DEFAULTS.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial

import compiler.te as te
from compiler.target import Target
from compiler.te.schedule import INLINE, ROOT, Schedule, Stage
from compiler.te.tensor import STASH, ComputeOp, IterVar, TensorLoad, walk
from compiler.tune.space import ConfigSpace, divisors, run_template

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
SPACE_VERSION = 12

# Each template's fallback config, by knob name. A split's value is the inner size its fallback is at most (the
# largest one that divides the loop); `padding` is where a conv's padded input is read from: "in_place" (the pad is
# inlined and the tile loops partitioned), "rows" or "plane" (a local padded copy of one row tile's rows or one
# channel's plane, made right before its taps read it) or "copy" (one padded copy through memory).
DEFAULTS: dict[str, dict[str, object]] = {
    # the vector split of an elementwise or reduction loop, in units of the target's lanes
    "injective": {"vector_lanes": 1},
    "reduce": {"vector_lanes": 1},
    # output channels x output columns held in registers; the pad stage is materialized once
    "conv2d": {"tile_oc": 8, "tile_ow": 16, "unroll_oc": 1},
    # oc x positions in registers, the taps outside. audio_conv1d's convs on AVX-512, 1 thread, ms for 8 x 32, 8 x 16,
    # 4 x 32, 6 x 32, 12 x 16: 1 -> 48 channels, 79 taps, stride 4, 16000 samples 0.125, 0.238, 0.143, 0.128, 0.214;
    # 48 -> 48, 3 taps, 1000 positions 0.063, 0.087, 0.072, 0.063, 0.085
    "conv1d": {"tile_oc": 8, "tile_ow": 32},
    # tile_oh x tile_ow accumulators per step. With padding in place the loops over row tiles and column tiles are
    # cut into border tiles, which keep the padding's select, and interior tiles, which read the input with no test
    # (dwconv_block, 2 threads, after each onnxruntime run: 0.43-0.50 ms, against 0.62-0.67 with the padded rows
    # copied per row tile). 2 x 32 on AVX-512 (4 x 16: 0.57-0.60 ms; 2 x 16 the same as 2 x 32; 8 rows: 1.1 ms).
    # The taps are unrolled (unroll_taps): else, in a border tile, LLVM keeps a loop over them whose 24- or 28-lane
    # accumulators it splits into scalars (1 thread: (32, 112, 112) 0.14 -> 0.11 ms, (32, 80, 80) 0.10 -> 0.065,
    # dwconv_block 0.62 -> 0.55)
    "depthwise_conv2d": {"tile_oh": 2, "tile_ow": 32, "unroll_taps": 1, "padding": "in_place"},
    # an NCHW[x]c conv's register tile: tile_blocks filter blocks x tile_ow output columns, both unrolled, each
    # filter block a vector (two on 16-byte targets, see VECTOR_DEFAULTS). `taps` "inner" moves the kernel window
    # inside the loop over a block's input channels, so the weights are read in memory order and one iteration
    # makes kh x kw x the tile's multiply-adds. A 1 x 1 window takes pointwise_tile_ow x pointwise_tile_blocks
    # instead where the target gives them (None: the same tile as any window). `unroll_outer` "blocks" makes each
    # block's columns in turn, so the columns' broadcast inputs stay live across the blocks; "columns" feeds each
    # column's one broadcast input to every block's weight vector, so the blocks' weights stay live instead (fewer
    # registers when the tile has fewer blocks than columns)
    "conv2d_nchwc": {
        "tile_ow": 14,
        "tile_blocks": 1,
        "taps": "outer",
        "unroll_outer": "blocks",
        "pointwise_tile_ow": None,
        "pointwise_tile_blocks": None,
        # natively, prefetch the next filter tile (_prefetch_filters): in a run every conv's filters come from
        # beyond the cache, and on small filters its few prefetches cost nothing measurable
        "prefetch": 1,
        # the taps' place (as `taps`) in a conv whose row is at most SMALL_ROW columns, tiled by at most
        # SMALL_ROW_TILE, with a window of at most SMALL_ROW_TAPS taps (None: as any other row)
        "small_row_taps": None,
        # the padding read in place, the rows, the column tiles and the window's rows partitioned: a padded copy is one
        # more job through memory, and at 2 threads each task reads rows the other thread copied (AVX-512, round-robin
        # against the copy, ms at 1 / 2 threads: resnet18 22.3 -> 21.2 / 12.7 -> 12.0, resnet50_bottleneck 3.79 ->
        # 3.65 / 2.28 -> 2.18, yolo_neck 2.16 -> 1.95 / 1.34 -> 1.20; but unet_small 3.00 -> 3.27 / 1.72 -> 1.82, its
        # 32-channel convs' border tiles spilling; docs/benchmarks.md, "Dense convs read their padding in place")
        "padding": "in_place",
    },
    # padding in place: the column tiles cut into the border ones (which test the column) and the interior
    # (mobilenet_v2, 1 thread: 6.4 ms against 7.2 with a padded copy, its depthwise kernels 2.5-3x faster; wasmtime:
    # 24.7 against 26.9 ms). "rows" makes the padded rows of each output row right before its taps, which pays when
    # it recomputes few rows (strided convs)
    "depthwise_conv2d_nchwc": {"tile_ow": 8, "tile_blocks": 1, "padding": "in_place"},
    # a dense/matmul's register block: tile_m rows x tile_n columns (2 vectors) of accumulators over the whole k;
    # tile_order (1, 0) walks the column tiles outermost, so the tiles that share a strip of B follow each other
    # while it is in cache. (1, 128, 768) x (768, 768) on AVX-512, one thread: 1.49 ms, against 1.82 ms with
    # 4 x 16 rows outer (and 5.55 ms before a batched MatMul had a template); x (768, 3072): 6.2 against 13.5 ms
    # "parallel" "outer" runs the outer tile loop alone in parallel; pack_b copies B's panel: the search's knobs,
    # their fallbacks the code before them (AVX-512 unrolls the k loop, VECTOR_DEFAULTS)
    "dense": {
        "tile_m": 8,
        "tile_n": 32,
        "unroll_m": 1,
        "split_k_tile_n": 8,
        "tile_order": (1, 0),
        "parallel": "tiles",
        "pack_b": 0,
        # the k loop split by at most this (the largest of 1, 2, 4, 8 that divides it), the inner part unrolled:
        # each iteration makes that many rank-1 updates of the block
        "unroll_k": 1,
        # 1: a row tile above tile_m (77 rows: 7) takes fewer columns, so the block keeps tile_m x tile_n
        # accumulators instead of growing past the registers
        "keep_accumulators": 0,
    },
    # a MatMulPacked's register block: tile_m rows x one panel of B (its columns, alter_layout's DENSE_PANEL_COLUMNS),
    # over the whole k, unrolled by unroll_k; tile_order (1, 0) walks the panels outermost, so a panel stays in cache
    # while every row tile reads it. Measured in docs/benchmarks.md, "Dense kernels at the machine's peak"
    "dense_packed": {"tile_m": 4, "unroll_k": 4, "unroll_m": 1, "tile_order": (1, 0), "parallel": "tiles"},
    # an Attention's tasks: tile_m query rows each, whose scores are tile_n keys at a time in registers over the
    # head's depth (the dense template's block), the output tile_d columns at a time over the keys
    "attention": {"tile_m": 4, "tile_n": 16, "tile_d": 16},
    # an NCHW[x]c pool's register tile: tile_ow output columns, each a channel block's vector
    "pool_max": {"tile_ow": 8},
    # a blocked ConvTranspose's register tile: tile_ow output columns, each a filter block's vector (not measured
    # beyond unet_small's 2x2 stride-2 upsampling, where 8 and 16 columns ran alike)
    "conv2d_transpose_nchwc": {"tile_ow": 8},
    # an NCHW pool's register tile along the output row, in target vectors
    "pool_nchw": {"tile_vectors": 2},
    # a plane reduction's (global pool over a contiguous H x W) partial sums, in target vectors
    "plane_reduce": {"partial_vectors": 2},
    # a row reduction's (softmax's max and sum, layer norm's moments, made per row inside the row loop) partial
    # results, in target vectors
    "row_reduce": {"partial_vectors": 1},
}

# Laid over DEFAULTS by the target's vector width in bytes (16 also stands for anything narrower).
VECTOR_DEFAULTS: dict[int, dict[str, dict[str, object]]] = {
    # wasm SIMD128 and NEON, measured in wasmtime: with 16 vector registers, 2 filter blocks x 8 columns beat
    # 1 x 14 by 10-13% on mobilenet_v2 and resnet18 (1 x 14 is 3% ahead on AVX-512). A transposed-B dense sums
    # 4-lane partial products there (alter_layout's split_lanes), 4 rows of B at a time (mlp: 0.107 ms against
    # 0.123 with 8); the other dense blocks are 4 x 16 rows outer (the 768 x 768 matmul above: 5.5 ms, 5.6 with
    # 8 x 32, 6.4-6.6 with 4-8 x 8).
    16: {
        # the taps inside the input channels (wasmtime, 1 thread, Module.profile, interleaved): resnet18 80.3-80.6 ms
        # against 99.9-102.6 (its 512-channel 7 x 7 convs 4.45 against 6.35), resnet50_bottleneck 15.3-15.5
        # against 16.0-16.3. The tile is sized for V8 (Node 20, x86-64: 16 xmm registers), 1 thread, each kernel
        # timed alone, interleaved: 2 blocks x 7 columns (28 accumulators), where 2 x 8 (32) fell off a cliff:
        # resnet18's 3 x 3 convs on 56 x 56 4.7 ms against 7.5, the model 76.4 against 87.0 ms (1 x 7: 79.0,
        # 1 x 4: 117). A 1 x 1 window has a short multiply-add chain per loaded input: there 1 block x 4 columns
        # (8 accumulators, XNNPACK's 4 x 8 wasm-SIMD GEMM tile) ran near the engine's peak where 2 x 7 or 1 x 7
        # spilled: mobilenet_v2's 16 -> 96 channels on 112 x 112 1.07 ms against 1.49 (2 x 8) and 1.54 (2 x 7),
        # 96 -> 24 on 56 x 56 0.26 against 0.52 (1 x 8)
        "conv2d_nchwc": {
            "tile_ow": 7,
            "tile_blocks": 2,
            "taps": "inner",
            "pointwise_tile_ow": 4,
            "pointwise_tile_blocks": 1,
            # Node 20 against onnxruntime-web, in place against the copy: resnet50_bottleneck 18.0 -> 19.1 ms,
            # inception_block 7.7 -> 8.9, yolo_neck and unet_small within the noise
            "padding": "copy",
        },
        # one vector wide in wasmtime: dwconv_block 4.1 ms, against 5.0-5.2 with 2 x 8 and 5.9 with 4 x 16
        "depthwise_conv2d": {"tile_oh": 2, "tile_ow": 4},
        # In V8 (Node 20, 1 thread, each kernel alone, interleaved) a block runs near the engine's peak while its
        # accumulators, B's vectors and the broadcast fit 16 registers, and spills beyond: 4 x 8 (XNNPACK's wasm-SIMD
        # GEMM tile) against 4 x 16, bert_tiny's (128, 128) x (128, 512) 0.29 ms against 0.57, the model 3.3 against
        # 5.3 ms; 77 rows take 7 x 4 (odd_transformer's (77, 200) x (200, 700) 0.40 ms, 0.75 in 7 x 8)
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
        # not measured: the register budget of the dense block above (16 accumulators)
        "conv1d": {"tile_oc": 4, "tile_ow": 16},
        # an NCHW conv's 8 x 16 (32 accumulators) spills in V8 too; at most 2 channels x 16 columns (8): Node 20,
        # 1 thread, odd_convnet's 3-group dilated 3x3 conv (45 channels, so 1 x 16) on 49 x 66 1.38 ms against 2.41
        # in 5 x 16 (3 x 8: 1.89, 5 x 8: 2.05, 3 x 12: 2.80), the model 3.18 against 4.25 ms
        "conv2d": {"tile_oc": 2, "tile_ow": 16},
    },
    # AVX-512: 2 filter blocks x 8 columns. 3x3 convs, 1 thread, interleaved (Module.profile): 64 channels on 56 x 56
    # 0.90 ms against 0.99 with 1 x 14, 128 on 28 x 28 0.91 against 1.01, 256 on 14 x 14 0.90 against 1.00 (and
    # 0.90 with 1 x 14 and the taps inside the input channels); 4 x 7 1.10, 4 x 4 0.96, 1 x 28 0.97. The taps inside:
    # 512 on 7 x 7 (9.4 MB of weights, read from L2 and beyond) 0.96-0.99 ms against 1.38-1.41, 256 on 14 x 14 0.88
    # against 0.94, the others equal. AVX2 keeps them outside: 64 on 56 x 56 2.0-2.2 ms against 2.4-2.5 inside
    64: {
        "conv2d_nchwc": {"tile_ow": 8, "tile_blocks": 2, "taps": "inner"},
        # 8 rows x 48 columns (three vectors: 24 accumulators, B's 3 vectors and A's broadcast in 32 registers), the
        # k loop unrolled by 4. Intel Xeon (LLVM's host CPU rocketlake), 1 thread, whole models round-robin against
        # onnxruntime, ms for DEFAULTS' 8 x 32, unroll_k 4 alone, 48 columns alone, both: odd_transformer 1.46, 1.38,
        # 1.35, 1.28 (onnxruntime 1.30), vit_tiny 2.85, 2.68, 2.64, 2.54 (2.95), bert_tiny 1.26, 1.21, 1.25, 1.22
        # (1.51), mlp 0.080 in all four. The search chose 7 x 48 with unroll_k 4 and 11 x 32 with 8 for
        # odd_transformer's 200 x 700 and 700 x 200 MatMuls (1.3-1.4x their old fallback)
        "dense": {"tile_n": 48, "unroll_k": 4},
        # 6 rows x a 64-column panel (24 accumulators, B's 4 vectors and A's broadcast in 32 registers)
        "dense_packed": {"tile_m": 6},
        "attention": {"tile_m": 6, "tile_n": 64, "tile_d": 64},
    },
    # AVX2 (16 registers of 8 floats), measured with -mcpu=haswell -mattr=-avx512f on the same machine: 6 x 16
    # (12 accumulators) 1.93 ms on the 768 x 768 matmul; 8 x 32 spills (4.27 ms). dwconv_block's 2 x 16 (two
    # vectors) 0.48 ms at 2 threads, against 0.88 with 4 x 16 and 1.1 with 2 x 32
    32: {
        # 2 filter blocks x 6 columns, the columns unrolled outside the blocks: 12 accumulators, the blocks' 2 weight
        # vectors and one broadcast input in 16 registers. With the blocks outside, the 6 broadcasts stayed live
        # and LLVM spilled 3 accumulators to the stack in the k loop. znver3, 1 thread, each model's variants
        # round-robin (median ms, onnxruntime's 1-thread session in the same rounds): yolo_neck 5.65 against 6.59
        # with DEFAULTS' 1 x 14 and 8.61 with 2 x 6 blocks outside (onnxruntime 4.70), unet_small 5.31, 6.08, 11.47
        # (6.12), resnet18 45.6, 49.3, 45.1 (40.9), resnet50_bottleneck 7.08, 8.72, 7.19 (7.00), inception_block
        # 3.32, 4.14, 3.32 (3.36); the taps inside the channels 7.13 on yolo_neck and 10.1 on unet_small. At the
        # default thread count, a 50 ms pause before each run, against 1 x 14: a conv net with untuned channels
        # (24, 40, 72, 136) 6.25 -> 5.62, resnet50_bottleneck 6.18 -> 5.30, yolo_neck 3.80 -> 3.48, resnet18
        # 25.4 -> 24.0 (docs/benchmarks.md, "AVX2 conv tiles (seventh session)")
        # The padded input copied, not read in place: on AMD EPYC (znver3), round-robin, ms in place -> copy at 1 / 2
        # threads (onnxruntime): resnet18 48.5 -> 45.7 / 36.1 -> 31.9 (41.1 / 25.7), inception_block 5.07 -> 4.35 /
        # 2.26 -> 1.93 (3.63 / 2.26), densenet_block 10.4 -> 9.5 / 5.09 -> 4.75, odd_convnet 2.88 -> 2.45 / 1.69 ->
        # 1.50; yolo_neck 3.69 -> 3.98 / 2.74 -> 2.85 and unet_small 7.13 -> 7.24 / 5.07 -> 5.36 the other way,
        # squeezenet and efficientnet_b0 equal; the same directions at 2 threads with a 50 ms pause before each run
        # (in place had won with -mcpu=haswell on an Intel host)
        # The taps inside the input channels on a short row (SMALL_ROW): 64-bit indices, znver3, 1 thread,
        # each conv alone round-robin with onnxruntime's conv, ms outer -> inner: 512 channels on 7 x 7 3.24 -> 3.03
        # (onnxruntime 2.75), 256 on 14 x 14 2.68 -> 2.53 (2.54), 96 on 25 x 25 1.40 -> 1.21, 320 on 10 x 10 2.05 ->
        # 1.93, 384 on 7 x 7 1.76 -> 1.64; 48-64 channels on 14-20 columns even. A 6-column tile's body (24 distinct
        # broadcasts per channel) or a 5 x 5 window spilled inside: 2.2x slower (160 on 24 x 24, 96 on 30 x 30); long
        # rows of 4-column tiles lost 6-10% (64 on 56 x 56, 128 on 28 x 28)
        "conv2d_nchwc": {
            "tile_ow": 6,
            "tile_blocks": 2,
            "unroll_outer": "columns",
            "padding": "copy",
            "small_row_taps": "inner",
        },
        # B's panel packed once per column tile, the column tiles the tasks: by its addresses, a 16-column strip
        # read in place at a row stride of 2 or 3 KB (512, 768 columns) falls into 2 or 4 of a 32 KB L1's 64 sets
        # (not measured with counters). AMD EPYC (znver3),
        # whole models round-robin, ms at 1 / 2 threads unpacked -> packed (onnxruntime): bert_tiny 2.25 -> 1.94 /
        # 1.16 -> 0.98 (2.55 / 1.69), odd_transformer 2.70 -> 2.38 / 1.43 -> 1.33 (2.20 / 1.60), vit_tiny equal
        # (its 77 x 192 x 768 MatMuls 3-5% slower, its attention's faster), 6-16% faster at 2 threads with a 50 ms
        # pause before each run; (128, 768) x (768, 768) alone, 1
        # thread, 2.92 -> 2.16 ms (1.70 with unroll_k 4, onnxruntime 1.74; docs/benchmarks.md, "MatMuls on an
        # AVX2 host")
        "dense": {"tile_m": 6, "tile_n": 16, "parallel": "outer", "pack_b": 1},
        # 6 rows x a 16-column panel: 12 accumulators, B's 2 vectors and A's broadcast in 16 registers
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

CONV_TAGS = ("conv2d", "group_conv2d")
CONV1D_TAGS = ("conv1d", "group_conv1d")
BLOCKED_CONV_TAGS = ("conv2d_nchwc", "depthwise_conv2d_nchwc")
DENSE_TAGS = ("dense", "batch_matmul")
PACKED_DENSE_TAG = "dense_packed"
POOL_TAGS = ("pool_max", "pool_avg")
TRANSPOSED_TAG = "conv2d_transpose_nchwc"
TILED_TAGS = (
    *CONV_TAGS,
    *CONV1D_TAGS,
    "depthwise_conv2d",
    *BLOCKED_CONV_TAGS,
    *DENSE_TAGS,
    PACKED_DENSE_TAG,
    *POOL_TAGS,
    TRANSPOSED_TAG,
)


def fallback(kind: str, target: Target | None = None) -> dict[str, object]:
    """The template's fallback knob values: DEFAULTS, with VECTOR_DEFAULTS for `target`'s vector width laid over."""
    values = dict(DEFAULTS[kind])
    if target is not None:
        values.update(VECTOR_DEFAULTS.get(max(16, target.vector_bytes), {}).get(kind, {}))
    return values


def vector_registers(target: Target) -> int:
    """The vector registers a register tile may fill: 32 on AVX-512 and AArch64, 16 on AVX2, SSE and ARMv7 NEON.
    Wasm runs on its engine's registers, unknown when compiling (16 in wasmtime on x86-64), and its blocked-conv
    default, 2 x 8 columns of two vectors, won in wasmtime with 32 accumulators: it takes 32, the most a host has."""
    if target.kind == "wasm" or target.vector_bytes == 64 or target.arch in ("aarch64", "arm64"):
        return 32
    return 16


def _limit_registers(cfg: ConfigSpace, target: Target, dtype: str, rows: tuple, columns) -> None:
    """Reject configs whose register tile (the product of `rows`, each a split knob's inner size or a constant, times
    the vectors of `columns` lanes) has more accumulators than the target has vector registers."""
    width, registers = lanes(target, dtype), vector_registers(target)

    def size(config, part) -> int:
        return config[part].size[-1] if isinstance(part, str) else part

    cfg.add_filter(
        lambda config: math.prod(size(config, part) for part in rows) * -(-size(config, columns) // width) <= registers
    )


def itemsize(dtype: str) -> int:
    """Bytes per element of `dtype` (bool and the 8-bit types 1)."""
    return {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "int16": 2}.get(dtype, 1)


def lanes(target: Target, dtype: str) -> int:
    return max(1, target.vector_bytes // itemsize(dtype))


def divisor_at_most(extent: int, limit: int) -> int:
    """The largest divisor of `extent` not above `limit`, so a split never needs a guarded tail."""
    for candidate in range(min(extent, max(limit, 1)), 0, -1):
        if extent % candidate == 0:
            return candidate
    return 1


def tile_or_tail(extent: int, limit: int, least: float = 0.5) -> int:
    """A register tile along `extent`: the largest divisor not above `limit` when it is at least `least` of it, else
    the fewest tiles of at most `limit`, balanced, the last one shorter (31 columns: 11 + 11 + 9; in tiles of 1,
    the only divisor, a conv ran 3.7x slower per output than over 32 columns). The template partitions the tile
    loop, so only the tail tile tests its bound, and the simplifier shortens its loops to it."""
    tile = divisor_at_most(extent, limit)
    if tile >= least * min(limit, extent):
        return tile
    return -(-extent // -(-extent // limit))


def column_tiles(extent: int) -> list[int]:
    """The tile sizes along `extent` a template may choose: its divisors, and the size of each balanced tiling
    (the fewest tiles of at most that size, all equal but the last)."""
    balanced = {-(-extent // parts) for parts in range(1, extent + 1)}
    return sorted(balanced | set(divisors(extent)))


def vector_factor(extent: int, width: int) -> int:
    """`width` when it divides `extent`; else the largest divisor of at least 4 (a short vector still beats scalar
    code); else 1 (no vector loop)."""
    if extent % width == 0:
        return width
    factor = divisor_at_most(extent, width)
    return factor if factor >= 4 else 1


def schedule_group(group, target: Target | str = "llvm", config: ConfigSpace | Mapping | None = None) -> te.Schedule:
    """A schedule of `group` (a GroupTE) for a CPU target. `config`: a cfg for the template to declare its knobs on
    (afterwards it holds the space), or a record's knob values (name -> JSON value: values that do not fit the
    template warn, and the fallback is built), or None for the fallback."""
    target = Target.parse(target)
    if isinstance(config, ConfigSpace):
        return _schedule_group(group, target, config)
    return run_template(partial(_schedule_group, group, target), config)[0]


def _schedule_group(group, target: Target, cfg: ConfigSpace) -> te.Schedule:
    outputs = [tensor for tensor in group.outputs if isinstance(tensor.op, ComputeOp)]
    schedule = te.create_schedule(list(dict.fromkeys(tensor.op for tensor in outputs)))
    _add_unread_inputs(schedule, group.inputs)
    if any(stage.op.tag == WINOGRAD_GEMM for stage in schedule.stages if isinstance(stage.op, ComputeOp)):
        cfg.template = "winograd"
        _winograd(schedule, target, cfg)
        return schedule
    if any(getattr(stage.op, "tag", "") == ATTENTION_TAG for stage in schedule.stages):
        cfg.template = ATTENTION_TAG
        _attention(schedule, target, cfg)
        return schedule
    anchor = _anchor_reduction(schedule)
    if anchor is not None and anchor.op.tag in POOL_TAGS and len(anchor.op.axis) == 4 and len(outputs) > 1:
        anchor = None  # a max pool's Indices read its padding too: that group keeps the generic schedule
    kind = _template_kind(anchor)
    keep: set[int] = set()
    if kind is not None and schedule[anchor].is_output:
        # the anchor writes a register-sized local tile; the output stage copies it out (and does the epilogue)
        anchor = schedule.cache_write(anchor.op.output(0), "local")
    nchw_pool = kind in POOL_TAGS and len(anchor.op.axis) == 4
    if kind in ("conv2d", "conv1d", "depthwise_conv2d", *BLOCKED_CONV_TAGS) or nchw_pool:
        pad = _padding_stage(schedule, anchor)
        if pad is not None:
            keep.add(id(pad))
    _inline_injective(schedule, keep)
    readers = _readers(schedule)
    for stage in schedule.stages:
        if id(stage.op) in keep and kind not in ("depthwise_conv2d", *BLOCKED_CONV_TAGS) and not nchw_pool:
            _schedule_rows(stage, target)
    if kind is not None and len(readers[schedule[anchor]]) == 1:
        output = readers[schedule[anchor]][0]
        if output.attach_type == ROOT and tuple(output.op.shape) == tuple(anchor.shape):
            cfg.template = kind
            TEMPLATES[kind](schedule, schedule[anchor], output, target, cfg)
            _schedule_rest(schedule, readers, target, cfg, done={schedule[anchor], output})
            return schedule
    _schedule_rest(schedule, readers, target, cfg, done=set())
    return schedule


def _add_unread_inputs(schedule: Schedule, inputs: list[te.Tensor]) -> None:
    """The kernel takes every group input (its ABI), even one no output reads (an op that ignores an operand):
    such a placeholder gets a stage so lowering can make it a parameter."""
    for tensor in inputs:
        if tensor.op not in schedule.stage_map:
            stage = Stage(schedule, tensor.op)
            schedule.stages.insert(0, stage)
            schedule.stage_map[tensor.op] = stage


def _anchor_reduction(schedule: Schedule) -> te.Tensor | None:
    """The reduction whose tag names a tiled template, else None (generic templates then apply)."""
    for stage in schedule.stages:
        op = stage.op
        if not (isinstance(op, ComputeOp) and op.reduce_axis and op.tag in TILED_TAGS):
            continue
        if op.tag in POOL_TAGS and len(op.axis) not in (4, 5):
            continue  # 1-D and 3-D pools keep the generic reduction schedule
        if len(op.axis) in (2, 4, 5) or op.tag in (*CONV1D_TAGS, PACKED_DENSE_TAG):
            return op.output(0)
        if op.tag == "batch_matmul" and len(op.axis) > 2:
            return op.output(0)
    return None


def _template_kind(anchor: te.Tensor | None) -> str | None:
    if anchor is None:
        return None
    if anchor.op.tag in DENSE_TAGS:
        return "dense"
    if anchor.op.tag in CONV1D_TAGS:
        return "conv1d"
    return "conv2d" if anchor.op.tag in CONV_TAGS else anchor.op.tag


def _padding_stage(schedule: Schedule, anchor: te.Tensor):
    """The conv's padded input, when the compute made one: kept as its own stage so the conv's inner loop reads
    a plain buffer (a select in the vector loop would cost a compare per multiply-add)."""
    for tensor in anchor.op.input_tensors:
        op = tensor.op
        if isinstance(op, ComputeOp) and op.tag == "injective" and not op.reduce_axis:
            return op
    return None


def _inline_injective(schedule: Schedule, keep: set[int]) -> None:
    for stage in schedule.stages:
        op = stage.op
        if isinstance(op, ComputeOp) and not op.reduce_axis and not stage.is_output and id(op) not in keep:
            if op.tag == STASH:
                continue
            if stage.scope == "global":
                stage.compute_inline()


def _readers(schedule: Schedule) -> dict[Stage, list[Stage]]:
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


# -- generic templates ----------------------------------------------------------------------------------------------


def _define_vector_lanes(cfg: ConfigSpace, kind: str, target: Target) -> int:
    """The vector width of a generic template's innermost loop, in target lanes: one knob for every stage of the
    group that the injective and reduction templates schedule."""
    cfg.define_knob("vector_lanes", [1, 2, 4], default=fallback(kind, target)["vector_lanes"])
    return cfg["vector_lanes"].val


def _schedule_injective(stage: Stage, target: Target, cfg: ConfigSpace) -> None:
    """Split the innermost axis by the vector width (when it divides), vectorize it, fuse the rest, parallel."""
    axes = list(stage.op.axis)
    if not axes:
        return
    axes[-1] = _vectorize_innermost(
        stage, lanes(target, stage.op.dtype) * _define_vector_lanes(cfg, "injective", target)
    )
    if len(axes) > 1:
        stage.parallel(stage.fuse(*axes))
    elif axes[0].extent > 1:
        stage.parallel(axes[0])


def _schedule_unblock(stage: Stage, target: Target) -> None:
    """NCHW[x]c -> NCHW: parallel over (batch, channel block, row); inside, each of the block's x channels is one
    output row, a vector loop over its columns that reads the column's x channels, a stride of x apart, from the
    row's x-by-W tile while it is in cache. Fusing all the axes (the generic injective template) made a division
    and a modulo per element and, over a width no vector divides, no vector loop: (1, 32, 112, 112) 0.23 ms."""
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
    division (unet_small's 2x bilinear upsampling, (1, 2, 96, 96, 16): 0.19 ms)."""
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
    fused index into the row and the column for every vector: inception_block's (1, 192, 28, 28) input, 1 thread,
    0.103 -> 0.065 ms on AVX-512 and 0.165 -> 0.059 in wasmtime."""
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
    for each vector, after dividing its index into block, row and column (densenet_block's 256-channel Concat +
    BatchNormalization + ReLU on 28 x 28, 1 thread: 0.140 ms, onnxruntime's three nodes 0.11)."""
    n, block, row, column, inner = stage.op.axis
    vector = _vectorize_innermost(stage, lanes(target, stage.op.dtype))
    stage.reorder(n, row, block, column, *([] if vector is inner else [vector]))
    stage.parallel(stage.fuse(n, row))
    stage.partition(block)


def _blocked_stage_loads(stage: Stage) -> list[TensorLoad]:
    """The tensor loads of an NCHW[x]c compute stage (five axes), or none for any other stage."""
    if len(stage.op.axis) != 5 or not isinstance(stage.op, ComputeOp):
        return []
    return [node for node in walk(stage.op.body) if isinstance(node, TensorLoad)]


def _schedule_rows(stage: Stage, target: Target) -> None:
    """A padding stage: parallel over its rows, each row a vector loop when its width allows one, else a plain
    loop. Fusing the row axis in too (as _schedule_injective does) would cost a division and a modulo per element
    for the padded rows' odd widths. In a blocked (NCHW[x]c) layout the vector is the channel block and the loop
    over a row's columns is partitioned: the interior columns copy without testing the column."""
    axes = list(stage.op.axis)
    _vectorize_innermost(stage, lanes(target, stage.op.dtype))
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


def _schedule_rest(schedule: Schedule, readers, target: Target, cfg: ConfigSpace, done: set) -> None:
    """Every stage no template took: a reduction (or stash stage) read by one root stage is computed inside that
    stage's loops (at its vector tile when the shapes agree, at its row loop when the reduction keeps size-1 axes),
    the rest at the root with the generic templates."""
    pending = [s for s in schedule.stages if s not in done and isinstance(s.op, ComputeOp)]
    pending = [s for s in pending if s.attach_type == ROOT and s.relations == [] and not s.annotations]
    partials = {stage: _factor_plane(schedule, stage, target, cfg) for stage in pending if _is_plane_reduction(stage)}
    hosted = [s for s in pending if _lives_in_host(s)]
    attached: dict[Stage, list[Stage]] = {}
    for stage in hosted:
        host = _host(stage, readers, schedule, set())
        if host is not None and host not in hosted and host in pending:
            attached.setdefault(host, []).append(stage)
    for members in attached.values():
        for member in members:
            if member not in partials and _is_row_reduction(member):
                partials[member] = _factor_row(schedule, member, target, cfg)
    if not cfg.template:
        cfg.template = "reduce" if any(stage.op.reduce_axis for stage in pending) else "injective"
    for stage in pending:
        if stage in attached:
            _schedule_host(stage, attached[stage], target, cfg)
            for member in attached[stage]:
                if member in partials:
                    _schedule_partials(partials[member], stage, member.attach_ivar)
        elif any(stage in members for members in attached.values()):
            continue
        elif stage.op.reduce_axis:
            parallel = _schedule_reduction(stage, target, cfg)
            if stage in partials and parallel is not None:
                _schedule_partials(partials[stage], stage, parallel)
        elif stage.op.tag == "layout_nchw":
            _schedule_unblock(stage, target)
        elif _repeats_columns(stage) or _moves_blocked_columns(stage) or _blocks_channels(stage):
            _schedule_rows(stage, target)
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
        uses = [index for index in load.indices if _uses(index, k)]
        if uses and (len(uses) != 1 or load.indices[-1] is not k):
            return False
    return True


def _factor_row(schedule: Schedule, stage: Stage, target: Target, cfg: ConfigSpace) -> Stage | None:
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


def _schedule_partials(partial: Stage | None, host: Stage, axis) -> None:
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


def _lives_in_host(stage: Stage) -> bool:
    """Reductions and stash stages (made once for several readers) that no one outside the group reads are made
    inside the loops of the stage they feed."""
    return bool(stage.op.reduce_axis or stage.op.tag == STASH) and not stage.is_output


def _host(stage: Stage, readers, schedule: Schedule, seen: set[int]) -> Stage | None:
    """The single root stage that `stage`'s value ends up in: its only reader, or the host of readers that are
    themselves reductions attached to the same host (softmax's max is read by its sum and its output)."""
    hosts = set()
    for reader in readers[stage]:
        if _lives_in_host(reader) and id(reader) not in seen:
            seen.add(id(reader))
            hosts.add(_host(reader, readers, schedule, seen))
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


def _schedule_host(host: Stage, members: list[Stage], target: Target, cfg: ConfigSpace) -> None:
    """`host` parallel over the axes every member keeps whole, with the members (local buffers) computed inside
    that loop: per vector tile when they have the host's shape, per row (softmax, layer norm) otherwise."""
    axes = list(host.op.axis)
    kept = [all(m.op.shape[d] == axes[d].extent for m in members) for d in range(len(axes))]
    width = lanes(target, host.op.dtype)
    if all(kept):
        outer = _vectorize_innermost(host, width)
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
        _vectorize_row(host, width)
    for member in members:
        member.set_scope("local")
        member.compute_at(host, fused)
        if not member.op.reduce_axis:
            _vectorize_row(member, width)


def _vectorize_row(stage: Stage, width: int) -> None:
    """A row's innermost axis in whole vectors of `width` lanes and, when they do not divide it, a shorter last one
    in its own partitioned piece: a softmax over 77 scores ran in vectors of 11 lanes (its divisor), each exp a
    16-lane polynomial for 11 of them. Rows shorter than a vector keep `_vectorize_innermost`'s divisor."""
    last = stage.op.axis[-1]
    if last.extent <= width or last.extent % width == 0 or vector_factor(last.extent, width) == width:
        _vectorize_innermost(stage, width)
        return
    outer, inner = stage.split(last, width)
    stage.vectorize(inner)
    stage.partition(outer)


def _vectorize_innermost(stage: Stage, width: int):
    """Split the stage's innermost axis by a vector factor of `width` lanes (when one divides it) and vectorize the
    inner part; the axis left outside (the whole axis when none divides)."""
    last = stage.op.axis[-1]
    factor = vector_factor(last.extent, width) if last.extent > 1 else 1
    if factor <= 1:
        return last
    outer, inner = stage.split(last, factor)
    stage.vectorize(inner)
    return outer


# -- anchor templates -----------------------------------------------------------------------------------------------


def _conv2d(schedule: Schedule, conv: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """Register-blocked direct convolution: each task owns (batch, oc block, output row); per column tile the
    conv accumulates tile_oc x tile_ow outputs over input channels and the kernel window, vectorized along the
    output row, and the epilogue is applied to that tile before it is stored."""
    values = fallback("conv2d", target)
    n, oc, oh, ow = output.op.axis
    cfg.define_split("tile_oc", oc, default=values["tile_oc"])
    _define_row_tile(cfg, "tile_ow", ow, values["tile_ow"], lanes(target, output.op.dtype))
    cfg.define_knob("unroll_oc", [0, 1], default=values["unroll_oc"])
    _limit_registers(cfg, target, output.op.dtype, ("tile_oc",), "tile_ow")
    oc_outer, oc_inner = cfg["tile_oc"].apply(schedule, output, oc)
    ow_outer, ow_inner = cfg["tile_ow"].apply(schedule, output, ow)
    output.reorder(n, oc_outer, oh, ow_outer, oc_inner, ow_inner)
    output.parallel(output.fuse(n, oc_outer, oh))
    output.vectorize(ow_inner)
    _partition_tail(output, ow_outer, ow.extent, cfg["tile_ow"].size[-1])
    conv.set_scope("local")
    conv.compute_at(output, ow_outer)
    cn, coc, coh, cow = conv.op.axis
    conv.reorder(cn, coh, *conv.op.reduce_axis, coc, cow)
    if cfg["unroll_oc"].val:
        conv.unroll(coc)
    conv.vectorize(cow)


def _conv1d(schedule: Schedule, conv: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """Register-blocked 1-D convolution: each task owns (batch, oc block); per tile of output positions the conv
    accumulates tile_oc x tile_ow outputs over input channels and taps (the taps a long kernel has outside, the tile
    inside, so each tap is one vector load of contiguous input, or of one stride phase, and tile_oc broadcast
    weights), vectorized along the positions. The position split is a power of two: a long signal's length rarely
    has a fitting divisor (3981 = 3 x 1327), so its last tile is guarded, the loop over tiles partitioned so only
    that tile tests it."""
    values = fallback("conv1d", target)
    n, oc, ow = output.op.axis
    # a tail tile wider than one vector is a slow odd-width vector loop (LLVM keeps its accumulators in memory: 96
    # channels, 125 positions, 8 x 32 tiles: 0.095 ms, 0.032 at 128 positions), so the fallback halves the tile
    # until the tail fits one vector (8 x 16: 0.045 ms)
    width, tile_ow = lanes(target, output.op.dtype), values["tile_ow"]
    while tile_ow > width and ow.extent % tile_ow > width:
        tile_ow //= 2
    cfg.define_split("tile_oc", oc, default=values["tile_oc"])
    cfg.define_split("tile_ow", ow, policy="power2", default=tile_ow)
    _limit_registers(cfg, target, output.op.dtype, ("tile_oc",), "tile_ow")
    oc_outer, oc_inner = cfg["tile_oc"].apply(schedule, output, oc)
    ow_outer, ow_inner = cfg["tile_ow"].apply(schedule, output, ow)
    output.reorder(n, oc_outer, ow_outer, oc_inner, ow_inner)
    output.parallel(output.fuse(n, oc_outer))
    output.partition(ow_outer)
    output.vectorize(ow_inner)
    conv.set_scope("local")
    conv.compute_at(output, ow_outer)
    cn, coc, cow = conv.op.axis
    conv.reorder(cn, *conv.op.reduce_axis, coc, cow)
    conv.unroll(coc)
    conv.vectorize(cow)


def _depthwise_conv2d(schedule: Schedule, conv: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """A 2-D output tile per step (tile_oh x tile_ow), vectorized along the row, parallel over batch x channels;
    the window taps are the outer loops of the tile's accumulation. The padding is read in place, the loops over
    row and column tiles partitioned so only the border tiles test it (or padded rows are made per tile, or a
    channel's padded plane per channel, or the whole padded input once)."""
    values = fallback("depthwise_conv2d", target)
    n, c, oh, ow = output.op.axis
    cfg.define_split("tile_oh", oh, default=values["tile_oh"])
    _define_row_tile(cfg, "tile_ow", ow, values["tile_ow"], lanes(target, output.op.dtype))
    cfg.define_knob("unroll_taps", [0, 1], default=values["unroll_taps"])
    _limit_registers(cfg, target, output.op.dtype, ("tile_oh",), "tile_ow")
    pad = _padding_stage(schedule, conv.op.output(0))
    if pad is not None:
        options = ["in_place", "copy"]
        if pad.shape[1] == output.op.shape[1]:
            options.append("rows")
            if math.prod(pad.shape[2:]) <= LOCAL_PAD_FLOATS:
                options.append("plane")
        cfg.define_knob("padding", options, default=values["padding"])
    oh_outer, oh_inner = cfg["tile_oh"].apply(schedule, output, oh)
    ow_outer, ow_inner = cfg["tile_ow"].apply(schedule, output, ow)
    output.reorder(n, c, oh_outer, ow_outer, oh_inner, ow_inner)
    channels = output.fuse(n, c)
    output.parallel(channels)
    output.vectorize(ow_inner)
    _partition_tail(output, ow_outer, ow.extent, cfg["tile_ow"].size[-1])
    conv.set_scope("local")
    conv.compute_at(output, ow_outer)
    cn, cc, coh, cow = conv.op.axis
    conv.reorder(cn, cc, *conv.op.reduce_axis, coh, cow)
    if cfg["unroll_taps"].val:
        for tap in conv.op.reduce_axis:
            conv.unroll(tap)
    if cfg["tile_oh"].size[-1] > 1:
        conv.unroll(coh)
    conv.vectorize(cow)
    if pad is None:
        return
    padding, pad = cfg["padding"].val, schedule[pad]
    if padding == "in_place":
        pad.compute_inline()
        output.partition(oh_outer)
        output.partition(ow_outer)
        return
    if padding != "copy":
        # the padded rows one row tile reads (or one channel's padded plane), filled right before its taps read
        # them, stay in cache
        pad.set_scope("local")
        pad.compute_at(output, oh_outer if padding == "rows" else channels)
    _schedule_rows(pad, target)


def _conv_nchwc(schedule: Schedule, conv: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """NCHW[x]c convolution (group 1 or depthwise): each task owns (batch, filter block, output row); per tile of
    tile_ow columns the conv keeps tile_ow vectors of the block's filters in registers, the taps outside, the
    columns unrolled inside, so every tap is one multiply-add per column on contiguous weights. The epilogue runs
    on the tile before it is stored, still in the blocked layout."""
    values = fallback(conv.op.tag, target)
    n, outer, oh, ow, inner = output.op.axis
    pointwise = conv.op.tag == "conv2d_nchwc" and all(axis.extent == 1 for axis in conv.op.reduce_axis[1:-1])
    pointwise_tile = pointwise and values["pointwise_tile_ow"] is not None
    if pointwise_tile:
        values.update(tile_ow=values["pointwise_tile_ow"], tile_blocks=values["pointwise_tile_blocks"])
    # the column tiles: the row's divisors and its balanced tilings whose last tile is shorter (31 columns:
    # 11 + 11 + 9), the fallback a divisor unless all of them are far below the tile (tile_or_tail)
    # The fallback keeps the accumulators of its full tile (tile_blocks x tile_ow of the defaults), enough
    # multiply-adds in flight to hide their latency: fewer filter blocks than the tile's (3 blocks of 16 channels)
    # take more columns, up to half the vector registers, and a row shorter than the tile takes more filter blocks
    # while they fit the registers (512 -> 512 channels on 7 x 7, AVX-512, 1 thread: 1.06 ms with 2 blocks x 7
    # columns, 1.39 with 1 x 7, 1.33 with 4 x 7). In wasm, 1 block x 16 columns of two vectors each made mobilenet_v2
    # 5% slower than 1 x 8
    accumulators = values["tile_blocks"] * values["tile_ow"]
    blocks = divisor_at_most(outer.extent, values["tile_blocks"])
    block_vectors = -(-inner.extent // lanes(target, output.op.dtype))
    columns = vector_registers(target) // 2 // block_vectors
    # a pointwise tile keeps its columns with a shorter last tile rather than halve them (14 columns in 4, 4, 4, 2:
    # mobilenet_v2's 64 -> 384 channels on 14 x 14 0.21 ms in V8, against 0.47 in 7 tiles of 2)
    least = 0.75 if pointwise_tile else 0.5
    tile_ow = tile_or_tail(ow.extent, max(values["tile_ow"], min(accumulators // blocks, columns)), least)
    cfg.define_split("tile_ow", ow, policy=column_tiles(ow.extent), default=tile_ow)
    columns_outer = conv.op.tag == "conv2d_nchwc" and values["unroll_outer"] == "columns"
    more_blocks = accumulators // tile_ow
    while more_blocks > blocks and not _fits_registers(target, more_blocks, tile_ow, block_vectors, columns_outer):
        more_blocks -= 1
    cfg.define_split("tile_blocks", outer, default=max(blocks, more_blocks))
    _limit_registers(cfg, target, output.op.dtype, ("tile_blocks", "tile_ow"), inner.extent)
    pad = _padding_stage(schedule, conv.op.output(0))
    if pad is not None:
        # a dense conv's local rows would be made again for every filter tile: not a choice
        choices = ["in_place", "copy"] if conv.op.tag == "conv2d_nchwc" else ["in_place", "rows", "copy"]
        cfg.define_knob("padding", choices, default=values["padding"])
    block_outer, block_inner = cfg["tile_blocks"].apply(schedule, output, outer)
    ow_outer, ow_inner = cfg["tile_ow"].apply(schedule, output, ow)
    output.reorder(n, block_outer, oh, ow_outer, block_inner, ow_inner, inner)
    rows = output.fuse(n, block_outer, oh)
    output.parallel(rows)
    output.vectorize(inner)
    if ow.extent % cfg["tile_ow"].size[-1]:
        output.partition(ow_outer)
    conv.set_scope("local")
    conv.compute_at(output, ow_outer)
    cn, couter, coh, cow, cinner = conv.op.axis
    reduce_axes = list(conv.op.reduce_axis)
    unrolled = [couter, cow]
    if conv.op.tag == "conv2d_nchwc":
        window = math.prod(axis.extent for axis in conv.op.reduce_axis[1:-1])
        short_row = ow.extent <= SMALL_ROW and cfg["tile_ow"].size[-1] <= SMALL_ROW_TILE and window <= SMALL_ROW_TAPS
        taps_place = values["small_row_taps"] if short_row and values["small_row_taps"] is not None else values["taps"]
        cfg.define_knob("taps", ["outer", "inner"], default=taps_place)
        if cfg["taps"].val == "inner":
            channel_outer, *taps, channel_inner = reduce_axes
            reduce_axes = [channel_outer, channel_inner, *taps]
        cfg.define_knob("unroll_outer", ["blocks", "columns"], default=values["unroll_outer"])
        if cfg["unroll_outer"].val == "columns":
            unrolled.reverse()
    conv.reorder(cn, coh, *reduce_axes, *unrolled, cinner)
    conv.unroll(couter)
    conv.unroll(cow)
    conv.vectorize(cinner)
    if conv.op.tag == "conv2d_nchwc" and target.kind == "llvm":
        _prefetch_filters(conv, cfg, target, rows, oh.extent, ow_outer, reduce_axes)
    if pad is None:
        return
    padding, pad = cfg["padding"].val, schedule[pad]
    if padding == "in_place":
        pad.compute_inline()
        output.partition(ow_outer)
        if conv.op.tag == "conv2d_nchwc":
            # the tests of a dense conv's taps come in every input channel's multiply-adds: the rows are cut too (a
            # task's body branches on its row), and in a border row the loop over the window's rows, where a
            # decided-out row's zero products are then dropped (tir/simplify.py). A border column tile keeps its
            # tests: its columns are unrolled and LLVM unrolls the window's short column loop, so they are constants
            # (cutting that loop too gave resnet18 177 copies of a tile's nest to emit against 97, and no speed)
            output.partition(rows)
            conv.partition(conv.op.reduce_axis[1])
        return
    if padding == "rows":
        # the kh padded input rows one output row reads, made right before its taps, in cache
        pad.set_scope("local")
        pad.compute_at(output, rows)
    _schedule_rows(pad, target)


def _prefetch_filters(
    conv: Stage, cfg: ConfigSpace, target: Target, rows: IterVar, row_count: int, columns, reduce_axes
) -> None:
    """While a task (a filter tile, an output row) runs, prefetch its share of the next filter tile, so the next
    filters stream in under this tile's multiply-adds instead of stalling the next tile's first row (its later rows
    find them in cache). The tile's rows, their column tiles and the outer reduction loops split the next tile's
    cache lines between their iterations, down to the deepest loop that still gives each iteration a line of its
    own: a few prefetches at a time, since a burst of them at the start of each channel step occupied the line-fill
    buffers the tile's own loads need. A tile's filters are contiguous in the packed weight (output blocks
    outermost)."""
    weights = next(
        node.tensor
        for node in walk(conv.op.body)
        if isinstance(node, TensorLoad) and node.indices[0] is conv.op.axis[1]
    )
    if weights.shape[0] == 1:
        return  # one filter block: every task reads the same filters
    cfg.define_knob("prefetch", [0, 1], default=fallback(conv.op.tag, target)["prefetch"])
    blocks = cfg["tile_blocks"].size[-1]
    tiles = -(-weights.shape[0] // blocks)
    if not cfg["prefetch"].val or tiles == 1:
        return
    tile = blocks * math.prod(weights.shape[1:])
    per_line = max(1, CACHE_LINE_BYTES // itemsize(weights.dtype))
    tile_lines = -(-tile // per_line)
    steps, step = row_count * columns.extent, rows % row_count * columns.extent + columns
    at = reduce_axes[0]
    for position, axis in enumerate(reduce_axes):
        if position and steps * axis.extent > tile_lines:
            break
        steps, step, at = steps * axis.extent, step * axis.extent + axis, axis
    lines = -(-tile_lines // steps)
    following = te.minimum(rows // row_count % tiles + 1, tiles - 1) * tile

    def line_of(line):
        # steps x lines may pass the tile's end (5 rows x 36 taps of 2 lines for AVX2's 288-line tile): the last
        # steps then name its last line again rather than the tile after
        index = step * lines + line
        return following + (index if steps * lines <= tile_lines else te.minimum(index, tile_lines - 1)) * per_line

    conv.prefetch(weights, at, lines, line_of)


def _fits_registers(target: Target, blocks: int, columns: int, block_vectors: int, columns_outer: bool) -> bool:
    """Whether a blocked conv's tile of `blocks` filter blocks x `columns` columns fits the vector registers: its
    accumulators, a weight vector per block and, with more than one block, the broadcast inputs the blocks share:
    each column's, held across the blocks (AVX2's 2 x 7 tile spilled them to the stack), or with the columns
    unrolled outside the blocks (`unroll_outer`) one at a time."""
    broadcasts = 0 if blocks == 1 else 1 if columns_outer else columns
    held = blocks * columns * block_vectors + blocks * block_vectors + broadcasts
    return held <= vector_registers(target)


def _dense(schedule: Schedule, dense: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """A tile_m x tile_n register block per step, vectorized along the output row, the k loop outside the block.
    With B transposed (N, K) the compute first sums interleaved partial products; those are vectorized along the
    contiguous k instead, split_k_tile_n rows of B at a time, one output row per block.

    The search may also unroll the k loop by unroll_k, run only the outer tile loop in parallel (so the inner one
    walks its tiles in one thread, in order) and pack the k x tile_n panel of B the block reads into a local buffer:
    with columns outermost and parallel "outer" it is packed once per column tile and read by every row tile.
    Their fallbacks (no unroll, every tile loop parallel, no packing) build what the template built before them."""
    values = fallback("dense", target)
    partial = next((t.op for t in dense.op.input_tensors if getattr(t.op, "tag", "") == "dense_partial"), None)
    *batch, i, j = output.op.axis
    width = lanes(target, output.op.dtype)
    # the column tile is the largest divisor of whole vectors up to tile_n. A row with none of at least half of it
    # (attention over 77 tokens; 200 columns in 16 lanes) takes the fallback's tile with a guarded last tile, the
    # loop over column tiles partitioned so only that tile tests it: the divisors of 77 gave 7 x 11-lane
    # tiles (vit_tiny's Q K^T, 1 thread: 0.082 ms for 4 heads' groups), and odd_transformer's (1, 77, 200) x
    # (200, 200) took 1.0 ms in wasmtime in 1 x 10-lane tiles (the largest divisors of 77 and 200 up to 4 and 16),
    # 0.185 ms in 7 x 8. The tail is not narrowed to one vector: codegen emits a vector loop wider than a register
    # and no power of two as registers and a remnant (_vector_pieces), so a 28-lane tail of 700 columns costs what
    # its lanes do ((1, 77, 200) x (200, 700), AVX-512, 1 thread: 0.089 ms in 7 x 32, against 0.127 in 7 x 16, the
    # tile that narrowing chose; onnxruntime 0.095). The tile narrows, a vector at a time, only while the block
    # does not fit the registers: on AVX2, 7 x 16 (the 7 rows of 77) spilled ((1, 91, 184) x (184, 604): 0.29 ms
    # against 0.23 in 7 x 8; vit_tiny's (1, 77, 192) x (192, 576) made 30 vector moves (B's 2 loads among them) per 14
    # multiply-adds once LLVM no longer unrolled its k loop by 2)
    # The row tile (_row_tile) is a divisor near tile_m. Where none is, or one above it whose block narrowed to fit
    # the registers holds fewer than FMA_CHAINS accumulators, it is tile_m's balanced tiling with a shorter last
    # tile, that tile's loop partitioned (tile_or_tail): 77 rows on AVX2 take 12 x 6 + 5, where the divisor 7 made
    # 7 x 16 (17 registers), narrowed to 7 x 8 and filled to 11 x 8: (1, 77, 192) x (192, 576) 0.229 -> 0.191 ms,
    # (1, 91, 184) x (184, 604) 0.288 -> 0.237 (onnxruntime 0.209, 0.269). AVX-512's 33 rows keep 11 (11 x 32);
    # wasm keeps its accumulators by narrowing the columns instead (keep_accumulators)
    tile_n = values["tile_n"]
    tile_m = _row_tile(i.extent, values["tile_m"])
    above = tile_m is not None and tile_m > values["tile_m"]
    if above and values["keep_accumulators"]:
        tile_n = max(width, values["tile_m"] * tile_n // tile_m // width * width)
    elif tile_m is None or (above and tile_m * _fitting_vectors(target, tile_m, tile_n, width) < FMA_CHAINS):
        tile_m = tile_or_tail(i.extent, values["tile_m"])
    ragged = partial is None and _ragged(j.extent, tile_n, width)
    if partial is None:
        tile_n = min(tile_n, _fitting_vectors(target, tile_m, tile_n, width) * width)
    if not ragged:
        tile_n = _vector_divisor(j.extent, tile_n, width) or tile_n
    if partial is None:
        most = values["tile_m"] * -(-values["tile_n"] // width)
        filled = _fill_block(target, i.extent, tile_m, -(-tile_n // width), most)
        # the rows' divisors and the fallback's tile (a balanced tiling's, when no divisor suits)
        cfg.define_split("tile_m", i, policy=sorted({*divisors(i.extent), tile_m}), default=filled)
        cfg.define_split("tile_n", j, policy=_ragged_tiles(j.extent, width) if ragged else "factors", default=tile_n)
        # a filled block's rows stay a loop: unrolled, LLVM interleaved two k steps of an 11 x 8 block and spilled
        cfg.define_knob("unroll_m", [0, 1], default=0 if filled > tile_m else values["unroll_m"])
        _limit_registers(cfg, target, output.op.dtype, ("tile_m",), "tile_n")
        i_outer, i_inner = cfg["tile_m"].apply(schedule, output, i)
        j_outer, j_inner = cfg["tile_n"].apply(schedule, output, j)
    else:
        cfg.define_split("split_k_tile_n", j, default=values["split_k_tile_n"])
        _limit_registers(cfg, target, output.op.dtype, ("split_k_tile_n",), partial.axis[-1].extent)
        i_outer, i_inner = output.split(i, 1)
        j_outer, j_inner = cfg["split_k_tile_n"].apply(schedule, output, j)
    cfg.define_reorder("tile_order", [i_outer, j_outer], default=values["tile_order"])
    tiles = cfg["tile_order"].permute([i_outer, j_outer])
    output.reorder(*batch, *tiles, i_inner, j_inner)
    parallel = default_parallel = "tiles"
    if partial is None:
        # "outer" makes the outer tile loop the tasks: a fallback takes it only with tasks enough for the threads
        outer_tasks = math.prod(axis.extent for axis in batch) * tiles[0].extent
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


# the fewest tasks a dense fallback's outer tile loop runs in parallel alone ("parallel" "outer"): two threads' share
# within an eighth of each other
OUTER_TASKS = 8


def _dense_packed(schedule: Schedule, dense: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """A MatMulPacked group (compiler/ops/nn.py, matmul_packed): a register block of tile_m rows by one panel of B,
    made over the whole k and copied out through the group's epilogue. B's panels were packed at compile time, so the
    block reads its panel at unit stride (whatever N is) and A's rows one broadcast element at a time. A last row tile
    shorter than tile_m, and a last panel past N, are pieces of their own (partitioned), so the other tiles test
    nothing. The search may change the rows, the k loop's unrolling, the order of the tile loops and which of them run
    in parallel; the panel is a layout decision, made by alter_layout."""
    values = fallback(PACKED_DENSE_TAG, target)
    (k,) = dense.op.reduce_axis
    loads = [node for node in walk(dense.op.body) if isinstance(node, TensorLoad)]
    panel = next(node.tensor for node in loads if len(node.indices) == 3 and node.indices[1] is k).shape[-1]
    # the rows are A's last axis before K of more than one element: a sequence-first projection ((tokens, 1, K), as
    # torch's MultiheadAttention exports it) tiles its tokens, not its single-row matrices
    *lead, j = output.op.axis
    row = max((position for position, axis in enumerate(lead) if axis.extent > 1), default=len(lead) - 1)
    i, batch = lead[row], [axis for position, axis in enumerate(lead) if position != row]
    vectors = -(-panel // lanes(target, output.op.dtype))
    most = max(size for size in range(1, i.extent + 1) if size == 1 or _dense_fits_registers(target, size, vectors))
    default = tile_or_tail(i.extent, min(values["tile_m"], most), least=1.0)
    cfg.define_split("tile_m", i, policy=list(range(1, most + 1)), default=default)
    cfg.define_knob("unroll_m", [0, 1], default=values["unroll_m"])
    i_outer, i_inner = cfg["tile_m"].apply(schedule, output, i)
    j_outer, j_inner = output.split(j, panel)
    cfg.define_reorder("tile_order", [i_outer, j_outer], default=values["tile_order"])
    tiles = cfg["tile_order"].permute([i_outer, j_outer])
    output.reorder(*batch, *tiles, i_inner, j_inner)
    cfg.define_knob("parallel", ["tiles", "outer"], default=values["parallel"])
    if cfg["parallel"].val == "tiles":
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
    dense.set_scope("local")
    dense.compute_at(output, fused)
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


WINOGRAD_GEMM = "winograd_gemm"
ATTENTION_TAG = "attention"


def _winograd(schedule: Schedule, target: Target, cfg: ConfigSpace) -> None:
    """A ConvWinogradNCHWc group (compiler/ops/nn.py, conv_winograd). Its padded input is copied by rows
    (read in place, each of a tile's loads kept its padding's select: 32 -> 32 channels on 64 x 64, F(4, 3), 1
    thread, 0.94 ms against 0.58 with the copy). The input transform runs parallel over (tile, channel block), a
    vector over the block. The matmuls are the dense template's (and its knobs), batched over the points. The output
    transform is inlined into the group's outputs, parallel over their rows of tiles, a vector over the filter
    block. The loops over a tile's points and over its output positions are partitioned: cut into one piece per
    value, in which each select on them is decided, so each value is its own few adds."""
    by_tag = {stage.op.tag: stage for stage in schedule.stages if isinstance(stage.op, ComputeOp)}
    transform, gemm = by_tag["winograd_input"], by_tag[WINOGRAD_GEMM]
    pad = _padding_stage(schedule, transform.op.output(0))
    for stage in schedule.stages:
        op = stage.op
        kept = stage is transform or op is pad
        if isinstance(op, ComputeOp) and not op.reduce_axis and not stage.is_output and not kept:
            stage.compute_inline()
    if pad is not None:
        _schedule_rows(schedule[pad], target)
    point, position, channel = transform.op.axis
    block = next(t for t in transform.op.input_tensors if len(t.shape) == 5).shape[-1]
    outer, inner = transform.split(channel, block)
    transform.reorder(position, outer, point, inner)
    transform.partition(point)
    transform.vectorize(inner)
    transform.parallel(transform.fuse(position, outer))
    local = schedule.cache_write(gemm.op.output(0), "local")
    _dense(schedule, schedule[local], gemm, target, cfg)
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


def _attention(schedule: Schedule, target: Target, cfg: ConfigSpace) -> None:
    """An Attention group (compiler/ops/nn.py, attention): parallel over (batch, tiles of tile_m query rows). Per task,
    in local buffers: the tile's scores against every key, tile_n keys at a time in registers over the head's depth
    (the dense template's block); their row maxima, exponentials and row sums (vectors of partials, as a softmax's);
    then the output, tile_d columns at a time in registers over the keys, divided by the row's sum as it is stored.
    A shorter last row, key or column tile is a piece of its own."""
    values = fallback(ATTENTION_TAG, target)
    by_tag = {stage.op.tag: stage for stage in schedule.stages if isinstance(stage.op, ComputeOp)}
    (output,) = (stage for stage in schedule.stages if stage.is_output)
    block, scores, largest = by_tag[ATTENTION_TAG], by_tag["attention_scores"], by_tag["attention_max"]
    exponentials, total = by_tag["attention_exp"], by_tag["attention_sum"]
    partials = [_factor_row(schedule, stage, target, cfg) for stage in (largest, total)]
    width = lanes(target, output.op.dtype)
    *batch, i, d = output.op.axis
    columns = scores.op.axis[-1]
    rows = tile_or_tail(i.extent, values["tile_m"], least=1.0)
    cfg.define_split("tile_m", i, policy=list(range(1, min(i.extent, 16) + 1)), default=rows)
    keys = _ragged_tiles(columns.extent, width)
    cfg.define_split("tile_n", columns, policy=keys, default=max(size for size in keys if size <= values["tile_n"]))
    depths = _ragged_tiles(d.extent, width)
    cfg.define_split("tile_d", d, policy=depths, default=max(size for size in depths if size <= values["tile_d"]))
    _limit_registers(cfg, target, output.op.dtype, ("tile_m",), "tile_n")
    _limit_registers(cfg, target, output.op.dtype, ("tile_m",), "tile_d")
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
        _schedule_partials(lanes_stage, reduction, reduction.op.axis[-1])
    *_, score_rows, score_columns = scores.op.axis
    (k,) = scores.op.reduce_axis
    keys_outer, keys_inner = cfg["tile_n"].apply(schedule, scores, score_columns)
    scores.reorder(keys_outer, k, score_rows, keys_inner)
    scores.unroll(score_rows)
    scores.vectorize(keys_inner)
    if columns.extent % cfg["tile_n"].size[-1]:
        scores.partition(keys_outer)
    _vectorize_row(exponentials, width)
    block.set_scope("local")
    block.compute_at(output, d_outer)
    *_, block_rows, block_columns = block.op.axis
    (n,) = block.op.reduce_axis
    block.reorder(n, block_rows, block_columns)
    block.unroll(block_rows)
    block.vectorize(block_columns)


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


def _vector_divisor(extent: int, limit: int, width: int) -> int:
    """The largest divisor of `extent` that is whole vectors of `width` lanes and not above `limit`; 0 if none."""
    return next((size for size in range(limit - limit % width, 0, -width) if extent % size == 0), 0)


def _ragged(extent: int, limit: int, width: int) -> bool:
    """Whether a vectorized row of `extent` has no divisor of whole vectors up to `limit` and at least half of it
    (66 columns in 4 or 16 lanes; 200 in 16), so that a tile dividing it would be a vector and a remnant (11 lanes)."""
    return extent > width and 2 * _vector_divisor(extent, limit, width) < min(limit, extent)


def _define_row_tile(cfg: ConfigSpace, name: str, axis, limit: int, width: int) -> None:
    """A split of a vectorized row into tiles of at most `limit` lanes: its divisors, the largest of whole vectors
    the fallback; a ragged row takes tiles of 1-4 whole vectors instead, the last one shorter, in its own piece
    (`_partition_tail`). odd_convnet's 3-group dilated conv on 49 x 66 (1 thread) took 1.0 ms in 5 x 11-lane
    tiles, 0.56 ms in 5 x 16 and a tail of 2."""
    if not _ragged(axis.extent, limit, width):
        cfg.define_split(name, axis, default=_vector_divisor(axis.extent, limit, width) or limit)
        return
    vectors = [width * count for count in range(1, 5) if width * count <= axis.extent]
    cfg.define_split(name, axis, policy=vectors, default=max(width, limit - limit % width))


def _partition_tail(stage: Stage, outer, extent: int, tile: int) -> None:
    """Partition the loop over the tiles of a row when its last tile is shorter, so only that one tests its bound."""
    if extent % tile:
        stage.partition(outer)


# the independent accumulators that keep two FMA ports busy through a multiply-add's 4-cycle latency
FMA_CHAINS = 8


def _fill_block(target: Target, rows: int, tile_m: int, vectors: int, most: int) -> int:
    """The block's rows once its column tile is `vectors` wide. A block of fewer than FMA_CHAINS accumulators waits
    on each multiply-add before the next: narrow columns (8 of 520 in AVX2: 3 x 8, the rows of 33 by at most 6) or a
    tile narrowed to fit (77 x 200: 7 x 8, where 7 x 16 spills) then take the largest divisor of `rows` that keeps
    the block within the fallback's accumulators (`most`) and the registers. (33, 100) x (100, 520), AVX2, 1 thread:
    3 x 8 0.096 ms (0.103 rolled), 11 x 8 0.076 unrolled and 0.058 rolled. Measured back to back: with a 50 ms
    pause before each run at 2 threads the gain did not hold (docs/benchmarks.md, "MatMuls on an AVX2 host")."""
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


def _ragged_tiles(extent: int, width: int) -> list[int]:
    """A ragged row's column tiles: powers of two and the first multiples of the vector width (3 vectors of 16 take
    48 of 200 columns, 4 tiles and a tail of 8), each with a guarded last tile."""
    powers = {1 << shift for shift in range(extent.bit_length()) if 1 << shift <= extent}
    return sorted(powers | {width * count for count in range(1, 5) if width * count <= extent})


def _pack_panel(schedule: Schedule, dense: Stage, loop, output: Stage) -> None:
    """Copy the k x tile_n panel of B that the register block reads into a contiguous local buffer, made inside
    `loop` (one copy per iteration of it): the block then reads B at unit stride, whatever B's row length (a
    power-of-two row maps every k of a strip to the same few cache sets)."""
    (k,) = dense.op.reduce_axis
    loads = [node for node in walk(dense.op.body) if isinstance(node, TensorLoad)]
    reads_b = [
        node.tensor
        for node in loads
        if any(_uses(index, k) for index in node.indices[-2:-1]) and _uses(node.indices[-1], dense.op.axis[-1])
    ]
    if not reads_b:
        return
    panel = schedule.cache_read(reads_b[0], "local", [dense.op.output(0)])
    stage = schedule[panel]
    stage.compute_at(output, loop)
    # one vector loop over the panel's columns (the block's tile_n, a ragged row's shorter last tile): a split by a
    # factor of B's whole row (7 of 21 columns) cut an 8-column panel into guarded pieces
    stage.vectorize(stage.op.axis[-1])


def _uses(expr, var) -> bool:
    return any(node is var for node in walk(expr))


def _pool(schedule: Schedule, pool: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    (_pool_nchwc if len(output.op.axis) == 5 else _pool_nchw)(schedule, pool, output, target, cfg)


def _pool_nchw(schedule: Schedule, pool: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """NCHW max or average pool: each task owns (batch, channel, output row), and makes the padded input rows the
    row's windows read right before them, in cache, their interior column vectors cut from the clamped borders.
    Per tile of tile_ow output columns (whole vectors; the last, shorter tile in its own partitioned piece) the
    taps are unrolled around the tile held in registers; strided taps read their columns as contiguous runs
    (codegen's strided loads). The generic reduction schedule gathered every stride-2 tap column by column and
    tested the padding in each: (1, 64, 111, 111) 3x3 stride 2 ceil_mode, 0.48 ms, onnxruntime 0.106."""
    n, c, oh, ow = output.op.axis
    width = lanes(target, output.op.dtype)
    vectors = [width * count for count in range(1, 5) if width * count <= ow.extent] or [ow.extent]
    cfg.define_split("tile_ow", ow, policy=vectors, default=width * fallback("pool_nchw", target)["tile_vectors"])
    _limit_registers(cfg, target, output.op.dtype, (1,), "tile_ow")
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
    pad = _padding_stage(schedule, pool.op.output(0))
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
    _limit_registers(cfg, target, output.op.dtype, ("tile_ow",), inner.extent)
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


def _transposed_conv_nchwc(schedule: Schedule, conv: Stage, output: Stage, target: Target, cfg: ConfigSpace) -> None:
    """NCHW[x]c ConvTranspose: each task owns (batch, filter block, output row); per tile of tile_ow output columns
    the input channels and the taps of each column's phase are the outer loops and the tile's columns, each a
    vector over the filter block, are held in registers, so one broadcast input value and one weight vector feed
    each multiply-add. The generic reduction schedule kept one vector of accumulators per output position: a chain
    of C dependent multiply-adds (unet_small's 64 -> 32 2x2 stride-2 upsampling at 24 x 24: 0.11 ms)."""
    n, outer, oh, ow, inner = output.op.axis
    cfg.define_split("tile_ow", ow, default=fallback(TRANSPOSED_TAG, target)["tile_ow"])
    _limit_registers(cfg, target, output.op.dtype, ("tile_ow",), inner.extent)
    ow_outer, ow_inner = cfg["tile_ow"].apply(schedule, output, ow)
    output.reorder(n, outer, oh, ow_outer, ow_inner, inner)
    output.parallel(output.fuse(n, outer, oh))
    output.vectorize(inner)
    conv.set_scope("local")
    conv.compute_at(output, ow_outer)
    cn, couter, coh, cow, cinner = conv.op.axis
    conv.reorder(cn, couter, coh, *conv.op.reduce_axis, cow, cinner)
    conv.unroll(cow)
    conv.vectorize(cinner)


TEMPLATES = {
    "conv2d": _conv2d,
    "conv1d": _conv1d,
    "depthwise_conv2d": _depthwise_conv2d,
    "conv2d_nchwc": _conv_nchwc,
    "depthwise_conv2d_nchwc": _conv_nchwc,
    "dense": _dense,
    PACKED_DENSE_TAG: _dense_packed,
    "pool_max": _pool,
    "pool_avg": _pool,
    TRANSPOSED_TAG: _transposed_conv_nchwc,
}

__all__ = [
    "DEFAULTS",
    "SPACE_VERSION",
    "TEMPLATES",
    "VECTOR_DEFAULTS",
    "divisor_at_most",
    "fallback",
    "lanes",
    "schedule_group",
    "vector_factor",
    "vector_registers",
]
