"""Schedules: how the loops of each compute stage are split, ordered, annotated and placed.

`create_schedule` makes one Stage per compute reachable from the outputs; the primitives only
record relations and annotations, and `tir/lower.py` reads them to build the loop nests.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.te.expr import Binary, Const, Expr, Select, TEError, Var, as_expr
from compiler.te.tensor import (
    REDUCE,
    THREAD,
    ComputeOp,
    IterVar,
    Operation,
    PlaceholderOp,
    Reduce,
    Tensor,
    TensorLoad,
    mutate,
    substitute,
)

SCOPES = ("global", "shared", "local")
ROOT, INLINE, SCOPE = "root", "inline", "scope"


@dataclass(frozen=True, eq=False)
class Split:
    parent: IterVar
    outer: IterVar
    inner: IterVar
    factor: int | None
    nparts: int | None


@dataclass(frozen=True, eq=False)
class Fuse:
    outer: IterVar
    inner: IterVar
    fused: IterVar


@dataclass(frozen=True, eq=False)
class PrefetchHint:
    """`lines` prefetches of `tensor` at the start of each iteration of `axis`: element `offset` (a flat index over
    the loops around that point and `line`, which counts them) for line in [0, lines)."""

    tensor: Tensor
    axis: IterVar
    line: IterVar
    offset: Expr


def _ceil_div(extent, divisor: int):
    if isinstance(extent, int):
        return -(-extent // divisor)
    extent = as_expr(extent, "int32")
    return Binary("floordiv", Binary("add", extent, Const(divisor - 1, "int32")), Const(divisor, "int32"))


def _mul(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    return Binary("mul", as_expr(a, "int32"), as_expr(b, "int32"))


def _describe(extent) -> str:
    return extent.name if isinstance(extent, Var) else "(a symbolic expression)"


class Stage:
    """The schedule of one operation. `op` is the operation computed (cache_read/cache_write may
    swap in a rewritten copy); `leaf_iter_vars` are the loops, outermost first."""

    def __init__(self, schedule: Schedule, op: Operation):
        self.schedule = schedule
        self.op = op
        self.is_output = False
        self.scope = "global"
        root = list(op.axis) + list(op.reduce_axis) if isinstance(op, ComputeOp) else []
        self.all_iter_vars: list[IterVar] = list(root)
        self.leaf_iter_vars: list[IterVar] = list(root)
        self.relations: list[Split | Fuse] = []
        self.annotations: dict[IterVar, str] = {}
        self.bindings: dict[IterVar, IterVar] = {}
        self.partitions: set[IterVar] = set()  # Stage.partition: serial or parallel loops, beside their kind
        self.attach_type = ROOT
        self.attach_stage: Stage | None = None
        self.attach_ivar: IterVar | None = None
        self.prefetches: list[PrefetchHint] = []

    @property
    def name(self) -> str:
        return self.op.name

    def scheduled(self) -> bool:
        """Whether a primitive has changed this stage's loops (cache_write and rfactor must come before any)."""
        changed = self.relations or self.annotations or self.bindings or self.partitions
        return bool(changed) or self.leaf_iter_vars != self.all_iter_vars

    def __repr__(self) -> str:
        return f"Stage({self.name})"

    def _where(self) -> str:
        return f"stage {self.name}"

    def _leaf(self, axis, primitive: str) -> IterVar:
        if not isinstance(axis, IterVar):
            raise TEError(f"{primitive} on {self._where()}: {axis!r} is not an axis (IterVar)")
        if axis in self.leaf_iter_vars:
            return axis
        for relation in self.relations:
            if isinstance(relation, Split) and relation.parent is axis:
                raise TEError(
                    f"{primitive} on {self._where()}: axis {axis.name} was already split into "
                    f"{relation.outer.name} and {relation.inner.name}; use those instead"
                )
            if isinstance(relation, Fuse) and axis in (relation.outer, relation.inner):
                raise TEError(
                    f"{primitive} on {self._where()}: axis {axis.name} was already fused into "
                    f"{relation.fused.name}; use that instead"
                )
        owner = next((stage for stage in self.schedule.stages if axis in stage.all_iter_vars), None)
        if owner is not None:
            raise TEError(
                f"{primitive} on {self._where()}: axis {axis.name} belongs to stage {owner.name}, "
                f"not to {self.name}; use s[{self.name}].op.axis"
            )
        raise TEError(
            f"{primitive} on {self._where()}: axis {axis.name} is not an axis of this stage; "
            f"its axes are {', '.join(iv.name for iv in self.leaf_iter_vars) or 'none'}"
        )

    def _new_axis(self, name: str, extent, kind: str) -> IterVar:
        iv = IterVar(name, dom=(0, extent), kind=kind)
        self.all_iter_vars.append(iv)
        return iv

    def split(self, parent: IterVar, factor: int | None = None, nparts: int | None = None):
        """Split `parent` into (outer, inner); inner has `factor` iterations, or outer has `nparts`.
        A factor that does not divide the extent is allowed: lowering guards the tail."""
        parent = self._leaf(parent, "split")
        self._check_plain(parent, "split")
        if (factor is None) == (nparts is None):
            raise TEError(f"split of axis {parent.name} in {self._where()}: give exactly one of factor or nparts")
        amount = factor if factor is not None else nparts
        if isinstance(amount, Const):
            amount = amount.value
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 1:
            what = "factor" if factor is not None else "nparts"
            raise TEError(
                f"split of axis {parent.name} in {self._where()}: {what} must be a positive int, got {amount!r}"
            )
        extent = parent.extent
        if factor is not None:
            outer_extent, inner_extent = _ceil_div(extent, amount), amount
        else:
            outer_extent, inner_extent = amount, _ceil_div(extent, amount)
        outer = self._new_axis(f"{parent.name}.outer", outer_extent, parent.kind)
        inner = self._new_axis(f"{parent.name}.inner", inner_extent, parent.kind)
        self.relations.append(
            Split(parent, outer, inner, amount if factor is not None else None, amount if nparts is not None else None)
        )
        position = self.leaf_iter_vars.index(parent)
        self.leaf_iter_vars[position : position + 1] = [outer, inner]
        return outer, inner

    def _done(self, iv: IterVar) -> str | None:
        """What a primitive already made of `iv`'s loop: its thread, its annotation, "partitioned", or None."""
        if iv in self.bindings:
            return self.bindings[iv].thread_tag
        return self.annotations.get(iv, "partitioned" if iv in self.partitions else None)

    def _check_plain(self, iv: IterVar, primitive: str) -> None:
        """Annotations belong to final loops; splitting or fusing one would leave it ambiguous."""
        done = self._done(iv)
        if done is not None:
            raise TEError(
                f"{primitive} of axis {iv.name} in {self._where()}: the axis is already {done}; "
                f"{primitive} first, then annotate the resulting axes"
            )

    def tile(self, x_parent: IterVar, y_parent: IterVar, x_factor: int, y_factor: int):
        """Split x and y, then order the loops x.outer, y.outer, x.inner, y.inner."""
        x_outer, x_inner = self.split(x_parent, x_factor)
        y_outer, y_inner = self.split(y_parent, y_factor)
        self.reorder(x_outer, y_outer, x_inner, y_inner)
        return x_outer, y_outer, x_inner, y_inner

    def reorder(self, *axes: IterVar) -> None:
        """Put `axes` in this order, in the positions they occupy now."""
        if len(axes) == 1 and isinstance(axes[0], list | tuple):
            axes = tuple(axes[0])
        leaves = [self._leaf(axis, "reorder") for axis in axes]
        if len(set(map(id, leaves))) != len(leaves):
            names = [iv.name for iv in leaves]
            duplicate = next(name for name in names if names.count(name) > 1)
            raise TEError(f"reorder on {self._where()}: axis {duplicate} is given twice")
        positions = sorted(self.leaf_iter_vars.index(iv) for iv in leaves)
        for position, iv in zip(positions, leaves):
            self.leaf_iter_vars[position] = iv

    def fuse(self, *axes: IterVar) -> IterVar:
        """Fuse adjacent axes (outermost first) into one loop."""
        if len(axes) == 1 and isinstance(axes[0], list | tuple):
            axes = tuple(axes[0])
        if not axes:
            raise TEError(f"fuse on {self._where()}: give at least one axis")
        leaves = [self._leaf(axis, "fuse") for axis in axes]
        for iv in leaves:
            self._check_plain(iv, "fuse")
        positions = [self.leaf_iter_vars.index(iv) for iv in leaves]
        if positions != list(range(positions[0], positions[0] + len(positions))):
            raise TEError(
                f"fuse on {self._where()}: axes {', '.join(iv.name for iv in leaves)} are not adjacent loops in "
                f"this order (the loops are {', '.join(iv.name for iv in self.leaf_iter_vars)}); reorder first"
            )
        if len({iv.kind for iv in leaves}) > 1:
            raise TEError(
                f"fuse on {self._where()}: cannot fuse a reduce axis with a data-parallel axis "
                f"({', '.join(f'{iv.name}: {iv.kind}' for iv in leaves)})"
            )
        fused = leaves[0]
        for inner in leaves[1:]:
            new = self._new_axis(f"{fused.name}.{inner.name}.fused".replace(".fused.", "."), None, fused.kind)
            new.dom = (0, _mul(fused.extent, inner.extent))
            self.relations.append(Fuse(fused, inner, new))
            position = self.leaf_iter_vars.index(fused)
            self.leaf_iter_vars[position : position + 2] = [new]
            fused = new
        return fused

    def _annotate(self, axis: IterVar, annotation: str, primitive: str) -> None:
        iv = self._leaf(axis, primitive)
        # a symbolic size (a Sym) may be annotated: an attached stage's region of it is a constant tile, which
        # lowering checks (a vectorized or unrolled loop must be constant there)
        fixed = isinstance(iv.extent, int) or hasattr(iv.extent, "__tensor_expr__")
        if annotation in ("vectorized", "unrolled") and not fixed:
            raise TEError(
                f"cannot {primitive} axis {iv.name} of {self._where()}: its extent {_describe(iv.extent)} is not a "
                "constant; "
                "split it by a constant factor and annotate the inner axis"
            )
        if iv.kind == REDUCE and annotation in ("vectorized", "parallel"):
            raise TEError(
                f"cannot {primitive} axis {iv.name} of {self._where()}: it is a reduction axis, whose iterations "
                "accumulate into the same element; annotate a data-parallel axis instead"
            )
        if iv in self.bindings:
            raise TEError(
                f"cannot {primitive} axis {iv.name} of {self._where()}: it is bound to {self.bindings[iv].thread_tag}"
            )
        if iv in self.partitions and annotation != "parallel":
            raise TEError(
                f"cannot {primitive} axis {iv.name} of {self._where()}: it is partitioned, and only a serial or "
                "parallel loop is partitioned"
            )
        self.annotations[iv] = annotation

    def vectorize(self, axis: IterVar) -> None:
        self._annotate(axis, "vectorized", "vectorize")

    def unroll(self, axis: IterVar) -> None:
        self._annotate(axis, "unrolled", "unroll")

    def parallel(self, axis: IterVar) -> None:
        self._annotate(axis, "parallel", "parallel")

    def partition(self, axis: IterVar) -> None:
        """Cut the loop of `axis` where the tests of its body that depend on it (padding, clamped regions) start or
        stop holding, so that each piece runs without the tests it decides (tir/partition.py). A serial loop is cut
        into loops; a parallel loop, one job of the thread pool, keeps its iterations and its body is cut into
        branches on the value of the term that the tests read (a fused loop's row)."""
        iv = self._leaf(axis, "partition")
        done = self._done(iv)
        if done not in (None, "parallel", "partitioned"):
            raise TEError(
                f"cannot partition axis {iv.name} of {self._where()}: it is {done}, and only a serial or "
                "parallel loop is partitioned; partition the loop outside it instead"
            )
        self.partitions.add(iv)

    def bind(self, axis: IterVar, thread: IterVar) -> None:
        """Run `axis` on the GPU grid axis `thread` (from te.thread_axis)."""
        iv = self._leaf(axis, "bind")
        if not isinstance(thread, IterVar) or thread.kind != THREAD:
            raise TEError(f"bind of axis {iv.name} in {self._where()}: {thread!r} is not a te.thread_axis(...)")
        if iv.kind == REDUCE:
            raise TEError(f"bind of axis {iv.name} in {self._where()}: a reduction axis cannot be bound to a thread")
        if iv in self.bindings:
            raise TEError(
                f"bind of axis {iv.name} in {self._where()}: the axis is already bound to "
                f"{self.bindings[iv].thread_tag}"
            )
        if self._done(iv) is not None:
            raise TEError(f"bind of axis {iv.name} in {self._where()}: the axis is already {self._done(iv)}")
        if thread.thread_tag != "vthread":
            for other, bound in self.bindings.items():
                if bound.thread_tag == thread.thread_tag:
                    raise TEError(
                        f"bind of axis {iv.name} in {self._where()}: {thread.thread_tag} is already bound to axis "
                        f"{other.name} of this stage; fuse the axes first"
                    )
        self.bindings[iv] = thread

    def compute_at(self, parent: Stage, axis: IterVar) -> None:
        """Compute this stage inside loop `axis` of `parent`, only the region that loop needs."""
        if isinstance(parent, Tensor | Operation):
            parent = self.schedule[parent]
        if not isinstance(parent, Stage):
            raise TEError(f"compute_at of {self._where()}: {parent!r} is not a stage; pass s[tensor]")
        if parent is self:
            raise TEError(f"compute_at of {self._where()}: a stage cannot be computed at itself")
        iv = parent._leaf(axis, f"compute_at of {self.name}")
        if self.is_output:
            raise TEError(f"compute_at of {self._where()}: it is an output of the schedule; only producers move")
        if parent in self.schedule.producers_of(self, transitive=True):
            raise TEError(
                f"compute_at of {self._where()} at {parent.name}: {parent.name} is one of its inputs, so "
                f"{self.name} cannot be computed inside {parent.name}'s loops"
            )
        chain = parent
        while chain is not None:
            if chain is self:
                raise TEError(
                    f"compute_at of {self._where()} at {parent.name}: {parent.name} is itself computed inside "
                    f"{self.name}; that would be a cycle"
                )
            chain = chain.attach_stage if chain.attach_type == SCOPE else None
        self.attach_type, self.attach_stage, self.attach_ivar = SCOPE, parent, iv

    def compute_inline(self) -> None:
        """Substitute this stage's body into every reader; no loops of its own remain."""
        if self.is_output:
            raise TEError(f"compute_inline of {self._where()}: it is an output of the schedule and must be stored")
        if not isinstance(self.op, ComputeOp):
            raise TEError(f"compute_inline of {self._where()}: only compute stages can be inlined")
        if self.op.reduce_axis:
            raise TEError(
                f"compute_inline of {self._where()}: it is a reduction, which has to be computed in its own loops"
            )
        for other in self.schedule.stages:
            if other.attach_type == SCOPE and other.attach_stage is self:
                raise TEError(
                    f"compute_inline of {self._where()}: stage {other.name} is computed at it; move that first"
                )
        self.attach_type, self.attach_stage, self.attach_ivar = INLINE, None, None

    def prefetch(self, tensor: Tensor, axis: IterVar, lines: int, offset) -> None:
        """Hint, at the start of each iteration of loop `axis`, that this stage will soon read `tensor` at
        `offset(line)` for line in [0, lines): a flat element index over the loops around that point. Lowering
        keeps it inside the tensor; a target without prefetch instructions ignores it, and results never change."""
        iv = self._leaf(axis, "prefetch")
        if not isinstance(tensor, Tensor):
            raise TEError(f"prefetch on {self._where()}: {tensor!r} is not a tensor")
        if not (isinstance(lines, int) and lines > 0):
            raise TEError(f"prefetch on {self._where()}: lines must be a positive int, got {lines!r}")
        line = IterVar(f"{tensor.name}.line", dom=(0, lines))
        self.prefetches.append(PrefetchHint(tensor, iv, line, as_expr(offset(line))))

    def set_scope(self, scope: str) -> None:
        if scope not in SCOPES:
            raise TEError(f"scope {scope!r} of {self._where()} is unknown; use one of {', '.join(SCOPES)}")
        self.scope = scope


