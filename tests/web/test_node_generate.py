"""tessel.js's model.generate in Node on GPT-2 (real_zoo's small size, random weights) exported with its KV cache and
compiled once for wasm with symbolic past and sequence sizes (real_zoo.decoder_dims(64)), with a threaded variant:
greedy tokens equal Python's Module.generate token for token, and each step's logits row equals the one Python's loop
picks from, bit for bit; per step only that row leaves the wasm memory, and only the cache rows the step before added
move inside it; a stop token, seeded sampling, onToken (awaited, the loop yielding between steps), a cache past its
range, bad options and prompts, models without a cache, a run between two steps, dispose and WebGPU.
tests/web/generate.test.mjs holds the cases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from node_helpers import _write_array, relu_model, run_node_tests
from onnx import TensorProto, helper, numpy_helper

from compiler import compile_model, real_zoo
from compiler.generate import FeedStepper, generate

NODE_TEST = Path(__file__).with_name("generate.test.mjs")
TOKENS = 64
NEW_TOKENS = 12
# with these random weights, greedy decoding repeats the last token, then changes once: [3, 3, 814, 814, ...]
PROMPT = [1, 2, 3]
SAMPLED_PROMPT = [5, 17, 300, 42]


class _Recording:
    """A stepper that keeps each step's logits row."""

    def __init__(self, inner):
        self.inner, self.rows = inner, []

    def step(self, ids, length):
        row = self.inner.step(ids, length)
        self.rows.append(np.array(row, np.float32))
        return row


def _no_cache_model():
    """input_ids [1, seq] -> logits [1, seq, 8] through an embedding table: a decoder without a cache."""
    table = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["logits"], axis=0)],
        "no_cache",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "seq", 8])],
        initializer=[table],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_node_generate_matches_python(tmp_path):
    path = real_zoo.export_with_cache("gpt2", "small", tmp_path / "export", TOKENS)
    module = compile_model(str(path), target="wasm", dims=real_zoo.decoder_dims(TOKENS), wasm_variants=("threads",))
    bundle = module.export(tmp_path / "gpt2")
    greedy = module.generate(PROMPT, NEW_TOKENS).tolist()
    # the rows Python's loop chooses from, through the Module's run (wasmtime) with the cache fed as arrays
    inputs = {spec.name: (spec.shape, spec.dtype) for spec in module.inputs}
    recording = _Recording(FeedStepper(module.run, inputs, module.output_names))
    assert generate(recording, PROMPT, NEW_TOKENS).tolist() == greedy
    assert len(set(greedy)) > 1, "the greedy tokens should change at least once, or the test checks little"
    cases = {
        "bundle": str(bundle),
        "prompt": PROMPT,
        "greedy": greedy,
        "logits": _write_array(tmp_path / "logits.bin", np.stack(recording.rows)),
        "sampledPrompt": SAMPLED_PROMPT,
        "tokens": TOKENS,
        "noCache": str(
            compile_model(_no_cache_model(), target="wasm", dims={"seq": (1, 8)}).export(tmp_path / "no_cache")
        ),
        "static": str(compile_model(relu_model(), target="wasm").export(tmp_path / "relu")),
    }
    run_node_tests(NODE_TEST, "TESSEL_GENERATE_CASES", cases, tmp_path, timeout=120)
