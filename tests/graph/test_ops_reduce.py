"""Reductions, ArgMax/ArgMin and CumSum: shape rules and numpy references against onnxruntime."""

import numpy as np
import pytest
from single_node import check_op

from compiler.errors import ShapeError
from compiler.graph.ir import TensorType
from compiler.graph.registry import Pattern, get_op

RNG = np.random.default_rng(1)

REDUCTIONS = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceLogSum",
    "ReduceLogSumExp",
]
AXES = [None, (1,), (-1,), (0, 2), (2, 0, 1), ()]


def data(*shape, dtype="float32"):
    # positive values keep ReduceLogSum defined; the mix of magnitudes exercises accumulation
    return np.asarray(RNG.random(shape) * 2 + 0.1).astype(dtype)


def axes_input(axes):
    return None if axes is None else np.array(axes, dtype=np.int64)


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("axes", AXES, ids=str)
@pytest.mark.parametrize("op", REDUCTIONS)
def test_reductions(op, axes, keepdims):
    check_op(op, [data(3, 4, 5), axes_input(axes)], {"keepdims": keepdims})


@pytest.mark.parametrize("op", REDUCTIONS)
def test_empty_axes_with_noop_flag_pass_input_through(op):
    check_op(op, [data(3, 4), np.array([], dtype=np.int64)], {"noop_with_empty_axes": 1})


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_reductions(op, dtype):
    x = RNG.integers(-5, 6, (3, 4, 2)).astype(dtype)
    check_op(op, [x, np.array([1], dtype=np.int64)])


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMean"])
def test_axes_as_opset_13_attribute(op):
    # ReduceSum took axes as an input from opset 13, the others as an attribute until opset 18
    if op == "ReduceSum":
        check_op(op, [data(3, 4, 5)], {"axes": [1, 2], "keepdims": 0}, opset=11)
    else:
        check_op(op, [data(3, 4, 5)], {"axes": [1, 2], "keepdims": 0}, opset=13)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd", "ReduceLogSumExp"])
def test_empty_reduced_axis(op):
    check_op(op, [np.zeros((2, 0, 3), dtype=np.float32), np.array([1], dtype=np.int64)])


def test_log_sum_exp_does_not_overflow():
    x = np.array([[1000.0, 1000.0], [-1000.0, 0.0]], dtype=np.float32)
    check_op("ReduceLogSumExp", [x, np.array([1], dtype=np.int64)])


def test_float16_sum_accumulates_wider():
    x = np.full((4096,), 0.1, dtype=np.float16)
    check_op("ReduceSum", [x], rtol=1e-3)


@pytest.mark.parametrize("select_last_index", [0, 1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_reductions(op, axis, keepdims, select_last_index):
    # few distinct values, so ties exercise select_last_index
    x = RNG.integers(0, 3, (3, 4, 5)).astype(np.float32)
    check_op(op, [x], {"axis": axis, "keepdims": keepdims, "select_last_index": select_last_index})


def test_arg_max_on_integers():
    check_op("ArgMax", [RNG.integers(-9, 9, (4, 6)).astype(np.int32)], {"axis": 1})


def test_out_of_range_axis_is_a_shape_error():
    with pytest.raises(ShapeError, match="axis 3 is out of range"):
        get_op("ReduceSum").infer([TensorType((2, 3), "float32")], {"axes": (3,)})


def test_repeated_axis_is_a_shape_error():
    with pytest.raises(ShapeError, match="same axis twice"):
        get_op("ReduceMean").infer([TensorType((2, 3), "float32")], {"axes": (1, -1)})


@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumsum(axis, exclusive, reverse):
    check_op("CumSum", [data(3, 4, 5), np.array(axis, np.int64)], {"exclusive": exclusive, "reverse": reverse})


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_cumsum_on_integers_with_an_int32_axis(dtype):
    # RoBERTa's position ids: a running count of the tokens that are not padding
    check_op("CumSum", [RNG.integers(0, 2, (2, 9)).astype(dtype), np.array([1], np.int32)], {"exclusive": 1})


def test_cumsum_axis_out_of_range_or_missing_is_a_shape_error():
    cumsum = get_op("CumSum")
    with pytest.raises(ShapeError, match="CumSum axis 2 is out of range"):
        cumsum.infer([TensorType((2, 3), "float32")], {"axis": np.array(2)})
    with pytest.raises(ShapeError, match="axis .its second input. as a constant"):
        cumsum.infer([TensorType((2, 3), "float32")], {})


EINSUMS = [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhid, bhjd -> bhij", [(1, 2, 3, 4), (1, 2, 5, 4)]),  # attention's scores, as MaxViT's torch.einsum writes them
    ("...ij,...jk", [(2, 1, 3, 4), (1, 5, 4, 2)]),  # implicit output, the ellipsis broadcast
    ("ii->i", [(4, 4)]),
    ("ij->", [(3, 4)]),
    ("i,j->ji", [(3,), (4,)]),
    ("ijk->kij", [(2, 3, 4)]),
]


@pytest.mark.parametrize("equation, shapes", EINSUMS, ids=[equation for equation, _ in EINSUMS])
def test_einsum(equation, shapes):
    check_op("Einsum", [data(*shape) for shape in shapes], {"equation": equation})


def test_einsum_on_integers():
    x = RNG.integers(-4, 5, (3, 4)).astype(np.int64)
    check_op("Einsum", [x, x], {"equation": "ij,kj->ik"})


@pytest.mark.parametrize(
    "equation, shapes, message",
    [
        ("ij,jk->ik", [(2, 3)], "names 2 inputs, the node has 1"),
        ("ij,jk->ik", [(2, 3), (4, 5)], "'j' of 'ij,jk->ik' is 3 and 4 long"),
        ("ij->i", [(2, 3, 4)], "does not fit an input of shape"),
        ("...i->i", [(2, 3)], "drops the '...' dimensions"),
        ("ij->iz", [(2, 3)], "must name input letters once each"),
    ],
)
def test_einsum_equations_that_do_not_fit_are_shape_errors(equation, shapes, message):
    with pytest.raises(ShapeError, match=message):
        get_op("Einsum").infer([TensorType(shape, "float32") for shape in shapes], {"equation": equation})


@pytest.mark.parametrize("op", [*REDUCTIONS, "ArgMax", "ArgMin", "CumSum", "Einsum"])
def test_reductions_have_reduce_pattern(op):
    assert get_op(op).pattern_of({}) == Pattern.REDUCE
