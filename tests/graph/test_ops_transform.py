"""Data-movement and shape ops: shape rules and numpy references against onnxruntime."""

import numpy as np
import pytest
from onnx import numpy_helper
from single_node import check_op

from compiler.errors import ShapeError, UnsupportedOpError
from compiler.graph.ir import TensorType
from compiler.graph.registry import Pattern, get_op

RNG = np.random.default_rng(2)
INT_MAX = np.iinfo(np.int64).max


def data(*shape, dtype="float32"):
    return np.asarray(RNG.standard_normal(shape)).astype(dtype)


def ints(*values):
    return np.array(values, dtype=np.int64)


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis):
    check_op("Flatten", [data(2, 3, 4, 5)], {"axis": axis})


@pytest.mark.parametrize(
    ("shape", "allowzero"),
    [((4, 15), 0), ((-1,), 0), ((0, -1), 0), ((2, 0, 5, 2), 0), ((3, -1, 2), 0), ((2, 3, 10), 1)],
)
def test_reshape(shape, allowzero):
    check_op("Reshape", [data(2, 3, 10), ints(*shape)], {"allowzero": allowzero})


def test_reshape_allowzero_makes_empty_tensors():
    check_op("Reshape", [data(0, 3), ints(3, 0)], {"allowzero": 1})


def test_reshape_to_wrong_size_is_a_shape_error():
    with pytest.raises(ShapeError, match="needs 8 elements"):
        get_op("Reshape").infer([TensorType((2, 3), "float32")], {"shape": (2, 4)})


@pytest.mark.parametrize("perm", [None, (0, 2, 1, 3), (3, 1, 0, 2)])
def test_transpose(perm):
    check_op("Transpose", [data(2, 3, 4, 5)], {} if perm is None else {"perm": perm})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for index, shape in enumerate(shapes):
        shape[axis] += index
    check_op("Concat", [data(*shape) for shape in shapes], {"axis": axis})


def test_concat_of_disagreeing_shapes_is_a_shape_error():
    types = [TensorType((2, 3), "float32"), TensorType((3, 3), "float32")]
    with pytest.raises(ShapeError, match="Concat"):
        get_op("Concat").infer(types, {"axis": 1})


@pytest.mark.parametrize(
    ("shape", "axis", "split", "outputs", "attrs"),
    [
        ((6, 4), 0, None, 3, {}),
        ((6, 4), 1, None, 2, {}),
        ((6, 4), 0, (1, 2, 3), 3, {}),
        ((6, 4), -1, (3, 1), 2, {}),
        ((7, 4), 0, None, 3, {"num_outputs": 3}),
        ((4, 8), 1, None, 4, {"num_outputs": 4}),
    ],
)
def test_split(shape, axis, split, outputs, attrs):
    split_input = None if split is None else ints(*split)
    check_op("Split", [data(*shape), split_input], {"axis": axis, **attrs}, outputs=outputs)


def test_split_as_opset_11_attribute():
    check_op("Split", [data(6, 2)], {"axis": 0, "split": [2, 4]}, outputs=2, opset=11)


SLICES = [
    ((0,), (2,), None, None),
    ((1, 0), (3, -1), (0, 2), None),
    ((-1,), (-INT_MAX,), (1,), (-1,)),
    ((INT_MAX,), (0,), (2,), (-2,)),
    ((0, 1), (INT_MAX, INT_MAX), (-1, 1), (2, 3)),
    ((10,), (20,), (0,), None),
    ((-100,), (100,), (2,), (3,)),
    ((2,), (1,), (0,), (1,)),
    ((-2, 3), (-5, 0), (1, 2), (-1, -2)),
]


@pytest.mark.parametrize(("starts", "ends", "axes", "steps"), SLICES)
def test_slice(starts, ends, axes, steps):
    inputs = [data(4, 5, 6), ints(*starts), ints(*ends)]
    inputs += [None if axes is None else ints(*axes), None if steps is None else ints(*steps)]
    check_op("Slice", inputs)


def test_slice_as_opset_1_attributes():
    check_op("Slice", [data(4, 5)], {"starts": [1, 0], "ends": [3, 10], "axes": [0, 1]}, opset=1)


@pytest.mark.parametrize("axes", [None, (0,), (-1,), (0, 2)])
def test_squeeze(axes):
    check_op("Squeeze", [data(1, 3, 1), None if axes is None else ints(*axes)])


def test_squeeze_of_a_long_axis_is_a_shape_error():
    with pytest.raises(ShapeError, match="size 3, not 1"):
        get_op("Squeeze").infer([TensorType((1, 3), "float32")], {"axes": (1,)})


@pytest.mark.parametrize("axes", [(0,), (-1,), (1, 0), (0, 3), (2, -1)])
def test_unsqueeze(axes):
    check_op("Unsqueeze", [data(3, 4), ints(*axes)])


@pytest.mark.parametrize(
    ("pads", "mode", "value", "axes"),
    [
        ((1, 2, 0, 3), "constant", None, None),
        ((1, 2, 0, 3), "constant", 1.5, None),
        ((0, -1, 2, -2), "constant", 0.0, None),
        ((1, 2, 2, 1), "reflect", None, None),
        ((2, 0, 1, 3), "edge", None, None),
        ((2, 1, 1, 3), "wrap", None, None),
        ((1, 2), "constant", 2.0, (-1,)),
        ((2, 1), "reflect", None, (0,)),
    ],
)
def test_pad(pads, mode, value, axes):
    inputs = [data(4, 5), ints(*pads), None if value is None else np.array(value, dtype=np.float32)]
    inputs.append(None if axes is None else ints(*axes))
    check_op("Pad", inputs, {"mode": mode})


