"""Kernels of a symbolic model at a decode step's sizes (issue 40 §2): a MatMulPacked planned for the largest sizes
computes its rows in blocks (6 x 64 accumulators on AVX-512), so a single row would fill a block with padding; its
kernel carries a variant planned for the smallest sizes, chosen at run time (schedule_small_sizes, tir/variants.py).
A KV cache's concat along `past + seq`, and its repeat for grouped-query attention, loop over that size instead of
dividing by it. Each checked on the loop IR and against numpy at the smallest sizes and beside them."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler import compile_model
from compiler.te.expr import Binary, Compare, Const, SizeVar, TEError
from compiler.tir.nodes import Allocate, For, ForKind, IfThen, LetStmt, PrimFunc, Seq, walk_stmts
from compiler.tir.variants import by_smallest_sizes
from compiler.tir.visitor import walk


def _dense_model(columns: int = 200) -> bytes:
    weight = np.random.default_rng(0).standard_normal((48, columns)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 48])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", columns])],
        [numpy_helper.from_array(weight, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _kernel(module, op: str) -> PrimFunc:
    name = next(kernel["name"] for kernel in module.manifest["kernels"] if kernel["ops"][0] == op)
    return next(func for func in module.funcs if func.name == name)


def _blocks(stmt) -> list[tuple]:
    return [node.buffer.shape for node in walk_stmts(stmt) if isinstance(node, Allocate)]


@pytest.mark.parametrize("target", ["llvm", "wasm"])
def test_a_dense_kernel_picks_a_one_row_variant_at_the_smallest_size(target):
    module = compile_model(_dense_model(), target=target, dims={"seq": (1, 64)})
    func = _kernel(module, "MatMulPacked")
    assert isinstance(func.body, LetStmt) and func.body.var.name == "seq"
    choice = func.body.body
    assert isinstance(choice, IfThen) and isinstance(choice.cond, Compare) and choice.cond.op == "eq"
    assert choice.cond.a is func.body.var and choice.cond.b.value == 1
    # the variant: one row of accumulators, its sizes constants; the general kernel: a block of several rows
    assert all(shape[-2] == 1 for shape in _blocks(choice.then_body))
    assert not any(isinstance(node, SizeVar) for stmt in walk_stmts(choice.then_body) for node in walk(stmt))
    assert max(shape[-2] for shape in _blocks(choice.else_body)) > 1
    weight = np.random.default_rng(0).standard_normal((48, 200)).astype(np.float32)
    for seq in (1, 2, 7, 64):
        x = np.random.default_rng(seq).standard_normal((1, seq, 48)).astype(np.float32)
        np.testing.assert_allclose(module.run({"x": x})["y"], x @ weight, rtol=1e-4, atol=1e-4)


def test_a_cache_concat_loops_over_its_symbolic_rows():
    graph = helper.make_graph(
        [helper.make_node("Concat", ["past_rows", "rows"], ["all_rows"], axis=2)],
        "cache",
        [
            helper.make_tensor_value_info("past_rows", TensorProto.FLOAT, [1, 4, "past", 32]),
            helper.make_tensor_value_info("rows", TensorProto.FLOAT, [1, 4, "seq", 32]),
        ],
        [helper.make_tensor_value_info("all_rows", TensorProto.FLOAT, [1, 4, "past+seq", 32])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    module = compile_model(model, target="llvm", dims={"past": (0, 30), "seq": (1, 4)})
    func = _kernel(module, "Concat")
    parallel = [stmt for stmt in walk_stmts(func.body) if isinstance(stmt, For) and stmt.kind == ForKind.PARALLEL]
    assert [stmt.extent.value for stmt in parallel if isinstance(stmt.extent, Const)] == [4]
    assert not _size_divisions(func)
    for past, seq in ((0, 1), (5, 1), (30, 4)):
        rng = np.random.default_rng(past + seq)
        feeds = {
            "past_rows": rng.standard_normal((1, 4, past, 32), np.float32),
            "rows": rng.standard_normal((1, 4, seq, 32), np.float32),
        }
        want = np.concatenate([feeds["past_rows"], feeds["rows"]], axis=2)
        np.testing.assert_array_equal(module.run(feeds)["all_rows"], want)


def test_grouped_query_attention_repeats_its_cache_without_dividing_by_a_size():
    """Llama's repeat_kv: the cache Unsqueezed, Expanded from 3 to 9 heads, Reshaped and transposed for Q K^T. The
    Unsqueeze's new axis is a reshape group of its own, so the rows read straight through (it had joined them to the
    head dim, and every lane divided by past + seq)."""
    ints = {"axis": [2], "front": [0], "two": 2, "expanded": [1, 3, 3], "width": [64], "heads": [9]}
    nodes = [
        helper.make_node("Concat", ["past_k", "k"], ["all"], axis=2),
        helper.make_node("Unsqueeze", ["all", "axis"], ["wide"]),
        helper.make_node("Shape", ["all"], ["shape"]),
        helper.make_node("Gather", ["shape", "two"], ["rows"]),
        helper.make_node("Unsqueeze", ["rows", "front"], ["row_list"]),
        helper.make_node("Concat", ["expanded", "row_list", "width"], ["expand_shape"], axis=0),
        helper.make_node("Expand", ["wide", "expand_shape"], ["repeated"]),
        helper.make_node("Concat", ["heads", "row_list", "width"], ["merged_shape"], axis=0),
        helper.make_node("Reshape", ["repeated", "merged_shape"], ["merged"]),
        helper.make_node("Transpose", ["merged"], ["kt"], perm=[0, 2, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "repeat_kv",
        [
            helper.make_tensor_value_info("past_k", TensorProto.FLOAT, [1, 3, "past", 64]),
            helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, 3, "seq", 64]),
        ],
        [helper.make_tensor_value_info("kt", TensorProto.FLOAT, [9, 64, "past+seq"])],
        [numpy_helper.from_array(np.array(value, np.int64), name) for name, value in ints.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    module = compile_model(model, target="llvm", dims={"past": (0, 40), "seq": (1, 8)})
    assert not _size_divisions(_kernel(module, "Concat"))
    for past, seq in ((0, 3), (1, 1), (17, 1), (40, 8)):
        rng = np.random.default_rng(past * 9 + seq)
        feeds = {
            "past_k": rng.standard_normal((1, 3, past, 64), np.float32),
            "k": rng.standard_normal((1, 3, seq, 64), np.float32),
        }
        rows = np.concatenate([feeds["past_k"], feeds["k"]], axis=2)
        want = np.repeat(rows, 3, axis=1).reshape(9, past + seq, 64).transpose(0, 2, 1)
        np.testing.assert_array_equal(module.run(feeds)["kt"], want)


def _size_divisions(func: PrimFunc) -> list:
    """The divisions of `func` by a value known only at run time."""
    return [
        node
        for stmt in walk_stmts(func.body)
        for node in walk(stmt)
        if isinstance(node, Binary) and node.op in ("floordiv", "floormod", "div") and not isinstance(node.b, Const)
    ]


def test_variants_must_share_arguments_and_read_sizes():
    module = compile_model(_dense_model(), target="llvm", dims={"seq": (1, 64)})
    general = _kernel(module, "MatMulPacked")
    other = PrimFunc(general.name, general.params[:-1], Seq(()))
    with pytest.raises(TEError, match="must take the general kernel's arguments"):
        by_smallest_sizes(general, other)
    with pytest.raises(TEError, match="must read the sizes"):
        by_smallest_sizes(general, PrimFunc(general.name, general.params, Seq(())))
