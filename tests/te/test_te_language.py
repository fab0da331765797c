"""The tensor-expression language: tensors, computes, reductions, intrinsics and their errors."""

import math

import pytest

import compiler.te as te
from compiler.te import TEError
from compiler.te.expr import Binary, Call, IfThenElse
from compiler.te.tensor import DATA_PAR, REDUCE, THREAD, identity_element


def test_placeholder_and_compute_carry_shape_dtype_and_axes():
    a = te.placeholder((3, 4), "float16", name="A")
    b = te.compute((3, 4), lambda i, j: a[i, j] * 2.0, name="B", tag="elemwise")
    assert (a.shape, a.dtype, a.name) == ((3, 4), "float16", "A")
    assert (b.shape, b.dtype, b.op.tag) == ((3, 4), "float16", "elemwise")
    i, j = b.op.axis
    assert (i.name, i.dom, i.kind) == ("i", (0, 3), DATA_PAR)
    assert (j.name, j.extent) == ("j", 4)
    assert b.op.input_tensors == [a]
    assert b.op.reduce_axis == ()


def test_compute_with_star_args_names_axes_by_position():
    a = te.placeholder((2, 3, 4), name="A")
    b = te.compute(a.shape, lambda *index: a[index] + 1.0, name="B")
    assert [iv.name for iv in b.op.axis] == ["ax0", "ax1", "ax2"]


def test_reduce_axis_and_reducers():
    a = te.placeholder((5, 7), "int8", name="A")
    k = te.reduce_axis((0, 7), name="k")
    assert (k.dom, k.kind) == ((0, 7), REDUCE)
    total = te.compute((5,), lambda i: te.sum(a[i, k].astype("int32"), axis=k), name="T")
    assert total.dtype == "int32"
    assert total.op.reduce_axis == (k,)
    assert total.op.body.identity.value == 0
    high = te.compute((5,), lambda i: te.max(a[i, k], axis=[k]), name="M")
    assert high.op.body.identity.value == -128


@pytest.mark.parametrize(
    ("combiner", "dtype", "expected"),
    [
        ("sum", "float32", 0.0),
        ("max", "float32", -math.inf),
        ("min", "float16", math.inf),
        ("max", "int32", -(2**31)),
        ("min", "int64", 2**63 - 1),
        ("max", "uint8", 0),
        ("min", "uint8", 255),
        ("min", "int8", 127),
        ("max", "bool", False),
        ("min", "bool", True),
    ],
)
def test_reducer_identity_elements(combiner, dtype, expected):
    identity = identity_element(combiner, dtype)
    assert identity.dtype == dtype and identity.value == expected


def test_elementwise_helpers_build_the_right_nodes():
    a = te.placeholder((4,), name="A")
    x = a[0]
    assert isinstance(te.maximum(x, 0.0), Binary) and te.maximum(x, 0.0).op == "max"
    assert te.minimum(1, x).dtype == "float32"
    assert isinstance(te.if_then_else(x > 0.0, x, 0.0), IfThenElse)
    for name in ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "floor", "ceil", "round", "abs"):
        node = getattr(te, name)(x)
        assert isinstance(node, Call) and node.name == name and node.dtype == "float32"
    assert te.pow(x, 2.0).op == "pow"
    assert te.const(3, "int8").dtype == "int8"
    assert te.var("n").dtype == "int32"
    assert te.any(x > 0.0, x < -1.0).op == "or"


def test_thread_axis():
    tx = te.thread_axis("threadIdx.x")
    assert (tx.kind, tx.thread_tag) == (THREAD, "threadIdx.x")
    with pytest.raises(TEError, match="unknown thread tag 'threadIdx.w'"):
        te.thread_axis("threadIdx.w")


def test_language_errors():
    a = te.placeholder((4, 4), name="A")
    k = te.reduce_axis((0, 4), name="k")
    with pytest.raises(TEError, match="a reduction must be the whole body"):
        te.compute((4,), lambda i: te.sum(a[i, k], axis=k) + 1.0, name="Bad")
    with pytest.raises(TEError, match="tensor A has 2 dimensions but was indexed with 1"):
        a[0]
    with pytest.raises(TEError, match="indexed with a float32 expression"):
        a[0, a[0, 0]]
    with pytest.raises(TEError, match="unknown dtype 'float8'"):
        te.placeholder((2,), "float8")
    with pytest.raises(TEError, match="is not a reduce axis"):
        te.sum(a[0, 0], axis=te.compute((4,), lambda i: a[i, i]).op.axis[0])
    with pytest.raises(TEError, match="empty range"):
        te.reduce_axis((3, 3), name="r")
    with pytest.raises(TEError, match="use te.all/te.any/te.select"):
        bool(a[0, 0] > 1.0)
    # == on expressions is Python's identity test: a condition built with it is a bool, refused, not a branch taken
    with pytest.raises(TEError, match="compare with te.equal"):
        te.select(a[0, 0] == 1.0, a[0, 0], 0.0)
    assert te.equal(a[0, 0], 1.0).dtype == "bool"
    with pytest.raises(TEError, match="needs a float expression"):
        te.exp(te.const(1))
    with pytest.raises(TEError, match="must not be negative"):
        te.placeholder((-1,), name="Neg")
