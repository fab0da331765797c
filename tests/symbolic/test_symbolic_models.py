"""A model compiled once with a symbolic size runs every size in its range (issue 40 §1): a hand-made attention block
that computes its shapes, positions and causal mask from the input's shape at run time (Shape, Gather, Range,
Concat into a Reshape's shape, a Slice from a computed start, a Concat along the symbolic axis, CumSum), against
onnxruntime on the same file at the range's ends and odd sizes between, natively and in wasm; the bundle keeps the
sizes; a size outside the range, a wrong rank and disagreeing sizes are refused by name."""

import hashlib
import json
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler import compile_model, load_module
from compiler.bundle import BundleError
from compiler.errors import RunError, ShapeError, TargetError
from compiler.frontend.onnx import load_onnx, parse_dims

HIGH = 40
DIMS = {"seq": (1, HIGH)}


def _model() -> bytes:
    rng = np.random.default_rng(0)

    def const(name, array):
        return numpy_helper.from_array(np.asarray(array), name)

    weights = [
        const("positions", rng.standard_normal((64, 16)).astype(np.float32)),
        const("tokens", rng.standard_normal((50, 16)).astype(np.float32)),
        const("wq", rng.standard_normal((16, 16)).astype(np.float32) * 0.3),
        const("wk", rng.standard_normal((16, 16)).astype(np.float32) * 0.3),
        const("wv", rng.standard_normal((16, 16)).astype(np.float32) * 0.3),
        const("zero", np.array(0, np.int64)),
        const("one", np.array(1, np.int64)),
        const("axis0", np.array([0], np.int64)),
        const("axis1", np.array([1], np.int64)),
        const("one_list", np.array([1], np.int64)),
        const("heads", np.array([2, 8], np.int64)),
        const("merged", np.array([0, -1, 16], np.int64)),
        const("scale", np.array(0.35, np.float32)),
        const("masked", np.array(-1e9, np.float32)),
        const("far", np.array([1 << 30], np.int64)),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["seq"]),
        helper.make_node("Range", ["zero", "seq", "one"], ["range"]),
        helper.make_node("Unsqueeze", ["range", "axis0"], ["position_ids"]),
        helper.make_node("Gather", ["positions", "position_ids"], ["position_rows"]),
        helper.make_node("Gather", ["tokens", "ids"], ["token_rows"]),
        helper.make_node("Add", ["x", "position_rows"], ["h0"]),
        helper.make_node("Add", ["h0", "token_rows"], ["h"]),
        helper.make_node("Unsqueeze", ["seq", "axis0"], ["seq_list"]),
        helper.make_node("Concat", ["one_list", "seq_list", "heads"], ["split_shape"], axis=0),
    ]
    for name, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [
            helper.make_node("MatMul", ["h", f"w{name}"], [f"{name}_flat"]),
            helper.make_node("Reshape", [f"{name}_flat", "split_shape"], [f"{name}_heads"]),
            helper.make_node("Transpose", [f"{name}_heads"], [name], perm=perm),
        ]
    nodes += [
        helper.make_node("MatMul", ["q", "k"], ["raw_scores"]),
        helper.make_node("Mul", ["raw_scores", "scale"], ["scores"]),
        helper.make_node("Unsqueeze", ["range", "axis1"], ["rows"]),
        helper.make_node("LessOrEqual", ["position_ids", "rows"], ["causal"]),
        helper.make_node("Where", ["causal", "scores", "masked"], ["masked_scores"]),
        helper.make_node("Softmax", ["masked_scores"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["mixed"]),
        helper.make_node("Transpose", ["mixed"], ["mixed_rows"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["mixed_rows", "merged"], ["attended"]),
        helper.make_node("Concat", ["x", "h"], ["both"], axis=1),
        helper.make_node("Sub", ["seq", "one"], ["last"]),
        helper.make_node("Unsqueeze", ["last", "axis0"], ["start"]),
        helper.make_node("Slice", ["both", "start", "far", "axis1"], ["tail"]),
        helper.make_node("CumSum", ["ids", "one"], ["running"]),
    ]
    graph = helper.make_graph(
        nodes,
        "symbolic_attention",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 16]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "seq"]),
        ],
        [
            helper.make_tensor_value_info("attended", TensorProto.FLOAT, [1, "seq", 16]),
            helper.make_tensor_value_info("tail", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("running", TensorProto.INT64, [1, "seq"]),
        ],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


MODEL = _model()


def _feeds(size: int) -> dict:
    rng = np.random.default_rng(size)
    return {
        "x": rng.standard_normal((1, size, 16)).astype(np.float32),
        "ids": rng.integers(0, 50, (1, size)).astype(np.int64),
    }


@pytest.fixture(scope="module")
def reference():
    session = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    return lambda feeds: dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def test_the_import_keeps_the_size_symbolic():
    graph = load_onnx(MODEL, dims=DIMS)
    assert [str(value.type) for value in graph.inputs] == ["float32[1,seq,16]", "int64[1,seq]"]
    assert [str(value.type) for value in graph.outputs] == ["float32[1,seq,16]", "float32[1,seq+1,16]", "int64[1,seq]"]
    text = str(graph)
    assert "Range() {delta=1, limit=seq, start=0}" in text and "shape=[1,seq,2,8]" in text


@pytest.mark.parametrize("target", ["llvm", "wasm"])
def test_one_bundle_runs_every_size(target, reference, tmp_path):
    module = compile_model(MODEL, target=target, dims=DIMS)
    assert module.manifest["sizes"] == [{"name": "seq", "min": 1, "max": HIGH}]
    assert module.manifest["outputs"][1]["shape"] == [1, "seq+1", 16]
    loaded = load_module(module.export(tmp_path / "bundle"))
    for size in (1, 2, 7, 23, HIGH):
        feeds = _feeds(size)
        want = reference(feeds)
        for runner in (module, loaded):
            got = runner.run(feeds)
            assert got["tail"].shape == (1, size + 1, 16)
            np.testing.assert_allclose(got["attended"], want["attended"], rtol=1e-4, atol=1e-5)
            np.testing.assert_array_equal(got["tail"], want["tail"])
            np.testing.assert_array_equal(got["running"], want["running"])


def test_runs_outside_the_range_are_refused_by_name():
    module = compile_model(MODEL, target="llvm", dims=DIMS)
    with pytest.raises(ShapeError, match=r"input 'x' axis 1 gives the size seq = 41, outside the range 1\.\.40"):
        module.run(_feeds(HIGH + 1))
    with pytest.raises(ShapeError, match="the model takes rank 3"):
        module.run({"x": np.zeros((5, 16), np.float32), "ids": np.zeros((1, 5), np.int64)})
    with pytest.raises(ShapeError, match="which is the size seq, but input 'x' axis 1 gives seq = 5"):
        module.run({"x": np.zeros((1, 5, 16), np.float32), "ids": np.zeros((1, 6), np.int64)})
    with pytest.raises(ShapeError, match=r"the model takes \(1, 5, 16\)"):
        module.run({"x": np.zeros((1, 5, 8), np.float32), "ids": np.zeros((1, 5), np.int64)})


def test_what_cannot_be_compiled_symbolically_says_why():
    with pytest.raises(ShapeError, match="--dim seq=1..2048"):
        load_onnx(MODEL)
    with pytest.raises(ShapeError, match="dims names 'tokens', which no input's shape uses"):
        load_onnx(MODEL, dims={"tokens": (1, 8)})
    # the position table has 64 rows: a run past them reads out of its range, as onnxruntime refuses too
    with pytest.raises(RunError, match="index is out of range in Range/Unsqueeze/Gather"):
        compile_model(MODEL, target="llvm", dims={"seq": (1, 100)}).run(_feeds(80))
    with pytest.raises(TargetError, match="CPU targets"):
        compile_model(MODEL, target="webgpu", dims=DIMS)


def test_static_shapes_still_compile_as_before(reference):
    module = compile_model(MODEL, target="llvm", input_shapes={"x": (1, 7, 16), "ids": (1, 7)})
    assert "sizes" not in module.manifest and "sizes" not in module.manifest["entry"]["arguments"]
    feeds = _feeds(7)
    np.testing.assert_allclose(module.run(feeds)["attended"], reference(feeds)["attended"], rtol=1e-4, atol=1e-5)


def test_the_cli_compiles_with_dim(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(MODEL)
    done = subprocess.run(
        [sys.executable, "-m", "compiler", "compile", str(path), "--target", "llvm", "--dim", "seq=1..40"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert load_module(tmp_path / "model.bundle").manifest["sizes"][0]["max"] == HIGH
    bad = subprocess.run(
        [sys.executable, "-m", "compiler", "compile", str(path), "--dim", "seq=1..x"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "NAME=LOW..HIGH" in bad.stderr and "Traceback" not in bad.stderr


def _edited(bundle, change) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    change(manifest)
    manifest["files"] = {name: hashlib.sha256((bundle / name).read_bytes()).hexdigest() for name in manifest["files"]}
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def _sizes(manifest, **range_):
    manifest["sizes"][0].update(range_)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: _sizes(m, max=1 << 31), "range outside 0..2147483647"),
        (lambda m: _sizes(m, name="9seq"), "misnamed"),
        (lambda m: m["sizes"].append({"name": "seq", "min": 1, "max": 2}), "repeated"),
        (lambda m: m["inputs"][0]["shape"].__setitem__(1, "-seq"), "stays at least 0"),
        (lambda m: m["inputs"][0]["shape"].__setitem__(1, "3"), "not a size expression"),
        (lambda m: m["inputs"][0]["shape"].__setitem__(1, "past"), "names 'past'"),
        (lambda m: [spec["shape"].__setitem__(1, "2*seq") for spec in m["inputs"]], "as a dim of its own"),
    ],
)
def test_a_bundle_with_bad_sizes_is_refused_on_load(tmp_path, change, message):
    bundle = compile_model(MODEL, target="llvm", dims=DIMS).export(tmp_path / "bundle")
    _edited(bundle, change)
    with pytest.raises(BundleError, match=message):
        load_module(bundle)


def test_sizes_past_32_bits_are_refused_at_compile_time():
    with pytest.raises(ShapeError, match="32-bit"):
        load_onnx(MODEL, dims={"seq": (1, 1 << 31)})


def test_a_size_may_be_zero():
    """A cache that starts empty: a Concat along a size whose range holds 0 (past in 0..9), run at past = 0 too."""
    graph = helper.make_graph(
        [helper.make_node("Concat", ["past_rows", "rows"], ["all_rows"], axis=1)],
        "cache",
        [
            helper.make_tensor_value_info("past_rows", TensorProto.FLOAT, [1, "past", 8]),
            helper.make_tensor_value_info("rows", TensorProto.FLOAT, [1, "seq", 8]),
        ],
        [helper.make_tensor_value_info("all_rows", TensorProto.FLOAT, [1, "past+seq", 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    for target in ("llvm", "wasm"):
        module = compile_model(model, target=target, dims={"past": (0, 9), "seq": (1, 4)})
        assert module.manifest["outputs"][0]["shape"] == [1, "past+seq", 8]
        for past, seq in ((0, 1), (0, 4), (3, 2), (9, 4)):
            rng = np.random.default_rng(past * 10 + seq)
            feeds = {
                "past_rows": rng.standard_normal((1, past, 8), np.float32),
                "rows": rng.standard_normal((1, seq, 8), np.float32),
            }
            got = module.run(feeds)["all_rows"]
            np.testing.assert_array_equal(got, np.concatenate([feeds["past_rows"], feeds["rows"]], axis=1))


def test_a_concat_of_symbolic_parts_is_made_by_a_kernel():
    """Concat parts of a batch of 1 are usually written in place, end to end; parts of symbolic sizes lie at their
    largest shapes' offsets instead, so their Concat keeps its kernel."""
    weight = numpy_helper.from_array(np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["a"]),
            helper.make_node("Softmax", ["x"], ["b"], axis=-1),
            helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
            helper.make_node("MatMul", ["c", "w"], ["y"]),
        ],
        "parts",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    module = compile_model(model, target="llvm", dims={"seq": (1, 12)})
    x = np.random.default_rng(2).standard_normal((1, 5, 8)).astype(np.float32)
    softmax = np.exp(x) / np.exp(x).sum(-1, keepdims=True)
    w = numpy_helper.to_array(weight)
    want = np.concatenate([x @ w, softmax], axis=1) @ w
    np.testing.assert_allclose(module.run({"x": x})["y"], want, rtol=1e-5, atol=1e-6)


def test_dims_parse_ranges_and_expressions():
    assert parse_dims(["past=0..63", "seq=1..64", "total=past+seq"]) == {
        "past": (0, 63),
        "seq": (1, 64),
        "total": "past+seq",
    }
    for bad, message in (("seq", "NAME=LOW..HIGH"), ("seq=5..2", "empty or negative"), ("seq=1..2", None)):
        if message is None:
            with pytest.raises(ShapeError, match="twice"):
                parse_dims([bad, bad])
        else:
            with pytest.raises(ShapeError, match=message):
                parse_dims([bad])
    # an expression naming a size no range gives is refused at import, by name
    with pytest.raises(ShapeError, match="names 'past'"):
        load_onnx(MODEL, dims={"seq": "past+1"})


def test_a_range_past_32_bit_indexing_is_refused_before_lowering():
    with pytest.raises(ShapeError, match=r"'causal' \(bool\[seq,seq\]\) has 10,000,000,000 elements.*narrower --dim"):
        compile_model(MODEL, target="llvm", dims={"seq": (1, 100_000)})


def test_replay_and_profile_take_a_runs_sizes(reference):
    module = compile_model(MODEL, target="llvm", dims=DIMS)
    feeds = _feeds(9)
    outputs, times = module.replay(feeds)
    np.testing.assert_allclose(outputs["attended"], reference(feeds)["attended"], rtol=1e-4, atol=1e-5)
    assert outputs["tail"].shape == (1, 10, 16) and len(times) == len(module.manifest["calls"])
    assert all(entry["median_ms"] >= 0 for entry in module.profile(repeat=1, feeds=feeds))
