"""Text generation over a compiled decoder with a KV cache (issue 40 §2): `Module.generate` runs the prompt once
(prefill), then one token per run (decode), each run's `present.*` outputs fed back as the next run's
`past_key_values.*` inputs, the next token chosen greedily or sampled (temperature, top-k, top-p).

It reads the model through its inputs' and outputs' names, as optimum and torch.onnx.export write a decoder with its
cache: `input_ids` [batch 1, seq], optionally `attention_mask` [1, past + seq] and `position_ids` [1, seq], every
`past_key_values.<layer>.<key|value>` [1, heads, past, depth] paired with the output `present.<layer>.<key|value>`,
and `logits` [1, seq, vocabulary]. Compile such a model with its sizes symbolic, the cache's from 0:
`dims={"past": (0, 2047), "seq": (1, 2048), "total": "past+seq"}` (docs/symbolic.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from compiler.errors import ShapeError, TesselError

PAST_PREFIX = "past_key_values."
PRESENT_PREFIX = "present."


@dataclass(frozen=True)
class CacheLayout:
    """Which inputs and outputs a decoder's generate loop feeds: (past input, present output) pairs by name."""

    pairs: list[tuple[str, str]]
    has_mask: bool
    has_positions: bool
    logits: str


def cache_layout(input_names: list[str], output_names: list[str]) -> CacheLayout:
    """The decoder's cache pairs, or a TesselError saying what the model lacks for generation."""
    if "input_ids" not in input_names:
        raise TesselError(
            f"generate needs a model that takes input_ids; this one takes {', '.join(input_names)}. Export the decoder "
            "with its cache (past_key_values.* inputs, present.* outputs), as optimum or torch.onnx.export write it"
        )
    logits = "logits" if "logits" in output_names else None
    if logits is None:
        raise TesselError(f"generate needs a model with a logits output; this one gives {', '.join(output_names)}")
    pairs = []
    for name in input_names:
        if name.startswith(PAST_PREFIX):
            present = PRESENT_PREFIX + name[len(PAST_PREFIX) :]
            if present not in output_names:
                raise TesselError(f"input {name!r} has no output {present!r} to take the next step's cache from")
            pairs.append((name, present))
    if not pairs:
        raise TesselError(
            "generate needs a decoder exported with its cache (past_key_values.* inputs, present.* outputs); this "
            "model recomputes the whole prompt each step: export it with use_cache=True"
        )
    unknown = set(input_names) - {"input_ids", "attention_mask", "position_ids", *(past for past, _ in pairs)}
    if unknown:
        raise TesselError(f"generate does not know what to feed the inputs {', '.join(sorted(unknown))}")
    return CacheLayout(pairs, "attention_mask" in input_names, "position_ids" in input_names, logits)


def choose_token(
    logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None, rng: np.random.Generator
) -> int:
    """The next token from one position's logits: the most likely at temperature 0; else sampled from the softmax of
    logits / temperature over the top_k most likely tokens, then over the fewest whose probabilities reach top_p."""
    logits = np.asarray(logits, np.float64)
    if temperature == 0:
        return int(np.argmax(logits))
    scaled = logits / temperature
    if top_k is not None and top_k < scaled.size:
        threshold = np.partition(scaled, -top_k)[-top_k]
        scaled = np.where(scaled >= threshold, scaled, -np.inf)
    probabilities = np.exp(scaled - scaled.max())
    probabilities /= probabilities.sum()
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-probabilities, kind="stable")
        cumulative = np.cumsum(probabilities[order])
        keep = order[: int(np.searchsorted(cumulative, top_p)) + 1]
        kept = np.zeros_like(probabilities)
        kept[keep] = probabilities[keep]
        probabilities = kept / kept.sum()
    return int(rng.choice(probabilities.size, p=probabilities))


