"""winograd: which blocked 3x3 convs become ConvWinogradNCHWc on a CPU target and which plain ones ConvWinograd on a
GPU target (a rule per case, before and expected), the transform matrices against a direct correlation, the ops'
numpy reference against the direct conv (tiles reaching past the output too), and compiled models (native, wasm,
WebGPU on lavapipe, OpenCL on PoCL) against onnxruntime, with the buffers they keep between calls shared safely by
two threads."""

import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
from compiler.errors import ShapeError
from compiler.graph.ir import Graph, TensorType
from compiler.graph.ops.conv import (
    _conv,
    _conv_winograd,
    block_channels,
    unblock_channels,
    winograd_matrices,
    winograd_weight,
)
from compiler.passes.pipeline import optimize
from compiler.runtime.native import aligned_buffer
from compiler.target import Target

RNG = np.random.default_rng(11)


def conv_graph(channels: int, filters: int, size: int, **attrs) -> Graph:
    """A 1x1 conv (so the 3x3 one reads a blocked value), ReLU, then the 3x3 conv under test."""
    graph = Graph()
    x = graph.add_input("x", TensorType((1, channels, size, size), "float32"))
    weight = graph.add_param("w1", RNG.standard_normal((channels, channels, 1, 1)).astype(np.float32))
    (y,) = graph.add_node("Relu", [graph.add_node("Conv", [x, weight])[0]])
    weight = graph.add_param("w3", RNG.standard_normal((filters, channels, 3, 3)).astype(np.float32))
    bias = graph.add_param("b3", RNG.standard_normal(filters).astype(np.float32))
    (z,) = graph.add_node("Conv", [y, weight, bias], {"pads": (1, 1, 1, 1), **attrs})
    graph.outputs = [z]
    return graph


def winograd_tiles(graph: Graph, target: str = "llvm") -> list[int]:
    op = "ConvWinograd" if target in ("webgpu", "opencl", "cuda") else "ConvWinogradNCHWc"
    return [
        node.attrs["tile"] for node in optimize(graph, fuse=False, target=Target.parse(target)).nodes if node.op == op
    ]


@pytest.mark.parametrize(
    ("channels", "filters", "size", "attrs", "tiles"),
    [
        (64, 64, 28, {}, [4]),  # 64 channels both sides, a 28 x 28 output of 4 x 4 tiles
        (64, 96, 14, {}, [2]),  # 14 x 14 is no whole number of 4 x 4 tiles: F(2, 3)
        (32, 48, 16, {}, [2]),  # 32 channels pay for F(2, 3) only
        (16, 64, 16, {}, []),  # too few input channels: the transforms outweigh the products saved
        (64, 64, 7, {}, []),  # 7 x 7 is no whole number of tiles
        (64, 64, 28, {"strides": (2, 2)}, []),
        (64, 64, 28, {"dilations": (2, 2), "pads": (2, 2, 2, 2)}, []),
    ],
)
def test_rule_picks_the_tile(channels, filters, size, attrs, tiles):
    assert winograd_tiles(conv_graph(channels, filters, size, **attrs)) == tiles


@pytest.mark.parametrize("target", ["webgpu", "opencl", "cuda"])
@pytest.mark.parametrize(
    ("channels", "filters", "size", "attrs", "tiles"),
    [
        (64, 64, 28, {}, [4]),  # 49 tiles of 4 x 4
        (64, 64, 14, {}, [4]),  # 16 tiles of 4 x 4, the last row and column reaching past the output
        (128, 128, 7, {}, [2]),  # 4 x 4 tiles would be 4, each transformed filter read by 4 tiles only: 16 of 2 x 2
        (128, 128, 6, {}, []),  # 9 tiles of 2 x 2
        (8, 64, 28, {}, []),  # too few input channels
        (32, 32, 16, {}, []),  # 2.4M multiply-adds: too few to pay for two more launches
        (64, 64, 28, {"strides": (2, 2)}, []),
        (64, 64, 28, {"group": 2}, []),
    ],
)
def test_gpu_rule_picks_the_tile(target, channels, filters, size, attrs, tiles):
    if "group" in attrs:
        graph = conv_graph(channels, filters, size)
        node = graph.nodes[-1]
        graph.params[node.inputs[1]] = graph.params[node.inputs[1]][:, : channels // 2]
        node.inputs[1].type = TensorType((filters, channels // 2, 3, 3), "float32")
        node.attrs = {**node.attrs, **attrs}
    else:
        graph = conv_graph(channels, filters, size, **attrs)
    assert winograd_tiles(graph, target) == tiles


@pytest.mark.parametrize("tile", [2, 4])
def test_matrices_compute_a_correlation(tile):
    bt, g, at = winograd_matrices(tile)
    d, taps = RNG.standard_normal(tile + 2), RNG.standard_normal(3)
    expected = [d[i : i + 3] @ taps for i in range(tile)]
    np.testing.assert_allclose(at @ ((g @ taps) * (bt @ d)), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("blocked", [True, False])
@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("shape", [(2, 32, 12, 8), (1, 32, 9, 7)])  # whole tiles; tiles reaching past the output
def test_reference_matches_the_direct_conv(shape, tile, blocked):
    x = RNG.standard_normal(shape).astype(np.float32)
    weight = RNG.standard_normal((48, 32, 3, 3)).astype(np.float32)
    bias = RNG.standard_normal(48).astype(np.float32)
    expected = _conv(x, weight, bias, pads=[1, 0, 1, 2])  # as many rows as the input, one more column
    if blocked:
        actual = _conv_winograd(
            block_channels(x, 16), winograd_weight(weight, tile), bias, tile=tile, pads=[1, 0, 1, 2], block=16
        )
        actual = unblock_channels(actual)
    else:
        actual = _conv_winograd(x, winograd_weight(weight, tile), bias, tile=tile, pads=[1, 0, 1, 2])
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())


def test_pads_that_are_not_four_are_a_shape_error():
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 2, 8, 8, 16), "float32"))
    u = graph.add_param("u", np.zeros((36, 32, 32), np.float32))
    with pytest.raises(ShapeError, match="pads"):
        graph.add_node("ConvWinogradNCHWc", [x, u], {"tile": 4, "pads": [1, 1], "block": 16})


