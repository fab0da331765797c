"""Features of a candidate schedule for the cost model (cost_model.py): its knob values, and statistics of the loop IR
that config lowers to (tir/lower.py), so that a model trained on some tasks can rank the configs of another.
It sits beside the drivers: it runs a task's template for a config and lowers it, never compiling anything."""

from __future__ import annotations

import math
from collections import OrderedDict
from functools import partial

import numpy as np

from compiler.compute import group_to_te
from compiler.graph.ir import ITEMSIZE
from compiler.schedules import schedule_group
from compiler.schedules.space import Config, OptionSpace, ReorderSpace, SplitSpace, run_template
from compiler.te.expr import Binary, Call, Cast, Compare, Const, Expr, IfThenElse, Logical, Select, Var, is_float
from compiler.te.tensor import walk
from compiler.tir.lower import lower
from compiler.tir.nodes import Allocate, For, ForKind, IfThen, LetStmt, Load, Prefetch, PrimFunc, Stmt, Store
from compiler.tir.simplify import bounds, loop_bounds
from compiler.tir.visitor import StmtVisitor
from compiler.tir.work import expr_operations
from compiler.tune.task import Task

# Loop levels described for each store, innermost first: a register tile, its reduction and the cache tiles above it
LEVELS = 5
KINDS = tuple(ForKind)
# the loop-IR part of a feature vector: the whole function, then LEVELS levels of (extent, kind one-hot, bytes one
# iteration moves the accesses by, bytes touched inside, operations per byte)
FUNCTION_FEATURES = (
    "operations",
    "flops",
    "global_bytes",
    "intensity",
    "code_stores",
    "code_loops",
    "unrolled_copies",
    "parallel_extent",
    "parallel_work",
    "vector_width",
    "vector_fraction",
    "local_bytes",
    "conditional_fraction",
    "contiguous_fraction",
    "strided_fraction",
    "outer_step_bytes",
    "shared_bytes",
    "threads_per_block",
    "blocks",
    "prefetches",
)
LEVEL_FEATURES = ("extent", *(f"kind_{kind.value}" for kind in KINDS), "step_bytes", "bytes", "intensity")
LOOP_FEATURES = FUNCTION_FEATURES + tuple(f"{name}_{level}" for level in range(LEVELS) for name in LEVEL_FEATURES)


def lower_config(task: Task, config: Config | dict | None) -> PrimFunc:
    """The loop IR `task`'s template builds for `config` (a Config or a record's knob values; None: the fallback)."""
    group = group_to_te(task.node)
    schedule, _ = run_template(partial(schedule_group, group, task.target), config)
    return lower(schedule, [*group.inputs, *group.outputs], "kernel")


def knob_features(config: Config) -> list[float]:
    """A config's knob values as numbers, in the space's knob order: a split's inner sizes (log2), an option's
    position (and its value when numeric), a reorder's position among the template's orders."""
    values: list[float] = []
    for name, knob in config.space.knobs.items():
        choice = config.choices[name]
        if isinstance(knob, SplitSpace):
            values.extend(math.log2(size) for size in knob.choices[choice][1:])
        elif isinstance(knob, OptionSpace):
            option = knob.choices[choice]
            numeric = isinstance(option, int | float) and not isinstance(option, bool)
            values.extend((float(choice), float(option) if numeric else 0.0))
        elif isinstance(knob, ReorderSpace):
            values.append(float(choice))
    return values


class _Access:
    """A load or store of a global buffer: its element size, its index and the loop vars that index reads."""

    __slots__ = ("buffer", "itemsize", "index", "vars")

    def __init__(self, buffer, index: Expr):
        self.buffer = buffer
        self.itemsize = ITEMSIZE.get(buffer.dtype, 4)
        self.index = index
        self.vars = {node for node in walk(index) if isinstance(node, Var)}

    def step(self, var: Var) -> int:
        """How far (in elements) the index moves when `var` goes from 0 to 1, every other var at 0: a fused
        loop's floordiv and floormod included, which is how a loop order shows in a fused parallel loop."""
        if var not in self.vars:
            return 0
        return _evaluate(self.index, {var: 1}) - _evaluate(self.index, {})


INTEGER_OPERATIONS = {
    "add": int.__add__,
    "sub": int.__sub__,
    "mul": int.__mul__,
    "floordiv": lambda a, b: a // b if b else 0,
    "div": lambda a, b: int(a / b) if b else 0,
    "floormod": lambda a, b: a % b if b else 0,
    "min": min,
    "max": max,
}


