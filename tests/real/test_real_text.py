"""The real zoo's text encoders and decoders (BERT, DistilBERT, RoBERTa, MiniLM, GPT-2, a Llama-class decoder) and
its Whisper-style audio encoder, at their small sizes: exported by torch.onnx.export's defaults from transformers'
code, compiled for llvm and wasm, and matched against onnxruntime on the same file."""

from collections import Counter

import onnx
import pytest

from compiler import real_zoo

MODELS = real_zoo.names("text") + real_zoo.names("audio")


@pytest.mark.slow
@pytest.mark.parametrize("target", ["llvm", "wasm"])
@pytest.mark.parametrize("name", MODELS)
def test_matches_onnxruntime(check_small_model, name, target):
    check_small_model(name, target)


def _ops(path) -> Counter:
    return Counter(node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node)


def test_the_exports_carry_what_makes_each_family(real_cache):
    """What the comparisons above are known to cover: RoBERTa's position ids by CumSum, the encoders' masks
    (padding positions turned into -inf by Where), GPT-2's and Llama's causal masks, Llama's RMSNorm written out
    (Pow, ReduceMean, Sqrt) and SiLU."""
    roberta = _ops(real_zoo.export("roberta_base", "small", real_cache))
    assert roberta["CumSum"] == 1 and roberta["Where"] >= 1
    llama = _ops(real_zoo.export("llama", "small", real_cache))
    assert llama["Pow"] >= 1 and llama["ReduceMean"] >= 1 and llama["Sigmoid"] >= 1
    assert llama["LayerNormalization"] == 0
    assert _ops(real_zoo.export("gpt2", "small", real_cache))["Where"] >= 1


def test_llama_shares_key_value_heads():
    config = real_zoo.build("llama", "small").config
    assert config.num_key_value_heads < config.num_attention_heads