def test_pad_integers():
    check_op("Pad", [ints(1, 2, 3), ints(1, 2), np.array(9, dtype=np.int64)])


def test_pad_as_opset_2_attributes():
    check_op("Pad", [data(3, 4)], {"pads": [0, 1, 1, 0], "value": 3.0}, opset=2)


@pytest.mark.parametrize(
    ("axis", "indices"),
    [
        (0, ints(0, 2, -1)),
        (1, ints([0, -2], [3, 1])),
        (-1, np.array(2, dtype=np.int64)),
        (2, np.array([1, 0], "int32")),
    ],
)
def test_gather(axis, indices):
    check_op("Gather", [data(4, 5, 3), indices], {"axis": axis})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis):
    indices = RNG.integers(-3, 3, (3, 3)).astype(np.int64)
    check_op("GatherElements", [data(3, 3), indices], {"axis": axis})


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_scatter_elements(axis, dtype):
    """Distinct positions along each line (ONNX leaves repeats undefined without a reduction), some counted from the
    end; indices shorter than the data off the axis leave the rest as it is."""
    line = RNG.permutation(4)[:3] - np.array([4, 0, 4])
    indices = np.moveaxis(np.broadcast_to(line, (2, 3)), -1, axis if axis >= 0 else 1).astype(dtype)
    shape = (4, 5) if axis == 0 else (5, 4)
    check_op("ScatterElements", [data(*shape), indices, data(*indices.shape)], {"axis": axis})


@pytest.mark.parametrize("reduction", ["add", "max", "min"])
def test_scatter_elements_reductions_combine_repeated_positions(reduction):
    indices = np.array([[0, 2, 2, 0], [1, 1, 1, 3]], np.int64)
    check_op("ScatterElements", [data(2, 4), indices, data(2, 4)], {"axis": 1, "reduction": reduction}, opset=18)


def test_scatter_elements_mul_and_mismatched_updates_are_refused():
    scatter = get_op("ScatterElements")
    types = [TensorType((2, 4), "float32"), TensorType((2, 3), "int64"), TensorType((2, 3), "float32")]
    with pytest.raises(UnsupportedOpError, match="reduction='mul' is not supported"):
        scatter.infer(types, {"reduction": "mul"})
    with pytest.raises(ShapeError, match="do not address data of shape"):
        scatter.infer([*types[:2], TensorType((2, 2), "float32")], {})
    assert scatter.pattern_of({}) == Pattern.REDUCE


@pytest.mark.parametrize(("start", "end"), [(None, None), (1, None), (-2, None), (0, -1), (-10, 10), (3, 1)])
def test_shape(start, end):
    attrs = {key: value for key, value in (("start", start), ("end", end)) if value is not None}
    check_op("Shape", [data(2, 3, 4, 5)], attrs)


def test_size():
    check_op("Size", [data(2, 3, 4)])


@pytest.mark.parametrize(("input_shape", "shape"), [((3, 1), (2, 3, 4)), ((3, 4), (4,)), ((1, 4), (3, 1)), ((2,), ())])
def test_expand(input_shape, shape):
    check_op("Expand", [data(*input_shape), ints(*shape)])


@pytest.mark.parametrize("repeats", [(1, 1), (2, 3), (3, 0)])
def test_tile(repeats):
    check_op("Tile", [data(2, 3), ints(*repeats)])


@pytest.mark.parametrize(
    ("shape", "value"),
    [((2, 3), None), ((4,), np.array([7], dtype=np.int64)), ((), np.array([1.5], dtype=np.float64)), ((2, 0), None)],
)
def test_constant_of_shape(shape, value):
    attrs = {} if value is None else {"value": numpy_helper.from_array(value)}
    check_op("ConstantOfShape", [np.array(shape, dtype=np.int64)], attrs)


@pytest.mark.parametrize(("start", "limit", "delta"), [(0, 10, 3), (10, 2, -2), (5, 5, 1), (1.0, 2.5, 0.25)])
def test_range(start, limit, delta):
    dtype = np.float32 if isinstance(start, float) else np.int64
    check_op("Range", [np.array(bound, dtype=dtype) for bound in (start, limit, delta)])


def test_range_keeps_numpy_scalar_dtypes():
    (output,) = get_op("Range").infer([], {"start": np.int32(0), "limit": np.int32(5), "delta": np.int32(2)})
    assert output == TensorType((3,), "int32")


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    check_op("DepthToSpace", [data(2, 8, 3, 2)], {"blocksize": 2, "mode": mode})


def test_space_to_depth():
    check_op("SpaceToDepth", [data(2, 3, 4, 6)], {"blocksize": 2})


@pytest.mark.parametrize(
    "op",
    ["Flatten", "Reshape", "Transpose", "Concat", "Split", "Slice", "Squeeze", "Unsqueeze", "Pad", "Gather"]
    + ["Expand", "Shape", "Tile"],
)
def test_transforms_are_injective(op):
    assert get_op(op).pattern_of({}) == Pattern.INJECTIVE


@pytest.mark.parametrize("k", [None, 0, 2, -1, 7, -7])
@pytest.mark.parametrize("upper", [0, 1])
def test_trilu(k, upper):
    check_op("Trilu", [data(2, 4, 5), None if k is None else np.array(k, dtype=np.int64)], {"upper": upper})


@pytest.mark.parametrize(
    "attrs",
    [
        {"value_float": 2.5},
        {"value_floats": (1.0, 2.0)},
        {"value_int": 7},
        {"value_ints": (1, 2, 3)},
        {"value": numpy_helper.from_array(np.arange(6, dtype=np.int32).reshape(2, 3))},
    ],
)
def test_constant_matches_onnxruntime(attrs):
    check_op("Constant", [], attrs)
