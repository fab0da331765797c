"""Both runtimes check every argument before generated code sees a pointer."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.build import build_func
from compiler.errors import ShapeError
from compiler.te.expr import Const, Var
from compiler.tir.nodes import Buffer, For, ForKind, Load, PrimFunc, Store


def add_func() -> PrimFunc:
    in0, in1, out = (Buffer(name, (6,), "float32") for name in ("in0", "in1", "out"))
    i = Var("i")
    body = Store(out, i, Load(in0, i) + Load(in1, i))
    return PrimFunc("add", [in0, in1, out], For(i, Const(0, "int32"), Const(6, "int32"), ForKind.SERIAL, body))


@pytest.fixture(scope="module", params=["llvm", "wasm"])
def kernel(request):
    return build_func(add_func(), request.param)


def test_correct_call(kernel):
    a, b, out = np.arange(6, dtype="float32"), np.ones(6, "float32"), np.zeros(6, "float32")
    kernel(a, b, out)
    np.testing.assert_array_equal(out, a + 1)


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ((np.zeros(6, "float32"),) * 2, "takes 3 arrays \\(in0, in1, out\\), got 2"),
        ((np.zeros(6, "float32"), np.zeros(6, "float64"), np.zeros(6, "float32")), "'in1'.*dtype float32, got float64"),
        (
            (np.zeros(6, "float32"), np.zeros(6, "float32"), np.zeros(7, "float32")),
            "'out'.*shape \\(6,\\), got \\(7,\\)",
        ),
        ((np.zeros(6, "float32"), np.zeros(12, "float32")[::2], np.zeros(6, "float32")), "'in1'.*C-contiguous"),
        (([0.0] * 6, np.zeros(6, "float32"), np.zeros(6, "float32")), "'in0'.*numpy array, got list"),
    ],
)
def test_bad_arguments_raise_shape_error_naming_the_argument(kernel, arrays, message):
    with pytest.raises(ShapeError, match=message):
        kernel(*arrays)


def test_read_only_array_is_rejected(kernel):
    frozen = np.zeros(6, "float32")
    frozen.flags.writeable = False
    with pytest.raises(ShapeError, match="'in0'.*read-only"):
        kernel(frozen, np.zeros(6, "float32"), np.zeros(6, "float32"))
