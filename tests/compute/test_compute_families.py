"""The nn computes (compiler/compute/conv.py, dense.py, pool.py, norm.py, resize.py) compiled as their fused groups — group_to_te, the default CPU schedule,
compiler.build — natively and in wasmtime, against the numpy reference executor on the same graph."""

import numpy as np
import pytest

from compiler.build import build
from compiler.compute import group_to_te
from compiler.errors import UnsupportedOpError
from compiler.graph.ir import Graph, TensorType
from compiler.graph.reference import run_reference
from compiler.passes.fuse_ops import fuse_ops
from compiler.schedules import schedule_group
from compiler.target import Target

TARGETS = ["llvm", "wasm"]


def run_compiled(graph: Graph, feeds: dict, target: str) -> dict:
    """Every fused group of `graph` as one kernel, run in order."""
    fused = fuse_ops(graph)
    env = {v: feeds[v.name] for v in fused.inputs}
    env.update(fused.params)
    for node in fused.nodes:
        group = group_to_te(node)
        kernel = build(
            schedule_group(group, Target.parse(target)), group.inputs + group.outputs, target=target, name=group.name
        )
        outputs = [np.zeros(v.type.shape, v.type.dtype) for v in node.outputs]
        kernel(*[np.array(env[v], copy=True) for v in node.inputs], *outputs)
        env.update(zip(node.outputs, outputs))
    return {v.name: env[v] for v in fused.outputs}


def single_op(op: str, shapes: list, attrs: dict, seed: int = 0) -> tuple[Graph, dict]:
    """A graph of one `op` node: the first operand an input, the others params (None: an omitted input)."""
    rng = np.random.default_rng(seed)
    graph = Graph()
    operands = []
    for index, shape in enumerate(shapes):
        if shape is None:
            operands.append(None)
            continue
        array = rng.standard_normal(shape).astype(np.float32)
        if op == "BatchNormalization" and index == 4:
            array = np.abs(array) + 0.1
        operands.append(
            graph.add_input("x", TensorType(shape, "float32")) if index == 0 else graph.add_param("p", array)
        )
        if index == 0:
            feeds = {"x": array}
    graph.outputs = list(graph.add_node(op, operands, attrs))
    return graph, feeds


def check(graph: Graph, feeds: dict, target: str) -> None:
    expected = run_reference(graph, feeds)
    actual = run_compiled(graph, feeds, target)
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


