"""Register tiles and vector splits: what every CPU template sizes its loops with (the target's vector registers
and lanes, divisor and balanced tilings, ragged rows, a row's vector loop)."""

from __future__ import annotations

import math

from compiler.schedules.space import ConfigSpace, divisors
from compiler.target import Target
from compiler.te.schedule import Stage
from compiler.te.tensor import walk


def vector_registers(target: Target) -> int:
    """The vector registers a register tile may fill: 32 on AVX-512 and AArch64, 16 on AVX2, SSE and ARMv7 NEON.
    Wasm runs on its engine's registers, unknown when compiling (16 in wasmtime on x86-64), and its blocked-conv
    default, 2 x 8 columns of two vectors, won in wasmtime with 32 accumulators: it takes 32, the most a host has."""
    if target.kind == "wasm" or target.vector_bytes == 64 or target.arch in ("aarch64", "arm64"):
        return 32
    return 16


def limit_registers(cfg: ConfigSpace, target: Target, dtype: str, rows: tuple, columns) -> None:
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


def vectorize_row(stage: Stage, width: int) -> None:
    """A row's innermost axis in whole vectors of `width` lanes and, when they do not divide it, a shorter last one
    in its own partitioned piece: a softmax over 77 scores ran in vectors of 11 lanes (its divisor), each exp a
    16-lane polynomial for 11 of them. Rows shorter than a vector keep `vectorize_innermost`'s divisor."""
    last = stage.op.axis[-1]
    if last.extent <= width or last.extent % width == 0 or vector_factor(last.extent, width) == width:
        vectorize_innermost(stage, width)
        return
    outer, inner = stage.split(last, width)
    stage.vectorize(inner)
    stage.partition(outer)


def vectorize_innermost(stage: Stage, width: int):
    """Split the stage's innermost axis by a vector factor of `width` lanes (when one divides it) and vectorize the
    inner part; the axis left outside (the whole axis when none divides)."""
    last = stage.op.axis[-1]
    factor = vector_factor(last.extent, width) if last.extent > 1 else 1
    if factor <= 1:
        return last
    outer, inner = stage.split(last, factor)
    stage.vectorize(inner)
    return outer


def vector_divisor(extent: int, limit: int, width: int) -> int:
    """The largest divisor of `extent` that is whole vectors of `width` lanes and not above `limit`; 0 if none."""
    return next((size for size in range(limit - limit % width, 0, -width) if extent % size == 0), 0)


def is_ragged(extent: int, limit: int, width: int) -> bool:
    """Whether a vectorized row of `extent` has no divisor of whole vectors up to `limit` and at least half of it
    (66 columns in 4 or 16 lanes; 200 in 16), so that a tile dividing it would be a vector and a remnant (11 lanes)."""
    return extent > width and 2 * vector_divisor(extent, limit, width) < min(limit, extent)


def define_row_tile(cfg: ConfigSpace, name: str, axis, limit: int, width: int) -> None:
    """A split of a vectorized row into tiles of at most `limit` lanes: its divisors, the largest of whole vectors
    the fallback; a ragged row takes tiles of 1-4 whole vectors instead, the last one shorter, in its own piece
    (`partition_tail`), which beat the divisors' narrow tiles (docs/benchmarks.md, "Template measurements")."""
    if not is_ragged(axis.extent, limit, width):
        cfg.define_split(name, axis, default=vector_divisor(axis.extent, limit, width) or limit)
        return
    vectors = [width * count for count in range(1, 5) if width * count <= axis.extent]
    cfg.define_split(name, axis, policy=vectors, default=max(width, limit - limit % width))


def partition_tail(stage: Stage, outer, extent: int, tile: int) -> None:
    """Partition the loop over the tiles of a row when its last tile is shorter, so only that one tests its bound."""
    if extent % tile:
        stage.partition(outer)


def ragged_tiles(extent: int, width: int) -> list[int]:
    """A ragged row's column tiles: powers of two and the first multiples of the vector width (3 vectors of 16 take
    48 of 200 columns, 4 tiles and a tail of 8), each with a guarded last tile."""
    extent = int(extent)  # (a symbolic size at its largest, while a template plans)
    powers = {1 << shift for shift in range(extent.bit_length()) if 1 << shift <= extent}
    return sorted(powers | {width * count for count in range(1, 5) if width * count <= extent})


def mentions(expr, var) -> bool:
    return any(node is var for node in walk(expr))
