"""Tessel in WebAssembly against onnxruntime-web, side by side in one Node 20 process: each zoo model is compiled
for wasm and exported as a bundle, then benchmarks/node_bench.mjs runs it through web_runtime/tessel.js and the
same .onnx through onnxruntime-web (wasm provider, SIMD, 1 thread), interleaved, after checking both agree.
Also times the bundle in wasmtime from Python. Installs onnxruntime-web from benchmarks/package.json when
benchmarks/node_modules is missing. Run: .venv/bin/python benchmarks/wasm.py [--models ...] [--repeat 30]"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
from common import DEFAULT_MODELS, WARMUP, check_close, print_slowest, print_table, ratio, spread, summary
from cpu import machine

import compiler
from compiler import zoo

HERE = Path(__file__).resolve().parent


def install_onnxruntime_web() -> None:
    """npm ci from the lockfile (npm install without one) into benchmarks/node_modules, once."""
    if (HERE / "node_modules" / "onnxruntime-web").is_dir():
        return
    if shutil.which("npm") is None:
        raise SystemExit("benchmarks/wasm.py needs Node 20 and npm on the PATH to install onnxruntime-web")
    command = "ci" if (HERE / "package-lock.json").is_file() else "install"
    subprocess.run(["npm", command, "--prefix", str(HERE), "--no-audit", "--no-fund"], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=zoo.MODELS)
    parser.add_argument("--repeat", type=int, default=30, help="timed runs of each, after warm-up (at least 30)")
    parser.add_argument("--slowest", type=int, default=5, help="slowest fused groups to list per model")
    arguments = parser.parse_args()
    repeat = max(30, arguments.repeat)
    install_onnxruntime_web()

    with tempfile.TemporaryDirectory(prefix="tessel-wasm-bench-") as folder:
        work = Path(folder)
        modules, feeds_of, specs = {}, {}, []
        for name in arguments.models:
            model = zoo.build_model(name)
            module = compiler.compile_model(model, target="wasm")
            module.export(work / name)
            (work / f"{name}.onnx").write_bytes(model.SerializeToString())
            feeds = zoo.sample_input(name)
            inputs = []
            for spec in module.inputs:
                path = work / f"{name}.{spec.name}.bin"
                path.write_bytes(np.ascontiguousarray(feeds[spec.name], np.float32).tobytes())
                inputs.append({"name": spec.name, "file": str(path), "shape": list(spec.shape)})
            outputs = [spec.name for spec in module.outputs]
            specs.append(
                {
                    "name": name,
                    "bundle": str(work / name),
                    "onnx": str(work / f"{name}.onnx"),
                    "inputs": inputs,
                    "outputs": outputs,
                    "outputPrefix": str(work / f"{name}.output"),
                }
            )
            modules[name], feeds_of[name] = module, feeds
        job = work / "job.json"
        job.write_text(json.dumps({"models": specs, "repeat": repeat, "warmup": WARMUP}))
        node = subprocess.run(
            ["node", str(HERE / "node_bench.mjs"), str(job)], capture_output=True, text=True, cwd=HERE
        )
        if node.returncode != 0:
            raise SystemExit(f"node_bench.mjs failed:\n{node.stderr.strip()}")
        report = json.loads(node.stdout)
        for name, module in modules.items():
            session = ort.InferenceSession(
                zoo.build_model(name).SerializeToString(), providers=["CPUExecutionProvider"]
            )
            expected = session.run(None, feeds_of[name])
            in_node = [
                np.fromfile(work / f"{name}.output{position}.bin", np.float32).reshape(spec.shape)
                for position, spec in enumerate(module.outputs)
            ]
            check_close(f"{name} (Tessel in Node)", in_node, expected)

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
