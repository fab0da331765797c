"""Real architectures (compiler/real_zoo.py: torchvision, transformers and timm code with seeded weights) against
onnxruntime and OpenVINO: each model exported by torch.onnx.export's defaults at --size (full: what users run),
compiled for llvm (its seconds printed), its outputs checked against onnxruntime's and OpenVINO's, then timed at 1
thread and at each runtime's default thread count, in blocks with pauses as benchmarks/zoo.py times its cells (a block
of Tessel runs, one of onnxruntime, one of OpenVINO, a pause, and again; a cell timed while the CPUs ran unevenly is
timed again). Prints median ms, the ratios Tessel / onnxruntime and Tessel / OpenVINO (lower is better) and their
geometric means. With --wasm, each model is compiled for wasm instead and timed in Node against onnxruntime-web on one
thread (benchmarks/node_bench.mjs). Needs `pip install 'tessel[real]'`.
Run: .venv/bin/python benchmarks/real.py [--models ...] [--size full|small] [--repeat 20] [--wasm] [--cache DIR]"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from functools import partial

# benchmarks/kernels.py would shadow the `kernels` package that transformers imports: this folder goes to the end of
# the path, where `common` and `cpu` are found all the same
sys.path.append(sys.path.pop(0))

import onnx
import onnxruntime as ort
import openvino as ov
from common import (
    check_close,
    geometric_mean,
    interleaved,
    onnxruntime_session,
    print_slowest,
    print_table,
    ratio,
    run_in_node,
    settled_cell,
    summary,
)
from cpu import machine

import compiler
from compiler import real_zoo

BLOCK = 5  # runs of one side before the next side's block, as in benchmarks/zoo.py (which says why)
PAUSE_S = 0.25
# A full-size random-weight network in float32 adds up its layers' rounding: ResNet-50's logits are 1.3e-5 of their
# range off float64 torch in onnxruntime and 3.9e-5 in Tessel (its 3x3 convs by Winograd F(4, 3)), 4.1e-5 apart.
# A wrong kernel is off by far more; docs/real_models.md has every model's figure.
RANGE_TOLERANCE = 1e-4
COLUMNS = (("1 thread", 1), ("default threads", None))


def openvino_model(core: ov.Core, path, threads: int | None):
    """OpenVINO's CPU plugin for latency, in float32 (left to itself it may pick bfloat16 on a CPU that has it, which
    is no like-for-like comparison), on `threads` threads (None: its default)."""
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    if threads is not None:
        config["INFERENCE_NUM_THREADS"] = threads
    return core.compile_model(str(path), "CPU", config).create_infer_request()


def openvino_outputs(request, feeds, output_names: list[str]) -> list:
    results = request.infer(feeds)
    by_name = {name: value for port, value in results.items() for name in port.get_names()}
    return [by_name[name] for name in output_names]


def time_native(name: str, path, feeds, repeat: int, core: ov.Core) -> dict:
    """Compile `path` for llvm and time it against onnxruntime and OpenVINO in each column: {"compile_s", column
    title: (Tessel ms, onnxruntime ms, OpenVINO ms)}, after checking that all three agree."""
    started = time.perf_counter()
    module = compiler.compile_model(str(path), target="llvm")
    row = {"compile_s": time.perf_counter() - started, "module": module}
    print(f"{name}: compiled for llvm in {row['compile_s']:.1f} s", flush=True)
    default_threads = module.num_threads
    output_names = [spec.name for spec in module.outputs]
    for title, threads in COLUMNS:
        module.num_threads = threads or default_threads
        # onnxruntime's own defaults otherwise: a thread per core, spinning workers
        if threads:
            session = onnxruntime_session(path, threads, spins=True)
        else:
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        request = openvino_model(core, path, threads)
        theirs = session.run(output_names, feeds)
        ours = module.run(feeds)
        check_close(f"{name} ({title})", [ours[output] for output in output_names], theirs, RANGE_TOLERANCE)
        check_close(f"{name} (OpenVINO, {title})", openvino_outputs(request, feeds, output_names), theirs, 1e-4)

        def time_cell(after_pause=None, session=session, request=request):
            runs = [partial(module.run, feeds), partial(session.run, None, feeds), partial(request.infer, feeds)]
            return interleaved(runs, repeat, block=BLOCK, pause_s=PAUSE_S, after_pause=after_pause, settle=True)

        times, _, _ = settled_cell(time_cell)
        row[title] = tuple(summary(side)["median"] for side in times)
        del session, request, time_cell  # spinning workers would run through the next cell's timings
    module.num_threads = default_threads
    return row


def native_table(rows: dict[str, dict]) -> None:
    header = ["model", "compile s"]
    for title, _ in COLUMNS:
        header += [f"{title}: Tessel / onnxruntime / OpenVINO ms", "vs onnxruntime", "vs OpenVINO"]
    table, ratios = [], {title: ([], []) for title, _ in COLUMNS}
    for name, row in rows.items():
        cells = [name, f"{row['compile_s']:.1f}"]
        for title, _ in COLUMNS:
            ours, onnxruntime_ms, openvino_ms = row[title]
            cells += [f"{ours:.2f} / {onnxruntime_ms:.2f} / {openvino_ms:.2f}"]
            cells += [ratio(ours, onnxruntime_ms), ratio(ours, openvino_ms)]
            ratios[title][0].append(ours / onnxruntime_ms)
            ratios[title][1].append(ours / openvino_ms)
        table.append(cells)
    means = ["geometric mean", ""]
    for title, _ in COLUMNS:
        means += ["", f"{geometric_mean(ratios[title][0]):.2f}×", f"{geometric_mean(ratios[title][1]):.2f}×"]
    table.append(means)
    print_table(header, table)


def wasm_table(names: list[str], size: str, repeat: int, cache) -> None:
    entries = []
    for name in names:
        path = real_zoo.export(name, size, cache)
        started = time.perf_counter()
        module = compiler.compile_model(str(path), target="wasm")
        print(f"{name}: compiled for wasm in {time.perf_counter() - started:.1f} s", flush=True)
        entries.append((name, onnx.load(str(path)), module, real_zoo.sample_inputs(name, size)))
    report = run_in_node(
        entries, repeat, block=BLOCK, pause_ms=PAUSE_S * 1000, settle=True, range_tolerance=RANGE_TOLERANCE
    )
    versions = report["versions"]
    print(f"\nwasm in Node {versions['node']} against onnxruntime-web {versions['onnxruntime_web']}, 1 thread, SIMD")
    rows, ratios = [], []
    for result in report["results"]:
        ours, theirs = summary(result["tessel"])["median"], summary(result["onnxruntime_web"])["median"]
        ratios.append(ours / theirs)
        rows.append([result["name"], f"{ours:.2f}", f"{theirs:.2f}", ratio(ours, theirs)])
    rows.append(["geometric mean", "", "", f"{geometric_mean(ratios):.2f}×"])
    print_table(["model", "Tessel ms", "onnxruntime-web ms", "ratio"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=real_zoo.names(), choices=real_zoo.names())
    parser.add_argument("--size", default="full", choices=real_zoo.SIZES)
    parser.add_argument("--repeat", type=int, default=20, help="timed runs of each side per cell, after warm-up")
    parser.add_argument("--wasm", action="store_true", help="time wasm in Node against onnxruntime-web instead")
    parser.add_argument("--slowest", type=int, default=8, help="slowest fused groups of the worst model to list")
    parser.add_argument("--cache", default=None, help="folder of the exports (default: real_zoo.default_cache_dir())")
    arguments = parser.parse_args()
    if arguments.repeat < 1:
        parser.error("--repeat needs at least 1 timed run")

    print(f"{datetime.date.today()}, {machine()}, {arguments.size} size")
    if arguments.wasm:
        wasm_table(arguments.models, arguments.size, arguments.repeat, arguments.cache)
        return
    core, rows = ov.Core(), {}
    for name in arguments.models:
        path = real_zoo.export(name, arguments.size, arguments.cache)
        rows[name] = time_native(name, path, real_zoo.sample_inputs(name, arguments.size), arguments.repeat, core)
    print(
        f"\nonnxruntime {ort.__version__}, OpenVINO {ov.get_version()} (f32, latency hint); median ms of "
        f"{arguments.repeat} runs in blocks of {BLOCK} with {PAUSE_S * 1000:.0f} ms pauses; ratios Tessel / rival, "
        "lower is better\n"
    )
    native_table(rows)
    if arguments.slowest:
        worst = max(rows, key=lambda name: rows[name]["default threads"][0] / rows[name]["default threads"][1])
        profile = rows[worst]["module"].profile(repeat=10, feeds=real_zoo.sample_inputs(worst, arguments.size))
        print_slowest(
            f"{worst} (the worst ratio to onnxruntime at the default thread count)", profile, arguments.slowest
        )


if __name__ == "__main__":
    main()