def check_options(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise TesselError(f"max_new_tokens must be a whole number >= 0, got {max_new_tokens!r}")
    if not temperature >= 0:
        raise TesselError(f"temperature must be >= 0 (0: greedy), got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise TesselError(f"top_k must be a whole number >= 1, got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise TesselError(f"top_p must lie in (0, 1], got {top_p!r}")


class FeedStepper:
    """One decode step at a time through any `run(feeds) -> {name: array}` (a Module's run, an onnxruntime session's):
    the cache goes in as arrays and comes back as the present outputs, each step."""

    def __init__(self, run: Callable[[dict], dict], inputs: dict[str, tuple], output_names: list[str]):
        self.run, self.inputs = run, inputs
        self.layout = cache_layout(list(inputs), output_names)
        self.cache = {}
        for past, _ in self.layout.pairs:
            shape, dtype = inputs[past]
            if len(shape) != 4 or not isinstance(shape[1], int) or not isinstance(shape[3], int):
                raise TesselError(
                    f"the cache input {past!r} has shape {list(shape)}; generate takes [1, heads, past, depth]"
                )
            self.cache[past] = np.zeros((1, shape[1], 0, shape[3]), dtype)

    def step(self, ids: np.ndarray, length: int) -> np.ndarray:
        """The logits of the last of `ids` (token ids after `length` cached ones), the cache then holding them too."""
        feeds = {"input_ids": ids.astype(self.inputs["input_ids"][1])[None, :], **self.cache}
        total = length + ids.size
        if self.layout.has_mask:
            feeds["attention_mask"] = np.ones((1, total), self.inputs["attention_mask"][1])
        if self.layout.has_positions:
            feeds["position_ids"] = np.arange(length, total, dtype=self.inputs["position_ids"][1])[None, :]
        results = self.run(feeds)
        self.cache = {past: results[present] for past, present in self.layout.pairs}
        return results[self.layout.logits][0, -1]


def generate(
    stepper,
    prompt,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_token: int | None = None,
    seed: int | None = None,
    on_token: Callable[[int], object] | None = None,
) -> np.ndarray:
    """The tokens generated after `prompt` (a 1-D sequence of token ids, or [1, n]), at most `max_new_tokens`, ending
    early after `stop_token`: the prompt in one step (prefill), then one token a step. `stepper.step(ids, length)`
    gives the last position's logits with `length` tokens cached (FeedStepper, or a Module's in-place one).
    `on_token(token)` is called as each token is chosen (its return value is ignored)."""
    check_options(max_new_tokens, temperature, top_k, top_p)
    ids = np.asarray(prompt)
    if ids.ndim == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ShapeError(f"the prompt must be a non-empty sequence of token ids, got an array of shape {ids.shape}")
    rng = np.random.default_rng(seed)
    tokens: list[int] = []
    step_ids, length = ids, 0
    while len(tokens) < max_new_tokens:
        token = choose_token(stepper.step(step_ids, length), temperature, top_k, top_p, rng)
        tokens.append(token)
        if on_token is not None:
            on_token(token)
        if token == stop_token:
            break
        step_ids, length = np.array([token]), length + step_ids.size
    return np.array(tokens, np.int64)


def stepper_for(module):
    """A compiled decoder's steps: natively (a runtime that writes into given outputs) the cache kept in the runtime's
    own buffers, InPlaceStepper; elsewhere through the Module's run, FeedStepper."""
    if module.sizes and getattr(module.runtime, "writes_into_outputs", False):
        return InPlaceStepper(module.runtime, module.inputs, module.outputs, module.sizes)
    inputs = {spec.name: (spec.shape, spec.dtype) for spec in module.inputs}
    return FeedStepper(module.run, inputs, module.output_names)


class InPlaceStepper:
    """A symbolic model's decode steps on buffers laid out once, through a runtime whose `run(inputs, sizes, outputs)`
    writes into given output arrays (the native one): a step writes only the new token ids, the mask and the positions,
    and before the next one each present output's new rows (the cache's contract: present = past, then the step's
    rows) are copied into its past input's buffer, in the runtime's own memory; only the last position's logits are
    read. `sizes` is the bundle's SymbolicSizes; the specs are at their layout shapes."""

    def __init__(self, runtime, input_specs, output_specs, sizes):
        self.layout = cache_layout([spec.name for spec in input_specs], [spec.name for spec in output_specs])
        self.runtime, self.sizes = runtime, sizes
        self.names = [spec.name for spec in input_specs]
        self.buffers = {spec.name: np.zeros(spec.shape, spec.dtype) for spec in input_specs}
        self.outputs = [np.zeros(spec.shape, spec.dtype) for spec in output_specs]
        self.position = {spec.name: index for index, spec in enumerate(output_specs)}
        self.cached = 0  # the rows every past buffer holds; the last step's present rows past them are still to copy

    def step(self, ids: np.ndarray, length: int) -> np.ndarray:
        seq, total = ids.size, length + ids.size
        for past, present in self.layout.pairs:
            buffer = self.buffers[past]
            rows = min(length, buffer.shape[2])  # past its range, bind below refuses the size by name
            buffer[:, :, self.cached : rows] = self.outputs[self.position[present]][:, :, self.cached : rows]
        self.cached = length
        shapes = {"input_ids": (1, seq), "attention_mask": (1, total), "position_ids": (1, seq)}
        for past, _ in self.layout.pairs:
            buffer = self.buffers[past]
            shapes[past] = (1, buffer.shape[1], length, buffer.shape[3])
        values = self.sizes.bind(self.names, [_Shaped(shapes[name]) for name in self.names])
        self.buffers["input_ids"][0, :seq] = ids
        if self.layout.has_mask:
            self.buffers["attention_mask"][0, :total] = 1
        if self.layout.has_positions:
            self.buffers["position_ids"][0, :seq] = np.arange(length, total)
        self.runtime.run(list(self.buffers.values()), self.sizes.argument(values), self.outputs)
        return self.outputs[self.position[self.layout.logits]][0, seq - 1].copy()


@dataclass(frozen=True)
class _Shaped:
    """What SymbolicSizes.bind reads of an input: its shape."""

    shape: tuple
