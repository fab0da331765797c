"""GPU lowering: the loop IR of a thread-bound schedule (tir/lower.py) becomes a kernel a GPU codegen can print.

It reads each grid axis's extent from the THREAD_BINDING loops into `func.attrs["launch"]`, makes every loop of a tag
span that extent (a shorter one is guarded), runs work that sits outside a thread loop once (on thread 0 of that axis),
and refuses what `target.device` cannot run. The result still means the same when every loop runs serially (CPU).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from compiler.errors import GpuKernelError
from compiler.target import Target
from compiler.te.expr import Call, Cast, Compare, Const, Expr, Logical, Var
from compiler.tir.nodes import (
    Allocate,
    Barrier,
    Buffer,
    For,
    ForKind,
    IfThen,
    KernelCall,
    LetStmt,
    Load,
    PrimFunc,
    Seq,
    Stmt,
    Store,
    walk_stmts,
)
from compiler.tir.printer import format_func
from compiler.tir.simplify import substitute_stmt
from compiler.tir.visitor import StmtMutator, StmtVisitor, walk

# The dtype a kernel's arithmetic narrows to where the device lacks the wide one: ops compute in float64 or int64 for
# precision or range (Resize's coordinates, flat indices), never because a buffer holds it; storage of those dtypes
# is still refused (a graph pass narrows int64 tensors first, passes/narrow_int64.py).
NARROWER = {"float64": "float32", "int64": "int32"}

GRID_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
BLOCK_TAGS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")


def _int(value: int) -> Const:
    return Const(value, "int32")


def _thread_loops(stmt: Stmt) -> list[For]:
    return [s for s in walk_stmts(stmt) if isinstance(s, For) and s.kind == ForKind.THREAD_BINDING]


def _has_barrier(stmt: Stmt) -> bool:
    return any(isinstance(s, Barrier) for s in walk_stmts(stmt))


def _expressions(node: Stmt | Expr):
    """Every expression under `node`, parents first."""
    return (item for item in walk(node) if isinstance(item, Expr))


class _GpuLowering:
    def __init__(self, func: PrimFunc, target: Target):
        self.func = func
        self.target = target
        self.where = f"kernel {func.name} for target {target}"
        self.extents: dict[str, int] = {}

    def fail(self, message: str) -> None:
        raise GpuKernelError(f"{self.where}: {message}")

    def launch_extents(self, loops: list[For]) -> None:
        for loop in loops:
            if loop.thread_tag not in GRID_TAGS + BLOCK_TAGS:
                self.fail(f"loop {loop.var.name} is bound to {loop.thread_tag!r}, which is no GPU grid axis")
            if not isinstance(loop.extent, Const) or not isinstance(loop.min, Const):
                self.fail(f"the {loop.thread_tag} loop {loop.var.name} has no constant range; bind constant extents")
            self.extents[loop.thread_tag] = max(self.extents.get(loop.thread_tag, 1), int(loop.extent.value))

    def check_limits(self) -> None:
        device = self.target.device
        block = [self.extents.get(tag, 1) for tag in BLOCK_TAGS]
        grid = [self.extents.get(tag, 1) for tag in GRID_TAGS]
        for tags, sizes, limits in ((BLOCK_TAGS, block, device.max_block), (GRID_TAGS, grid, device.max_grid)):
            for tag, size, limit in zip(tags, sizes, limits):
                if size > limit:
                    self.fail(f"{tag} has extent {size}, above the device's {limit}; split that axis further")
        threads = int(np.prod(block))
        if threads > device.max_threads:
            self.fail(
                f"a block of {' x '.join(map(str, block))} = {threads} threads is above the device's "
                f"{device.max_threads}; bind fewer threads"
            )
        shared = 0
        for stmt in walk_stmts(self.func.body):
            if isinstance(stmt, Allocate) and stmt.buffer.scope == "shared":
                shared += stmt.buffer.size * np.dtype(stmt.buffer.dtype).itemsize
        if shared > device.shared_bytes:
            self.fail(
                f"its shared buffers take {shared} bytes, above the device's {device.shared_bytes}; use smaller tiles"
            )

    def check_dtypes(self) -> None:
        allowed = self.target.device.dtypes
        have = ", ".join(sorted(allowed))
        buffers = list(self.func.params)
        buffers += [s.buffer for s in walk_stmts(self.func.body) if isinstance(s, Allocate)]
        for buffer in buffers:
            if buffer.dtype not in allowed:
                self.fail(f"buffer {buffer.name} holds {buffer.dtype}, which {self.target.kind} has not ({have})")
        for node in _expressions(self.func.body):
            # a bool value is a comparison's result, not storage: every GPU language has it
            if node.dtype != "bool" and node.dtype not in allowed:
                self.fail(f"an expression computes in {node.dtype}, which {self.target.kind} has not ({have})")

    def check_placement(self, stmt: Stmt) -> None:
        _Placement(self.fail).visit(stmt)

    def check_buffers(self, loops: list[For]) -> None:
        """A kernel allocates no global memory, and a local buffer is private to a thread, so no thread loop inside
        its allocation may touch it. Loops of one tag are one hardware index, so a loop nested in another of its
        tag must not read the outer one's variable (lowering keeps cooperative stages free of it)."""
        for stmt in walk_stmts(self.func.body):
            if not isinstance(stmt, Allocate):
                continue
            buffer = stmt.buffer
            if buffer.scope == "global":
                self.fail(
                    f"it allocates the global buffer {buffer.name}, which a kernel cannot; inline that stage, give "
                    "it shared or local scope, or lower the parts of tir/gpu.py split_launches (a root one becomes "
                    "their workspace)"
                )
            if buffer.scope != "local":
                continue
            for loop in _thread_loops(stmt.body):
                if loop.thread_tag in BLOCK_TAGS and _touches(loop.body, buffer):
                    self.fail(
                        f"local buffer {buffer.name} is private to one thread, but the {loop.thread_tag} loop "
                        f"{loop.var.name} inside its allocation spreads it over threads; compute it inside the thread "
                        "loops, or give it shared scope"
                    )
        for loop in loops:
            for inner in _thread_loops(loop.body):
                if inner.thread_tag == loop.thread_tag and _reads_var(inner.body, loop.var):
                    self.fail(
                        f"loop {inner.var.name} is bound to {loop.thread_tag} inside loop {loop.var.name} of the same "
                        f"tag and reads {loop.var.name}; on a GPU both are one index"
                    )

    def widen(self, stmt: Stmt) -> Stmt:
        return _Widen(self.extents).visit(stmt)

    def once(self, stmt: Stmt) -> Stmt:
        return _Once(self).visit(stmt)

    def on_first(self, stmt: Stmt, tags: list[str]) -> Stmt:
        indices = [Var(f"{tag}.once", "int32") for tag in tags]
        tests = [Compare("eq", index, _int(0)) for index in indices]
        body: Stmt = IfThen(tests[0] if len(tests) == 1 else Logical("and", tuple(tests)), stmt)
        for tag, index in zip(reversed(tags), reversed(indices)):
            body = For(index, _int(0), _int(self.extents[tag]), ForKind.THREAD_BINDING, body, tag)
        return body

    def one_thread(self, body: Stmt) -> PrimFunc:
        """The kernel as `body` run by a launch of one thread."""
        launch = {"grid": [1, 1, 1], "block": [1, 1, 1]}
        return PrimFunc(self.func.name, self.func.params, body, {**self.func.attrs, "launch": launch})

    def run(self) -> PrimFunc:
        loops = _thread_loops(self.func.body)
        if not any(isinstance(stmt, Store) for stmt in walk_stmts(self.func.body)):
            # nothing to compute (the outputs are empty tensors): one thread that does nothing
            return self.one_thread(Seq(()))
        if not loops and not any(isinstance(stmt, For) for stmt in walk_stmts(self.func.body)):
            # a scalar (a 0-d value computed at run time, such as a dynamic quantization's scale): one thread
            self.check_dtypes()
            return self.one_thread(self.func.body)
        if not loops:
            self.fail(
                "it has no thread-bound loop (a CPU schedule); GPU kernels come from compiler/schedules/gpu.py, "
                "or bind axes with te.thread_axis"
            )
        launches = len(split_launches(self.func))
        if launches > 1:
            self.fail(
                f"its root stages read what earlier ones wrote, which needs {launches} launches (blocks of one launch "
                "never wait for each other); lower each of tir/gpu.py split_launches's parts instead"
            )
        self.launch_extents(loops)
        self.check_limits()
        self.check_dtypes()
        self.check_buffers(loops)
        widened = self.widen(self.func.body)
        self.check_placement(widened)
        body = self.once(widened)
        launch = {
            "grid": [self.extents.get(tag, 1) for tag in GRID_TAGS],
            "block": [self.extents.get(tag, 1) for tag in BLOCK_TAGS],
        }
        return PrimFunc(self.func.name, self.func.params, body, {**self.func.attrs, "launch": launch})


