"""Fused group → tensor expressions: the kernel stage's entry point for one node of the fused graph.

It walks the group's body graph in order, calling each member op's registered compute on the tensors
made so far, and hands the schedules (compiler/schedules/) a GroupTE: placeholders, outputs, anchor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from compiler import te
from compiler.errors import UnsupportedOpError
from compiler.graph.ir import Node
from compiler.graph.registry import Pattern, get_op
from compiler.graph.sym import LARGEST, SMALLEST, Sym, planning, set_expr_converter
from compiler.te.tensor import ComputeOp


@dataclass
class GroupTE:
    name: str
    inputs: list[te.Tensor]
    outputs: list[te.Tensor]
    anchor: te.Tensor | None
    anchor_op: str
    pattern: str
    stages: list[te.Tensor]


def _symbol(name: str) -> str:
    """A value name as a kernel symbol: ONNX names may hold any character."""
    cleaned = re.sub(r"\W", "_", name)
    return cleaned if cleaned and not cleaned[0].isdigit() else f"v_{cleaned}"


_SIZE_VARS: dict[tuple[str, int, int], te.SizeVar] = {}


def size_expr(sym: Sym) -> te.Expr:
    """A Sym as a tensor expression over size vars, one var per size name and range (shared by every kernel: each
    kernel binds the vars it uses from its sizes argument, tir/lower.py)."""
    total = None
    for monomial, coef in sorted(sym.terms.items()):
        term = None
        for name in monomial:
            key = (name, *sym.ranges[name])
            var = _SIZE_VARS.setdefault(key, te.size_var(*key))
            term = var if term is None else term * var
        term = te.const(coef, "int32") if term is None else term if coef == 1 else term * coef
        total = term if total is None else total + term
    return total


set_expr_converter(size_expr)

# for the schedules (which see TE, not the graph): symbolic extents answered as ints while a template chooses, at
# their largest (LARGEST) or smallest (SMALLEST) values
planning_sizes = planning
PLAN_LARGEST, PLAN_SMALLEST = LARGEST, SMALLEST


def group_to_te(node: Node) -> GroupTE:
    """The tensor expressions of a "fused" node; placeholders and outputs follow node.inputs/outputs. A symbolic
    dimension stays a Sym in the TE shapes; it becomes size vars where a loop or an index uses it (size_expr)."""
    body = node.attrs["body"]
    pattern = Pattern[node.attrs["pattern"]]
    names: list[str] = []
    for value in node.inputs:
        name = _symbol(value.name)
        # two ONNX names may clean up to the same symbol; parameters need distinct ones
        while name in names:
            name += "_"
        names.append(name)
    inputs = [te.placeholder(v.type.shape, v.type.dtype, name=name) for v, name in zip(node.inputs, names, strict=True)]
    tensors = dict(zip(body.inputs, inputs, strict=True))
    anchor = None
    anchor_op = node.attrs.get("anchor", "")
    for member in body.nodes:
        op = get_op(member.op)
        if op.compute is None:
            raise UnsupportedOpError(
                f"op {member.op} has no kernel yet (node {member.name}); it runs in the reference executor only",
                {member.op: [member.name]},
            )
        results = op.compute(
            [tensors[v] if v is not None else None for v in member.inputs],
            member.attrs,
            [v.type for v in member.outputs],
        )
        for value, tensor in zip(member.outputs, results, strict=True):
            if tuple(tensor.shape) != value.type.shape or tensor.dtype != value.type.dtype:
                raise AssertionError(
                    f"compute of {member.op} gave {tensor.dtype}{list(tensor.shape)} for %{value.name}, "
                    f"inference typed it {value.type}"
                )
            tensors[value] = tensor
        if anchor is None and pattern >= Pattern.REDUCE and op.pattern_of(member.attrs) == pattern:
            anchor = results[0]
    outputs = [tensors[v] for v in body.outputs]
    return GroupTE(node.name, inputs, outputs, anchor, anchor_op, pattern.name, _compute_stages(outputs))


def _compute_stages(outputs: list[te.Tensor]) -> list[te.Tensor]:
    """Every compute tensor the outputs depend on, producers before readers."""
    order: list[te.Tensor] = []
    seen: set[int] = set()

    def visit(tensor: te.Tensor) -> None:
        if id(tensor.op) in seen:
            return
        seen.add(id(tensor.op))
        for producer in tensor.op.input_tensors:
            visit(producer)
        if isinstance(tensor.op, ComputeOp):
            order.append(tensor)

    for tensor in outputs:
        visit(tensor)
    return order
