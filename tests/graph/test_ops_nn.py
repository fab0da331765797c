"""The nn ops' shape rules and numpy references against onnxruntime, one ONNX node at a time."""

from __future__ import annotations

import numpy as np
import pytest
from nn_single_node import check_node

from compiler.errors import ShapeError, UnsupportedOpError
from compiler.graph.ir import TensorType
from compiler.graph.registry import Pattern, get_op


def random(*shape, dtype="float32", seed=0):
    rng = np.random.default_rng(seed + sum(shape))
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -100), min(info.max, 100), size=shape, dtype=dtype)
    return rng.standard_normal(shape).astype(dtype)


# -- Conv ---------------------------------------------------------------------------------------------------------

CONV_CASES = {
    "1d": ((2, 4, 9), (6, 4, 3), True, {"strides": [2], "pads": [1, 2], "dilations": [2]}),
    "2d_plain": ((1, 3, 7, 8), (5, 3, 3, 3), False, {}),
    "2d_bias_strides_pads_dilations": (
        (2, 3, 9, 10),
        (4, 3, 3, 2),
        True,
        {"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]},
    ),
    "2d_kernel_shape_given": ((1, 2, 6, 6), (3, 2, 2, 3), False, {"kernel_shape": [2, 3]}),
    "groups": ((2, 4, 6, 6), (6, 2, 3, 3), True, {"group": 2, "pads": [1, 1, 1, 1]}),
    "depthwise": ((1, 8, 9, 9), (8, 1, 3, 3), True, {"group": 8, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "depthwise_multiplier": ((1, 4, 5, 5), (8, 1, 3, 3), False, {"group": 4}),
    "same_upper_stride2": ((1, 2, 7, 8), (3, 2, 3, 3), True, {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "same_lower_stride2": ((1, 2, 7, 8), (3, 2, 4, 3), False, {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    "valid": ((1, 2, 7, 8), (3, 2, 3, 2), False, {"auto_pad": "VALID", "strides": [2, 3]}),
    "pointwise": ((2, 6, 5, 4), (4, 6, 1, 1), True, {}),
    "3d": ((1, 2, 5, 6, 4), (3, 2, 2, 3, 2), True, {"strides": [1, 2, 1], "pads": [0, 1, 1, 1, 0, 0]}),
}


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_matches_onnxruntime(case):
    x_shape, w_shape, with_bias, attrs = CONV_CASES[case]
    bias = random(w_shape[0], seed=2) if with_bias else None
    check_node("Conv", [random(*x_shape), random(*w_shape, seed=1), bias], attrs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "case",
    [
        ((1, 2, 6, 6), (2, 2, 2, 2), "float32", {"auto_pad": "SAME_UPPER", "dilations": [2, 2]}),
        ((1, 2, 7, 7), (3, 2, 3, 2), "float32", {"auto_pad": "SAME_LOWER", "dilations": [2, 3], "strides": [2, 1]}),
        ((1, 2, 5, 5), (3, 2, 3, 3), "float64", {"pads": [1, 0, 0, 1]}),
    ],
    ids=["same_upper_dilated", "same_lower_dilated", "float64"],
)
def test_conv_cases_onnxruntime_lacks(case):
    # onnxruntime has no float64 Conv and refuses dilations with SAME padding, so ONNX's reference is the oracle
    x_shape, w_shape, dtype, attrs = case
    inputs = [random(*x_shape, dtype=dtype), random(*w_shape, dtype=dtype, seed=1)]
    check_node("Conv", inputs, attrs, rtol=1e-5, atol=1e-6, oracle="reference")


def test_conv_at_mobilenet_and_resnet_sizes():
    # weights scaled as trained networks' are (He initialisation), so outputs stay near 1 as in a real model
    depthwise = [random(1, 32, 112, 112), random(32, 1, 3, 3, seed=1) * np.float32(0.47), random(32, seed=2)]
    check_node("Conv", depthwise, {"group": 32, "pads": [1, 1, 1, 1]}, rtol=1e-4, atol=1e-5)
    dense = [random(1, 64, 56, 56), random(64, 64, 3, 3, seed=1) * np.float32(0.059), random(64, seed=2)]
    check_node("Conv", dense, {"pads": [1, 1, 1, 1]}, rtol=1e-4, atol=1e-5)


def test_conv_rejects_mismatched_channels():
    with pytest.raises(ShapeError, match="group"):
        get_op("Conv").infer([TensorType((1, 3, 8, 8), "float32"), TensorType((4, 2, 3, 3), "float32")], {})
    with pytest.raises(ShapeError, match="does not fit"):
        get_op("Conv").infer([TensorType((1, 3, 2, 2), "float32"), TensorType((4, 3, 3, 3), "float32")], {})


# -- ConvTranspose --------------------------------------------------------------------------------------------------

CONV_TRANSPOSE_CASES = {
    "2d_plain": ((1, 2, 4, 5), (2, 3, 3, 3), False, {}),
    "strides_pads_output_padding": (
        (2, 2, 3, 4),
        (2, 3, 3, 3),
        True,
        {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
    ),
    "asymmetric_pads": ((1, 2, 4, 4), (2, 2, 3, 2), False, {"strides": [2, 3], "pads": [0, 1, 2, 0]}),
    "groups": ((1, 4, 3, 3), (4, 2, 3, 3), True, {"group": 2, "strides": [2, 2]}),
    "depthwise": ((1, 3, 4, 4), (3, 1, 3, 3), False, {"group": 3, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "dilations": ((1, 2, 4, 4), (2, 2, 3, 3), False, {"dilations": [2, 2]}),
    "output_shape": ((1, 1, 3, 3), (1, 2, 3, 3), False, {"strides": [3, 2], "output_shape": [10, 8]}),
    "same_upper": ((1, 1, 3, 3), (1, 2, 3, 3), False, {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "same_lower": ((1, 1, 3, 4), (1, 2, 3, 3), False, {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    "output_shape_overrides_pads": (
        (1, 1, 3, 3),
        (1, 1, 3, 3),
        False,
        {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_shape": [6, 7]},
    ),
    "1d": ((1, 2, 5), (2, 3, 3), True, {"strides": [2], "pads": [1, 0]}),
    "3d": ((1, 2, 3, 3, 2), (2, 2, 2, 2, 2), False, {"strides": [2, 1, 2]}),
}


@pytest.mark.parametrize("case", CONV_TRANSPOSE_CASES)
def test_conv_transpose_matches_onnxruntime(case):
    x_shape, w_shape, with_bias, attrs = CONV_TRANSPOSE_CASES[case]
    bias = random(w_shape[1] * attrs.get("group", 1), seed=2) if with_bias else None
    check_node("ConvTranspose", [random(*x_shape), random(*w_shape, seed=1), bias], attrs, rtol=1e-4, atol=1e-5)


# -- Gemm and MatMul ------------------------------------------------------------------------------------------------

GEMM_CASES = {
    "plain": ((3, 4), (4, 5), None, {}),
    "transposed": ((4, 3), (5, 4), (3, 5), {"transA": 1, "transB": 1}),
    "alpha_beta_row_bias": ((3, 4), (4, 5), (5,), {"alpha": 0.5, "beta": 2.0}),
    "column_bias": ((3, 4), (5, 4), (3, 1), {"transB": 1}),
    "scalar_bias": ((3, 4), (4, 5), (), {"beta": -1.5}),
    "matrix_row_bias": ((2, 4), (4, 6), (1, 6), {"alpha": 2.0}),
}


@pytest.mark.parametrize("case", GEMM_CASES)
def test_gemm_matches_onnxruntime(case):
    a_shape, b_shape, c_shape, attrs = GEMM_CASES[case]
    c = None if c_shape is None else random(*c_shape, seed=2)
    check_node("Gemm", [random(*a_shape), random(*b_shape, seed=1), c], attrs, rtol=1e-5, atol=1e-5)


MATMUL_CASES = [
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 1, 3, 4), (5, 4, 6)),
    ((4,), (2, 4, 3)),
    ((2, 3, 4), (4,)),
    ((1, 3, 4), (2, 4, 2)),
]


@pytest.mark.parametrize("shapes", MATMUL_CASES, ids=str)
def test_matmul_matches_onnxruntime(shapes):
    check_node("MatMul", [random(*shapes[0]), random(*shapes[1], seed=1)], rtol=1e-5, atol=1e-5)


def test_matmul_rejects_mismatched_inner_dimensions():
    with pytest.raises(ShapeError, match="inner"):
        get_op("MatMul").infer([TensorType((3, 4), "float32"), TensorType((5, 6), "float32")], {})


# -- normalisation --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (2, 4, 5, 6), (1, 2, 3, 4, 2)], ids=str)
def test_batch_normalization_matches_onnxruntime(shape):
    channels = shape[1]
    parameters = [random(channels, seed=i) for i in range(1, 4)] + [np.abs(random(channels, seed=4)) + 0.1]
    check_node("BatchNormalization", [random(*shape), *parameters], {"epsilon": 1e-3}, rtol=1e-5, atol=1e-5)


def test_batch_normalization_training_is_refused():
    types = [TensorType((1, 2, 3, 3), "float32")] + [TensorType((2,), "float32")] * 4
    with pytest.raises(UnsupportedOpError, match="training_mode"):
        get_op("BatchNormalization").infer(types, {"training_mode": 1})
    with pytest.raises(UnsupportedOpError, match="3 outputs"):
        get_op("BatchNormalization").infer(types, {"_outputs": 3})


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 4, 5, 6), (2, 2, 3, 2, 3)], ids=str)
def test_instance_normalization_matches_onnxruntime(shape):
    inputs = [random(*shape), random(shape[1], seed=1), random(shape[1], seed=2)]
    check_node("InstanceNormalization", inputs, {"epsilon": 1e-4}, rtol=1e-4, atol=1e-5)


LAYER_NORM_CASES = {
    "last_axis": ((2, 3, 8), -1, True, 1),
    "two_axes": ((2, 3, 4), 1, True, 1),
    "no_bias": ((4, 6), -1, False, 1),
    "first_axis_all_outputs": ((2, 3, 4), 0, True, 3),
    "mean_output": ((3, 5), -1, False, 2),
}


@pytest.mark.parametrize("case", LAYER_NORM_CASES)
def test_layer_normalization_matches_onnxruntime(case):
    shape, axis, with_bias, outputs = LAYER_NORM_CASES[case]
    normalised = shape[axis:]
    bias = random(*normalised, seed=2) if with_bias else None
    inputs = [random(*shape), random(*normalised, seed=1), bias]
    check_node("LayerNormalization", inputs, {"axis": axis, "epsilon": 1e-3}, outputs=outputs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("groups", [1, 2, 6])
def test_group_normalization_matches_onnxruntime(groups):
    inputs = [random(2, 6, 3, 4), random(6, seed=1), random(6, seed=2)]
    check_node("GroupNormalization", inputs, {"num_groups": groups, "epsilon": 1e-3}, rtol=1e-4, atol=1e-5)


def test_group_normalization_opset18_scale_per_group():
    inputs = [random(2, 6, 5), random(3, seed=1), random(3, seed=2)]
    check_node("GroupNormalization", inputs, {"num_groups": 3}, opset=18, rtol=1e-4, atol=1e-5, oracle="reference")


@pytest.mark.parametrize("axes", [None, (1,), (0, 2, 3), (-1, -2)], ids=str)
def test_mean_variance_normalization_matches_onnxruntime(axes):
    attrs = {} if axes is None else {"axes": list(axes)}
    check_node("MeanVarianceNormalization", [random(2, 3, 4, 5)], attrs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, -1])
def test_lp_normalization_matches_onnxruntime(p, axis):
    x = random(3, 4, 5)
    x[0, 0] = 0
    x[:, 0, 0] = 0
    check_node("LpNormalization", [x], {"p": p, "axis": axis}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("size", [1, 3, 5])
def test_lrn_matches_onnxruntime(size):
    check_node("LRN", [random(2, 7, 3, 4)], {"size": size, "alpha": 0.01, "beta": 0.6, "bias": 1.5}, rtol=1e-5)


def test_lrn_even_size_follows_the_onnx_formula():
    # onnxruntime only takes odd sizes, so the oracle is the spec's sum over [c - floor((size-1)/2), c + ceil(...)]
    x = random(2, 6, 2, 3)
    expected = np.empty_like(x)
    for c in range(6):
        window = x[:, max(0, c - 1) : c + 3]
        expected[:, c] = x[:, c] / (1.0 + 0.1 / 4 * np.square(window).sum(axis=1)) ** 0.5
    actual = get_op("LRN").reference(x, size=4, alpha=0.1, beta=0.5)
    assert actual.dtype == np.float32
    np.testing.assert_allclose(actual, expected, rtol=1e-5)


# -- Softmax and LogSoftmax -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [None, 0, 1, -2])
def test_softmax_matches_onnxruntime(op, axis):
    attrs = {} if axis is None else {"axis": axis}
    check_node(op, [random(3, 4, 5) * 10], attrs, rtol=1e-5, atol=1e-6)


def test_softmax_is_stable_for_large_inputs():
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1000.0, -1000.0]], np.float32)
    check_node("Softmax", [x], {}, rtol=1e-6, atol=1e-7)
    check_node("LogSoftmax", [x], {}, rtol=1e-6, atol=1e-6)


# -- pooling ------------------------------------------------------------------------------------------------------

MAX_POOL_CASES = {
    "2d": ((1, 3, 8, 8), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "2d_overlapping_pads": ((2, 2, 7, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "asymmetric_pads": ((1, 2, 6, 7), {"kernel_shape": [3, 2], "pads": [2, 0, 1, 1]}),
    "dilations": ((1, 2, 9, 9), {"kernel_shape": [2, 3], "dilations": [2, 2], "strides": [1, 2]}),
    "ceil_mode": ((1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 3], "ceil_mode": 1}),
    "ceil_mode_pads": ((1, 1, 6, 6), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    "same_upper": ((1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "same_lower": ((1, 2, 7, 8), {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"}),
    "valid": ((1, 2, 7, 8), {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "VALID"}),
    "1d": ((2, 3, 11), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    "3d": ((1, 2, 5, 6, 4), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2]}),
}


@pytest.mark.parametrize("case", MAX_POOL_CASES)
def test_max_pool_matches_onnxruntime(case):
    shape, attrs = MAX_POOL_CASES[case]
    check_node("MaxPool", [random(*shape)], attrs)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "float64"])
def test_max_pool_other_dtypes(dtype):
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    check_node("MaxPool", [random(1, 2, 6, 6, dtype=dtype)], attrs)


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [2, 3], "strides": [1, 2], "dilations": [2, 1]},
    ],
    ids=["pads", "dilations"],
)
def test_max_pool_indices_match_onnxruntime(attrs, storage_order):
    check_node("MaxPool", [random(2, 3, 7, 6)], {**attrs, "storage_order": storage_order}, outputs=2)


AVERAGE_POOL_CASES = {
    "2d": ((1, 3, 8, 8), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "pads_excluded": ((1, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "pads_included": (
        (1, 2, 7, 7),
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 2, 1, 0], "count_include_pad": 1},
    ),
    "ceil_mode": ((1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 3], "ceil_mode": 1}),
    "ceil_mode_pads_included": (
        (1, 1, 6, 7),
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1, "count_include_pad": 1},
    ),
    "same_upper_excluded": ((1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "same_lower_included": (
        (1, 2, 7, 8),
        {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER", "count_include_pad": 1},
    ),
    "valid": ((1, 2, 7, 8), {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "VALID"}),
    "dilations": ((1, 2, 9, 9), {"kernel_shape": [2, 2], "dilations": [2, 3], "pads": [1, 1, 1, 1]}),
    "1d": ((2, 3, 11), {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "count_include_pad": 1}),
    "3d": ((1, 2, 5, 6, 4), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [1, 1, 0, 0, 1, 1]}),
}


@pytest.mark.parametrize("case", AVERAGE_POOL_CASES)
def test_average_pool_matches_onnxruntime(case):
    shape, attrs = AVERAGE_POOL_CASES[case]
    check_node("AveragePool", [random(*shape)], attrs)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 4, 6, 7), (1, 2, 3, 4, 5)], ids=str)
def test_global_pools_match_onnxruntime(op, shape):
    check_node(op, [random(*shape)], rtol=1e-5, atol=1e-6)


LP_POOL_CASES = {
    "p2_pads": ((1, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "p1_same_upper": ((1, 2, 6, 7), {"kernel_shape": [2, 3], "auto_pad": "SAME_UPPER", "p": 1}),
    "p3_1d": ((2, 3, 9), {"kernel_shape": [3], "strides": [2], "p": 3}),
    "dilations_ceil_mode": (
        (1, 1, 8, 8),
        {"kernel_shape": [2, 2], "dilations": [2, 2], "strides": [2, 2], "ceil_mode": 1},
    ),
}


@pytest.mark.parametrize("case", LP_POOL_CASES)
def test_lp_pool_matches_onnxruntime(case):
    shape, attrs = LP_POOL_CASES[case]
    check_node("LpPool", [random(*shape)], attrs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_global_lp_pool_matches_onnxruntime(p):
    check_node("GlobalLpPool", [random(2, 3, 4, 5)], {"p": p}, rtol=1e-5, atol=1e-6)


def test_max_unpool_inverts_max_pool():
    pool = {"kernel_shape": [2, 2], "strides": [2, 2]}
    values, indices = get_op("MaxPool").reference(random(1, 2, 6, 6), _outputs=2, **pool)
    check_node("MaxUnpool", [values, indices], pool)


def test_max_unpool_with_output_shape_follows_onnx():
    # with output_shape, ONNX (and its node tests) read indices in the inferred shape, placed at the output's start;
    # onnxruntime reads them in output_shape itself, so ONNX's reference is the oracle here
    pool = {"kernel_shape": [2, 2], "strides": [2, 2]}
    values, indices = get_op("MaxPool").reference(random(1, 2, 6, 6), _outputs=2, **pool)
    check_node("MaxUnpool", [values, indices, np.array([1, 2, 7, 7], np.int64)], pool, oracle="reference")


def test_pools_at_resnet_sizes():
    x = random(1, 64, 112, 112)
    check_node("MaxPool", [x], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})
    check_node("GlobalAveragePool", [random(1, 512, 7, 7)], rtol=1e-5, atol=1e-6)


# -- Resize and Upsample --------------------------------------------------------------------------------------------

F = np.float32
RESIZE_CASES = {
    "nearest_up_scales": ((1, 2, 3, 4), None, [1, 1, 2, 3], None, {"mode": "nearest"}),
    "nearest_down_scales": ((1, 1, 6, 8), None, [1, 1, 0.5, 0.6], None, {"mode": "nearest"}),
    "nearest_asymmetric_floor": (
        (1, 1, 4, 5),
        None,
        None,
        [1, 1, 7, 8],
        {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
    ),
    "nearest_round_prefer_ceil": ((1, 1, 4, 4), None, None, [1, 1, 8, 8], {"nearest_mode": "round_prefer_ceil"}),
    "nearest_ceil_align_corners": (
        (1, 1, 4, 4),
        None,
        None,
        [1, 1, 7, 9],
        {"nearest_mode": "ceil", "coordinate_transformation_mode": "align_corners"},
    ),
    "linear_up_half_pixel": ((1, 2, 3, 4), None, [1, 1, 2, 2], None, {"mode": "linear"}),
    "linear_down_sizes": ((2, 1, 8, 7), None, None, [2, 1, 3, 4], {"mode": "linear"}),
    "linear_align_corners": (
        (1, 1, 4, 4),
        None,
        None,
        [1, 1, 7, 3],
        {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
    ),
    "linear_pytorch_half_pixel": (
        (1, 1, 4, 5),
        None,
        None,
        [1, 1, 1, 8],
        {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
    ),
    "linear_asymmetric": (
        (1, 1, 4, 4),
        None,
        [1, 1, 2, 1.5],
        None,
        {"mode": "linear", "coordinate_transformation_mode": "asymmetric"},
    ),
    "linear_tf_crop_and_resize": (
        (1, 1, 5, 5),
        [0, 0, 0.2, 0.6, 1, 1, 0.9, 1.3],
        None,
        [1, 1, 4, 3],
        {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 7.5},
    ),
    "cubic_up": ((1, 1, 4, 4), None, [1, 1, 2, 1.5], None, {"mode": "cubic"}),
    "cubic_exclude_outside": (
        (1, 1, 5, 4),
        None,
        None,
        [1, 1, 8, 3],
        {"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5},
    ),
    "cubic_align_corners": (
        (1, 1, 4, 4),
        None,
        None,
        [1, 1, 6, 6],
        {"mode": "cubic", "coordinate_transformation_mode": "align_corners"},
    ),
    "linear_3d_all_axes": ((2, 3, 4), None, [2, 0.5, 1.5], None, {"mode": "linear"}),
    "axes_sizes": ((1, 2, 4, 6), None, None, [8, 3], {"mode": "linear", "axes": [2, 3]}),
    "axes_negative_scales": ((1, 2, 4, 6), None, [2.0], None, {"mode": "nearest", "axes": [-1]}),
    "keep_aspect_not_larger": (
        (1, 1, 4, 6),
        None,
        None,
        [9, 9],
        {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"},
    ),
    "keep_aspect_not_smaller": (
        (1, 1, 4, 6),
        None,
        None,
        [9, 9],
        {"mode": "nearest", "axes": [2, 3], "keep_aspect_ratio_policy": "not_smaller"},
    ),
    "linear_antialias_down": ((1, 1, 9, 8), None, None, [1, 1, 4, 3], {"mode": "linear", "antialias": 1}),
    "cubic_antialias_down": ((1, 1, 9, 8), None, None, [1, 1, 4, 5], {"mode": "cubic", "antialias": 1}),
}


@pytest.mark.parametrize("case", RESIZE_CASES)
def test_resize_matches_onnxruntime(case):
    shape, roi, scales, sizes, attrs = RESIZE_CASES[case]
    inputs = [
        random(*shape),
        None if roi is None else np.array(roi, F),
        None if scales is None else np.array(scales, F),
        None if sizes is None else np.array(sizes, np.int64),
    ]
    check_node("Resize", inputs, attrs, rtol=1e-5, atol=1e-5)


def test_resize_uint8_image():
    image = random(1, 3, 5, 6, dtype="uint8")
    check_node("Resize", [image, None, None, np.array([1, 3, 9, 4], np.int64)], {"mode": "nearest"})


def test_resize_needs_scales_or_sizes():
    with pytest.raises(ShapeError, match="scales and sizes"):
        get_op("Resize").infer([TensorType((1, 1, 4, 4), "float32")], {})


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_matches_onnxruntime(mode):
    check_node("Upsample", [random(1, 2, 3, 4), np.array([1, 1, 2, 3], F)], {"mode": mode}, opset=9)


# -- float16 ------------------------------------------------------------------------------------------------------

HALF_CASES = {
    "Conv": ([(1, 2, 5, 5), (3, 2, 3, 3)], {"pads": [1, 1, 1, 1]}, 1),
    "Gemm": ([(3, 4), (4, 5)], {"alpha": 0.5}, 1),
    "MatMul": ([(2, 3, 4), (4, 5)], {}, 1),
    "Softmax": ([(3, 5)], {}, 1),
    "MaxPool": ([(1, 2, 6, 6)], {"kernel_shape": [2, 2]}, 1),
    "AveragePool": ([(1, 2, 6, 6)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, 1),
    "GlobalAveragePool": ([(1, 3, 4, 4)], {}, 1),
    "LayerNormalization": ([(3, 5), (5,)], {}, 3),
}


@pytest.mark.parametrize("op", HALF_CASES)
def test_float16_matches_onnxruntime(op):
    # float16 is computed in float32 and rounded once; LayerNormalization's statistics stay float32 (ONNX's type U)
    shapes, attrs, outputs = HALF_CASES[op]
    inputs = [random(*shape, seed=index, dtype="float16") for index, shape in enumerate(shapes)]
    check_node(op, inputs, attrs, outputs=outputs, rtol=2e-3, atol=2e-3)


# -- registry facts -----------------------------------------------------------------------------------------------


def test_patterns_follow_the_op_contract():
    expected = {
        "Conv": Pattern.OUT_EWISE_FUSABLE,
        "ConvTranspose": Pattern.OUT_EWISE_FUSABLE,
        "Gemm": Pattern.OUT_EWISE_FUSABLE,
        "MatMul": Pattern.OUT_EWISE_FUSABLE,
        "MaxPool": Pattern.OUT_EWISE_FUSABLE,
        "AveragePool": Pattern.OUT_EWISE_FUSABLE,
        "GlobalAveragePool": Pattern.REDUCE,
        "GlobalMaxPool": Pattern.REDUCE,
        "Softmax": Pattern.OPAQUE,
        "LogSoftmax": Pattern.OPAQUE,
        "LayerNormalization": Pattern.OPAQUE,
        "BatchNormalization": Pattern.BROADCAST,
        "Resize": Pattern.INJECTIVE,
        "LpPool": Pattern.OUT_EWISE_FUSABLE,
        "GlobalLpPool": Pattern.REDUCE,
    }
    assert {op: get_op(op).pattern_of({}) for op in expected} == expected
    assert get_op("Resize").const_inputs == ((1, "roi"), (2, "scales"), (3, "sizes"))