class _Narrow(StmtMutator):
    """Rewrites every expression computing in a dtype of `narrower` to compute in its image (casts, constants,
    intrinsic calls, variables; loads keep their buffer's dtype)."""

    def __init__(self, narrower: dict[str, str]):
        self.narrower = narrower
        self.vars: dict[Var, Var] = {}

    def visit_var(self, node: Var) -> Var:
        if node.dtype not in self.narrower:
            return node
        if node not in self.vars:
            self.vars[node] = Var(node.name, self.narrower[node.dtype])
        return self.vars[node]

    def visit_const(self, node: Const) -> Const:
        dtype = self.narrower.get(node.dtype)
        if dtype is None:
            return node
        return Const(float(node.value) if dtype.startswith("float") else int(node.value), dtype)

    def visit_cast(self, node: Cast):
        value = self.visit(node.value)
        dtype = self.narrower.get(node.dtype, node.dtype)
        return value if value.dtype == dtype else Cast(dtype, value)

    def visit_call(self, node: Call) -> Call:
        args = tuple(self.visit(arg) for arg in node.args)
        return Call(node.name, args, self.narrower.get(node.dtype, node.dtype))


def narrow_arithmetic(func: PrimFunc, dtypes: frozenset[str]) -> PrimFunc:
    """`func` with its float64/int64 arithmetic in float32/int32 where `dtypes` (a device's) lacks the wide one."""
    narrower = {wide: narrow for wide, narrow in NARROWER.items() if wide not in dtypes}
    if not narrower:
        return func
    return PrimFunc(func.name, func.params, _Narrow(narrower).visit(func.body), func.attrs)


