"""Loop partitioning (compiler/tir/partition.py, asked for with Stage.partition): the loop IR it writes, and the
kernels built from it natively and in wasmtime against numpy."""

import numpy as np
import pytest

import compiler.te as te
from compiler.build import build
from compiler.compute.support import pad
from compiler.te import TEError
from compiler.te.expr import Compare
from compiler.te.tensor import walk
from compiler.tir.lower import lower
from compiler.tir.nodes import Buffer, For, ForKind, IfThen, PrimFunc, Store, walk_stmts
from compiler.tir.partition import partition_loops
from compiler.tir.printer import format_func, format_stmt
from compiler.tir.simplify import simplify

TARGETS = ["llvm", "wasm"]
RNG = np.random.default_rng(0)


def stencil(n: int, before: int = 1, after: int = 1):
    """b[i] = p[i] + 2 p[i + 1] + 3 p[i + 2] over a padded with `before` and `after` zeros (n + before + after - 2
    outputs), the padding inlined: a select whose test depends on i."""
    a = te.placeholder((1, 1, 1, n), name="A")
    padded = pad(a, [0, before], [0, after], 0.0, "P")
    m = n + before + after - 2
    b = te.compute((m,), lambda i: padded[0, 0, 0, i] + padded[0, 0, 0, i + 1] * 2.0 + padded[0, 0, 0, i + 2] * 3.0)
    schedule = te.create_schedule(b.op)
    schedule[padded].compute_inline()
    return schedule, a, b


def stencil_reference(x: np.ndarray, before: int, after: int) -> np.ndarray:
    p = np.concatenate([np.zeros(before, "float32"), x, np.zeros(after, "float32")])
    return p[:-2] + 2 * p[1:-1] + 3 * p[2:]


def outer_loops(func) -> list[For]:
    return [stmt for stmt in walk_stmts(func.body) if isinstance(stmt, For) and stmt.var.name == "i.outer"]


def stores(stmt) -> list[Store]:
    return [node for node in walk_stmts(stmt) if isinstance(node, Store)]


def run(schedule, args, target: str, x: np.ndarray, outputs: int) -> np.ndarray:
    kernel = build(schedule, args, target=target, name="kernel")
    out = np.zeros(outputs, "float32")
    kernel(x.reshape(1, 1, 1, -1), out)
    return out


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("n", "factor", "before", "after"), [(64, 8, 1, 1), (37, 8, 1, 1), (50, 4, 3, 2), (9, 4, 1, 1)]
)
def test_partitioned_stencil_matches_numpy_and_its_interior_has_no_test(target, n, factor, before, after):
    schedule, a, b = stencil(n, before, after)
    stage = schedule[b]
    outer, inner = stage.split(b.op.axis[0], factor)
    stage.vectorize(inner)
    stage.partition(outer)
    func = lower(schedule, [a, b], "stencil")
    tested = [any(isinstance(node, te.Select) for node in walk(store.value)) for store in stores(func.body)]
    # the border tiles keep the padding's select (the last also the guard of a split that does not divide); the
    # interior tiles (a loop, or one substituted tile) have none
    assert any(tested) and not all(tested), format_func(func)
    x = RNG.standard_normal(n).astype("float32")
    expected = stencil_reference(x, before, after)
    np.testing.assert_allclose(run(schedule, [a, b], target, x, len(expected)), expected, rtol=1e-5, atol=1e-6)


def test_a_loop_is_cut_where_the_tests_of_its_body_are_decided():
    schedule, a, b = stencil(64)
    stage = schedule[b]
    outer, inner = stage.split(b.op.axis[0], 8)
    stage.vectorize(inner)
    stage.partition(outer)
    loops = outer_loops(lower(schedule, [a, b], "stencil"))
    # i = 8 * outer + inner reads p[i .. i + 2] = a[i - 1 .. i + 1]: a[-1] in tile 0 and a[64] in tile 7
    assert [(loop.min.value, loop.extent.value) for loop in loops] == [(1, 6)]
    printed = format_func(lower(schedule, [a, b], "stencil"))
    assert printed.count("select(") == 2, printed


def test_two_tiles_that_are_both_borders_keep_one_test_each():
    """16 outputs in 2 tiles of 8: no tile is free of tests, but each piece knows which side it is on."""
    schedule, a, b = stencil(16)
    outer, inner = schedule[b].split(b.op.axis[0], 8)
    schedule[b].vectorize(inner)
    schedule[b].partition(outer)
    func = lower(schedule, [a, b], "stencil")
    assert not outer_loops(func)  # two pieces of one tile each, the tile index substituted
    tests = [
        sum(
            isinstance(node, te.Compare)
            for select in walk(store.value)
            if isinstance(select, te.Select)
            for node in walk(select.cond)
        )
        for store in stores(func.body)
    ]
    assert tests == [1, 1], format_func(func)
    x = RNG.standard_normal(16).astype("float32")
    np.testing.assert_allclose(run(schedule, [a, b], "llvm", x, 16), stencil_reference(x, 1, 1), rtol=1e-5, atol=1e-6)


def test_a_decreasing_index_is_partitioned_too():
    """out[i] = p[n + 1 - i]: the test's coefficient is negative."""
    n = 40
    a = te.placeholder((1, 1, 1, n), name="A")
    padded = pad(a, [0, 1], [0, 1], 0.0, "P")
    b = te.compute((n + 2,), lambda i: padded[0, 0, 0, n + 1 - i] * 2.0)
    schedule = te.create_schedule(b.op)
    schedule[padded].compute_inline()
    outer, inner = schedule[b].split(b.op.axis[0], 6)
    schedule[b].vectorize(inner)
    schedule[b].partition(outer)
    loops = outer_loops(lower(schedule, [a, b], "reverse"))
    assert len(loops) == 1 and loops[0].min.value == 1
    x = RNG.standard_normal(n).astype("float32")
    expected = 2 * np.concatenate([[0], x, [0]])[::-1].astype("float32")
    np.testing.assert_allclose(run(schedule, [a, b], "llvm", x, n + 2), expected, rtol=1e-6)


