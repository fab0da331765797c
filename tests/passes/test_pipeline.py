"""The pass pipeline on every zoo model: the optimised graph computes what the unoptimised graph and
onnxruntime compute, and a pass that breaks the graph is named."""

import numpy as np
import onnxruntime
import pytest

from compiler import zoo
from compiler.frontend.onnx import load_onnx
from compiler.graph.ir import Graph, GraphError, TensorType
from compiler.graph.reference import run_reference
from compiler.passes import pipeline
from compiler.passes.fuse_ops import group_summary

GONE_OPS = {"BatchNormalization", "Identity", "Dropout"}


@pytest.mark.parametrize("name", zoo.MODELS)
def test_optimized_zoo_model_matches_reference_and_onnxruntime(name):
    model = zoo.build_model(name)
    graph = load_onnx(model)
    optimized = pipeline.optimize(graph)
    summary = group_summary(optimized)
    print(f"{name}: {len(graph.nodes)} nodes -> {len(summary)} fused groups")

    members = {op for _, _, ops in summary for op in ops}
    assert not members & GONE_OPS
    inputs = zoo.sample_input(name)
    expected = run_reference(graph, inputs)
    actual = run_reference(optimized, inputs)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    runtime = session.run(None, inputs)
    assert list(actual) == list(expected)
    for (output, array), oracle in zip(actual.items(), runtime, strict=True):
        np.testing.assert_allclose(array, expected[output], rtol=1e-4, atol=1e-5, err_msg=f"{output} vs unoptimised")
        np.testing.assert_allclose(array, oracle, rtol=1e-4, atol=1e-5, err_msg=f"{output} vs onnxruntime")
        np.testing.assert_allclose(expected[output], oracle, rtol=1e-4, atol=1e-5, err_msg=f"unoptimised {output}")


def test_seed_block_is_one_kernel():
    optimized = pipeline.optimize(load_onnx(zoo.build_model("dwconv_block")))
    assert [ops for _, _, ops in group_summary(optimized)] == [["Conv", "Mul", "Add", "Relu"]]


def test_without_fusion_the_graph_keeps_plain_ops():
    optimized = pipeline.optimize(load_onnx(zoo.build_model("digits")), fuse=False)
    assert optimized.nodes and all(node.op != "fused" for node in optimized.nodes)


def test_a_pass_that_breaks_the_graph_is_named(monkeypatch):
    def forget_inputs(graph: Graph) -> Graph:
        broken = graph.copy()
        broken.inputs = []
        return broken

    monkeypatch.setattr(pipeline, "PASSES", [*pipeline.PASSES, forget_inputs])
    graph = Graph()
    x = graph.add_input("x", TensorType((2,), "float32"))
    graph.outputs = graph.add_node("Relu", [x])
    with pytest.raises(GraphError, match="pass forget_inputs broke the graph"):
        pipeline.optimize(graph)