class _Placement(StmtVisitor):
    """Every thread of a block must reach each barrier, so none may sit under a branch or loop whose test reads a
    thread index (`dependent`: those indices and lets of them; `branch` names the innermost such test)."""

    def __init__(self, fail):
        self.fail = fail
        self.dependent: frozenset[Var] = frozenset()
        self.branch: str | None = None

    def visit_expr(self, node: Expr) -> None:
        pass  # an expression holds no barrier

    def reads_dependent(self, *exprs: Expr) -> bool:
        return any(var in self.dependent for expr in exprs for var in walk(expr) if isinstance(var, Var))

    def within(self, dependent: frozenset[Var], branch: str | None, *bodies: Stmt | None) -> None:
        saved = self.dependent, self.branch
        self.dependent, self.branch = dependent, branch
        for body in bodies:
            if body is not None:
                self.visit(body)
        self.dependent, self.branch = saved

    def visit_barrier(self, node: Barrier) -> None:
        if self.branch is not None:
            self.fail(
                f"a barrier sits under {self.branch}, which depends on the thread, so not every thread reaches it; "
                "place shared stages (and their barriers) where every thread runs them (thread loops of the full "
                "extent)"
            )

    def visit_ifthen(self, node: IfThen) -> None:
        branch = "a test of the thread index" if self.reads_dependent(node.cond) else self.branch
        self.within(self.dependent, branch, node.then_body, node.else_body)

    def visit_for(self, node: For) -> None:
        dependent, branch = self.dependent, self.branch
        if node.kind == ForKind.THREAD_BINDING:
            if node.thread_tag in BLOCK_TAGS:
                dependent = dependent | {node.var}
        elif self.reads_dependent(node.min, node.extent):
            branch = f"loop {node.var.name}, whose range depends on the thread index"
        self.within(dependent, branch, node.body)

    def visit_letstmt(self, node: LetStmt) -> None:
        dependent = self.dependent | {node.var} if self.reads_dependent(node.value) else self.dependent
        self.within(dependent, self.branch, node.body)


