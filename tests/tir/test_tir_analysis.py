"""The target-neutral index analysis of tir/analysis.py, which the LLVM emitter widens loads and loops by and the
C-like and WGSL printers can read: affine coefficients (through lets), clamped runs and the widening decision."""

from compiler.te.expr import Binary, Const, Var
from compiler.tir.analysis import affine_coefficient, can_widen, clamped_run
from compiler.tir.nodes import Buffer, IfThen, LetStmt, Load, Seq, Store


def _int(value: int) -> Const:
    return Const(value, "int32")


def test_affine_coefficients_see_through_lets_and_refuse_products_of_the_var():
    i, j, k = Var("i"), Var("j"), Var("k")
    index = Binary("add", Binary("mul", i, _int(4)), Binary("sub", j, k))
    assert affine_coefficient(index, i, {}) == 4
    assert affine_coefficient(index, j, {}) == 1
    assert affine_coefficient(index, k, {}) == -1
    assert affine_coefficient(index, Var("other"), {}) == 0
    assert affine_coefficient(index, i, {k: Binary("mul", _int(3), i)}) == 1
    assert affine_coefficient(Binary("mul", i, i), i, {}) is None
    assert affine_coefficient(Binary("floordiv", i, _int(2)), i, {}) is None


def test_a_clamped_padded_row_is_a_run_once_the_clamp_is_dropped():
    lane, row = Var("lane"), Var("row")
    position = Binary("sub", lane, _int(1))
    clamp = Binary("max", Binary("min", position, _int(31)), _int(0))
    index = Binary("add", Binary("mul", row, _int(32)), clamp)
    found = clamped_run(index, lane, {})
    assert found is not None
    run, low, high, unclamped = found
    assert run is position and (low, high) == (0, 31)
    assert affine_coefficient(unclamped, lane, {}) == 1
    assert clamped_run(Binary("add", Binary("mul", row, _int(32)), lane), lane, {}) is None


def test_a_body_widens_only_when_its_lanes_cannot_see_each_others_writes():
    i = Var("i")
    a, b = Buffer("a", (8,), "float32"), Buffer("b", (8,), "float32")
    assert can_widen(Store(b, i, Binary("mul", Load(a, i), Const(2.0, "float32"))), i)
    total = Store(b, _int(0), Binary("add", Load(b, _int(0)), Load(a, i)))
    assert not can_widen(total, i), "a sum into one element"
    shifted = Seq((Store(b, i, Load(a, i)), Store(a, i, Load(b, Binary("add", i, _int(1))))))
    assert not can_widen(shifted, i), "a lane reads what the next lane wrote"
    assert not can_widen(IfThen(Binary("add", i, _int(1)), Store(b, i, Load(a, i))), i)
    doubled = Var("doubled")
    assert can_widen(LetStmt(doubled, Binary("mul", i, _int(1)), Store(b, doubled, Load(a, doubled))), i)
