"""Tuning tasks: what a fused group's kernel is tuned, and its records looked up, as. A task's key is the template that
schedules the group, its whole workload (every member op with its attributes and wiring, every input and output
shape and dtype, so the fused epilogue too), the target with its CPU features, and the templates' space version.
It sits beside the drivers: it reads the fused graph, builds TE (ops/) and runs the schedule templates."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from compiler.frontend.onnx import load_onnx
from compiler.graph.ir import Graph, Node
from compiler.ops import group_to_te
from compiler.passes.pipeline import optimize
from compiler.schedules import family
from compiler.target import Target
from compiler.tune.space import ConfigSpace, run_template

# Attribute arrays up to this many elements are written out in a task's workload; larger ones by their digest.
LISTED_ELEMENTS = 64


def _attr_json(value):
    """An attribute as JSON that tells apart every value that can change a kernel (a scalar's dtype too)."""
    if isinstance(value, np.ndarray):
        described = {"dtype": str(value.dtype), "shape": list(value.shape)}
        if value.size <= LISTED_ELEMENTS:
            return {**described, "values": value.ravel().tolist()}
        return {**described, "sha256": hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()}
    if isinstance(value, np.generic):
        return {"dtype": str(value.dtype), "value": value.item()}
    if isinstance(value, dict):
        return {str(key): _attr_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_attr_json(item) for item in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def workload(node: Node) -> dict:
    """A fused node's whole computation: its inputs' types; each member's op, attributes, inputs (positions among
    the group's inputs and the members' outputs) and output types; which values are the group's outputs."""
    body = node.attrs["body"]
    position = {value: index for index, value in enumerate(body.inputs)}
    members = []
    for member in body.nodes:
        for value in member.outputs:
            position.setdefault(value, len(position))
        members.append(
            {
                "op": member.op,
                "attrs": _attr_json(member.attrs),
                "inputs": [None if value is None else position[value] for value in member.inputs],
                "outputs": [[list(value.type.shape), value.type.dtype] for value in member.outputs],
            }
        )
    return {
        "inputs": [[list(value.type.shape), value.type.dtype] for value in body.inputs],
        "ops": members,
        "outputs": [position[value] for value in body.outputs],
    }


def target_json(target: Target) -> dict:
    """The machine a record was measured for: the same features under another spelling are the same target."""
    return {"kind": target.kind, "triple": target.triple, "cpu": target.cpu, "features": sorted(target.feature_set)}


def canonical(task: dict) -> str:
    """The text records are looked up by: the task's JSON with sorted keys."""
    return json.dumps(task, sort_keys=True, separators=(",", ":"))


@dataclass
class Task:
    """One tuning task; `weight` counts the model's groups that run its kernel, `node` is one of them and `space`
    the space its template declared."""

    template: str
    workload: dict
    target: Target
    space: ConfigSpace = field(repr=False, compare=False)
    node: Node = field(repr=False, compare=False)
    weight: int = 1

    def to_json(self) -> dict:
        return {
            "template": self.template,
            "workload": self.workload,
            "target": target_json(self.target),
            "space_version": family(self.target).SPACE_VERSION,
        }

    @property
    def key(self) -> str:
        return canonical(self.to_json())

    @property
    def ops(self) -> list[str]:
        return [member["op"] for member in self.workload["ops"]]


def _fallback(node: Node, target: Target):
    """The group's TE, its fallback schedule and the cfg its template declared."""
    group = group_to_te(node)
    cfg = ConfigSpace()
    return group, family(target).schedule_group(group, target, cfg), cfg


def task_of(node: Node, target: Target | str) -> Task:
    """The task of one fused node (its template is found by running it, which also collects its space)."""
    target = Target.parse(target)
    _, _, cfg = _fallback(node, target)
    return Task(cfg.template, workload(node), target, cfg, node)


def schedule_node(node: Node, target: Target, records: dict[str, dict] | None = None):
    """(group TE, schedule, cfg) of a fused node: built with the config `records` (task key -> knob values) holds
    for its task, else (or when that config no longer fits the template, with a TuningWarning) the fallback."""
    group, schedule, cfg = _fallback(node, target)
    values = records.get(Task(cfg.template, workload(node), target, cfg, node).key) if records else None
    if values is None:
        return group, schedule, cfg
    schedule, cfg = run_template(partial(family(target).schedule_group, group, target), values)
    return group, schedule, cfg


def extract_tasks(model, target: Target | str = "llvm", input_shapes: dict | None = None) -> list[Task]:
    """The unique tasks of a model (a path, ONNX bytes, a ModelProto or an imported Graph), in the order their first
    group runs, each weighted by how many of its fused groups share it."""
    target = Target.parse(target)
    graph = model if isinstance(model, Graph) else load_onnx(model, input_shapes)
    # for one target the workload decides the template, so a workload seen before is the same task
    tasks: dict[str, Task] = {}
    for node in optimize(graph, fuse=True, target=target).nodes:
        computation = canonical(workload(node))
        if computation in tasks:
            tasks[computation].weight += 1
        else:
            tasks[computation] = task_of(node, target)
    return list(tasks.values())
