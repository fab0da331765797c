"""float16 models as onnxruntime's converter writes them (issue 41): a zoo convnet and a small transformer, converted
with `convert_float_to_float16` with and without keep_io_types, compile for llvm and match onnxruntime on the same
file. With keep_io_types the converter appends its input Casts at the end of the node list, so these models also
hold the importer's sort.

The oracle runs the model as written (graph optimizations off: onnxruntime's LayerNormFusion refuses the converted
transformer, binding a float16 and a float32 input to one type). Tolerance: every element within 8 float16 rounding
steps of the output's largest magnitude (8 * 2^-11 * max|expected|), and the mean within 1. Both sides round each
op's result to float16 and they disagree on some of those roundings (onnxruntime's float16 Sub is not always
correctly rounded; Tessel's is), so differences of a few steps build up through the layers: the largest measured
are 5 steps (bert_tiny) and 1.2 (resnet50_bottleneck), with means of 0.84 and 0.19."""

import numpy as np
import onnxruntime
import pytest
from onnxruntime.transformers.float16 import convert_float_to_float16

from compiler import compile_model, zoo
from compiler.frontend.order import node_order

ROUNDING_STEP = 2.0**-11  # float16's unit roundoff
_OPTIONS = onnxruntime.SessionOptions()
_OPTIONS.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL


@pytest.mark.parametrize("keep_io_types", [True, False], ids=["keep_io_types", "float16_io"])
@pytest.mark.parametrize("name", ["resnet50_bottleneck", "bert_tiny"])
def test_a_float16_model_from_onnxruntime_s_converter_compiles_and_matches_onnxruntime(name, keep_io_types):
    model = convert_float_to_float16(zoo.build_model(name), keep_io_types=keep_io_types)
    in_file_order = node_order(model.graph) == list(range(len(model.graph.node)))
    assert in_file_order != keep_io_types, "keep_io_types's input Casts are no longer at the end of the node list"
    data = model.SerializeToString()
    session = onnxruntime.InferenceSession(data, _OPTIONS, providers=["CPUExecutionProvider"])
    ((name_in, shape, dtype),) = [
        (i.name, i.shape, np.float32 if keep_io_types else np.float16) for i in session.get_inputs()
    ]
    feeds = {name_in: np.random.default_rng(0).standard_normal(shape).astype(dtype)}
    (expected,) = session.run(None, feeds)
    (got,) = compile_model(data, target="llvm").run(feeds).values()
    assert got.dtype == expected.dtype == dtype and got.shape == expected.shape
    scale = float(np.abs(expected).max())
    difference = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    assert difference.max() <= 8 * ROUNDING_STEP * scale
    assert difference.mean() <= ROUNDING_STEP * scale
