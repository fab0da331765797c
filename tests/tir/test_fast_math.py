"""The shapes tir/fast_math.py's expansions take, on the loop IR (their accuracy is measured compiled, in
tests/codegen/test_llvm_codegen.py)."""

import pytest

from compiler.te.expr import Binary, Call, Var
from compiler.te.tensor import walk
from compiler.tir.fast_math import expand_expr


def test_erf_expands_to_one_form_without_exp():
    """Every lane computes one polynomial ratio: no exp, no select between two approximations."""
    x = Var("x", "float32")
    expanded = expand_expr(Call("erf", (x,), "float32"), native=("exp", "log", "abs", "floor"))
    names = {node.name for node in walk(expanded) if isinstance(node, Call)}
    divisions = [node for node in walk(expanded) if isinstance(node, Binary) and node.op == "div"]
    assert "exp" not in names and len(divisions) == 1


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sin_and_cos_read_their_operand_once(name):
    """A rotary embedding's angle is an expression of positions and frequencies: the expansion binds it, so it is
    written out once, not at each of the reduction's reads of it (a Llama kernel grew to 0.9 MB of LLVM IR)."""
    x, y = Var("x", "float32"), Var("y", "float32")
    angle = x * y + x
    expanded = expand_expr(Call(name, (angle,), "float32"), native=("exp", "log", "abs", "floor", "round"))
    assert sum(1 for node in walk(expanded) if node is angle) == 1
    assert not any(isinstance(node, Call) and node.name in ("sin", "cos") for node in walk(expanded))
