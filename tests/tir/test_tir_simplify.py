"""Simplifier rules, each shown on the smallest expression or statement that needs it."""

import math

import pytest

import compiler.te as te
from compiler.te.expr import Binary, Compare, Const, Var
from compiler.tir.nodes import Buffer, For, ForKind, IfThen, Load, Seq, Store
from compiler.tir.printer import format_expr, format_stmt
from compiler.tir.simplify import bounds, simplify

x, y = Var("x"), Var("y")
RANGES = {x: (0, 15), y: (0, 3)}


def text(expr, env=None):
    return format_expr(simplify(expr, env))


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ((te.const(2) + 3) * 4, "20"),
        (Binary("div", te.const(-7), te.const(2)), "-3"),
        (te.const(-7) // 2, "-4"),
        (te.const(-7) % 2, "1"),
        (te.const(1.5) * 2.0, "3.0f"),
        (te.const(200, "uint8") + te.const(100, "uint8"), "uint8(44)"),
        (te.const(3).astype("float32"), "3.0f"),
        (te.const(2.7).astype("int32"), "2"),
    ],
)
def test_constant_folding(expr, expected):
    assert text(expr) == expected


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (x + 0, "x"),
        (x * 1, "x"),
        (x * 0, "0"),
        (x - x, "0"),
        ((x + 1) + 2, "x + 3"),
        ((x * 2) * 3, "x*6"),
        ((x + 2) * 3 - 6, "x*3"),
        (7 - x, "7 - x"),
        ((x + y) * 4 + x * 2, "(x*6) + (y*4)"),
    ],
)
def test_identities_and_linear_combination(expr, expected):
    assert text(expr) == expected


