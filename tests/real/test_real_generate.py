"""Decoders of the real zoo exported with their KV cache (real_zoo.export_with_cache: GPT-2, and Llama with RoPE and
grouped-query attention), compiled once with symbolic past and sequence sizes (issue 40 §2): every step of a cache
from empty to nearly full matches onnxruntime on the same file, and Module.generate's tokens are the ones the same
loop picks over onnxruntime's logits."""

import numpy as np
import onnxruntime as ort
import pytest

import compiler
from compiler import real_zoo
from compiler.errors import ShapeError, TesselError
from compiler.generate import FeedStepper, generate

TOKENS = 64


@pytest.fixture(scope="module", params=[("gpt2", "llvm"), ("llama", "wasm")], ids=lambda p: f"{p[0]}-{p[1]}")
def decoder(request, real_cache):
    name, target = request.param
    path = real_zoo.export_with_cache(name, "small", real_cache, TOKENS)
    module = compiler.compile_model(str(path), target=target, dims=real_zoo.decoder_dims(TOKENS))
    return module, ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _session_run(session):
    names = [output.name for output in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(None, feeds), strict=True))


@pytest.mark.slow
def test_each_cache_size_matches_onnxruntime(decoder):
    module, session = decoder
    heads, depth = module.inputs[2].shape[1], module.inputs[2].shape[3]
    reference = _session_run(session)
    for past, seq in ((0, 1), (0, 9), (5, 1), (30, 7), (TOKENS - 1, 1)):
        rng = np.random.default_rng(past * 100 + seq)
        feeds = {"input_ids": rng.integers(1, 1000, (1, seq)), "attention_mask": np.ones((1, past + seq), np.int64)}
        for spec in module.inputs[2:]:
            feeds[spec.name] = rng.standard_normal((1, heads, past, depth)).astype(np.float32)
        got, want = module.run(feeds), reference(feeds)
        for name, expected in want.items():
            assert got[name].shape == expected.shape
            np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-4, err_msg=f"{name} at {past}+{seq}")


@pytest.mark.slow
def test_generate_picks_onnxruntimes_tokens(decoder):
    module, session = decoder
    prompt = [5, 17, 300, 42]
    inputs = {spec.name: (spec.shape, spec.dtype) for spec in module.inputs}
    want = generate(FeedStepper(_session_run(session), inputs, module.output_names), prompt, 12)
    seen = []
    got = module.generate(prompt, 12, on_token=seen.append)
    assert got.tolist() == want.tolist() == seen and len(got) == 12
    # sampled: the same seed draws the same tokens; a stop token ends the run after it
    sampled = module.generate(prompt, 8, temperature=0.9, top_k=50, top_p=0.95, seed=7)
    assert sampled.tolist() == module.generate(prompt, 8, temperature=0.9, top_k=50, top_p=0.95, seed=7).tolist()
    last = max(k for k in range(len(want)) if want[k] not in want[:k])  # the latest first appearance of a token
    assert module.generate(prompt, 12, stop_token=int(want[last])).tolist() == want[: last + 1].tolist()


@pytest.mark.slow
def test_generate_says_what_it_cannot_do(decoder):
    module, _ = decoder
    with pytest.raises(TesselError, match="temperature must be >= 0"):
        module.generate([1, 2], 3, temperature=-1)
    with pytest.raises(TesselError, match="top_p must lie in"):
        module.generate([1, 2], 3, temperature=1.0, top_p=0.0)
    with pytest.raises(ShapeError, match="non-empty sequence of token ids"):
        module.generate([], 3)
    # the cache's range ends at 63 tokens: a run past it names the size
    with pytest.raises(ShapeError, match="the size past"):
        module.generate(list(range(1, 60)), 10)
