"""Tensor-expression computes of every registered op, attached to the op registry on import (one module per op family,
named as in compiler/graph/ops/), the tags they give their stages (tags.py), and the translation of a fused group into
tensor expressions that the schedules (compiler/schedules/) take."""

from compiler.compute import conv, dense, elementwise, norm, pool, quantize, reduce, resize, transform
from compiler.compute.group import PLAN_LARGEST, PLAN_SMALLEST, GroupTE, group_to_te, planning_sizes

__all__ = [
    "GroupTE",
    "conv",
    "dense",
    "elementwise",
    "group_to_te",
    "PLAN_LARGEST",
    "PLAN_SMALLEST",
    "planning_sizes",
    "norm",
    "pool",
    "quantize",
    "reduce",
    "resize",
    "transform",
]
