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

from compiler.compute import group_to_te
from compiler.errors import TesselError
from compiler.frontend.onnx import load_onnx
from compiler.graph.ir import Graph, Node, TensorType, Value
from compiler.graph.registry import Pattern, get_op
from compiler.graph.sym import Sym
from compiler.passes.pipeline import optimize
from compiler.schedules import schedule_small_sizes, space_version, templates
from compiler.schedules.space import ConfigSpace, run_template
from compiler.target import Target
from compiler.tir.lower import lower
from compiler.tir.variants import by_smallest_sizes

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
    if isinstance(value, Sym):
        return _dim_json(value)
    return repr(value)


def _dim_json(dim):
    """A dimension as JSON: an int, or a symbolic size's expression with its sizes' ranges."""
    return dim if isinstance(dim, int) else {"size": str(dim), "ranges": {k: list(v) for k, v in dim.ranges.items()}}


def _attr_value(value):
    """The attribute _attr_json wrote (a list for a tuple); raises LookupError for an array kept as its digest."""
    if isinstance(value, list):
        return [_attr_value(item) for item in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"dtype", "value"}:
        return np.dtype(value["dtype"]).type(value["value"])
    if set(value) == {"dtype", "shape", "values"}:
        return np.array(value["values"], dtype=value["dtype"]).reshape(value["shape"])
    if "sha256" in value:
        raise LookupError("an attribute array larger than a workload lists")
    return {key: _attr_value(item) for key, item in value.items()}


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
                "outputs": [[list(map(_dim_json, value.type.shape)), value.type.dtype] for value in member.outputs],
            }
        )
    return {
        "inputs": [[list(map(_dim_json, value.type.shape)), value.type.dtype] for value in body.inputs],
        "ops": members,
        "outputs": [position[value] for value in body.outputs],
    }


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
            "target": self.target.to_json(),
            "space_version": templates(self.target).SPACE_VERSION,
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
    return group, templates(target).schedule_group(group, target, cfg), cfg


def task_of(node: Node, target: Target) -> Task:
    """The task of one fused node (its template is found by running it, which also collects its space)."""
    _, _, cfg = _fallback(node, target)
    return Task(cfg.template, workload(node), target, cfg, node)


def schedule_node(node: Node, target: Target, records: dict[str, dict] | None = None):
    """(group TE, schedule, cfg) of a fused node: built with the config `records` (task key -> knob values) holds
    for its task, else (or when that config no longer fits the template, with a TuningWarning) the fallback."""
    group, schedule, cfg = _fallback(node, target)
    values = records.get(Task(cfg.template, workload(node), target, cfg, node).key) if records else None
    if values is None:
        return group, schedule, cfg
    schedule, cfg = run_template(partial(templates(target).schedule_group, group, target), values)
    return group, schedule, cfg


def lower_node(node: Node, target: Target, records: dict[str, dict] | None, name: str, sizes: list[str]):
    """(kernel, cfg) of a fused node: its schedule (schedule_node) lowered, and for a symbolic group whose template
    plans otherwise for the sizes' smallest values (schedule_small_sizes: a decode step's single row), both lowerings
    in one kernel that picks at run time (tir/variants.py)."""
    group, schedule, cfg = schedule_node(node, target, records)
    arguments = [*group.inputs, *group.outputs]
    func = lower(schedule, arguments, name, sizes)
    small = schedule_small_sizes(group, target, cfg) if sizes else None
    if small is not None:
        func = by_smallest_sizes(func, lower(small[0], arguments, name, sizes))
    return func, cfg


def task_from_json(task: dict) -> Task | None:
    """The task a record names (its `task` field), rebuilt from its workload so that its configs can be lowered
    again (features of other tasks' records, to pretrain a cost model); None when the workload cannot be rebuilt
    (an attribute array kept as its digest, an op or template this compiler lacks, another space version)."""
    try:
        if task["space_version"] != space_version(task["target"]["kind"]):
            return None
        work = task["workload"]
        inputs = [
            Value(f"input{index}", TensorType(tuple(shape), dtype))
            for index, (shape, dtype) in enumerate(work["inputs"])
        ]
        values = list(inputs)
        members = []
        for number, member in enumerate(work["ops"]):
            outputs = [
                Value(f"value{len(values) + k}", TensorType(tuple(shape), dtype))
                for k, (shape, dtype) in enumerate(member["outputs"])
            ]
            operands = [None if position is None else values[position] for position in member["inputs"]]
            members.append(Node(member["op"], operands, outputs, _attr_value(member["attrs"]), f"member{number}"))
            values.extend(outputs)
        pattern = max(get_op(member.op).pattern_of(member.attrs) for member in members)
        anchor = next(member.op for member in members if get_op(member.op).pattern_of(member.attrs) == pattern)
        body = Graph(inputs, [values[position] for position in work["outputs"]], members, {}, "task")
        attrs = {"body": body, "pattern": pattern.name, "anchor": anchor if pattern >= Pattern.REDUCE else ""}
        node = Node(
            "fused",
            [Value(v.name, v.type) for v in inputs],
            [Value(v.name, v.type) for v in body.outputs],
            attrs,
            "task",
        )
        rebuilt = task_of(node, Target.from_json(task["target"]))
    except (LookupError, TypeError, ValueError, TesselError):
        return None
    return rebuilt if rebuilt.key == canonical(task) else None


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
