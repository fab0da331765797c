"""Text models of the real zoo exported with a symbolic sequence (torch's dynamic_shapes, as a model for varying
prompts is), compiled once with that size kept symbolic, and run at the range's ends and an odd size between against
onnxruntime on the same file: BERT with its padding mask, GPT-2's causal mask and position ids, Llama's RoPE,
RMSNorm and grouped-query attention (issue 40 §1)."""

import onnxruntime as ort
import pytest

import compiler
from compiler import real_zoo
from tests.model_checks import assert_close_in_range

TOKENS = (1, 64)  # the small models' position tables hold 64


@pytest.mark.slow
@pytest.mark.parametrize(("name", "target"), [("bert_base_128", "llvm"), ("gpt2", "llvm"), ("llama", "wasm")])
def test_one_compile_runs_every_prompt_length(real_cache, name, target):
    path = real_zoo.export(name, "small", real_cache, tokens=TOKENS)
    module = compiler.compile_model(str(path), target=target, dims={real_zoo.SEQUENCE: TOKENS})
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    for count in (1, 7, TOKENS[1]):
        feeds = real_zoo.sample_inputs(name, "small", count)
        results = module.run(feeds)
        for output, want in zip(names, session.run(None, feeds), strict=True):
            assert results[output].shape == want.shape
            assert_close_in_range(results[output], want, f"{name} at {count} tokens on {target}: {output}", 1e-5)