def test_an_input_of_the_other_layout_is_a_shape_error():
    graph = Graph()
    x = graph.add_input("x", TensorType((1, 2, 9, 9, 16), "float32"))
    u = graph.add_param("u", np.zeros((36, 32, 32), np.float32))
    with pytest.raises(ShapeError, match="NCHW input"):
        graph.add_node("ConvWinograd", [x, u], {"tile": 4, "pads": [1, 1, 1, 1]})


def onnx_model(channels: int, filters: int, size: int):
    w1 = (RNG.standard_normal((channels, channels, 1, 1)) / np.sqrt(channels)).astype(np.float32)
    w3 = (RNG.standard_normal((filters, channels, 3, 3)) / np.sqrt(9 * channels)).astype(np.float32)
    bias = RNG.standard_normal(filters).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Conv", ["b", "w3", "bias"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "winograd",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(array, name) for name, array in (("w1", w1), ("w3", w3), ("bias", bias))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("target", ["llvm", "wasm", "webgpu", "opencl"])
@pytest.mark.parametrize(
    ("channels", "filters", "size", "ops"),
    [
        (64, 80, 12, ["ConvWinogradNCHWc", "ConvWinograd"]),  # CPU F(4, 3); GPU F(2, 3), 36 tiles
        (48, 32, 10, ["ConvWinogradNCHWc"]),  # CPU F(2, 3); GPU direct (1.4M multiply-adds)
        (64, 64, 16, ["ConvWinogradNCHWc", "ConvWinograd"]),  # GPU F(4, 3), 16 tiles
        (128, 96, 7, ["ConvWinograd"]),  # GPU F(2, 3), 16 tiles past the output
    ],
)
def test_compiled_model_matches_onnxruntime(target, channels, filters, size, ops):
    model = onnx_model(channels, filters, size)
    module = compiler.compile_model(model, target=target)
    op = "ConvWinogradNCHWc" if target in ("llvm", "wasm") else "ConvWinograd"
    assert any(op in kernel["ops"] for kernel in module.manifest["kernels"]) == (op in ops)
    x = RNG.standard_normal((1, channels, size, size)).astype(np.float32)
    (expected,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    for _ in range(2):  # the second call reuses the transformed tiles' buffers the first one kept
        np.testing.assert_allclose(module.run({"x": x})["y"], expected, rtol=1e-4, atol=1e-4)


def test_kept_buffers_are_never_shared_by_concurrent_calls():
    # one library's entry called from two threads at once, each with its own arena (as a C caller may, and as
    # ctypes lets go of the GIL): each call holds its own transformed tiles' buffers while the other runs
    module = compiler.compile_model(onnx_model(64, 64, 32), target="llvm")
    module.num_threads = 1
    model = module.runtime
    inputs = [RNG.standard_normal((1, 64, 32, 32)).astype(np.float32) for _ in range(2)]
    expected = [module.run({"x": x})["y"] for x in inputs]
    failures = []

    def calls(x, wanted):
        arena = aligned_buffer(model.arena.nbytes)
        for _ in range(40):
            actual = np.empty_like(wanted)
            assert model.entry(x.ctypes.data, actual.ctypes.data, model.params.ctypes.data, arena.ctypes.data) == 0
            failures.extend([] if np.array_equal(actual, wanted) else [1])

    threads = [threading.Thread(target=calls, args=pair) for pair in zip(inputs, expected)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