def test_loops_without_tests_on_their_var_are_left_whole():
    a = te.placeholder((4, 16), name="A")
    b = te.compute((4, 16), lambda i, j: te.select(i >= 2, a[i, j], 0.0), name="B")
    plain = te.create_schedule(b.op)
    marked = te.create_schedule(b.op)
    marked[b].partition(marked[b].op.axis[1])  # j: the test is on i
    assert format_func(lower(plain, [a, b], "f")) == format_func(lower(marked, [a, b], "f"))


def test_a_test_that_is_not_linear_in_the_var_leaves_the_loop_whole():
    a = te.placeholder((16,), name="A")
    b = te.compute((16,), lambda i: te.select(i % 4 >= 1, a[i], 0.0), name="B")
    schedule = te.create_schedule(b.op)
    schedule[b].partition(b.op.axis[0])
    func = lower(schedule, [a, b], "f")
    (loop,) = [stmt for stmt in walk_stmts(func.body) if isinstance(stmt, For)]
    assert (loop.min.value, loop.extent.value) == (0, 16)


def rows_stencil(rows: int, columns: int):
    """b[r, c] = p[r, c] + 2 p[r + 1, c] + 3 p[r + 2, c] over `a` padded with a zero row above and below, the padding
    inlined, the (rows x columns) outputs one parallel loop (fused), as a blocked conv's tasks are."""
    a = te.placeholder((1, 1, rows, columns), name="A")
    padded = pad(a, [1, 0], [1, 0], 0.0, "P")
    b = te.compute(
        (rows, columns),
        lambda r, c: padded[0, 0, r, c] + padded[0, 0, r + 1, c] * 2.0 + padded[0, 0, r + 2, c] * 3.0,
        name="B",
    )
    schedule = te.create_schedule(b.op)
    schedule[padded].compute_inline()
    fused = schedule[b].fuse(*b.op.axis)
    schedule[b].parallel(fused)
    return schedule, a, b, fused


@pytest.mark.parametrize("target", TARGETS)
def test_a_parallel_loop_branches_on_the_row_its_tests_read(target):
    """A parallel loop stays one loop (one job), and its body branches on the row (fused / columns) that the padding's
    tests read: the first row, the interior rows (the row clamped into their range, so the simplifier knows it) and
    the last row, none of which tests anything."""
    rows, columns = 6, 5
    schedule, a, b, fused = rows_stencil(rows, columns)
    schedule[b].partition(fused)
    func = lower(schedule, [a, b], "rows")
    (loop,) = [stmt for stmt in walk_stmts(func.body) if isinstance(stmt, For)]
    assert loop.kind.value == "parallel" and loop.extent.value == rows * columns
    tested = [any(isinstance(node, te.Select) for node in walk(store.value)) for store in stores(func.body)]
    assert tested == [False, False, False], format_func(func)
    assert format_func(func).count("if (r.c.fused.piece < ") == 2, format_func(func)
    x = RNG.standard_normal((rows, columns)).astype("float32")
    padded = np.concatenate([np.zeros((1, columns), "float32"), x, np.zeros((1, columns), "float32")])
    expected = padded[:-2] + 2 * padded[1:-1] + 3 * padded[2:]
    kernel = build(schedule, [a, b], target=target, name="kernel")
    out = np.zeros((rows, columns), "float32")
    kernel(x.reshape(1, 1, rows, columns), out)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_a_vectorized_loop_is_not_partitioned():
    a = te.placeholder((16,), name="A")
    b = te.compute((16,), lambda i: a[i] * 2.0, name="B")
    schedule = te.create_schedule(b.op)
    schedule[b].vectorize(b.op.axis[0])
    with pytest.raises(TEError, match="only a serial or parallel loop is partitioned"):
        schedule[b].partition(b.op.axis[0])
    schedule = te.create_schedule(b.op)
    schedule[b].partition(b.op.axis[0])
    with pytest.raises(TEError, match="it is partitioned"):
        schedule[b].vectorize(b.op.axis[0])


def test_a_loop_of_a_run_time_extent_is_cut_at_its_constant_cuts():
    """Row tiles of 6 over `(seq + 5) / 6`, laid out for 256 rows (not a multiple of 6): the tiles before the 42nd
    test nothing, and a last piece, from 42 to the loop's end, keeps the row test (it stayed in every tile, inside
    the multiply-add loop of a symbolic dense whose rows run serially in its panel's task)."""
    seq = te.size_var("seq", 1, 256)
    tile, row = te.expr.Var("tile"), te.expr.Var("row")
    out = Buffer("out", (256,), "float32")
    index = tile * 6 + row
    body = For(
        row,
        te.const(0),
        te.const(6),
        ForKind.UNROLLED,
        IfThen(Compare("lt", index, te.const(256)), Store(out, index, te.const(1.0))),
    )
    loop = For(tile, te.const(0), (seq + 5) // 6, ForKind.SERIAL, body)
    func = simplify(partition_loops(PrimFunc("k", [out], loop), {tile}))
    first, second = [stmt for stmt in walk_stmts(func.body) if isinstance(stmt, For) and stmt.var is tile]
    assert format_stmt(first).splitlines()[0] == "for (tile: int32, 0, min(42, (seq + 5) / 6)) {"
    assert not any(isinstance(stmt, IfThen) for stmt in walk_stmts(first))
    assert first.min.value == 0 and second.min.value == 42
    assert any(isinstance(stmt, IfThen) for stmt in walk_stmts(second))
