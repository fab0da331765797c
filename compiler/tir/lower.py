"""Lowering: a TE schedule becomes one PrimFunc of loop IR.

It infers the region each attached stage must produce, builds every stage's loop nest from its
split/fuse relations, places attached stages and their allocations, splits reductions into an init
and an update nest, guards non-dividing splits, then simplifies. Codegen receives the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.target import size_capacity
from compiler.te.expr import (
    Binary,
    Call,
    Compare,
    Const,
    Expr,
    IfThenElse,
    Logical,
    Select,
    SizeVar,
    TEError,
    Var,
    as_expr,
)
from compiler.te.schedule import INLINE, ROOT, SCOPE, Schedule, Split, Stage
from compiler.te.tensor import (
    REDUCE,
    ComputeOp,
    IterVar,
    PlaceholderOp,
    Reduce,
    Tensor,
    TensorLoad,
    mutate,
    substitute,
    walk,
)
from compiler.tir.nodes import (
    Allocate,
    Barrier,
    Buffer,
    For,
    ForKind,
    IfThen,
    LetStmt,
    Load,
    Prefetch,
    PrimFunc,
    Seq,
    Stmt,
    Store,
    walk_stmts,
)
from compiler.tir.partition import partition_loops
from compiler.tir.simplify import Linear, bounds, loop_bounds, simplify, substitute_stmt
from compiler.tir.visitor import ScopedMutator, StmtMutator, structural_key

# The argument of a kernel that uses size vars (and of the run entry of a model with symbolic sizes): int32 values,
# one slot per size of the model
SIZES_ARGUMENT = "sizes"

_KINDS = {"parallel": ForKind.PARALLEL, "vectorized": ForKind.VECTORIZED, "unrolled": ForKind.UNROLLED}


def _int(value: int) -> Const:
    return Const(value, "int32")


def _extent(value) -> Expr:
    """A loop's or region's extent as an expression: a constant, or one of the kernel's size vars."""
    return _int(value) if isinstance(value, int) else as_expr(value, "int32")


def _upper(value) -> int:
    """The extent an axis is laid out for: itself, or a symbolic one's largest value rounded up (size_capacity)."""
    if isinstance(value, Const):
        return int(value.value)
    if isinstance(value, int):
        return value
    high = bounds(_extent(value), {})[1]
    if high is None:
        raise TEError(f"the extent {value} has no upper bound; a symbolic size needs a range")
    return size_capacity(high)


def _loop_extent(value):
    """A loop's extent as lowering keeps it: an int, or an expression of size vars (a Sym converted)."""
    if isinstance(value, Const):
        return value.value
    return value if isinstance(value, int) else _extent(value)


