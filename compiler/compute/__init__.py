"""Tensor-expression computes of every registered op, attached to the op registry on import, and the
translation of a fused group into tensor expressions that the schedules (compiler/schedules/) take."""

from compiler.compute import elementwise, nn, reduce, transform
from compiler.compute.group import GroupTE, group_to_te

__all__ = ["GroupTE", "elementwise", "group_to_te", "nn", "reduce", "transform"]
