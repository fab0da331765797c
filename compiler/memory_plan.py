"""The static memory plan of a compiled model: every intermediate value (one written by a kernel and
read by later kernels) gets a byte offset in one arena. build.py hands it the values' sizes and
lifetimes (kernel steps) and writes the offsets into the `run` entry's kernel calls."""

from __future__ import annotations

from dataclasses import dataclass

ALIGNMENT = 64


def align(size: int, alignment: int = ALIGNMENT) -> int:
    return (size + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class Lifetime:
    """A value of `size` bytes written at step `first` and last read at step `last` (inclusive)."""

    name: str
    size: int
    first: int
    last: int

    def overlaps(self, other: Lifetime) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class MemoryPlan:
    """`offsets[name]` is each value's place in an arena of `arena_bytes`; `total_bytes` is what the
    values would take with no reuse (each aligned), the number the plan is measured against."""

    offsets: dict[str, int]
    arena_bytes: int
    total_bytes: int


def plan_memory(lifetimes: list[Lifetime], alignment: int = ALIGNMENT) -> MemoryPlan:
    """Greedy by size, largest value first: each value goes to the lowest aligned offset whose range is
    free of every already placed value alive at the same time, so values that never coexist reuse bytes."""
    names = [lifetime.name for lifetime in lifetimes]
    if len(set(names)) != len(names):
        raise ValueError("every value of a memory plan needs a distinct name")
    placed: list[tuple[Lifetime, int]] = []
    offsets: dict[str, int] = {}
    # the placed values alive at each step, so a value is compared only with those it may coexist with: comparing
    # it with every placed one grew with the square of the number of values
    alive: dict[int, list[int]] = {}
    for lifetime in sorted(lifetimes, key=lambda item: (-item.size, item.first, item.name)):
        size = align(max(lifetime.size, 1), alignment)
        steps = range(lifetime.first, lifetime.last + 1)
        neighbours = {index for step in steps for index in alive.get(step, ())}
        busy = sorted(
            (offset, offset + align(max(other.size, 1), alignment))
            for other, offset in map(placed.__getitem__, neighbours)
        )
        offset = 0
        for start, end in busy:
            if offset + size <= start:
                break
            offset = max(offset, end)
        offsets[lifetime.name] = offset
        for step in steps:
            alive.setdefault(step, []).append(len(placed))
        placed.append((lifetime, offset))
    arena = max((offset + align(max(item.size, 1), alignment) for item, offset in placed), default=0)
    total = sum(align(max(item.size, 1), alignment) for item in lifetimes)
    return MemoryPlan({name: offsets[name] for name in names}, arena, total)
