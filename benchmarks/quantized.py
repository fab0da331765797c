"""Quantized and float16 files against onnxruntime on the same file and against Tessel's own float32 build: BERT-base
(128 tokens), DistilBERT, ResNet-50 and MobileNetV3-Large (compiler/real_zoo.py), each exported as benchmarks/real.py
exports it, then written by compiler/quantize.py (`tessel quantize`) as int8 (static QDQ for the convnets, calibrated on
the sample input and seeded draws like it; dynamic for the transformers), 4-bit (MatMulNBits) and float16 files. Each
file is compiled for llvm, its outputs checked against onnxruntime's on the same file, then timed at 1 thread and at the
default thread count in real.py's blocks with pauses (a block of Tessel on the file, one of onnxruntime on it, one of
Tessel's float32 build, a pause, and again). Prints Tessel / onnxruntime, Tessel / its float32 build and the bundle's
bytes over the float32 bundle's (lower is better), and their geometric means. A file Tessel refuses prints the
refusal, and the run goes on to the next file. With --node, each quantized file is also compiled for wasm and timed in
Node 20 against onnxruntime-web on the same file (wasm execution provider, one thread each, in blocks with pauses:
common.run_in_node, after checking both against onnxruntime).
Run: .venv/bin/python benchmarks/quantized.py [--models ...] [--quick] [--repeat 20] [--cache DIR] [--node]"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path

# benchmarks/kernels.py would shadow the `kernels` package that transformers imports (real.py says so too)
sys.path.append(sys.path.pop(0))

import numpy as np
import onnx
import onnxruntime as ort
from common import (
    check_close,
    geometric_mean,
    interleaved,
    onnxruntime_session,
    print_table,
    run_in_node,
    settled_cell,
    summary,
)
from cpu import machine
from real import BLOCK, COLUMNS, PAUSE_S, RANGE_TOLERANCE

import compiler
from compiler import real_zoo
from compiler.errors import TesselError, UnsupportedOpError
from compiler.quantize import quantize_model

MODELS = ("bert_base_128", "distilbert", "resnet50", "mobilenet_v3_large")
CALIBRATION_SAMPLES = 8
# Tessel and onnxruntime on the same quantized file: a requantized value may land one step apart (1/255 of its range
# for u8), and a float16 file is computed in float32 by Tessel on CPU but partly in float16 by onnxruntime. A wrong
# kernel is off by far more.
QUANTIZED_RANGE_TOLERANCE = 2e-2
NODE = "Node, 1 thread"


def files_to_compare(name: str, path: Path, feeds: dict, folder: Path) -> list[tuple[str, Path]]:
    """The int8, 4-bit and float16 files of the float model at `path`, written into `folder` by `tessel quantize`'s
    module, as (label, path); a file the quantizer could not write, or that would equal the float model, is reported
    and left out."""
    convnet = real_zoo.MODELS[name].family == "convnet"
    int8 = ("int8 (static QDQ)", "static") if convnet else ("int8 (dynamic)", "dynamic")
    files = []
    for label, mode in (int8, ("4-bit (MatMulNBits)", "int4"), ("float16", "fp16")):
        options = {"calibration": _calibration(feeds)} if mode == "static" else {}
        started = time.perf_counter()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = quantize_model(path, folder / f"{name}.{mode}.onnx", mode, **options)
        except TesselError as error:
            print(f"{name} {label}: not written: {error}", flush=True)
            continue
        if mode == "int4" and not result.ops.get("MatMulNBits"):
            print(f"{name} {label}: no MatMul by a constant weight to quantize (Conv and Gemm stay float); skipped")
            continue
        for warning in caught:
            print(f"{name} {label}: warning: {warning.message}")
        print(
            f"{name} {label}: {result.bytes:,} bytes ({result.bytes / result.source_bytes:.2f}x the float file), "
            f"{result.summary()}, quantized in {time.perf_counter() - started:.1f} s",
            flush=True,
        )
        files.append((label, result.path))
    return files


def _calibration(feeds: dict) -> dict[str, np.ndarray]:
    """The sample input and seeded standard-normal draws like it (real_zoo's images are standard normal)."""
    rng = np.random.default_rng(1)
    return {
        key: np.concatenate([value[None], rng.standard_normal((CALIBRATION_SAMPLES - 1, *value.shape))]).astype(
            value.dtype
        )
        for key, value in feeds.items()
    }


def bundle_bytes(module) -> int:
    with tempfile.TemporaryDirectory(prefix="tessel-quantized-bundle-") as folder:
        path = module.export(Path(folder) / "bundle")
        return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


def compile_checked(label: str, path: Path, feeds: dict, range_tolerance: float):
    """Tessel's llvm module of `path`, its compile seconds and the tolerance its outputs met, after checking them
    against onnxruntime's on the same file (`range_tolerance`, or twice what onnxruntime's own two sessions disagree
    by on an 8-bit file); None (the reason printed) when Tessel refuses or fails the file, or they disagree."""
    started = time.perf_counter()
    try:
        module = compiler.compile_model(str(path), target="llvm")
    except UnsupportedOpError as error:
        missing = ", ".join(f"{op} ({len(nodes)} nodes)" for op, nodes in sorted(error.ops.items()))
        print(f"{label}: Tessel refuses it: it lacks {missing or error}", flush=True)
        return None
    except TesselError as error:
        print(f"{label}: Tessel refuses it: {error}", flush=True)
        return None
    except Exception as error:  # a new dtype meeting a stage that lacks it: a bug to report, not a reason to stop
        print(f"{label}: Tessel failed on it: {type(error).__name__}: {str(error).splitlines()[0]}", flush=True)
        return None
    seconds = time.perf_counter() - started
    names = [spec.name for spec in module.outputs]
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(names, feeds)
    ours = module.run(feeds)
    try:
        check_close(label, [ours[output] for output in names], theirs, range_tolerance)
    except SystemExit as disagreement:
        # an 8-bit model whose requantized values tip one step apart early moves every later layer: onnxruntime's
        # own two paths (its optimised session's integer kernels, its unoptimised one's float ops between Q and DQ)
        # differ too, and Tessel must stay within twice that
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        plain = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(names, feeds)
        own = max(float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in zip(theirs, plain, strict=True))
        error = max(float(np.max(np.abs(ours[n].astype(np.float64) - b))) for n, b in zip(names, theirs, strict=True))
        if error > 2 * own:
            print(f"{disagreement} (onnxruntime's optimised and unoptimised sessions differ by {own:.3g})", flush=True)
            return None
        print(
            f"{label}: differs from onnxruntime by {error:.3g}, within twice what onnxruntime's optimised and "
            f"unoptimised sessions differ by ({own:.3g})",
            flush=True,
        )
        return module, seconds, max(range_tolerance, 2 * own)
    print(f"{label}: compiled for llvm in {seconds:.1f} s; outputs agree with onnxruntime's", flush=True)
    return module, seconds, range_tolerance


def time_file(module, path: Path, float_module, feeds: dict, repeat: int) -> dict:
    """Per column title: (Tessel ms, onnxruntime ms on the same file, Tessel float32 ms), medians of interleaved
    blocks."""
    row, default_threads = {}, module.num_threads
    for title, threads in COLUMNS:
        module.num_threads = float_module.num_threads = threads or default_threads
        # onnxruntime's own defaults otherwise: a thread per core, spinning workers (as real.py)
        if threads:
            session = onnxruntime_session(path, threads, spins=True)
        else:
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

        def time_cell(after_pause=None, session=session):
            runs = [partial(module.run, feeds), partial(session.run, None, feeds), partial(float_module.run, feeds)]
            return interleaved(runs, repeat, block=BLOCK, pause_s=PAUSE_S, after_pause=after_pause, settle=True)

        times, _, _ = settled_cell(time_cell)
        row[title] = tuple(summary(side)["median"] for side in times)
        del session, time_cell  # spinning workers would run through the next cell's timings
    module.num_threads = float_module.num_threads = default_threads
    return row


def time_in_node(label: str, path: Path, feeds: dict, repeat: int, tolerance: float) -> tuple[float, float] | None:
    """(Tessel wasm ms, onnxruntime-web ms) in Node on one thread, medians of blocks with pauses, after their outputs
    agree within `tolerance` of their range (the native check's); None (the reason printed) when Tessel refuses the
    file for wasm."""
    try:
        module = compiler.compile_model(str(path), target="wasm")
    except TesselError as error:
        print(f"{label}: Tessel refuses it for wasm: {error}", flush=True)
        return None
    entry = (label.replace(" ", "_"), onnx.load(str(path)), module, feeds)
    report = run_in_node([entry], repeat, block=BLOCK, pause_ms=PAUSE_S * 1000, settle=True, range_tolerance=tolerance)
    (result,) = report["results"]
    return summary(result["tessel"])["median"], summary(result["onnxruntime_web"])["median"]


def benchmark_model(name: str, size: str, repeat: int, cache, node: bool = False) -> list[dict]:
    path = real_zoo.export(name, size, cache)
    feeds = real_zoo.sample_inputs(name, size)
    compiled = compile_checked(f"{name} float32", path, feeds, RANGE_TOLERANCE)
    if compiled is None:
        return []
    float_module = compiled[0]
    float_bytes = bundle_bytes(float_module)
    rows = []
    with tempfile.TemporaryDirectory(prefix=".quantized-", dir=path.parent) as folder:
        for label, file in files_to_compare(name, path, feeds, Path(folder)):
            compiled = compile_checked(f"{name} {label}", file, feeds, QUANTIZED_RANGE_TOLERANCE)
            if compiled is None:
                continue
            module, seconds, tolerance = compiled
            row = {"model": name, "file": label, "compile_s": seconds, "bytes": bundle_bytes(module) / float_bytes}
            row |= time_file(module, file, float_module, feeds, repeat)
            if node:
                row[NODE] = time_in_node(f"{name} {label}", file, feeds, repeat, tolerance)
            rows.append(row)
    return rows


def report(rows: list[dict]) -> None:
    header = ["model", "file", "compile s", "bundle / float32 bundle"]
    for title, _ in COLUMNS:
        header += [f"{title}: Tessel / onnxruntime / Tessel float32 ms", "vs onnxruntime", "vs float32"]
    node = any(NODE in row for row in rows)
    if node:
        header += [f"{NODE}: Tessel wasm / onnxruntime-web ms", "vs onnxruntime-web"]
    table = []
    for row in rows:
        cells = [row["model"], row["file"], f"{row['compile_s']:.1f}", f"{row['bytes']:.2f}×"]
        for title, _ in COLUMNS:
            ours, theirs, float_ms = row[title]
            cells += [f"{ours:.2f} / {theirs:.2f} / {float_ms:.2f}", f"{ours / theirs:.2f}×", f"{ours / float_ms:.2f}×"]
        if node:
            ours, theirs = row.get(NODE) or (None, None)
            cells += [f"{ours:.2f} / {theirs:.2f}", f"{ours / theirs:.2f}×"] if ours else ["refused", ""]
        table.append(cells)
    if rows:
        means = ["geometric mean", "", "", f"{geometric_mean([row['bytes'] for row in rows]):.2f}×"]
        for title, _ in COLUMNS:
            means += ["", f"{geometric_mean([row[title][0] / row[title][1] for row in rows]):.2f}×"]
            means += [f"{geometric_mean([row[title][0] / row[title][2] for row in rows]):.2f}×"]
        if node:
            timed = [row[NODE] for row in rows if row.get(NODE)]
            means += ["", f"{geometric_mean([ours / theirs for ours, theirs in timed]):.2f}×" if timed else ""]
        table.append(means)
    print_table(header, table)


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument(
        "--quick", action="store_true", help="the models' small sizes (real_zoo) and 3 timed runs: a smoke run"
    )
    parser.add_argument("--repeat", type=int, help="timed runs of each side per cell, after warm-up (default 20)")
    parser.add_argument("--cache", default=None, help="folder of the exports (default: real_zoo.default_cache_dir())")
    parser.add_argument(
        "--node", action="store_true", help="also time each quantized file in wasm in Node against onnxruntime-web"
    )
    arguments = parser.parse_args(argv)
    if arguments.repeat is not None and arguments.repeat < 1:
        parser.error("--repeat needs at least 1 timed run")
    arguments.size = "small" if arguments.quick else "full"
    arguments.repeat = arguments.repeat or (3 if arguments.quick else 20)
    return arguments


def main() -> None:
    arguments = parse_arguments()
    print(f"{datetime.date.today()}, {machine()}, {arguments.size} size, onnxruntime {ort.__version__}", flush=True)
    rows = []
    for name in arguments.models:
        rows += benchmark_model(name, arguments.size, arguments.repeat, arguments.cache, arguments.node)
    print(
        f"\nmedian ms of {arguments.repeat} runs in blocks of {BLOCK} with {PAUSE_S * 1000:.0f} ms pauses; ratios "
        "Tessel on the file / onnxruntime on the same file and / Tessel's float32 build; lower is better\n"
    )
    report(rows)


if __name__ == "__main__":
    main()
