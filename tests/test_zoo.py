"""The zoo's models against onnx's checker and onnxruntime, the digits trainer's gradients against finite
differences, and the shipped digits model's held-out accuracy in onnxruntime and through Tessel's own path."""

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from compiler import zoo
from compiler.data import train_digits
from compiler.errors import TesselError


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def models() -> dict[str, onnx.ModelProto]:
    return {name: zoo.build_model(name) for name in zoo.MODELS}


@pytest.mark.parametrize("name", zoo.MODELS)
def test_model_is_valid_onnx_and_runs_in_onnxruntime(models, name):
    model = models[name]
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == 17
    assert [i.name for i in model.graph.input] == ["input"]
    inputs = zoo.sample_input(name)
    assert inputs["input"].shape == zoo.INPUT_SHAPES[name]
    assert inputs["input"].dtype == np.float32
    (output,) = _session(model).run(None, inputs)
    assert np.all(np.isfinite(output))
    # He-scaled weights and realistic batch-norm statistics keep activations far from overflow or vanishing.
    assert 1e-3 < float(np.abs(output).mean()) < 1e3


def test_model_op_counts_match_the_published_architectures(models):
    def counts(model):
        return Counter(node.op_type for node in model.graph.node)

    def depthwise(model):
        return sum(
            1
            for n in model.graph.node
            if n.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in n.attribute)
        )

    mobilenet = counts(models["mobilenet_v2"])
    assert mobilenet["Conv"] == 52 and depthwise(models["mobilenet_v2"]) == 17
    assert mobilenet["BatchNormalization"] == 52
    assert mobilenet["Clip"] == 35 and mobilenet["Add"] == 10
    assert mobilenet["Gemm"] == 1

    resnet = counts(models["resnet18"])
    assert resnet["Conv"] == 20 and depthwise(models["resnet18"]) == 0
    assert resnet["BatchNormalization"] == 20 and resnet["Add"] == 8 and resnet["MaxPool"] == 1
    for op in ("Shape", "Gather", "Unsqueeze", "Concat", "Reshape"):
        assert resnet[op] == 1, op

    assert counts(models["dwconv_block"]) == Counter({"Conv": 1, "Mul": 1, "Add": 1, "Relu": 1})
    assert depthwise(models["dwconv_block"]) == 1
    assert counts(models["mlp"]) == Counter({"Gemm": 3, "Relu": 2})


def test_models_are_deterministic():
    assert zoo.build_model("mlp").SerializeToString() == zoo.build_model("mlp").SerializeToString()
    assert np.array_equal(zoo.sample_input("resnet18", seed=3)["input"], zoo.sample_input("resnet18", seed=3)["input"])
    assert not np.array_equal(zoo.sample_input("mlp", seed=0)["input"], zoo.sample_input("mlp", seed=1)["input"])


def test_unknown_model_names_the_choices(tmp_path):
    for call in (zoo.build_model, zoo.sample_input, lambda name: zoo.save_model(name, tmp_path / "x.onnx")):
        with pytest.raises(
            TesselError, match="unknown zoo model 'vgg'.*mlp, mobilenet_v2, resnet18, dwconv_block, digits"
        ):
            call("vgg")


def test_save_model_round_trips(tmp_path):
    path = zoo.save_model("dwconv_block", tmp_path / "block.onnx")
    loaded = onnx.load(str(path))
    assert loaded.SerializeToString() == zoo.build_model("dwconv_block").SerializeToString()


# -- the digits trainer and the shipped model -------------------------------------------------------------------


def test_trainer_gradients_match_finite_differences():
    rng = np.random.default_rng(5)
    params = train_digits._Params.initial(rng)
    params.conv1_bias = rng.normal(0, 0.1, 16)
    params.conv2_bias = rng.normal(0, 0.1, 32)
    x = rng.random((3, 1, 8, 8))
    labels = np.array([1, 7, 3])
    _, grads = train_digits._gradients(params, x, labels)
    step = 1e-6
    for name in params.names():
        array = getattr(params, name)
        for flat_index in rng.choice(array.size, size=4, replace=False):
            index = np.unravel_index(flat_index, array.shape)
            original = array[index]
            array[index] = original + step
            plus, _ = train_digits._gradients(params, x, labels)
            array[index] = original - step
            minus, _ = train_digits._gradients(params, x, labels)
            array[index] = original
            numeric = (plus - minus) / (2 * step)
            assert grads[name][index] == pytest.approx(numeric, rel=1e-4, abs=1e-7), (name, index)


def test_exported_model_matches_the_trainers_forward_pass(tmp_path):
    params = train_digits._Params.initial(np.random.default_rng(9))
    path = tmp_path / "digits.onnx"
    train_digits.export(params, path)
    x = np.random.default_rng(2).random((1, 1, 8, 8)).astype(np.float32)
    logits, _ = train_digits._forward(params, x.astype(np.float64))
    expected = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    (probabilities,) = _session(onnx.load(str(path))).run(None, {"input": x})
    np.testing.assert_allclose(probabilities, expected, rtol=1e-4, atol=1e-6)


def test_held_out_split_is_the_stratified_quarter():
    x_test, y_test = train_digits.held_out_split()
    assert x_test.shape == (450, 1, 8, 8) and x_test.dtype == np.float32
    assert y_test.shape == (450,) and y_test.dtype == np.int64
    assert 0.0 <= x_test.min() and x_test.max() <= 1.0
    # Stratified: each of the ten classes keeps about a quarter of its ~180 images.
    assert np.all(np.abs(np.bincount(y_test, minlength=10) - 45) <= 2)


def test_shipped_digits_model_is_accurate_in_onnxruntime():
    assert zoo.DIGITS_PATH.stat().st_size < 1 << 20
    model = zoo.build_model("digits")
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert shape == [1, 1, 8, 8]
    assert [o.name for o in model.graph.output] == ["probabilities"]
    session = _session(model)
    x_test, y_test = train_digits.held_out_split()
    predictions = [int(session.run(None, {"input": image[None]})[0].argmax()) for image in x_test]
    assert np.mean(np.array(predictions) == y_test) >= 0.95


def test_shipped_digits_model_is_accurate_through_tessel():
    from compiler.frontend.onnx import load_onnx
    from compiler.graph.reference import run_reference
    from compiler.passes.pipeline import optimize

    graph = optimize(load_onnx(zoo.build_model("digits")), fuse=True)
    session = _session(zoo.build_model("digits"))
    x_test, y_test = train_digits.held_out_split()
    predictions = []
    for index, image in enumerate(x_test):
        (probabilities,) = run_reference(graph, {"input": image[None]}).values()
        if index < 20:
            np.testing.assert_allclose(
                probabilities, session.run(None, {"input": image[None]})[0], rtol=1e-4, atol=1e-5
            )
        predictions.append(int(probabilities.argmax()))
    assert np.mean(np.array(predictions) == y_test) >= 0.95