CASES = {
    "conv_bias_pads": ("Conv", [(1, 3, 7, 7), (4, 3, 3, 3), (4,)], {"pads": [1, 1, 1, 1]}),
    "conv_stride_asymmetric_pads": ("Conv", [(2, 3, 9, 8), (5, 3, 3, 2)], {"strides": [2, 2], "pads": [1, 0, 2, 1]}),
    "conv_dilations_same_upper": (
        "Conv",
        [(1, 2, 9, 8), (3, 2, 3, 3)],
        {"dilations": [2, 1], "auto_pad": "SAME_UPPER"},
    ),
    "conv_same_lower_stride": ("Conv", [(1, 2, 9, 8), (3, 2, 2, 3)], {"auto_pad": "SAME_LOWER", "strides": [2, 3]}),
    "conv_valid": ("Conv", [(1, 2, 6, 6), (3, 2, 3, 3)], {"auto_pad": "VALID"}),
    "conv_groups": ("Conv", [(1, 4, 7, 6), (6, 2, 3, 3), (6,)], {"group": 2, "pads": [1, 1, 1, 1]}),
    "depthwise": ("Conv", [(1, 4, 9, 8), (4, 1, 3, 3)], {"group": 4, "strides": [2, 2], "pads": [1, 0, 1, 2]}),
    "depthwise_multiplier": ("Conv", [(1, 3, 7, 6), (6, 1, 3, 3)], {"group": 3, "pads": [1, 1, 1, 1]}),
    "conv_1d": ("Conv", [(1, 3, 11), (2, 3, 3), (2,)], {"pads": [2, 1], "strides": [2]}),
    "conv_1x1": ("Conv", [(1, 8, 5, 6), (16, 8, 1, 1)], {}),
    # NCHW[x]c layouts and packed (M / x, C / group, kh, kw, x) weights, as the alter_layout pass makes them
    "conv_nchwc_bias_stride_pads": (
        "ConvNCHWc",
        [(1, 2, 9, 8, 4), (2, 8, 3, 3, 4), (8,)],
        {"strides": [2, 2], "pads": [1, 0, 2, 1]},
    ),
    "conv_nchwc_image_block": ("ConvNCHWc", [(1, 1, 9, 8, 3), (2, 3, 3, 3, 8), (16,)], {"pads": [1, 1, 1, 1]}),
    "conv_nchwc_1x1_dilations_same_upper": (
        "ConvNCHWc",
        [(2, 1, 9, 8, 2), (1, 2, 3, 3, 4)],
        {"dilations": [2, 1], "auto_pad": "SAME_UPPER"},
    ),
    "conv_nchwc_depthwise": (
        "ConvNCHWc",
        [(1, 2, 9, 8, 4), (2, 1, 3, 3, 4), (8,)],
        {"group": 8, "strides": [2, 2], "pads": [1, 0, 1, 2]},
    ),
    "conv_nchwc_groups_of_whole_blocks": (
        "ConvNCHWc",
        [(1, 4, 7, 6, 4), (4, 8, 3, 3, 4), (16,)],
        {"group": 2, "pads": [1, 1, 1, 1], "strides": [2, 1]},
    ),
    "conv_nchwc_groups_filter_blocks_differ": ("ConvNCHWc", [(1, 3, 5, 5, 4), (3, 4, 1, 1, 8)], {"group": 3}),
    "max_pool_nchwc_pads_ceil": (
        "MaxPoolNCHWc",
        [(1, 2, 7, 8, 4)],
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 0], "ceil_mode": 1},
    ),
    # wide enough for the column tiles to have an interior (the template partitions them)
    "max_pool_nchwc_wide_stride_1": (
        "MaxPoolNCHWc",
        [(1, 2, 9, 40, 4)],
        {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]},
    ),
    "max_pool_nchwc_dilated_ceil": (
        "MaxPoolNCHWc",
        [(2, 1, 11, 30, 8)],
        {"kernel_shape": [2, 3], "strides": [2, 2], "dilations": [2, 1], "ceil_mode": 1, "pads": [0, 1, 1, 2]},
    ),
    "average_pool_nchwc_pads_ceil": (
        "AveragePoolNCHWc",
        [(1, 2, 7, 8, 4)],
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 0], "ceil_mode": 1},
    ),
    "average_pool_nchwc_include_pad_dilated": (
        "AveragePoolNCHWc",
        [(2, 1, 9, 12, 8)],
        {"kernel_shape": [2, 3], "dilations": [2, 1], "pads": [0, 1, 1, 2], "count_include_pad": 1},
    ),
    "layout_transform_to_blocked": ("LayoutTransform", [(1, 8, 3, 5)], {"src": "NCHW", "dst": "NCHW4c"}),
    "layout_transform_1d_to_blocked": ("LayoutTransform", [(1, 6, 7)], {"src": "NCW", "dst": "NCHW4c", "channels": 6}),
    "layout_transform_1d_to_plain": ("LayoutTransform", [(1, 2, 1, 7, 4)], {"src": "NCHW4c", "dst": "NCW"}),
    "layout_transform_padded": ("LayoutTransform", [(1, 6, 3, 5)], {"src": "NCHW", "dst": "NCHW4c", "channels": 6}),
    "layout_transform_cropped": ("LayoutTransform", [(2, 2, 3, 5, 4)], {"src": "NCHW4c", "dst": "NCHW", "channels": 7}),
    "layout_transform_to_plain": ("LayoutTransform", [(2, 2, 3, 5, 4)], {"src": "NCHW4c", "dst": "NCHW"}),
    "channel_shuffle_nchwc_two_groups": ("ChannelShuffleNCHWc", [(1, 6, 3, 5, 8)], {"groups": 2}),
    "channel_shuffle_nchwc_four_groups": ("ChannelShuffleNCHWc", [(2, 4, 5, 3, 4)], {"groups": 4}),
    "conv_transpose": (
        "ConvTranspose",
        [(1, 3, 4, 5), (3, 2, 3, 3), (2,)],
        {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
    ),
    "conv_transpose_2x2_stride_2": ("ConvTranspose", [(1, 4, 3, 5), (4, 3, 2, 2), (3,)], {"strides": [2, 2]}),
    "conv_transpose_4x4_stride_2_pads": (
        "ConvTranspose",
        [(2, 3, 4, 3), (3, 2, 4, 3)],
        {"strides": [2, 3], "pads": [1, 0, 1, 2], "output_padding": [1, 0]},
    ),
    "conv_transpose_output_shape": (
        "ConvTranspose",
        [(1, 2, 3, 3), (2, 2, 3, 3)],
        {"strides": [2, 2], "output_shape": [8, 8], "auto_pad": "SAME_LOWER"},
    ),
    "conv_transpose_nchwc_stride_2": (
        "ConvTransposeNCHWc",
        [(1, 2, 4, 5, 4), (2, 8, 3, 3, 4), (8,)],
        {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
    ),
    "conv_transpose_nchwc_2x2_dilated": (
        "ConvTransposeNCHWc",
        [(1, 1, 3, 4, 8), (1, 8, 2, 2, 8)],
        {"strides": [2, 1], "dilations": [1, 2]},
    ),
    "conv_transpose_groups": ("ConvTranspose", [(1, 4, 4, 4), (4, 1, 3, 3)], {"group": 2, "dilations": [2, 2]}),
    "gemm_bias": ("Gemm", [(3, 5), (5, 4), (4,)], {}),
    "gemm_trans_alpha_beta": ("Gemm", [(5, 3), (4, 5), (3, 4)], {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}),
    "gemm_trans_b_row_bias": ("Gemm", [(2, 6), (9, 6), (1, 9)], {"transB": 1}),
    "gemm_trans_b_split_k": ("Gemm", [(3, 64), (10, 64), (10,)], {"transB": 1}),
    "gemm_beta_zero": ("Gemm", [(3, 5), (5, 4), (3, 4)], {"beta": 0.0}),
    "gemm_no_c": ("Gemm", [(3, 5), (5, 4)], {"alpha": 2.0}),
    "matmul_2d": ("MatMul", [(3, 5), (5, 7)], {}),
    "matmul_batched_broadcast": ("MatMul", [(2, 1, 3, 5), (3, 5, 4)], {}),
    "matmul_vector_left": ("MatMul", [(5,), (2, 5, 4)], {}),
    "matmul_vector_right": ("MatMul", [(2, 3, 5), (5,)], {}),
    "max_pool_pads": ("MaxPool", [(1, 2, 7, 7)], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "max_pool_ceil_dilations": (
        "MaxPool",
        [(1, 2, 7, 8)],
        {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1, "dilations": [1, 2]},
    ),
    "max_pool_indices": (
        "MaxPool",
        [(1, 2, 7, 6)],
        {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 1, 1, 0], "_outputs": 2},
    ),
    "max_pool_indices_column_major": (
        "MaxPool",
        [(2, 2, 5, 6)],
        {"kernel_shape": [2, 2], "storage_order": 1, "_outputs": 2},
    ),
    "average_pool_excluding_pad": (
        "AveragePool",
        [(1, 2, 7, 7)],
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    ),
    "average_pool_ceil_including_pad": (
        "AveragePool",
        [(1, 2, 7, 8)],
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "pads": [0, 1, 1, 0], "count_include_pad": 1},
    ),
    "average_pool_same_upper": ("AveragePool", [(1, 2, 7, 8)], {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER"}),
    "global_average_pool": ("GlobalAveragePool", [(2, 3, 5, 4)], {}),
    "global_max_pool": ("GlobalMaxPool", [(2, 3, 5, 4)], {}),
    "batch_norm": ("BatchNormalization", [(2, 3, 4, 5), (3,), (3,), (3,), (3,)], {"epsilon": 1e-3}),
    "layer_norm": ("LayerNormalization", [(2, 3, 8), (8,), (8,)], {}),
    "layer_norm_three_outputs": ("LayerNormalization", [(2, 3, 8), (3, 8), None], {"axis": 1, "_outputs": 3}),
    "instance_norm": ("InstanceNormalization", [(2, 3, 4, 5), (3,), (3,)], {}),
    "group_norm": ("GroupNormalization", [(2, 4, 3, 3), (4,), (4,)], {"num_groups": 2}),
    "mean_variance_norm": ("MeanVarianceNormalization", [(2, 3, 4, 5)], {}),
    "lp_norm_l1": ("LpNormalization", [(3, 6)], {"p": 1, "axis": 0}),
    "lp_norm_l2": ("LpNormalization", [(3, 6)], {"p": 2}),
    "lp_pool_p3": ("LpPool", [(1, 2, 6, 6)], {"kernel_shape": [2, 2], "p": 3, "pads": [1, 1, 0, 0]}),
    "global_lp_pool": ("GlobalLpPool", [(1, 3, 4, 4)], {"p": 2}),
    "lrn": ("LRN", [(1, 5, 3, 3)], {"size": 3, "alpha": 0.01}),
    "softmax_last": ("Softmax", [(3, 7)], {}),
    "softmax_middle": ("Softmax", [(2, 3, 4)], {"axis": 1}),
    "softmax_first": ("Softmax", [(3, 16)], {"axis": 0}),
    "log_softmax_last": ("LogSoftmax", [(2, 16)], {}),
    "log_softmax_middle": ("LogSoftmax", [(2, 5, 3)], {"axis": -2}),
    "resize_nearest": ("Resize", [(1, 2, 4, 5)], {"scales": [1, 1, 2, 2], "mode": "nearest"}),
    "resize_nearest_asymmetric_floor": (
        "Resize",
        [(1, 2, 4, 5)],
        {"scales": [1, 1, 2, 1.5], "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
    ),
    # integer upscales take exact int32 coordinates (one axis x3, the other x1.5 through float64)
    "resize_nearest_integer_ceil": (
        "Resize",
        [(1, 2, 4, 5)],
        {"scales": [1, 1, 3, 1.5], "nearest_mode": "round_prefer_ceil", "coordinate_transformation_mode": "asymmetric"},
    ),
    "resize_nearest_integer_half_pixel_ceil": (
        "Resize",
        [(1, 2, 3, 5)],
        {"scales": [1, 1, 4, 2], "nearest_mode": "ceil"},
    ),
    "resize_linear_integer_half_pixel": ("Resize", [(1, 2, 4, 5)], {"scales": [1, 1, 2, 3], "mode": "linear"}),
    "resize_linear_integer_pytorch": (
        "Resize",
        [(1, 2, 4, 5)],
        {"scales": [1, 1, 3, 2], "mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
    ),
    "resize_linear_integer_asymmetric": (
        "Resize",
        [(1, 2, 4, 5)],
        {"scales": [1, 1, 2, 4], "mode": "linear", "coordinate_transformation_mode": "asymmetric"},
    ),
    "resize_cubic": ("Resize", [(1, 2, 4, 5)], {"scales": [1, 1, 2, 1.5], "mode": "cubic"}),
    "resize_cubic_exclude_outside": (
        "Resize",
        [(1, 1, 5, 4)],
        {"scales": [1, 1, 0.6, 1.75], "mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5},
    ),
    "resize_cubic_align_corners": (
        "Resize",
        [(1, 1, 4, 4)],
        {"sizes": [1, 1, 7, 3], "mode": "cubic", "coordinate_transformation_mode": "align_corners"},
    ),
    "resize_linear_sizes": ("Resize", [(1, 2, 4, 5)], {"sizes": [1, 2, 7, 3], "mode": "linear"}),
    "resize_linear_align_corners": (
        "Resize",
        [(1, 2, 4, 5)],
        {"scales": [1, 1, 1.5, 0.7], "mode": "linear", "coordinate_transformation_mode": "align_corners"},
    ),
    "resize_crop_extrapolate": (
        "Resize",
        [(1, 2, 4, 5)],
        {
            "sizes": [1, 2, 3, 3],
            "roi": [0, 0, 0.2, 0.3, 1, 1, 0.8, 1.2],
            "mode": "linear",
            "coordinate_transformation_mode": "tf_crop_and_resize",
            "extrapolation_value": 5.0,
        },
    ),
    "upsample": ("Upsample", [(1, 1, 2, 3)], {"scales": [1, 1, 2, 3], "mode": "nearest"}),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_nn_op_matches_reference(case, target):
    op, shapes, attrs = CASES[case]
    check(*single_op(op, shapes, attrs), target)


@pytest.mark.parametrize(
    ("op", "shapes", "attrs", "named"),
    [
        ("Resize", [(1, 1, 4, 4)], {"scales": [1, 1, 0.5, 0.5], "mode": "linear", "antialias": 1}, "antialias"),
        ("Resize", [(1, 1, 4, 4)], {"scales": [1, 1, 0.5, 0.5], "mode": "cubic", "antialias": 1}, "antialias"),
    ],
)
def test_unsupported_configuration_names_itself(op, shapes, attrs, named):
    graph, _ = single_op(op, shapes, attrs)
    with pytest.raises(UnsupportedOpError, match=named):
        group_to_te(fuse_ops(graph).nodes[0])
