"""passes/widen_half.py: a float16 model computes in float32 on CPU targets, its large dense weights kept float16 in
the bundle and widened by the kernel; a model without float16 values passes through untouched. Accuracy against
onnxruntime on converted models is tests/frontend/test_fp16_models.py's (the same tolerance holds: float32
arithmetic on the model's float16 weights is closer to the float32 model than onnxruntime's float16 graph)."""

import numpy as np
from onnxruntime.transformers.float16 import convert_float_to_float16

from compiler import zoo
from compiler.frontend import load_onnx
from compiler.passes.pipeline import optimize
from compiler.passes.widen_half import widen_half
from compiler.target import Target

CPU = Target.parse("llvm")


def _half_values(graph) -> list[str]:
    """Every float16 value computed inside the graph (params, the weights kept narrow, are stored values)."""
    edges = {*graph.inputs, *graph.outputs, *graph.params}
    return [value.name for value in graph.values() if value.type.dtype == "float16" and value not in edges]


def test_a_float16_transformer_computes_in_float32_with_float16_dense_weights():
    model = convert_float_to_float16(zoo.build_model("bert_tiny"), keep_io_types=False)
    graph = optimize(load_onnx(model.SerializeToString()), fuse=False, target=CPU)
    assert _half_values(graph) == []
    assert [v.type.dtype for v in graph.inputs] == ["float16"] and graph.outputs[0].type.dtype == "float16"
    packed = [node.inputs[1].type.dtype for node in graph.nodes if node.op == "MatMulPacked"]
    assert packed == ["float16"] * 13  # the 12 projections and the single-row pooler


def test_a_graph_without_float16_is_returned_unchanged():
    graph = load_onnx(zoo.build_model("mlp").SerializeToString())
    assert widen_half(graph, CPU) is graph


def test_float16_convnet_weights_are_widened_at_compile_time():
    """Conv weights have no float16 kernel path: they become float32 params (the ConvNCHWc reads float32)."""
    model = convert_float_to_float16(zoo.build_model("resnet50_bottleneck"), keep_io_types=True)
    graph = optimize(load_onnx(model.SerializeToString()), fuse=False, target=CPU)
    assert _half_values(graph) == []
    convs = [node for node in graph.nodes if node.op.startswith("Conv")]
    assert convs and all(node.inputs[1].type.dtype == "float32" for node in convs)
    assert np.dtype(graph.inputs[0].type.dtype) == np.float32


def test_a_float16_param_output_as_it_is_stays_defined():
    """A float16 initializer that is also a graph output keeps its float16 bytes for the output, and its readers
    read the widened twin."""
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.arange(6, dtype=np.float16).reshape(2, 3), "table")
    node = helper.make_node("Add", ["x", "table"], ["sum"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 3])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT16, [2, 3]) for name in ("sum", "table")],
        [table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    widened = optimize(load_onnx(model.SerializeToString()), fuse=False, target=CPU)
    assert [value.type.dtype for value in widened.outputs] == ["float16", "float16"]
    assert _half_values(widened) == []
