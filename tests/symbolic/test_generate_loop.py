"""The generate loop's parts that need no model (compiler/generate.py): which inputs and outputs make a cache, and how
a token is chosen from logits."""

import numpy as np
import pytest

from compiler.errors import TesselError
from compiler.generate import cache_layout, choose_token


def test_the_cache_pairs_past_inputs_with_present_outputs():
    layout = cache_layout(
        ["input_ids", "attention_mask", "past_key_values.0.key", "past_key_values.0.value"],
        ["logits", "present.0.key", "present.0.value"],
    )
    assert layout.pairs == [("past_key_values.0.key", "present.0.key"), ("past_key_values.0.value", "present.0.value")]
    assert layout.has_mask and not layout.has_positions


@pytest.mark.parametrize(
    ("inputs", "outputs", "message"),
    [
        (["x"], ["logits"], "takes input_ids"),
        (["input_ids"], ["y"], "logits output"),
        (["input_ids"], ["logits"], "use_cache=True"),
        (["input_ids", "past_key_values.0.key"], ["logits"], "no output 'present.0.key'"),
        (["input_ids", "past_key_values.0.key", "extra"], ["logits", "present.0.key"], "inputs extra"),
    ],
)
def test_models_without_a_cache_are_refused_by_name(inputs, outputs, message):
    with pytest.raises(TesselError, match=message):
        cache_layout(inputs, outputs)


def test_greedy_top_k_and_top_p():
    logits = np.array([0.0, 3.0, 1.0, 2.9])
    rng = np.random.default_rng(0)
    assert choose_token(logits, 0.0, None, None, rng) == 1
    assert {choose_token(logits, 1.0, 2, None, rng) for _ in range(200)} == {1, 3}
    # top_p keeps the fewest most likely tokens whose probabilities reach it: here tokens 1 and 3
    assert {choose_token(logits, 1.0, None, 0.8, rng) for _ in range(200)} == {1, 3}
    draws = [choose_token(logits, 1.0, None, None, np.random.default_rng(5)) for _ in range(3)]
    assert len(set(draws)) == 1