def _evaluate(expr: Expr, values: dict) -> int:
    """An integer index at the given var values (others 0); what it cannot evaluate (a loaded index) counts 0."""
    if isinstance(expr, Const):
        return int(expr.value)
    if isinstance(expr, Var):
        return values.get(expr, 0)
    if isinstance(expr, Binary) and expr.op in INTEGER_OPERATIONS:
        return INTEGER_OPERATIONS[expr.op](_evaluate(expr.a, values), _evaluate(expr.b, values))
    if isinstance(expr, Cast):
        return _evaluate(expr.value, values)
    return 0


def _flops(expr: Expr) -> int:
    """Floating-point operations of one evaluation of `expr`."""
    return sum(
        1
        for node in walk(expr)
        if isinstance(node, Binary | Call) and is_float(node.dtype) and not isinstance(node, Load)
    )


class _Walk(StmtVisitor):
    """One pass over a function: for each store, its loop path and accesses, weighted by how often it runs. The loop
    path, the bounds of the vars in scope and whether a branch guards the statement are the visitor's state."""

    def __init__(self):
        self.stores: list[tuple[float, list[tuple[For, int]], list[_Access], int, int, bool]] = []
        self.code_stores = self.code_loops = 0
        self.prefetches = 0.0
        self.local_bytes = self.shared_bytes = 0
        self.path: list[tuple[For, int]] = []
        self.env: dict = {}
        self.conditional = False

    def _inside(self, body: Stmt, **state) -> None:
        """Visit `body` with some of the state replaced, restoring it after."""
        saved = self.path, self.env, self.conditional
        for name, value in state.items():
            setattr(self, name, value)
        self.visit(body)
        self.path, self.env, self.conditional = saved

    def visit_for(self, stmt: For) -> None:
        self.code_loops += 1
        extent = bounds(stmt.extent, self.env)[1]
        self._inside(
            stmt.body,
            path=[*self.path, (stmt, max(1, extent or 1))],
            env={**self.env, stmt.var: loop_bounds(stmt.min, stmt.extent, self.env)},
        )

    def visit_ifthen(self, stmt: IfThen) -> None:
        self._inside(stmt.then_body, conditional=True)
        if stmt.else_body is not None:
            self._inside(stmt.else_body, conditional=True)

    def visit_letstmt(self, stmt: LetStmt) -> None:
        self._inside(stmt.body, env={**self.env, stmt.var: bounds(stmt.value, self.env)})

    def visit_allocate(self, stmt: Allocate) -> None:
        size = stmt.buffer.size * ITEMSIZE.get(stmt.buffer.dtype, 4)
        if stmt.buffer.scope == "local":
            self.local_bytes += size
        elif stmt.buffer.scope == "shared":
            self.shared_bytes += size
        self.visit(stmt.body)

    def visit_store(self, stmt: Store) -> None:
        self.code_stores += 1
        accesses = [_Access(stmt.buffer, stmt.index)] if stmt.buffer.scope == "global" else []
        selects = False
        for node in walk(stmt.value):
            if isinstance(node, Load) and node.buffer.scope == "global":
                accesses.append(_Access(node.buffer, node.index))
            selects = selects or isinstance(node, Select | IfThenElse | Compare | Logical)
        count = math.prod(extent for _, extent in self.path)
        operations = 1 + expr_operations(stmt.value)
        self.stores.append((count, self.path, accesses, operations, _flops(stmt.value), self.conditional or selects))

    def visit_prefetch(self, stmt: Prefetch) -> None:
        self.prefetches += math.prod(extent for _, extent in self.path)

    def visit_expr(self, expr: Expr) -> None:
        """The walk is over statements: a store's expressions are read by visit_store, no others are descended into."""


def _log(value: float) -> float:
    return math.log2(1.0 + max(0.0, value))


