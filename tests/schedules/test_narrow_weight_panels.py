"""A MatMulPacked's narrow weight (4-bit levels in blocks, float16) is widened element by element in the product for
few rows and a panel at a time into a local buffer for many (schedules/cpu/dense.py, _widen_knob), where threaded
wasm would make that buffer a static array: both forms match onnxruntime on the same file, with an erf epilogue
(whose unrolled rows keep the accumulators in registers) and a ragged last row tile."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler import compile_model

RNG = np.random.default_rng(23)
INNER, COLUMNS, BLOCK = 256, 80, 32


def _model(rows: int, weight: str):
    """x (rows, INNER) @ W, W 4-bit levels in blocks of 32 along K (DequantizeLinear, opset 21) or float16 (Cast),
    then a GELU written with Erf."""
    if weight == "int4":
        levels = RNG.integers(-8, 8, INNER * COLUMNS).tolist()
        params = [
            helper.make_tensor("q", TensorProto.INT4, [INNER, COLUMNS], levels),
            numpy_helper.from_array(RNG.uniform(0.01, 0.05, (INNER // BLOCK, COLUMNS)).astype(np.float32), "s"),
        ]
        widen = helper.make_node("DequantizeLinear", ["q", "s"], ["w"], axis=0, block_size=BLOCK)
    else:
        half = (RNG.standard_normal((INNER, COLUMNS)) * 0.05).astype(np.float16)
        params = [numpy_helper.from_array(half, "q")]
        widen = helper.make_node("Cast", ["q"], ["w"], to=TensorProto.FLOAT)
    params += [numpy_helper.from_array(np.array(v, np.float32), n) for v, n in ((2**-0.5, "r"), (1.0, "one"))]
    nodes = [
        widen,
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Mul", ["m", "r"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["a"]),
        helper.make_node("Mul", ["m", "a"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "narrow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, INNER])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        params,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize(
    "rows, weight, target, panel",
    [
        (3, "int4", "llvm", False),  # 3 rows x 50 nodes: inline
        (37, "int4", "llvm", True),  # a panel at a time, row tiles of 6 and a shorter last one
        (37, "int4", "wasm", True),  # one thread: the panel is the module's static array
        (37, "int4", "wasm -mattr=+atomics,+bulk-memory", True),  # its 256 x 8 panel fits the stack
        (37, "float16", "llvm", False),  # a conversion instruction per element: inline up to ~200 rows
        (45, "float16", "wasm", True),  # no half conversions: bit arithmetic per element, a panel from 41 rows
    ],
)
def test_narrow_weights_widened_inline_or_a_panel_at_a_time_match_onnxruntime(rows, weight, target, panel):
    model = _model(rows, weight)
    module = compile_model(model, target=target)
    tir = module.source("tir")
    assert ("allocate dense_weight" in tir) == panel
    x = RNG.standard_normal((rows, INNER)).astype(np.float32)
    # unoptimised: onnxruntime's optimiser makes DequantizeLinear -> MatMul a MatMulNBits that may quantize x to 8 bits
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})
    (actual,) = module.run({"x": x}).values()
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)