class _Widen(StmtMutator):
    """Every loop of a tag spans the launch extent; one that is shorter tests its variable."""

    def __init__(self, extents: dict[str, int]):
        self.extents = extents

    def visit_expr(self, node: Expr) -> Expr:
        return node

    def visit_for(self, node: For) -> For:
        node = self.generic_visit(node)
        if node.kind != ForKind.THREAD_BINDING:
            return node
        launch, low, extent = self.extents[node.thread_tag], int(node.min.value), int(node.extent.value)
        body = node.body if low == 0 else substitute_stmt(node.body, {node.var: node.var + _int(low)})
        if extent < launch:
            body = IfThen(Compare("lt", node.var, _int(extent)), body)
        return For(node.var, _int(0), _int(launch), ForKind.THREAD_BINDING, body, node.thread_tag)


class _Once(StmtMutator):
    """Work outside the loops of some grid axes runs on index 0 of each of them, as it runs once on a CPU; a subtree
    with a barrier, or with a loop of such an axis, is split further so barriers stay where they were (`bound`: the
    tags of the thread loops around the statement being visited)."""

    def __init__(self, lowering: _GpuLowering):
        self.lowering = lowering
        self.bound: frozenset[str] = frozenset()

    def visit_expr(self, node: Expr) -> Expr:
        return node

    def visit_stmt(self, node: Stmt) -> Stmt:
        extents = self.lowering.extents
        missing = [tag for tag in GRID_TAGS + BLOCK_TAGS if tag in extents and tag not in self.bound]
        if not missing:
            return node
        inner_tags = {loop.thread_tag for loop in _thread_loops(node)}
        if not _has_barrier(node) and not inner_tags.intersection(missing):
            return self.lowering.on_first(node, missing)
        if not (isinstance(node, For) and node.kind == ForKind.THREAD_BINDING):
            return self.generic_visit(node)
        saved = self.bound
        self.bound = saved | {node.thread_tag}
        result = self.generic_visit(node)
        self.bound = saved
        return result


def _touches(stmt: Stmt, buffer) -> bool:
    return any(isinstance(node, Store | Load) and node.buffer is buffer for node in walk(stmt))


def _reads_var(stmt: Stmt, var: Var) -> bool:
    return any(node is var for node in walk(stmt))


def lower_gpu(func: PrimFunc, target: Target) -> PrimFunc:
    """`func` (from tir/lower.py, thread-bound) as a kernel for the GPU `target`, with attrs["launch"] =
    {"grid": [x, y, z], "block": [x, y, z]}; raises GpuKernelError for what the target's device cannot run."""
    if not target.is_gpu:
        raise GpuKernelError(f"kernel {func.name}: lower_gpu needs a GPU target (webgpu, opencl, cuda), not {target}")
    return _GpuLowering(narrow_arithmetic(func, target.device.dtypes), target).run()


def _globals(stmt: Stmt) -> tuple[set, set]:
    """The global buffers `stmt` reads and writes."""
    nodes = [node for node in walk(stmt) if isinstance(node, Store | Load) and node.buffer.scope == "global"]
    read = {node.buffer for node in nodes if isinstance(node, Load)}
    written = {node.buffer for node in nodes if isinstance(node, Store)}
    return read, written


def _spans_blocks(stmt: Stmt) -> bool:
    return any(
        loop.thread_tag in GRID_TAGS and not (isinstance(loop.extent, Const) and loop.extent.value == 1)
        for loop in _thread_loops(stmt)
    )


