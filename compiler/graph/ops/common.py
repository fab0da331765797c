"""Shape helpers shared by the op families in `compiler/graph/ops/`: numpy-style broadcasting and axis
normalisation, raising ShapeError so a bad model is reported by node rather than by a numpy traceback."""

from __future__ import annotations

from collections.abc import Iterable

from compiler.errors import ShapeError
from compiler.graph.sym import Sym


def broadcast_shapes(*shapes: Iterable[int]) -> tuple[int, ...]:
    """The multidirectional (numpy) broadcast of `shapes`; ShapeError when two dimensions disagree."""
    shapes = [tuple(d if isinstance(d, Sym) else int(d) for d in shape) for shape in shapes]
    rank = max((len(shape) for shape in shapes), default=0)
    result = []
    for position in range(rank):
        dims = {shape[position - rank + len(shape)] for shape in shapes if position - rank + len(shape) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            listed = " and ".join(str(list(shape)) for shape in shapes)
            raise ShapeError(f"shapes {listed} do not broadcast: give inputs whose dimensions agree or are 1")
        result.append(dims.pop() if dims else 1)
    return tuple(result)


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    """`axis` in [-rank, rank) as a non-negative index; ShapeError naming `what` when out of range."""
    axis = int(axis)
    if not -rank <= axis < rank:
        raise ShapeError(f"{what} {axis} is out of range for a tensor of rank {rank}; use a value in [{-rank}, {rank})")
    return axis + rank if axis < 0 else axis


def normalize_axes(axes: Iterable[int], rank: int) -> tuple[int, ...]:
    """Each axis normalised as `normalize_axis` does, in the given order; ShapeError on a repeated axis."""
    axes = tuple(axes)
    result = tuple(normalize_axis(axis, rank, "axis") for axis in axes)
    if len(set(result)) != len(result):
        raise ShapeError(f"axes {list(axes)} name the same axis twice for a tensor of rank {rank}")
    return result
