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
