"""Text generation speed (issue 40 §3): GPT-2 (124 M) and a Llama-class decoder (SmolLM2-135M's shape: RoPE, RMSNorm,
SiLU MLP, grouped-query attention), random weights, exported with their KV cache by real_zoo.export_with_cache, each
compiled once by Tessel with symbolic past and sequence sizes (decoder_dims), against onnxruntime on the same file.

Per model and thread count, in one run: the prefill of a 128-token prompt (its time to first token: the prefill and the
first token's choice), then 128 new tokens, greedy, each decode step one run with the cache of the steps before (the
loop of compiler/generate.py, the same for both runtimes: the tokens must agree). Reported: prefill ms and time to
first token (medians over --repeat prompts), decode tokens per second (over all steps of all repeats), the ratios
Tessel / onnxruntime for times and onnxruntime / Tessel for tokens per second (above 1: Tessel faster), and the
bundle's memory (params, arena and inputs and outputs at their layouts) against the weights plus the largest cache.

--weights int4 or int8 runs both runtimes on the export's copy written by `tessel quantize`'s module (4-bit
MatMulNBits, or dynamic int8): the decode kernels then stream a quarter or a half of the bytes. GPT-2's projections
are Gemms, which the 4-bit quantizer leaves float (only its embedding becomes 4-bit).

Run: .venv/bin/python benchmarks/generate.py [--models gpt2 llama] [--threads 1 0] [--repeat 3] [--new 128]
     [--weights float32|int4|int8]"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

# benchmarks/kernels.py would shadow the `kernels` package that transformers imports: this folder goes to the end of
# the path (as benchmarks/real.py does), the repository's root to its front
sys.path.append(sys.path.pop(0))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import onnxruntime_session, print_table  # noqa: E402

from compiler import compile_model, real_zoo  # noqa: E402
from compiler.generate import FeedStepper, generate, stepper_for  # noqa: E402
from compiler.quantize import quantize_model  # noqa: E402
from compiler.runtime.native import default_num_threads  # noqa: E402

PROMPT = 128
TOKENS = 256  # the cache's range: a 128-token prompt and 128 new tokens


class TimedSteps:
    """A stepper whose steps' seconds are recorded: the first of a generation is the prefill."""

    def __init__(self, stepper):
        self.stepper, self.times = stepper, []

    def step(self, ids, length):
        started = time.perf_counter()
        logits = self.stepper.step(ids, length)
        self.times.append(time.perf_counter() - started)
        return logits


def timed_generation(stepper, prompt, new: int) -> dict:
    """One greedy generation, timed: its tokens, prefill ms (the first step), time to first token ms (the call to the
    first token chosen), each decode step's seconds, and decode ms from the first token to the last (as
    generate_web.mjs times tessel.js, where only the tokens are seen)."""
    timed = TimedSteps(stepper)
    chosen: list[float] = []
    started = time.perf_counter()
    tokens = generate(timed, prompt, new, on_token=lambda _: chosen.append(time.perf_counter()))
    return {
        "tokens": tokens.tolist(),
        "prefill_ms": timed.times[0] * 1000,
        "ttft_ms": (chosen[0] - started) * 1000,
        "steps": timed.times[1:],
        "decode_ms": (chosen[-1] - chosen[0]) * 1000,
    }


def _memory(module) -> tuple[int, int]:
    """(the bundle's working set: params, arena, inputs and outputs at their layouts; weights plus the largest cache)."""
    manifest = module.manifest
    io = sum(int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize for spec in [*module.inputs, *module.outputs])
    working = manifest["params"]["bytes"] + manifest["memory"]["arena_bytes"] + io
    cache = sum(
        int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize
        for spec in module.outputs
        if spec.name.startswith("present.")
    )
    return working, manifest["params"]["bytes"] + cache


# --weights: the file both runtimes run, as tessel quantize writes it from the float export (compiler/quantize.py)
WEIGHTS = {"float32": None, "int4": "int4", "int8": "dynamic"}


def exported(name: str, weights: str, cache_dir) -> Path:
    """The decoder's export with its cache, or its quantized copy beside it (written once, then reused)."""
    path = real_zoo.export_with_cache(name, "full", cache_dir, TOKENS)
    mode = WEIGHTS[weights]
    if mode is None:
        return path
    quantized = path.with_name(f"{path.stem}.{weights}.onnx")
    if not quantized.exists():
        print(f"{name}: {quantize_model(path, quantized, mode).summary()}", flush=True)
    return quantized


