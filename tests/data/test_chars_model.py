"""The character-level text model that the /generate demo runs (compiler/data/train_chars.py, shipped as chars.onnx
and chars.json): its export keeps the decoder-with-cache contract of compiler/generate.py, it compiles for wasm with
its symbolic sizes, and Module.generate picks the tokens that the same loop picks over onnxruntime; the shipped model
writes words of its training text; the training script runs (a few steps) and exports what it trained."""

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import compiler
from compiler.data import train_chars
from compiler.generate import FeedStepper, generate

PROMPT = "The compiler "


@pytest.fixture(scope="module")
def about():
    return train_chars.load_vocabulary()


@pytest.fixture(scope="module")
def module():
    return compiler.compile_model(str(train_chars.MODEL_PATH), target="wasm", dims=train_chars.dims())


def _onnxruntime_stepper(path, module):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    inputs = {spec.name: (spec.shape, spec.dtype) for spec in module.inputs}
    return FeedStepper(lambda feeds: dict(zip(names, session.run(None, feeds), strict=True)), inputs, names)


def test_shipped_files_keep_the_decoder_contract(about):
    text = train_chars.load_text()
    assert about["vocabulary"] == train_chars.vocabulary(text) and about["context"] == train_chars.CONTEXT
    assert text == train_chars.plain(text), "chars.txt holds characters plain() would not keep"
    model = onnx.load(str(train_chars.MODEL_PATH))
    assert model.graph.input[0].name == "input_ids" and model.graph.input[1].name == "attention_mask"

    def dims(value):
        return [dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]

    depth = train_chars.WIDTH // train_chars.HEADS
    inputs = {value.name: dims(value) for value in model.graph.input}
    outputs = {value.name: dims(value) for value in model.graph.output}
    assert inputs.pop("input_ids") == [1, "seq"] and inputs.pop("attention_mask") == [1, "total"]
    layers = [(layer, kind) for layer in range(train_chars.LAYERS) for kind in ("key", "value")]
    assert inputs == {
        f"past_key_values.{layer}.{kind}": [1, train_chars.HEADS, "past", depth] for layer, kind in layers
    }
    assert outputs.pop("logits") == [1, "seq", len(about["vocabulary"])]
    assert sorted(outputs) == sorted(f"present.{layer}.{kind}" for layer, kind in layers)
    assert train_chars.MODEL_PATH.stat().st_size < 1_000_000


def test_generate_picks_onnxruntimes_tokens(module, about):
    prompt = train_chars.encode(PROMPT, about["vocabulary"])
    stepper = _onnxruntime_stepper(train_chars.MODEL_PATH, module)
    want = generate(stepper, prompt, 40)
    seen = []
    got = module.generate(prompt, 40, on_token=seen.append)
    assert got.tolist() == want.tolist() == seen and len(got) == 40
    options = {"temperature": 0.8, "top_k": 20, "seed": 5}
    want = generate(_onnxruntime_stepper(train_chars.MODEL_PATH, module), prompt, 40, **options)
    assert module.generate(prompt, 40, **options).tolist() == want.tolist()
    # the cache holds context - 1 characters at most: the prompt and the new ones but the last must fit
    longest = train_chars.CONTEXT + 1 - len(prompt)
    assert len(module.generate(prompt, longest)) == longest


def test_the_shipped_model_writes_words_of_its_text(module, about):
    """Greedy and sampled text from the shipped model: most of its words are words of the training text."""
    known = set(re.findall(r"[a-z]+", train_chars.load_text().lower()))
    prompt = train_chars.encode(PROMPT, about["vocabulary"])
    for options in ({}, {"temperature": 0.7, "top_k": 10, "seed": 1}):
        text = train_chars.decode(module.generate(prompt, 100, **options), about["vocabulary"])
        words = re.findall(r"[a-z]+", text.lower())
        assert len(words) >= 8 and sum(word in known for word in words) >= 0.7 * len(words), text


def test_encode_leaves_out_unknown_characters(about):
    characters = about["vocabulary"]
    assert train_chars.decode(train_chars.encode("a\u00e9b\tc", characters), characters) == "abc"
    assert train_chars.plain("x \u00d7 y \u2192 z\u2014\u00e9") == "x x y -> z--"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")  # torch.onnx.export's notes
def test_training_a_few_steps_exports_what_it_trained(tmp_path):
    """Three steps on the start of the text; the export, run by onnxruntime with a cache, gives the network's logits
    for the same characters run whole in torch."""
    torch = pytest.importorskip("torch")
    network, characters, loss = train_chars.train(train_chars.load_text()[:20_000], steps=3, verbose=False)
    assert np.isfinite(loss)
    path = tmp_path / "chars.onnx"
    train_chars.export(network, characters, path, tmp_path / "chars.json")
    assert train_chars.load_vocabulary(tmp_path / "chars.json")["vocabulary"] == characters
    ids = np.array([train_chars.encode("Symbolic sizes", characters)], np.int64)
    with torch.no_grad():
        whole = network(torch.from_numpy(ids), torch.ones(ids.shape, dtype=torch.int64), *train_chars.empty_cache())
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]

    def step(part, cache, total):
        feeds = {"input_ids": part, "attention_mask": np.ones((1, total), np.int64), **cache}
        results = dict(zip(names, session.run(None, feeds), strict=True))
        return results["logits"], {name.replace("present.", "past_key_values."): results[name] for name in names[1:]}

    depth = train_chars.WIDTH // train_chars.HEADS
    empty = {spec.name: np.zeros((1, train_chars.HEADS, 0, depth), np.float32) for spec in session.get_inputs()[2:]}
    first, cache = step(ids[:, :9], empty, 9)
    second, _ = step(ids[:, 9:], cache, ids.shape[1])
    np.testing.assert_allclose(np.concatenate([first, second], axis=1), whole[0].numpy(), rtol=1e-4, atol=1e-4)