def _ceil_div(extent, divisor):
    if isinstance(extent, int) and isinstance(divisor, int):
        return -(-extent // divisor)
    return Binary("floordiv", _extent(extent) + _extent(divisor) - _int(1), _extent(divisor))


def _product(a, b):
    return a * b if isinstance(a, int) and isinstance(b, int) else _extent(a) * _extent(b)


@dataclass
class _Geometry:
    """Where one stage's loops run: the region of its output it produces (`mins`, `extents`, one per
    output axis), the extent of every iter var, each iter var's value in terms of the leaf loops,
    and the conditions that guard non-dividing splits and clamped regions."""

    mins: list[Expr]
    extents: list[int]
    iter_extents: dict[IterVar, int]
    values: dict[IterVar, Expr]
    data_conditions: list[Expr] = field(default_factory=list)
    reduce_conditions: list[Expr] = field(default_factory=list)


class _Lowering:
    def __init__(self, schedule: Schedule, args: list[Tensor], name: str, sizes=()):
        self.schedule = schedule
        self.name = name
        self.sizes = list(sizes)
        self.geometries: dict[Stage, _Geometry] = {}
        self.bodies: dict[Stage, Expr] = {}
        self.buffers: dict[Stage, Buffer] = {}
        self.origins: dict[Stage, list[Expr]] = {}
        self.params: list[Buffer] = []
        self.allocated: list[Stage] = []
        self.loop_vars: dict[IterVar, Var] = {}
        for arg in args:
            if not isinstance(arg, Tensor):
                raise TEError(f"lower {name}: argument {arg!r} is not a tensor")
            stage = self._stage_of(arg)
            if stage in self.buffers:
                raise TEError(f"lower {name}: tensor {arg.name} is given twice in the arguments")
            buffer = Buffer(arg.name, self._static_shape(arg.op), arg.dtype, "global")
            self.buffers[stage] = buffer
            self.origins[stage] = [_int(0)] * len(buffer.shape)
            self.params.append(buffer)
        self.computes = [s for s in schedule.stages if isinstance(s.op, ComputeOp) and s.attach_type != INLINE]
        for stage in schedule.stages:
            if stage.is_output and stage not in self.buffers:
                raise TEError(
                    f"lower {name}: output {stage.name} is not in the arguments; pass it so results come back"
                )
        for stage in self.computes:
            for tensor in self._reads(stage):
                producer = self._stage_of(tensor)
                if isinstance(producer.op, PlaceholderOp) and producer not in self.buffers:
                    raise TEError(
                        f"lower {name}: stage {stage.name} reads placeholder {tensor.name}, which is not in the "
                        "arguments"
                    )

    def loop_var(self, iv: IterVar) -> Var:
        """The plain Var a leaf IterVar becomes in the loop IR, which holds no TE nodes."""
        if iv not in self.loop_vars:
            self.loop_vars[iv] = Var(iv.name, "int32")
        return self.loop_vars[iv]

    def _stage_of(self, tensor: Tensor) -> Stage:
        return self.schedule[tensor]

    def _static_shape(self, op) -> tuple[int, ...]:
        """The shape a tensor's buffer is laid out for: a symbolic dimension at its largest over the size vars' ranges,
        rounded up (_upper)."""
        shape = []
        for extent in op.shape:
            if isinstance(extent, Const):
                extent = extent.value
            if not isinstance(extent, int):
                extent = _extent(extent)
                if not all(isinstance(node, SizeVar) for node in walk(extent) if isinstance(node, Var)):
                    described = extent.name if isinstance(extent, Var) else "(an expression)"
                    raise TEError(
                        f"lower {self.name}: tensor {op.name} has the symbolic dimension {described}, which is not a "
                        "function of the kernel's size vars (te.size_var); kernels are built for those or for ints"
                    )
                extent = _upper(extent)
            shape.append(extent)
        return tuple(shape)

    @staticmethod
    def _extents(op) -> list:
        """The tensor's dimensions as loops run them: ints, or expressions of size vars."""
        return [_loop_extent(extent) for extent in op.shape]

    def body(self, stage: Stage) -> Expr:
        """The stage's compute body with every inlined producer substituted."""
        if stage not in self.bodies:

            def visit(node):
                if isinstance(node, TensorLoad):
                    producer = self._stage_of(node.tensor)
                    indices = [mutate(index, visit) for index in node.indices]
                    if producer.attach_type == INLINE:
                        return substitute(self.body(producer), dict(zip(producer.op.axis, indices)))
                    return TensorLoad(node.tensor, tuple(indices))
                return None

            self.bodies[stage] = mutate(stage.op.body, visit)
        return self.bodies[stage]

    def _reads(self, stage: Stage) -> list[Tensor]:
        return [node.tensor for node in walk(self.body(stage)) if isinstance(node, TensorLoad)]

    def outer_path(self, stage: Stage) -> list[IterVar]:
        """The loops around the point where `stage` is computed, outermost first."""
        if stage.attach_type != SCOPE:
            return []
        parent = stage.attach_stage
        return self.outer_path(parent) + parent.leaf_iter_vars[: parent.leaf_iter_vars.index(stage.attach_ivar) + 1]

    def path(self, stage: Stage) -> list[IterVar]:
        return self.outer_path(stage) + stage.leaf_iter_vars

    def geometry(self, stage: Stage) -> _Geometry:
        if stage in self.geometries:
            return self.geometries[stage]
        op = stage.op
        shape = self._static_shape(op)
        if stage.attach_type == SCOPE:
            mins, extents, clamp = self.infer_region(stage, shape)
        else:
            mins, extents, clamp = [_int(0)] * len(shape), self._extents(op), [False] * len(shape)
        # an extent is an int, or an expression of size vars (a symbolic dimension): its splits are always guarded
        iter_extents: dict[IterVar, int | Expr] = dict(zip(op.axis, extents))
        for iv in op.reduce_axis:
            low, extent = iv.dom
            if not isinstance(low, int):
                raise TEError(f"lower {self.name}: reduce axis {iv.name} of stage {stage.name} has a symbolic start")
            iter_extents[iv] = _loop_extent(extent)
        geometry = _Geometry(mins, extents, iter_extents, {})
        divides: dict[IterVar, bool] = {}
        for relation in stage.relations:
            if isinstance(relation, Split):
                extent = iter_extents[relation.parent]
                if relation.factor is not None:
                    inner, outer = relation.factor, _ceil_div(extent, relation.factor)
                else:
                    outer, inner = relation.nparts, _ceil_div(extent, relation.nparts)
                iter_extents[relation.outer], iter_extents[relation.inner] = outer, inner
                divides[relation.parent] = isinstance(extent, int) and outer * inner == extent
            else:
                iter_extents[relation.fused] = _product(iter_extents[relation.outer], iter_extents[relation.inner])
        values: dict[IterVar, Expr] = {iv: self.loop_var(iv) for iv in stage.leaf_iter_vars}
        for relation in reversed(stage.relations):
            if isinstance(relation, Split):
                inner_extent = _extent(iter_extents[relation.inner])
                values[relation.parent] = values[relation.outer] * inner_extent + values[relation.inner]
            else:
                inner_extent = _extent(iter_extents[relation.inner])
                values[relation.outer] = Binary("floordiv", values[relation.fused], inner_extent)
                values[relation.inner] = Binary("floormod", values[relation.fused], inner_extent)
        geometry.values = values
        padding_safe = self._padding_safe(stage)
        for parent, exact in divides.items():
            if not exact:
                bound = iter_extents[parent]
                if padding_safe and parent in op.axis and not isinstance(bound, int):
                    # a tensor is laid out at its largest shape, and every reader stops at the run's sizes: a tile
                    # of a symbolic axis only has to stay inside the layout, a test that a tile dividing the largest
                    # size drops (the run's size in a vector loop's test scalarized it)
                    bound = _upper(bound)
                condition = Compare("lt", values[parent], _extent(bound))
                target = geometry.reduce_conditions if parent.kind == REDUCE else geometry.data_conditions
                target.append(condition)
        for axis, low, needs_clamp, extent in zip(op.axis, mins, clamp, shape):
            if needs_clamp:
                index = low + values[axis]
                geometry.data_conditions += [Compare("ge", index, _int(0)), Compare("lt", index, _int(extent))]
        self.geometries[stage] = geometry
        return geometry

    def _padding_safe(self, stage: Stage) -> bool:
        """Whether a stage may compute elements past the run's sizes (inside its buffer's largest layout), where its
        inputs hold whatever the padding holds: a float stage with no data-dependent index (an index check would
        fail on a padding's index) and so no integer division by a padding's zero."""
        if stage.op.dtype not in ("float32", "float16", "float64"):
            return False
        return not any(isinstance(node, Call) and node.name == "index_check" for node in walk(self.body(stage)))

    def root_index(self, stage: Stage, geometry: _Geometry) -> dict[Var, Expr]:
        mapping: dict[Var, Expr] = {
            axis: low + geometry.values[axis] for axis, low in zip(stage.op.axis, geometry.mins)
        }
        for iv in stage.op.reduce_axis:
            mapping[iv] = _int(iv.dom[0]) + geometry.values[iv]
        return mapping

    def var_extents(self, stages) -> dict[Var, tuple[int, int]]:
        env: dict[Var, tuple[int, int]] = {}
        for stage in stages:
            geometry = self.geometry(stage)
            for iv in stage.leaf_iter_vars:
                env[self.loop_var(iv)] = (0, _upper(geometry.iter_extents[iv]) - 1)
        return env

    def infer_region(self, stage: Stage, shape: tuple[int, ...]):
        """The box of `stage`'s output that its readers inside the attach loop touch, per axis:
        (min expression over the outer loops, constant extent, whether it must be clamped)."""
        outer = self.outer_path(stage)
        outer_ids = {id(self.loop_var(iv)) for iv in outer}
        if stage.scope == "shared":
            # One shared buffer serves every thread of a block, so it holds what all of them read.
            for owner in self._attach_chain(stage):
                for iv, thread in owner.bindings.items():
                    if thread.thread_tag.startswith("threadIdx") or thread.thread_tag == "vthread":
                        outer_ids.discard(id(self.loop_var(iv)))
        readers = [
            s for s in self.computes if s is not stage and any(self._stage_of(t) is stage for t in self._reads(s))
        ]
        if not readers:
            raise TEError(
                f"lower {self.name}: stage {stage.name} is computed at {stage.attach_stage.name} but nothing reads it"
            )
        boxes: list[list[tuple[Linear, int, int] | None]] = [[] for _ in shape]
        for reader in readers:
            reader_path = self.path(reader)
            if [id(iv) for iv in reader_path[: len(outer)]] != [id(iv) for iv in outer]:
                raise TEError(
                    f"lower {self.name}: stage {stage.name} is computed at axis {stage.attach_ivar.name} of "
                    f"{stage.attach_stage.name}, but its reader {reader.name} runs outside that loop; compute "
                    f"{stage.name} at {reader.name} instead"
                )
            owners = [reader] + self._attach_chain(reader)
            env = self.var_extents(owners)
            # the reader's own serial loops: one of a single iteration (its region's axes of extent 1, computed at
            # a thread) is its value, and their ranges simplify the indices, so that an index through them (a tile's
            # row of a Winograd conv, (position % tiles) // columns) stays a function of the outer loops alone
            bound = {self.loop_var(iv) for iv in reader.bindings}
            own = {var: extent for var, extent in self.var_extents([reader]).items() if var not in bound}
            single = {var: _int(low) for var, (low, high) in own.items() if low == high}
            mapping = {
                var: substitute(expr, single) for var, expr in self.root_index(reader, self.geometry(reader)).items()
            }
            for node in walk(self.body(reader)):
                if not isinstance(node, TensorLoad) or self._stage_of(node.tensor) is not stage:
                    continue
                for dim, index in enumerate(node.indices):
                    expr = simplify(substitute(index, mapping), own)
                    boxes[dim].append(self._interval(expr, outer_ids, env))
        mins, extents, clamp = [], [], []
        for dim, (extent, run_extent) in enumerate(zip(shape, self._extents(stage.op))):
            low_expr, size, needs_clamp = self._merge(boxes[dim], extent, self.var_extents(self._attach_chain(stage)))
            whole = size == extent and isinstance(low_expr, Const) and not needs_clamp
            fixed_loop = stage.annotations.get(stage.op.axis[dim]) in ("vectorized", "unrolled")
            if whole and not isinstance(run_extent, int) and not fixed_loop:
                # the whole of a symbolic axis: computed to the run's size (its readers stop there), not the largest
                size = run_extent
            mins.append(low_expr)
            extents.append(size)
            clamp.append(needs_clamp)
        return mins, extents, clamp

    def _attach_chain(self, stage: Stage) -> list[Stage]:
        chain = []
        while stage.attach_type == SCOPE:
            stage = stage.attach_stage
            chain.append(stage)
        return chain

    @staticmethod
    def _interval(expr: Expr, outer_ids: set[int], env) -> tuple[Linear, int, int] | None:
        linear = Linear.of(expr)
        fixed = Linear(linear.dtype)
        low = high = linear.const
        for key, (atom, coef) in linear.terms.items():
            # a term of the outer loops' vars and the sizes (a run's constants) is fixed inside the attach loop
            if all(id(node) in outer_ids or isinstance(node, SizeVar) for node in walk(atom) if isinstance(node, Var)):
                fixed.terms[key] = [atom, coef]
                continue
            atom_low, atom_high = bounds(atom, env)
            if atom_low is None or atom_high is None:
                return None
            atom_low, atom_high = (
                (atom_low * coef, atom_high * coef) if coef > 0 else (atom_high * coef, atom_low * coef)
            )
            low, high = low + atom_low, high + atom_high
        return fixed, low, high

    @staticmethod
    def _merge(intervals, extent: int, outer_env) -> tuple[Expr, int, bool]:
        if any(interval is None for interval in intervals):
            return _int(0), extent, False
        keys = {structural_key(fixed.to_expr()) for fixed, _, _ in intervals}
        if len(keys) == 1:
            fixed = intervals[0][0]
            low = min(interval[1] for interval in intervals)
            high = max(interval[2] for interval in intervals)
        else:
            low, high = None, None
            for fixed_part, part_low, part_high in intervals:
                fixed_low, fixed_high = fixed_part.bounds(outer_env)
                if fixed_low is None or fixed_high is None:
                    return _int(0), extent, False
                low = fixed_low + part_low if low is None else min(low, fixed_low + part_low)
                high = fixed_high + part_high if high is None else max(high, fixed_high + part_high)
            fixed = Linear("int32")
        if high - low + 1 >= extent:
            return _int(0), extent, False
        if not fixed.terms:
            low, high = max(low, 0), min(high, extent - 1)
            return _int(low), high - low + 1, False
        return simplify(fixed.plus(Linear("int32", const=low)).to_expr()), high - low + 1, True

    def load(self, tensor: Tensor, indices: list[Expr]) -> Load:
        stage = self._stage_of(tensor)
        buffer = self.buffers[stage]
        origin = self.origins[stage]
        return Load(buffer, self.flat(buffer, [index - low for index, low in zip(indices, origin)]))

    @staticmethod
    def flat(buffer: Buffer, indices: list[Expr]) -> Expr:
        result: Expr | None = None
        for index, stride in zip(indices, buffer.strides):
            term = index * _int(stride) if stride != 1 else index
            result = term if result is None else result + term
        return result if result is not None else _int(0)

    def to_tir(self, expr: Expr, mapping: dict[Var, Expr]) -> Expr:
        def visit(node):
            if isinstance(node, Var):
                return mapping.get(node)
            if isinstance(node, TensorLoad):
                return self.load(node.tensor, [mutate(index, visit) for index in node.indices])
            if isinstance(node, Reduce):
                raise TEError(f"lower {self.name}: a reduction appears inside an expression")
            return None

        return mutate(expr, visit)

    def loop_kind(self, stage: Stage, iv: IterVar) -> tuple[ForKind, str | None]:
        if iv in stage.bindings:
            tag = stage.bindings[iv].thread_tag
            return (ForKind.UNROLLED, None) if tag == "vthread" else (ForKind.THREAD_BINDING, tag)
        return _KINDS.get(stage.annotations.get(iv), ForKind.SERIAL), None

    def allocate(self, stage: Stage) -> None:
        """The buffer a non-argument stage writes: its region, in the stage's scope."""
        if stage in self.buffers:
            return
        geometry = self.geometry(stage)
        extents = tuple(_upper(extent) for extent in geometry.extents)  # a symbolic region at its largest
        self.buffers[stage] = Buffer(stage.name, extents, stage.op.dtype, stage.scope)
        self.origins[stage] = geometry.mins
        self.allocated.append(stage)

    def attached(self, stage: Stage, iv: IterVar) -> list[Stage]:
        return [s for s in self.computes if s.attach_type == SCOPE and s.attach_stage is stage and s.attach_ivar is iv]

    def with_children(self, children: list[Stage], rest: Stmt) -> Stmt:
        """`rest` preceded by the nests of the stages attached here, inside their allocations."""
        parts: list[Stmt] = []
        for child in children:
            shared = child.scope == "shared"
            if shared and child.attach_type == SCOPE and not (parts and isinstance(parts[-1], Barrier)):
                parts.append(Barrier("shared"))
            parts.append(self.emit(child))
            if shared:
                parts.append(Barrier("shared"))
        body: Stmt = Seq((*parts, rest))
        for child in reversed(children):
            if child in self.allocated:
                body = Allocate(self.buffers[child], body)
        return body

    def prefetches(self, stage: Stage, iv: IterVar) -> list[Stmt]:
        """The prefetch loops of `stage` at the start of loop `iv`'s body, each element clamped into its tensor."""
        loops = []
        for hint in (hint for hint in stage.prefetches if hint.axis is iv):
            around = self.outer_path(stage) + stage.leaf_iter_vars[: stage.leaf_iter_vars.index(iv) + 1]
            used = [node for node in walk(hint.offset) if isinstance(node, IterVar)]
            outside = [node.name for node in used if node is not hint.line and node not in around]
            if outside:
                raise TEError(
                    f"lower {self.name}: a prefetch of {hint.tensor.name} in stage {stage.name} reads loop "
                    f"{', '.join(outside)}, which is not around loop {iv.name}"
                )
            buffer = self.buffers[self._stage_of(hint.tensor)]
            mapping = {node: self.loop_var(node) for node in used}
            element = Binary("min", self.to_tir(hint.offset, mapping), _int(buffer.size - 1))
            line = self.loop_var(hint.line)
            loops.append(For(line, _int(0), _int(hint.line.extent), ForKind.SERIAL, Prefetch(Load(buffer, element))))
        return loops

    def loops(self, stage: Stage, leaves: list[IterVar], body: Stmt, rename: dict | None = None) -> Stmt:
        geometry = self.geometry(stage)
        for iv in reversed(leaves):
            if rename is None:
                children = self.attached(stage, iv)
                if children:
                    body = self.with_children(children, body)
                hints = self.prefetches(stage, iv)
                if hints:
                    body = Seq((*hints, body))
            kind, tag = self.loop_kind(stage, iv)
            var = self.loop_var(iv)
            var = rename[var] if rename is not None else var
            body = For(var, _int(0), _extent(geometry.iter_extents[iv]), kind, body, tag)
        return body

    def emit(self, stage: Stage) -> Stmt:
        geometry = self.geometry(stage)
        buffer = self.buffers[stage]
        mapping = self.root_index(stage, geometry)
        origin = self.origins[stage]
        index = self.flat(buffer, [mapping[axis] - low for axis, low in zip(stage.op.axis, origin)])
        body = self.body(stage)
        leaves = stage.leaf_iter_vars
        if not isinstance(body, Reduce):
            store = _guard(geometry.data_conditions, Store(buffer, index, self.to_tir(body, mapping)))
            return self.loops(stage, leaves, store)
        value = self.to_tir(body.source, mapping)
        current = Load(buffer, index)
        combined = {"sum": current + value, "max": Binary("max", current, value), "min": Binary("min", current, value)}
        update = _guard(
            geometry.data_conditions + geometry.reduce_conditions, Store(buffer, index, combined[body.combiner])
        )
        first = next(position for position, iv in enumerate(leaves) if iv.kind == REDUCE)
        init_leaves = [iv for iv in leaves[first:] if iv.kind != REDUCE]
        rename = {self.loop_var(iv): Var(f"{iv.name}.init", "int32") for iv in init_leaves}
        init_store = _guard(geometry.data_conditions, Store(buffer, index, body.identity))
        init_store = substitute_stmt(init_store, rename)
        init = self.loops(stage, init_leaves, init_store, rename)
        nest = Seq((init, self.loops(stage, leaves[first:], update)))
        return self.loops(stage, leaves[:first], nest)

    def bind_sizes(self, body: Stmt) -> tuple[Stmt, list[Buffer]]:
        """A kernel that uses size vars takes one more argument, `sizes` (int32, a slot per size of the model), and
        reads each var from its slot before anything else; a static kernel's arguments and body stay as they were."""
        found: dict[str, SizeVar] = {}
        for stmt in walk_stmts(body):
            for node in _stmt_exprs(stmt):
                if isinstance(node, SizeVar) and found.setdefault(node.name, node) is not node:
                    raise TEError(f"lower {self.name}: two size vars are named {node.name}")
        if not found:
            return body, self.params
        missing = sorted(set(found) - set(self.sizes))
        if missing:
            raise TEError(f"lower {self.name}: the kernel uses the sizes {missing}, which lower's sizes do not list")
        sizes = Buffer(SIZES_ARGUMENT, (len(self.sizes),), "int32", "global")
        for name, var in sorted(found.items(), key=lambda item: -self.sizes.index(item[0])):
            body = LetStmt(var, Load(sizes, _int(self.sizes.index(name))), body)
        return body, [*self.params, sizes]

    def run(self) -> PrimFunc:
        for stage in self.computes:
            self.allocate(stage)
        roots = [stage for stage in self.computes if stage.attach_type == ROOT]
        body = self.with_children(roots, Seq(()))
        body, params = self.bind_sizes(body)
        func = simplify(PrimFunc(self.name, params, body))
        partitioned = {self.loop_var(iv) for stage in self.computes for iv in stage.partitions}
        if partitioned:
            func = simplify(partition_loops(func, partitioned))
        func = PrimFunc(func.name, func.params, _GuardSelects().visit(func.body))
        for stmt in walk_stmts(func.body):
            if isinstance(stmt, For) and stmt.kind in (ForKind.VECTORIZED, ForKind.UNROLLED):
                if not isinstance(stmt.extent, Const):
                    raise TEError(f"lower {self.name}: loop {stmt.var.name} is {stmt.kind.value} but not constant")
        return func


def _stmt_exprs(stmt: Stmt):
    """Every expression node directly in `stmt` (a loop's bounds, a store's index and value, a condition)."""
    for name in ("min", "extent", "index", "value", "condition"):
        expr = getattr(stmt, name, None)
        if isinstance(expr, Expr):
            yield from walk(expr)


def _guard(conditions: list[Expr], stmt: Stmt) -> Stmt:
    if not conditions:
        return stmt
    condition = conditions[0]
    for other in conditions[1:]:
        condition = Logical("and", (condition, other))
    return IfThen(condition, stmt)


def _in_bounds(expr: Expr, env) -> bool:
    for node in walk(expr):
        if isinstance(node, Load):
            low, high = bounds(node.index, env)
            if low is None or high is None or low < 0 or high >= node.buffer.size:
                return False
    return True


class _GuardSelects(ScopedMutator):
    """Select evaluates both arms; in a stored value, a select whose arm may read out of bounds (given the bounds of
    the loop and let vars in scope) becomes an IfThenElse, which evaluates only the taken arm."""

    def visit_expr(self, expr: Expr) -> Expr:
        return expr

    def visit_store(self, stmt: Store) -> Stmt:
        return Store(stmt.buffer, stmt.index, _SelectsToIfs(self.env).visit(stmt.value))

    def visit_for(self, stmt: For) -> Stmt:
        body = self.inside(stmt.var, loop_bounds(stmt.min, stmt.extent, self.env), stmt.body)
        return For(stmt.var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_tag)

    def visit_letstmt(self, stmt: LetStmt) -> Stmt:
        return LetStmt(stmt.var, stmt.value, self.inside(stmt.var, bounds(stmt.value, self.env), stmt.body))


class _SelectsToIfs(StmtMutator):
    def __init__(self, env):
        self.env = env

    def visit_select(self, node: Select) -> Expr:
        cond, true_value, false_value = (self.visit(e) for e in (node.cond, node.true_value, node.false_value))
        safe = _in_bounds(true_value, self.env) and _in_bounds(false_value, self.env)
        return Select(cond, true_value, false_value) if safe else IfThenElse(cond, true_value, false_value)


def lower(schedule: Schedule, args: list[Tensor], name: str, sizes=()) -> PrimFunc:
    """The loop IR of `schedule`, with one global buffer parameter per tensor of `args`, in order. A schedule over
    symbolic sizes (te.SizeVar) takes one more, SIZES_ARGUMENT: an int32 value per name of `sizes`, in order."""
    return _Lowering(schedule, list(args), name, sizes).run()