class Schedule:
    """All stages of a computation, producers before consumers."""

    def __init__(self, outputs: list[Operation]):
        self.outputs = outputs
        self.stages: list[Stage] = []
        self.stage_map: dict[Operation, Stage] = {}
        for op in _post_order(outputs):
            stage = Stage(self, op)
            self.stages.append(stage)
            self.stage_map[op] = stage
        for op in outputs:
            self.stage_map[op].is_output = True

    def __getitem__(self, key) -> Stage:
        op = key.op if isinstance(key, Tensor) else key
        try:
            return self.stage_map[op]
        except (KeyError, TypeError):
            name = getattr(op, "name", repr(key))
            raise TEError(f"{name} has no stage in this schedule; is it reachable from the outputs?") from None

    def producers_of(self, stage: Stage, transitive: bool = False) -> list[Stage]:
        found: list[Stage] = []
        pending = [stage]
        while pending:
            current = pending.pop()
            for tensor in current.op.input_tensors:
                producer = self[tensor]
                if producer not in found:
                    found.append(producer)
                    if transitive:
                        pending.append(producer)
        return found

    def readers_of(self, stage: Stage) -> list[Stage]:
        return [other for other in self.stages if stage in self.producers_of(other)]

    def _replace_op(self, stage: Stage, op: ComputeOp) -> None:
        stage.op = op
        self.stage_map[op] = stage

    def _insert(self, stage: Stage, before: Stage) -> None:
        self.stages.insert(self.stages.index(before), stage)
        self.stage_map[stage.op] = stage

    def cache_read(self, tensor: Tensor, scope: str, readers) -> Tensor:
        """A stage copying `tensor` into a `scope` buffer; `readers` then read the copy."""
        source = self[tensor]
        if scope not in SCOPES:
            raise TEError(f"cache_read of {tensor.name}: scope {scope!r} is unknown; use one of {', '.join(SCOPES)}")
        readers = readers if isinstance(readers, list | tuple) else [readers]
        reader_stages = [self[reader] for reader in readers]
        if not reader_stages:
            raise TEError(f"cache_read of {tensor.name}: give the stages that should read the cache")
        for reader in reader_stages:
            if source not in self.producers_of(reader):
                raise TEError(f"cache_read of {tensor.name}: stage {reader.name} does not read {tensor.name}")
        names = [f"ax{k}" for k in range(len(tensor.shape))]
        axis = tuple(IterVar(name, dom=(0, extent)) for name, extent in zip(names, tensor.shape))
        cache_op = ComputeOp(f"{tensor.name}.{scope}", "", axis, tensor[axis])
        cache = cache_op.output(0)
        for reader in reader_stages:
            body = _replace_reads(reader.op.body, tensor.op, cache)
            self._replace_op(reader, ComputeOp(reader.op.name, reader.op.tag, reader.op.axis, body))
        stage = Stage(self, cache_op)
        stage.scope = scope
        first = min(reader_stages, key=self.stages.index)
        self._insert(stage, first)
        return cache

    def cache_write(self, tensor: Tensor, scope: str) -> Tensor:
        """Compute `tensor` into a `scope` buffer first; the original stage then copies it out."""
        stage = self[tensor]
        if scope not in SCOPES:
            raise TEError(f"cache_write of {tensor.name}: scope {scope!r} is unknown; use one of {', '.join(SCOPES)}")
        if not isinstance(stage.op, ComputeOp):
            raise TEError(f"cache_write of {tensor.name}: only compute stages can be cached")
        if stage.scheduled():
            raise TEError(f"cache_write of {tensor.name}: call cache_write before scheduling stage {stage.name}")
        op = stage.op
        mapping: dict[Var, Expr] = {}
        axis = tuple(IterVar(f"{iv.name}.c", dom=iv.dom) for iv in op.axis)
        mapping.update(zip(op.axis, axis))
        body = op.body
        if isinstance(body, Reduce):
            reduce_axis = tuple(IterVar(iv.name, dom=iv.dom, kind=REDUCE) for iv in body.axis)
            mapping.update(zip(body.axis, reduce_axis))
            body = Reduce(body.combiner, substitute(body.source, mapping), reduce_axis, body.identity)
        else:
            body = substitute(body, mapping)
        cache_op = ComputeOp(f"{op.name}.{scope}", op.tag, axis, body)
        cache = cache_op.output(0)
        self._replace_op(stage, ComputeOp(op.name, op.tag, op.axis, cache[op.axis]))
        stage.all_iter_vars = list(op.axis)
        stage.leaf_iter_vars = list(op.axis)
        cache_stage = Stage(self, cache_op)
        cache_stage.scope = scope
        self._insert(cache_stage, stage)
        return cache

    def recompute(self, tensor: Tensor) -> Tensor:
        """A copy of `tensor`'s (non-reduction) compute, inlined, that every stage reading `tensor` reads instead:
        `tensor` is still stored (it is an output), but no stage waits for that store. On a GPU the blocks of one
        launch never wait for each other, so a stage reading another root stage's output would need a second
        launch."""
        source = self[tensor]
        op = source.op
        if not isinstance(op, ComputeOp) or isinstance(op.body, Reduce):
            raise TEError(f"recompute of {tensor.name}: only a compute stage without a reduction can be recomputed")
        axis = tuple(IterVar(f"{iv.name}.r", dom=iv.dom) for iv in op.axis)
        copy_op = ComputeOp(f"{op.name}.recompute", op.tag, axis, substitute(op.body, dict(zip(op.axis, axis))))
        copy = copy_op.output(0)
        readers = [stage for stage in self.stages if stage is not source and source in self.producers_of(stage)]
        if not readers:
            raise TEError(f"recompute of {tensor.name}: no stage reads it")
        for reader in readers:
            self._replace_op(
                reader,
                ComputeOp(reader.op.name, reader.op.tag, reader.op.axis, _replace_reads(reader.op.body, op, copy)),
            )
        stage = Stage(self, copy_op)
        self._insert(stage, min(readers, key=self.stages.index))
        stage.compute_inline()
        return copy

    def rfactor(self, tensor: Tensor, factor: int) -> Tensor:
        """Split the reduction computing `tensor` in two: a partial stage with a new leading `lane` axis of `factor`
        iterations, lane t combining the elements t, t + factor, t + 2 * factor... of the reduction's (flattened)
        domain, and the stage itself, which then combines the `factor` partials. Binding the partial stage's lane to
        a thread axis makes a cross-thread reduction; on a CPU its loops stay serial and give the same result."""
        stage = self[tensor]
        op = stage.op
        if not isinstance(op, ComputeOp) or not isinstance(op.body, Reduce):
            raise TEError(f"rfactor of {tensor.name}: only a reduction stage can be factored")
        if stage.scheduled():
            raise TEError(f"rfactor of {tensor.name}: call rfactor before scheduling stage {stage.name}")
        if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
            raise TEError(f"rfactor of {tensor.name}: the factor must be a positive int, got {factor!r}")
        body = op.body
        extents = [iv.extent for iv in body.axis]
        if len(extents) == 1 and hasattr(extents[0], "__tensor_expr__"):
            return self._rfactor_symbolic(stage, factor)
        if not all(isinstance(extent, int) for extent in extents):
            raise TEError(f"rfactor of {tensor.name}: its reduce axes need constant extents")
        total = 1
        for extent in extents:
            total *= extent
        lane = IterVar(f"{op.name}.lane", dom=(0, factor))
        step = IterVar(f"{op.name}.step", dom=(0, _ceil_div(total, factor)), kind=REDUCE)
        flat = step * Const(factor, "int32") + lane
        mapping: dict[Var, Expr] = {}
        stride = total
        for iv, extent in zip(body.axis, extents):
            stride //= extent
            index = flat if stride == 1 else Binary("floordiv", flat, Const(stride, "int32"))
            if stride * extent != total:
                index = Binary("floormod", index, Const(extent, "int32"))
            mapping[iv] = index + Const(iv.dom[0], "int32") if iv.dom[0] else index
        axis = tuple(IterVar(f"{iv.name}.rf", dom=iv.dom) for iv in op.axis)
        mapping.update(zip(op.axis, axis))
        source = substitute(body.source, mapping)
        if total % factor:
            source = Select(flat < Const(total, "int32"), source, body.identity)
        return self._factored(stage, factor, lane, step, source, axis)

    def _rfactor_symbolic(self, stage: Stage, factor: int) -> Tensor:
        """rfactor of a reduction over one axis of a symbolic size: lane t takes the elements t, t + factor, ... below
        the run's size (each read past it is the identity)."""
        op = stage.op
        body = op.body
        (iv,) = body.axis
        lane = IterVar(f"{op.name}.lane", dom=(0, factor))
        step = IterVar(f"{op.name}.step", dom=(0, _ceil_div(iv.extent, factor)), kind=REDUCE)
        flat = step * Const(factor, "int32") + lane
        axis = tuple(IterVar(f"{axis.name}.rf", dom=axis.dom) for axis in op.axis)
        mapping: dict[Var, Expr] = {iv: flat + Const(iv.dom[0], "int32") if iv.dom[0] else flat}
        mapping.update(zip(op.axis, axis))
        source = Select(flat < as_expr(iv.extent, "int32"), substitute(body.source, mapping), body.identity)
        return self._factored(stage, factor, lane, step, source, axis)

    def _factored(self, stage: Stage, factor: int, lane, step, source, axis) -> Tensor:
        """The partial stage of an rfactor (lanes of `source` over `axis`, reduced over `step`) and the stage that
        combines them."""
        op = stage.op
        body = op.body
        partial_op = ComputeOp(
            f"{op.name}.rf", "", (lane, *axis), Reduce(body.combiner, source, (step,), body.identity)
        )
        partial = partial_op.output(0)
        lanes = IterVar(f"{op.name}.lanes", dom=(0, factor), kind=REDUCE)
        combined = Reduce(body.combiner, partial[(lanes, *op.axis)], (lanes,), body.identity)
        self._replace_op(stage, ComputeOp(op.name, op.tag, op.axis, combined))
        stage.all_iter_vars = [*op.axis, lanes]
        stage.leaf_iter_vars = [*op.axis, lanes]
        partial_stage = Stage(self, partial_op)
        partial_stage.scope = stage.scope
        self._insert(partial_stage, stage)
        return partial

    def rfactor_tree(self, tensor: Tensor, factor: int) -> list[Tensor]:
        """rfactor, then halve the partials instead of combining them all in one stage: stage k combines lane t with
        lane t + ceil(n / 2) of the stage before (n lanes; past the end, the identity), until one or two lanes are
        left for the reduction stage to combine. [partial, halving stages...]: bound to a thread axis, each halving is
        one step of a tree reduction across the threads, log2(factor) steps instead of `factor` serial ones."""
        partial = self.rfactor(tensor, factor)
        stage = self[tensor]
        op = stage.op
        combiner, identity = op.body.combiner, op.body.identity
        chain, lanes = [partial], factor
        while lanes > 2:
            half = -(-lanes // 2)
            previous = chain[-1]
            lane = IterVar(f"{op.name}.half{len(chain)}", dom=(0, half))
            axis = tuple(IterVar(f"{iv.name}.h{len(chain)}", dom=iv.dom) for iv in op.axis)
            low, high = previous[(lane, *axis)], previous[(lane + Const(half, "int32"), *axis)]
            if 2 * half != lanes:
                high = Select(lane + Const(half, "int32") < Const(lanes, "int32"), high, identity)
            combined = low + high if combiner == "sum" else Binary(combiner, low, high)
            halving = ComputeOp(f"{op.name}.half{len(chain)}", "", (lane, *axis), combined)
            halving_stage = Stage(self, halving)
            halving_stage.scope = stage.scope
            self._insert(halving_stage, stage)
            chain.append(halving.output(0))
            lanes = half
        last = IterVar(f"{op.name}.lanes", dom=(0, lanes), kind=REDUCE)
        self._replace_op(
            stage, ComputeOp(op.name, op.tag, op.axis, Reduce(combiner, chain[-1][(last, *op.axis)], (last,), identity))
        )
        stage.all_iter_vars = [*op.axis, last]
        stage.leaf_iter_vars = [*op.axis, last]
        return chain


def _replace_reads(body: Expr, old: Operation, new: Tensor) -> Expr:
    def visit(node):
        if isinstance(node, TensorLoad) and node.tensor.op is old:
            return TensorLoad(new, tuple(mutate(index, visit) for index in node.indices))
        return None

    return mutate(body, visit)


def _post_order(outputs: list[Operation]) -> list[Operation]:
    order: list[Operation] = []
    seen: set[int] = set()

    def visit(op: Operation) -> None:
        if id(op) in seen:
            return
        seen.add(id(op))
        for tensor in op.input_tensors:
            visit(tensor.op)
        order.append(op)

    for op in outputs:
        visit(op)
    return order


def create_schedule(ops) -> Schedule:
    """A schedule for `ops` (an operation, a tensor, or a list of them) and everything they read."""
    items = ops if isinstance(ops, list | tuple) else [ops]
    outputs = []
    for item in items:
        op = item.op if isinstance(item, Tensor) else item
        if not isinstance(op, Operation):
            raise TEError(f"create_schedule: {item!r} is not an operation or a tensor")
        if isinstance(op, PlaceholderOp):
            raise TEError(f"create_schedule: {op.name} is a placeholder; schedule the compute that produces output")
        outputs.append(op)
    return Schedule(outputs)


__all__ = ["Fuse", "Schedule", "Split", "Stage", "create_schedule"]