def benchmark(name: str, threads: int, repeat: int, new: int, cache_dir, weights: str = "float32") -> dict:
    path = exported(name, weights, cache_dir)
    started = time.perf_counter()
    module = compile_model(str(path), target="llvm", dims=real_zoo.decoder_dims(TOKENS), num_threads=threads)
    compile_s = time.perf_counter() - started
    session = onnxruntime_session(path, threads or default_num_threads(), spins=False)
    names = [output.name for output in session.get_outputs()]
    inputs = {spec.name: (spec.shape, spec.dtype) for spec in module.inputs}

    def ort_run(feeds):
        return dict(zip(names, session.run(None, feeds), strict=True))

    results = {"tessel": [], "onnxruntime": []}
    rng = np.random.default_rng(0)
    vocabulary = module.outputs[0].shape[-1]
    for _ in range(repeat):
        prompt = rng.integers(1, vocabulary, PROMPT)
        # alternate which runtime goes first, so neither always runs on a cooler machine
        # Tessel's stepper keeps the cache in its runtime's buffers (Module.generate's); onnxruntime's takes and gives
        # the cache as arrays each step, as its Python API does
        steppers = [
            ("tessel", lambda: stepper_for(module)),
            ("onnxruntime", lambda: FeedStepper(ort_run, inputs, names)),
        ]
        for label, make in steppers if len(results["tessel"]) % 2 == 0 else steppers[::-1]:
            results[label].append(timed_generation(make(), prompt, new))
    for ours, theirs in zip(results["tessel"], results["onnxruntime"], strict=True):
        ours, theirs = ours["tokens"], theirs["tokens"]
        if ours == theirs:
            continue
        first = next(position for position, (a, b) in enumerate(zip(ours, theirs)) if a != b)
        if weights != "int8":
            raise SystemExit(f"{name}: Tessel's token {first} is {ours[first]}, onnxruntime's {theirs[first]}")
        # dynamic int8 quantizes each step's activations by their range, so float rounding a step apart can move one
        # level and, greedy, a near tie: the runs then go on through other tokens, as many steps of the same sizes
        print(f"{name}: the int8 runs agree on {first} of {len(ours)} tokens, then differ (a near tie)", flush=True)
    row = {"model": name, "threads": threads or default_num_threads(), "compile_s": compile_s}
    for label, runs in results.items():
        steps = [step for run in runs for step in run["steps"]]
        row[label] = {
            "prefill_ms": statistics.median(run["prefill_ms"] for run in runs),
            "ttft_ms": statistics.median(run["ttft_ms"] for run in runs),
            "tokens_per_s": len(steps) / sum(steps),
        }
    row["memory"] = _memory(module)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(real_zoo.DECODERS), choices=real_zoo.DECODERS)
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 0], help="0: the default (every usable core)")
    parser.add_argument("--repeat", type=int, default=3, help="prompts per model and thread count")
    parser.add_argument("--new", type=int, default=128, help="tokens generated per prompt")
    parser.add_argument("--cache", type=Path, help="the export cache (default ~/.cache/tessel/real)")
    parser.add_argument(
        "--weights",
        choices=WEIGHTS,
        default="float32",
        help="the file both runtimes run: the float export, or its 4-bit (MatMulNBits) or int8 (dynamic) copy",
    )
    arguments = parser.parse_args()
    rows = [
        benchmark(name, threads, arguments.repeat, arguments.new, arguments.cache, arguments.weights)
        for name in arguments.models
        for threads in arguments.threads
    ]
    table = []
    for row in rows:
        ours, theirs = row["tessel"], row["onnxruntime"]
        working, needed = row["memory"]
        table.append(
            [
                row["model"],
                str(row["threads"]),
                f"{ours['prefill_ms']:.1f} / {theirs['prefill_ms']:.1f} ({ours['prefill_ms'] / theirs['prefill_ms']:.2f})",
                f"{ours['ttft_ms']:.1f} / {theirs['ttft_ms']:.1f} ({ours['ttft_ms'] / theirs['ttft_ms']:.2f})",
                f"{ours['tokens_per_s']:.1f} / {theirs['tokens_per_s']:.1f} "
                f"({ours['tokens_per_s'] / theirs['tokens_per_s']:.2f})",
                f"{working / 2**20:.0f} MB / {needed / 2**20:.0f} MB ({working / needed:.2f})",
                f"{row['compile_s']:.0f} s",
            ]
        )
    print(
        f"{arguments.weights} weights, prompt {PROMPT} tokens, {arguments.new} new tokens greedy, cache range {TOKENS}; "
        "Tessel / onnxruntime"
    )
    print_table(
        [
            "model",
            "threads",
            "prefill ms (ratio)",
            "first token ms (ratio)",
            "decode tokens/s (Tessel / ort)",
            "working set / weights+cache",
            "compile",
        ],
        table,
    )


if __name__ == "__main__":
    main()