def split_launches(func: PrimFunc) -> list[PrimFunc]:
    """`func` as the kernels to launch one after another. Lowering runs a kernel's root stages in order, which a CPU
        keeps. On a GPU the blocks of one launch do not wait for each other, so a root stage that reads (or overwrites)
        what an earlier one wrote starts a new launch, unless both run in one block (outside every block loop), where a
    barrier between them is enough. Global
        buffers the kernel allocates at its root (an intermediate) become parameters after the kernel's own, its
        workspace; shared and local ones stay around the launch that uses them. One launch without workspace is `func`
        itself; otherwise the parts are named `<name>_part<i>` and each takes every parameter and every workspace buffer."""
    workspace, wrappers, body = [], [], func.body
    while isinstance(body, Allocate):
        (workspace if body.buffer.scope == "global" else wrappers).append(body.buffer)
        body = body.body
    launches: list[list[Stmt]] = [[]]
    # each global buffer the current launch read or wrote -> whether a statement doing so ran over several blocks
    launch_read: dict = {}
    launch_written: dict = {}
    synced_read, synced_written, threaded = set(), set(), False  # since the launch's last barrier
    barriers = 0
    for stmt in body.stmts if isinstance(body, Seq) else (body,):
        if isinstance(stmt, Barrier):
            launches[-1].append(stmt)
            synced_read, synced_written, threaded = set(), set(), False
            continue
        stmt_read, stmt_written = _globals(stmt)
        stmt_spans = _spans_blocks(stmt)
        stmt_threaded = any(loop.thread_tag in BLOCK_TAGS for loop in _thread_loops(stmt))
        conflicts = [launch_written[b] for b in stmt_read | stmt_written if b in launch_written]
        conflicts += [launch_read[b] for b in stmt_written if b in launch_read]
        if conflicts and (stmt_spans or any(conflicts)):
            launches.append([])
            launch_read, launch_written = {}, {}
            synced_read, synced_written, threaded = set(), set(), False
        elif ((stmt_read | stmt_written) & synced_written or stmt_written & synced_read) and (
            threaded or stmt_threaded
        ):
            # both sides run in block 0 only (lower_gpu's once rule), so its threads can wait for each other; work
            # outside every thread loop runs on thread 0 alone, in program order
            launches[-1].append(Barrier("global"))
            barriers += 1
            synced_read, synced_written, threaded = set(), set(), False
        launches[-1].append(stmt)
        for buffer in stmt_read:
            launch_read[buffer] = launch_read.get(buffer, False) or stmt_spans
        for buffer in stmt_written:
            launch_written[buffer] = launch_written.get(buffer, False) or stmt_spans
        synced_read |= stmt_read
        synced_written |= stmt_written
        threaded = threaded or stmt_threaded
    if len(launches) == 1 and not workspace and not barriers:
        return [func]
    params = [*func.params, *workspace]
    parts = []
    for position, launch in enumerate(launches):
        part: Stmt = Seq(tuple(launch))
        for buffer in reversed(wrappers):
            if len(launches) == 1 or _touches(part, buffer):
                part = Allocate(buffer, part)
        parts.append(PrimFunc(f"{func.name}_part{position}", params, part, dict(func.attrs)))
    for buffer in wrappers:
        users = [part.name for part in parts if _touches(part.body, buffer)]
        if len(users) > 1:
            raise GpuKernelError(
                f"kernel {func.name}: its {buffer.scope} buffer {buffer.name} is used by launches {', '.join(users)}, "
                "which cannot share it; compute that stage at a block loop of the stage that reads it"
            )
    return parts


def _region(buffer) -> tuple[str, int]:
    """The region a `run` parameter is (build.py names them input_i, output_i, params and arena)."""
    kind, _, index = buffer.name.rpartition("_")
    if kind in ("input", "output") and index.isdigit():
        return kind, int(index)
    if buffer.name in ("params", "arena"):
        return buffer.name, 0
    raise GpuKernelError(f"the run entry's parameter {buffer.name} is no region (input_i, output_i, params, arena)")


class _Renamed(StmtMutator):
    """A body with each buffer of `names` replaced by its stand-in, and each buffer it allocates by one named by the
    order of its allocation (a register cache is named after the tensor it holds)."""

    def __init__(self, names: dict):
        self.names = dict(names)

    def visit_allocate(self, node: Allocate):
        buffer = node.buffer
        self.names[buffer] = Buffer(f"local{len(self.names)}", buffer.shape, buffer.dtype, buffer.scope)
        return self.visit_load(node)

    def visit_load(self, node: Load | Store | Allocate):
        node = self.generic_visit(node)
        return dataclasses.replace(node, buffer=self.names[node.buffer]) if node.buffer in self.names else node

    visit_store = visit_load