def test_float_identities_do_not_touch_times_zero():
    f = Var("f", "float32")
    assert text(f * 1.0) == "f"
    assert text(f + 0.0) == "f"
    assert text(f * 0.0) == "f*0.0f"


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ((x * 4 + y) // 4, "x"),
        ((x * 4 + y) % 4, "y"),
        ((x * 4 + y + 4) // 4, "x + 1"),
        ((x * 8 + y) // 4, "x*2"),
        (x // 16, "0"),
        (x % 16, "x"),
        (x // 3, "x / 3"),
        ((x * 6 + y * 2) % 3, "floormod(y*2, 3)"),
        ((x // 4) * 4 + x % 4, "x"),
    ],
)
def test_division_with_known_ranges(expr, expected):
    assert text(expr, RANGES) == expected


def test_division_of_possibly_negative_values_keeps_floor_semantics():
    z = Var("z")
    assert text(z // 4) == "floordiv(z, 4)"
    assert text(z % 4) == "floormod(z, 4)"


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (x < 16, "True"),
        (x < 15, "x < 15"),
        (x * 4 + y < 64, "True"),
        (x * 4 + y >= 64, "False"),
        (x + 1 > 0, "True"),
        (x - 1 >= 0, "x >= 1"),
        (te.all(x < 16, y < 2), "y < 2"),
        (te.any(x < 16, y < 2), "True"),
        (Compare("eq", x * 0, te.const(0)), "True"),
    ],
)
def test_comparisons_decided_from_ranges(expr, expected):
    assert text(expr, RANGES) == expected


def test_min_max_and_select_with_known_ranges():
    assert text(te.minimum(x, 20), RANGES) == "x"
    assert text(te.maximum(x, -1), RANGES) == "x"
    assert text(te.minimum(x, y), RANGES) == "min(x, y)"
    assert text(te.select(x < 16, x, y), RANGES) == "x"


def test_bounds_of_index_expressions():
    assert bounds(x * 4 + y, RANGES) == (0, 63)
    assert bounds(x % 5, RANGES) == (0, 4)
    assert bounds(x // 4, RANGES) == (0, 3)
    assert bounds(x - y, RANGES) == (-3, 15)
    assert bounds(Var("free"), RANGES) == (None, None)


def loop(var, extent, body, kind=ForKind.SERIAL):
    return For(var, Const(0, "int32"), Const(extent, "int32"), kind, body)


def test_guard_proven_by_loop_ranges_is_removed():
    out = Buffer("out", (64,), "float32")
    i, j = Var("i"), Var("j")
    store = Store(out, i * 4 + j, te.const(1.0))
    stmt = loop(i, 16, loop(j, 4, IfThen(i * 4 + j < 64, store)))
    assert format_stmt(simplify(stmt)) == "\n".join(
        [
            "for (i: int32, 0, 16) {",
            "  for (j: int32, 0, 4) {",
            "    out[(i*4) + j] = 1.0f",
            "  }",
            "}",
        ]
    )


def test_guard_that_may_fail_is_kept_and_constant_if_picks_a_branch():
    out = Buffer("out", (10,), "float32")
    i, j = Var("i"), Var("j")
    kept = loop(j, 3, loop(i, 8, IfThen(i + j < 9, Store(out, i, te.const(1.0)))))
    assert "if ((i + j) < 9) {" in format_stmt(simplify(kept))
    chosen = IfThen(te.const(1) > 2, Store(out, te.const(0), te.const(1.0)), Store(out, te.const(1), te.const(2.0)))
    assert format_stmt(simplify(chosen)) == "out[1] = 2.0f"


def test_a_bound_on_the_loop_variable_shortens_the_loop_and_other_tests_move_out():
    """A tail tile's guards: `column < 3` inside the unrolled column loop's vector loop becomes a loop of 3."""
    out = Buffer("out", (4, 10, 16), "float32")
    row, column, lane, rows = Var("row"), Var("column"), Var("lane"), Var("rows")
    store = Store(out, row * 160 + column * 16 + lane, te.const(1.0))
    guarded = IfThen(te.all(column < 3, row < rows), store)
    stmt = loop(row, 4, loop(column, 14, loop(lane, 16, guarded)))
    assert format_stmt(simplify(stmt)) == (
        "for (row: int32, 0, 4) {\n"
        "  if ((row - rows) < 0) {\n"
        "    for (column: int32, 0, 3) {\n"
        "      for (lane: int32, 0, 16) {\n"
        "        out[(row*160) + (column*16) + lane] = 1.0f\n"
        "      }\n"
        "    }\n"
        "  }\n"
        "}"
    )
    assert format_stmt(simplify(loop(column, 4, IfThen(column < 0, store)))) == ""


@pytest.mark.parametrize("kind", [ForKind.SERIAL, ForKind.VECTORIZED])
def test_loop_whose_whole_body_tests_its_end_runs_to_that_end(kind):
    """A split's guarded tail tile: `for (i, 0, 16) if (i < 13)` becomes `for (i, 0, 13)`, so a vector loop stays
    one vector body; a guard beyond the loop's end is dropped, one before its start drops the loop."""
    out = Buffer("out", (16,), "float32")
    i = Var("i")
    word = "vectorized " if kind == ForKind.VECTORIZED else ""
    tail = loop(i, 16, IfThen(i < 13, Store(out, i, te.const(1.0))), kind)
    assert format_stmt(simplify(tail)) == f"for (i: int32, 0, 13) {word}{{\n  out[i] = 1.0f\n}}"
    inclusive = loop(i, 16, IfThen(Compare("le", i, Const(4, "int32")), Store(out, i, te.const(1.0))), kind)
    assert format_stmt(simplify(inclusive)).startswith("for (i: int32, 0, 5)")
    assert format_stmt(simplify(loop(i, 16, IfThen(i < 0, Store(out, i, te.const(1.0)))))) == ""
    with_else = loop(i, 16, IfThen(i < 13, Store(out, i, te.const(1.0)), Store(out, i, te.const(2.0))))
    assert "if (i < 13) {" in format_stmt(simplify(with_else))


def test_loops_of_extent_one_disappear_and_empty_statements_vanish():
    out = Buffer("out", (4,), "float32")
    i, j = Var("i"), Var("j")
    stmt = loop(i, 4, loop(j, 1, Store(out, i + j, te.const(0.0))))
    assert format_stmt(simplify(stmt)) == "for (i: int32, 0, 4) {\n  out[i] = 0.0f\n}"
    assert format_stmt(simplify(Seq((loop(i, 0, Store(out, i, te.const(0.0))),)))) == ""


def test_a_reduction_step_that_adds_a_zero_product_is_dropped():
    """acc[i] = acc[i] + 0 * w (a padded tap that partitioning decided) adds nothing, and its loop goes with it;
    0 * w anywhere else stays, so an inf or NaN still shows."""
    acc, w = Buffer("acc", (4,), "float32"), Buffer("w", (4,), "float32")
    i, k = Var("i"), Var("k")
    step = Store(acc, i, Load(acc, i) + te.const(0.0) * Load(w, k))
    assert format_stmt(simplify(Seq((Store(acc, i, te.const(1.0)), loop(k, 4, step))))) == "acc[i] = 1.0f"
    other = Store(acc, i, Load(acc, i + 1) + te.const(0.0) * Load(w, k))
    assert "0.0f" in format_stmt(simplify(loop(k, 4, other)))
    assert "0.0f" in format_stmt(simplify(loop(k, 4, Store(acc, i, te.const(0.0) * Load(w, k)))))


def test_infinity_constants_survive():
    assert math.isinf(simplify(te.const(-math.inf) + 0.0).value)


def test_a_run_time_size_dividing_a_value_below_it():
    """A loop's var divided by the loop's symbolic extent, and a row clamped below a size, divided by that size (a
    KV cache's concat, a reshape of [past + seq] rows): the division folds away, where numeric bounds cannot show it."""
    past, seq = te.size_var("past", 0, 255), te.size_var("seq", 1, 256)
    out = Buffer("out", (1024,), "int32")
    row, wide = Var("row"), Var("wide")
    clamped = Binary("max", Binary("min", row - past, seq - 1), te.const(0))
    body = Seq(
        (
            Store(out, row, Binary("floormod", row, past + seq) + Binary("floordiv", row, past + seq)),
            Store(out, row + 512, Binary("floormod", clamped, seq)),
        )
    )
    loop = simplify(For(row, te.const(0), past + seq, ForKind.SERIAL, body))
    assert "floormod" not in format_stmt(loop) and "/" not in format_stmt(loop)
    # one row more than the size: its last value divides to 1, so the division stays
    longer = simplify(For(wide, te.const(0), past + seq + 1, ForKind.SERIAL, Store(out, wide, wide % (past + seq))))
    assert "floormod(wide, past + seq)" in format_stmt(longer)


def test_a_fused_loops_outer_index_stays_below_its_count():
    """A loop over (seq + 3) / 4 row tiles fused with 96 panels: the panel index, fused // tiles, is below 96, so the
    panel's column guard folds (it stayed in the vector loop of a symbolic wasm dense, 4x slower)."""
    seq = te.size_var("seq", 1, 256)
    tiles = (seq + 3) // 4
    fused, lane = Var("fused"), Var("lane")
    out = Buffer("out", (768,), "float32")
    panel = Binary("floordiv", fused, tiles)
    store = Store(out, panel * 8 + lane, te.const(1.0))
    guarded = IfThen(Compare("lt", panel * 8 + lane, te.const(768)), store)
    loop = For(
        fused, te.const(0), tiles * 96, ForKind.SERIAL, For(lane, te.const(0), te.const(8), ForKind.SERIAL, guarded)
    )
    text = format_stmt(simplify(loop))
    assert "if" not in text and "out[(min(floordiv(fused, (seq + 3) / 4), 95)*8) + lane] = 1.0f" in text
    # 97 tiles' worth of loop: the index may reach 96, and the guard stays
    longer = For(
        fused, te.const(0), tiles * 97, ForKind.SERIAL, For(lane, te.const(0), te.const(8), ForKind.SERIAL, guarded)
    )
    assert "if" in format_stmt(simplify(longer))
