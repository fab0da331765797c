"""Runtimes: load what link.py produced and call kernels on numpy arrays. native.py (ctypes) and
wasm.py (wasmtime) share the argument check below, run before any generated code sees a pointer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.errors import RunError, ShapeError


@dataclass(frozen=True)
class ArgSpec:
    """What one kernel parameter must be: a C-contiguous array of this shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str


def check_args(kernel: str, specs: list[ArgSpec], arrays: tuple) -> None:
    if len(arrays) != len(specs):
        names = ", ".join(spec.name for spec in specs)
        raise ShapeError(f"kernel {kernel!r} takes {len(specs)} arrays ({names}), got {len(arrays)}")
    for position, (spec, array) in enumerate(zip(specs, arrays)):
        where = f"kernel {kernel!r} argument {position} ({spec.name!r})"
        if not isinstance(array, np.ndarray):
            raise ShapeError(f"{where}: expected a numpy array, got {type(array).__name__}")
        if array.dtype != np.dtype(spec.dtype):
            raise ShapeError(f"{where}: expected dtype {spec.dtype}, got {array.dtype}")
        if tuple(array.shape) != tuple(spec.shape):
            raise ShapeError(f"{where}: expected shape {tuple(spec.shape)}, got {tuple(array.shape)}")
        if not array.flags.c_contiguous:
            raise ShapeError(f"{where}: expected a C-contiguous array; pass np.ascontiguousarray(x)")
        if not array.flags.writeable:
            raise ShapeError(f"{where}: the array is read-only; kernels may write any argument, pass a copy")


def check_status(status: int, calls: list[str]) -> None:
    """Raise the failure a run entry returned: the number (from 1) of the kernel call whose index check
    failed, `calls` naming each call's ops and group."""
    if status == 0:
        return
    where = calls[status - 1] if 0 < status <= len(calls) else f"kernel call {status}"
    raise RunError(
        f"an index is out of range in {where}: each index must lie in [-n, n) for an axis of n elements "
        "(onnxruntime refuses it too); check the model's index inputs"
    )


__all__ = ["ArgSpec", "check_args", "check_status"]
