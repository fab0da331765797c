"""The input checks the nn family's shape rules share: how many inputs an op takes, which must be float, how
many outputs it makes, and the dtype it accumulates in."""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.errors import ShapeError, UnsupportedOpError
from compiler.graph.ir import TensorType

FLOAT_DTYPES = ("float16", "float32", "float64")


def op_inputs(op: str, types: list[TensorType | None], required: int, total: int) -> list[TensorType | None]:
    """`types` padded with None to `total`; ShapeError when one of the first `required` is missing."""
    if len(types) > total:
        raise ShapeError(f"{op} takes at most {total} inputs, got {len(types)}")
    types = list(types) + [None] * (total - len(types))
    for index in range(required):
        if types[index] is None:
            raise ShapeError(f"{op} needs input {index}; give the node at least {required} inputs")
    return types


def float_input(op: str, value: TensorType, what: str = "input") -> None:
    if value.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"{op} {what} has dtype {value.dtype}; it needs one of {', '.join(FLOAT_DTYPES)}")


def output_count(attrs: dict[str, Any]) -> int:
    return int(attrs.get("_outputs", 1))


def single_output(op: str, attrs: dict[str, Any]) -> None:
    if output_count(attrs) > 1:
        raise UnsupportedOpError(
            f"{op} with {output_count(attrs)} outputs is not supported (only its first output is); "
            "remove the extra outputs from the node",
            {op: []},
        )


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """float16 math loses too much in float16 itself, so it runs in float32 and is cast back."""
    return np.dtype(np.float32) if dtype == np.float16 else np.dtype(dtype)