def loop_features(func: PrimFunc) -> list[float]:
    """Statistics of a function's loop IR (LOOP_FEATURES), comparable across tasks: sizes are log2(1 + x), per-level
    values are averages over stores weighted by how often each runs."""
    walker = _Walk()
    walker.visit(func.body)
    total = sum(count for count, *_ in walker.stores) or 1.0
    operations = flops = global_bytes = vector = vector_count = conditional = contiguous = strided = outer_step = 0.0
    copies = 0
    parallel_extent = 1
    threads: list[int] = []
    blocks: list[int] = []
    levels = np.zeros((LEVELS, len(LEVEL_FEATURES)))
    for count, path, accesses, store_operations, store_flops, guarded in walker.stores:
        weight = count / total
        vector_extent = math.prod(extent for loop, extent in path if loop.kind == ForKind.VECTORIZED)
        # a vector loop's iterations are one instruction each
        issued = count / vector_extent
        operations += issued * store_operations
        flops += count * store_flops
        global_bytes += count * sum(access.itemsize for access in accesses)
        if vector_extent > 1:
            vector += weight * vector_extent
            vector_count += weight
        conditional += weight * guarded
        if path and accesses:
            steps = [abs(access.step(path[-1][0].var)) for access in accesses]
            contiguous += weight * sum(step <= 1 for step in steps) / len(steps)
            strided += weight * sum(step > 1 for step in steps) / len(steps)
            outer_step += weight * _log(sum(access.itemsize * abs(access.step(path[0][0].var)) for access in accesses))
        copies += math.prod(extent for loop, extent in path if loop.kind in (ForKind.UNROLLED, ForKind.VECTORIZED))
        for prefix, grid in (("threadIdx", threads), ("blockIdx", blocks)):
            # a loop bound again to a tag its nest already binds (a cooperative copy) runs on the same threads
            extents: dict[str, int] = {}
            for loop, extent in path:
                if (loop.thread_tag or "").startswith(prefix):
                    extents[loop.thread_tag] = max(extent, extents.get(loop.thread_tag, 1))
            grid.append(math.prod(extents.values()))
        parallel = [extent for loop, extent in path if loop.kind == ForKind.PARALLEL]
        if parallel:
            parallel_extent = max(parallel_extent, math.prod(parallel))
        inner_count = 1
        for level, (loop, extent) in enumerate(reversed(path[-LEVELS:])):
            inner_count *= extent
            inside = path[len(path) - level - 1 :]
            touched = sum(
                access.itemsize * math.prod(e for candidate, e in inside if candidate.var in access.vars)
                for access in {(access.buffer, frozenset(access.vars)): access for access in accesses}.values()
            )
            row = levels[level]
            row[0] += weight * math.log2(extent)
            row[1 + KINDS.index(loop.kind)] += weight
            row[-3] += weight * _log(sum(access.itemsize * abs(access.step(loop.var)) for access in accesses))
            row[-2] += weight * _log(touched)
            row[-1] += weight * _log(inner_count * store_flops / max(1, touched))
    parameter_bytes = sum(buffer.size * ITEMSIZE.get(buffer.dtype, 4) for buffer in func.params)
    function = [
        _log(operations),
        _log(flops),
        _log(global_bytes),
        _log(flops / max(1, parameter_bytes)),
        _log(walker.code_stores),
        _log(walker.code_loops),
        _log(copies),
        _log(parallel_extent),
        _log(operations / parallel_extent),
        vector / vector_count if vector_count else 0.0,
        vector_count,
        _log(walker.local_bytes),
        conditional,
        contiguous,
        strided,
        outer_step,
        _log(walker.shared_bytes),
        _log(max(threads, default=1)),
        _log(max(blocks, default=1)),
        _log(walker.prefetches),
    ]
    return function + levels.ravel().tolist()


class Featurizer:
    """The features of a task's configs, each computed once: loop-IR statistics (comparable across tasks, what a
    transferred model reads) followed by the knob values (this task's own)."""

    def __init__(self, task: Task):
        self.task = task
        self._loops: dict[int, np.ndarray] = {}

    def loops(self, config: Config) -> np.ndarray:
        features = self._loops.get(config.index)
        if features is None:
            features = self._loops[config.index] = np.asarray(loop_features(lower_config(self.task, config)))
        return features

    def __call__(self, configs: list[Config]) -> np.ndarray:
        """One row per config: LOOP_FEATURES, then knob_features."""
        return np.array([np.concatenate([self.loops(config), knob_features(config)]) for config in configs])

    def loop_matrix(self, configs: list[Config]) -> np.ndarray:
        return np.array([self.loops(config) for config in configs])


_FEATURIZERS: OrderedDict[str, Featurizer] = OrderedDict()
# Featurizers kept for the tasks seen last: tuners of one task (seeds, a resumed run) share its lowered configs
KEPT_FEATURIZERS = 32


def featurizer_of(task: Task) -> Featurizer:
    """The Featurizer of `task` (by key), shared while it is among the last KEPT_FEATURIZERS tasks asked for."""
    featurizer = _FEATURIZERS.pop(task.key, None) or Featurizer(task)
    _FEATURIZERS[task.key] = featurizer
    while len(_FEATURIZERS) > KEPT_FEATURIZERS:
        _FEATURIZERS.popitem(last=False)
    return featurizer