def _shared_form(func: PrimFunc, used: list[int]) -> str:
    """`func` taking only its parameters at `used`, printed with them as stand-ins named by position and its own name
    a placeholder: equal for two launches that differ only in which buffers they are given."""
    names = {
        func.params[index]: Buffer(f"arg{position}", func.params[index].shape, func.params[index].dtype)
        for position, index in enumerate(used)
    }
    renamed = PrimFunc("launch", list(names.values()), _Renamed(names).visit(func.body), {})
    return f"{func.attrs.get('launch')}\n{format_func(renamed)}"


def share_launches(launches: dict[str, list[PrimFunc]]) -> tuple[list[PrimFunc], dict[str, list[tuple]]]:
    """Each kernel's launches (`split_launches`, lowered), each taking only the parameters it reads or writes, and
    those whose code is the same one function: the input transform and the matmuls of two Winograd convs of one shape
    whose epilogues differ, say (resnet18: 33 launches of 11 kernels, 19 functions). (The functions, and for each
    kernel its launches in order as (function, the positions of its parameters, workspace after them, it takes).)"""
    functions: dict[str, PrimFunc] = {}
    shared: dict[str, list[tuple]] = {}
    for kernel, parts in launches.items():
        shared[kernel] = []
        for part in parts:
            used = [index for index, buffer in enumerate(part.params) if _touches(part.body, buffer)]
            key = _shared_form(part, used)
            if key not in functions:
                functions[key] = PrimFunc(part.name, [part.params[i] for i in used], part.body, dict(part.attrs))
            shared[kernel].append((functions[key], used))
    return list(functions.values()), shared


def dispatch_list(
    run: PrimFunc, launches: dict[str, list[PrimFunc]], workspace_offset: int
) -> tuple[list[dict], int, list[PrimFunc]]:
    """The manifest's dispatch list of a whole model, shared by every GPU backend, the workspace bytes it needs and
    the functions its dispatches run. For each KernelCall of `run` (build.py's entry), in order, one dispatch per part
    of `launches[kernel]` (the kernel's `split_launches`, each lowered by `lower_gpu`, then `share_launches`): the
    function's name, the call's position, one binding per parameter the function takes (region, index, byte offset,
    bytes, dtype) and the launch dimensions. Workspace parameters are bound in the arena from `workspace_offset` on,
    one layout per kernel (its parts run in turn, so kernels share it)."""
    calls = run.body.stmts if isinstance(run.body, Seq) else (run.body,)
    for parts in launches.values():
        for func in parts:
            if "launch" not in func.attrs:
                raise GpuKernelError(f"kernel {func.name} has no launch dimensions; lower it with lower_gpu first")
    functions, shared = share_launches(launches)
    dispatches, workspace_bytes = [], 0
    for position, call in enumerate(calls):
        if not isinstance(call, KernelCall):
            raise GpuKernelError(f"the run entry holds a {type(call).__name__}; a GPU model runs kernel calls only")
        params = launches[call.func][0].params
        arguments = [(*_region(buffer), int(offset)) for buffer, offset in call.args]
        offset = workspace_offset
        for buffer in params[len(arguments) :]:
            arguments.append(("arena", 0, offset))
            offset += -(-buffer.size * np.dtype(buffer.dtype).itemsize // 64) * 64
        workspace_bytes = max(workspace_bytes, offset - workspace_offset)
        for func, used in shared[call.func]:
            bindings = [
                {
                    "region": arguments[index][0],
                    "index": arguments[index][1],
                    "offset": arguments[index][2],
                    "bytes": int(params[index].size * np.dtype(params[index].dtype).itemsize),
                    "dtype": params[index].dtype,
                }
                for index in used
            ]
            launch = func.attrs["launch"]
            dispatches.append(
                {
                    "kernel": func.name,
                    "call": position,
                    "bindings": bindings,
                    "grid": list(launch["grid"]),
                    "block": list(launch["block"]),
                }
            )
    return dispatches, workspace_bytes, functions
