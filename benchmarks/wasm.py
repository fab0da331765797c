"""Tessel in WebAssembly against onnxruntime-web, side by side in one Node 20 process: each zoo model is compiled
for wasm and exported as a bundle, then benchmarks/node_bench.mjs runs it through web_runtime/tessel.js and the
same .onnx through onnxruntime-web (wasm provider, SIMD, 1 thread), interleaved, after checking both agree.
Also times the bundle in wasmtime from Python. Installs onnxruntime-web from benchmarks/package.json when
benchmarks/node_modules is missing. Run: .venv/bin/python benchmarks/wasm.py [--models ...] [--repeat 30]"""

from __future__ import annotations

import argparse
import datetime

from common import DEFAULT_MODELS, print_slowest, print_table, ratio, run_in_node, spread, summary
from cpu import machine

import compiler
from compiler import zoo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=zoo.MODELS)
    parser.add_argument("--repeat", type=int, default=30, help="timed runs of each, after warm-up (at least 30)")
    parser.add_argument("--slowest", type=int, default=5, help="slowest fused groups to list per model")
    arguments = parser.parse_args()
    repeat = max(30, arguments.repeat)

    modules, feeds_of, entries = {}, {}, []
    for name in arguments.models:
        model = zoo.build_model(name)
        modules[name] = compiler.compile_model(model, target="wasm")
        feeds_of[name] = zoo.sample_input(name)
        entries.append((name, model, modules[name], feeds_of[name]))
    report = run_in_node(entries, repeat)

    versions = report["versions"]
    print(
        f"{datetime.date.today()}, {machine()}, Node {versions['node']} (V8 {versions['v8']}), "
        f"onnxruntime-web {versions['onnxruntime_web']}, 1 thread, SIMD128"
    )
    rows, profiles = [], {}
    for result in report["results"]:
        name = result["name"]
        tessel, rival = summary(result["tessel"]), summary(result["onnxruntime_web"])
        wasmtime = modules[name].benchmark(repeat=repeat, feeds=feeds_of[name])
        rows.append(
            [
                name,
                spread(tessel),
                spread(rival),
                ratio(tessel["median"], rival["median"]),
                f"{wasmtime['median_ms']:.2f}",
                ratio(wasmtime["median_ms"], rival["median"]),
            ]
        )
        profiles[name] = modules[name].profile(repeat=10, feeds=feeds_of[name])
    print_table(
        [
            "model",
            "Tessel in Node ms (median / min / max)",
            "onnxruntime-web ms (median / min / max)",
            "Tessel / onnxruntime-web",
            "Tessel in wasmtime ms (median)",
            "wasmtime / onnxruntime-web",
        ],
        rows,
    )
    for name, profile in profiles.items():
        print_slowest(f"{name} in wasmtime", profile, arguments.slowest)


if __name__ == "__main__":
    main()
