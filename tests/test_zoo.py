"""The zoo's models against onnx's checker and onnxruntime, the digits trainer's gradients against finite
differences, and the shipped digits model's held-out accuracy in onnxruntime and through Tessel's own path."""

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

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


def test_broad_zoo_models_have_their_architectures_signature_ops(models):
    def counts(name):
        return Counter(node.op_type for node in models[name].graph.node)

    def attribute(node, key):
        return next((helper.get_attribute_value(a) for a in node.attribute if a.name == key), None)

    def nodes(name, op):
        return [node for node in models[name].graph.node if node.op_type == op]

    # SqueezeNet 1.1: eight fire modules (a Concat each), three ceil_mode max pools, convs with bias
    assert counts("squeezenet")["Concat"] == 8
    assert [attribute(node, "ceil_mode") for node in nodes("squeezenet", "MaxPool")] == [1, 1, 1]
    assert all(len(node.input) == 3 for node in nodes("squeezenet", "Conv"))
    # ShuffleNetV2: a Split in each of the 13 basic units, a Reshape-Transpose-Reshape shuffle after all 16
    shuffle = counts("shufflenet_v2")
    assert shuffle["Split"] == 13 and shuffle["Transpose"] == 16 and shuffle["Reshape"] == 32
    assert {tuple(attribute(node, "perm")) for node in nodes("shufflenet_v2", "Transpose")} == {(0, 2, 1, 3, 4)}
    # MobileNetV3-small: nine squeeze-excites gated by HardSigmoid, HardSwish from the fourth block on
    assert counts("mobilenet_v3_small")["HardSigmoid"] == 9 and counts("mobilenet_v3_small")["HardSwish"] == 19
    kernels = {tuple(attribute(node, "kernel_shape")) for node in nodes("efficientnet_b0", "Conv")}
    assert {(3, 3), (5, 5), (1, 1)} == kernels
    assert counts("efficientnet_b0")["GlobalAveragePool"] == 10
    assert [len(node.input) for node in nodes("densenet_block", "Concat")] == [2, 3, 4, 5, 6, 7]
    (joined,) = nodes("inception_block", "Concat")
    assert len(joined.input) == 4
    assert counts("resnet50_bottleneck")["Add"] == 3
    assert counts("unet_small")["ConvTranspose"] == 1 and counts("unet_small")["Concat"] == 2
    assert [attribute(node, "mode") for node in nodes("unet_small", "Resize")] == [b"linear"]
    assert [attribute(node, "mode") for node in nodes("yolo_neck", "Resize")] == [b"nearest", b"nearest"]
    assert [attribute(node, "kernel_shape") for node in nodes("yolo_neck", "MaxPool")] == [[5, 5]] * 3
    assert counts("vit_tiny")["LayerNormalization"] == 9 and counts("vit_tiny")["Softmax"] == 4
    assert "LayerNormalization" not in counts("bert_tiny") and counts("bert_tiny")["Pow"] == 5
    audio = nodes("audio_conv1d", "Conv")
    assert {len(attribute(node, "kernel_shape")) for node in audio} == {1}
    assert sorted(attribute(node, "dilations") or [1] for node in audio) == [[1]] * 4 + [[2], [4]]
    odd = nodes("odd_convnet", "Conv")
    assert {attribute(node, "group") for node in odd} == {1, 3, 27}
    assert {tuple(attribute(node, "strides")) for node in odd} == {(1, 1), (2, 2), (3, 3)}
    assert [attribute(node, "ceil_mode") for node in nodes("odd_convnet", "AveragePool")] == [1]
    assert counts("odd_transformer")["Softmax"] == 2 and counts("odd_transformer")["LayerNormalization"] == 5
    # the sequence lengths of CLIP's text encoder (77 tokens: 7x11 patches) and BERT's usual 128
    for name, scores in (("vit_tiny", [1, 3, 77, 77]), ("bert_tiny", [1, 4, 128, 128])):
        inferred = onnx.shape_inference.infer_shapes(models[name]).graph.value_info
        shapes = {info.name: [dim.dim_value for dim in info.type.tensor_type.shape.dim] for info in inferred}
        assert {str(shapes[node.output[0]]) for node in nodes(name, "Softmax")} == {str(scores)}


def test_flops_count_the_multiply_adds_of_each_contraction():
    def single(op, shapes, output, **attrs):
        names = [f"x{index}" for index in range(len(shapes))]
        graph = helper.make_graph(
            [helper.make_node(op, names, ["y"], **attrs)],
            "one",
            [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in zip(names, shapes)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, output)],
        )
        return zoo.model_flops(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))

    # a grouped conv: each of the 1*8*5*5 outputs sums 2 (channels per group) x 3 x 3 products
    assert single("Conv", [[1, 4, 5, 5], [8, 2, 3, 3]], [1, 8, 5, 5], pads=[1] * 4, group=2) == 2 * 200 * 18
    # a transposed conv scatters each of the 1*4*3*3 inputs through 6 x 2 x 2 weights
    assert single("ConvTranspose", [[1, 4, 3, 3], [4, 6, 2, 2]], [1, 6, 6, 6], strides=[2, 2]) == 2 * 36 * 24
    assert single("Gemm", [[7, 5], [3, 7]], [5, 3], transA=1, transB=1) == 2 * 15 * 7
    assert single("MatMul", [[2, 3, 4, 9], [2, 3, 9, 5]], [2, 3, 4, 5]) == 2 * 120 * 9
    assert zoo.model_parameters(zoo.build_model("mlp")) == 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10


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
