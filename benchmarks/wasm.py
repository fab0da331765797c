"""Tessel in WebAssembly against onnxruntime-web, side by side in Node 20, on one thread and on several: each model is
compiled for wasm with its threaded and relaxed-SIMD variants and exported as a bundle, then benchmarks/node_bench.mjs
runs it through web_runtime/tessel.js (plain and relaxed SIMD, on 1 thread and on --threads threads) and the same .onnx
through onnxruntime-web (wasm provider, SIMD), interleaved, after checking they all agree. onnxruntime-web fixes its
thread count once per process, so there is one Node process per onnxruntime-web thread count (1 and --threads), each
timing every Tessel side too; the ratios are taken within one process. Also times the bundle in wasmtime from Python.
Installs onnxruntime-web from benchmarks/package.json when benchmarks/node_modules is missing. With --browser, the same
Tessel sides also run in headless Chromium (Debian's chromium through Playwright) on a cross-origin isolated page,
interleaved round by round with onnxruntime-web at 1 and at --threads threads in pages of their own.
Run: .venv/bin/python benchmarks/wasm.py [--models ...] [--threads 2] [--repeat 30] [--browser]"""

from __future__ import annotations

import argparse
import base64
import datetime
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from common import (
    DEFAULT_MODELS,
    WARMUP,
    check_close,
    isolated_chromium,
    print_slowest,
    print_table,
    ratio,
    run_in_node,
    spread,
    summary,
)
from cpu import machine
from onnx import TensorProto, helper, numpy_helper

import compiler
from compiler import zoo
from compiler.build import EVERY_WASM_VARIANT

# Node 20's V8 has relaxed SIMD behind this flag (Chrome has it from 114 on)
NODE_FLAGS = ("--experimental-wasm-relaxed-simd",)
UNUSUAL = "unusual_shapes"


def unusual_model() -> onnx.ModelProto:
    """Shapes no schedule was tuned for: odd channel counts, a non-square input, a 3x5 kernel with stride (2, 1) and
    uneven padding, a depthwise 3x3 over 29 channels, a 1x1 down to 13 and a dense layer to 17."""
    rng = np.random.default_rng(11)

    def weight(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], kernel_shape=[3, 5], strides=[2, 1], pads=[1, 2, 0, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=29),
        helper.make_node("Sigmoid", ["c2"], ["s2"]),
        helper.make_node("Mul", ["c2", "s2"], ["m2"]),
        helper.make_node("Conv", ["m2", "w3", "b3"], ["c3"], kernel_shape=[1, 1]),
        helper.make_node("GlobalAveragePool", ["c3"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("Gemm", ["flat", "w4", "b4"], ["output"], transB=1),
    ]
    initializers = [
        weight("w1", 29, 7, 3, 5),
        weight("b1", 29),
        weight("w2", 29, 1, 3, 3),
        weight("w3", 13, 29, 1, 1),
        weight("b3", 13),
        weight("w4", 17, 13),
        weight("b4", 17),
    ]
    graph = helper.make_graph(
        nodes,
        UNUSUAL,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 7, 61, 43])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 17])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # onnxruntime-web 1.23 fails to create a session from a later IR version (a bare number)
    return model


# In one page, each Tessel side loaded and checked against the first, then warmed up; `round` times one run of each
# side (A B C D), called once per round from Python so onnxruntime-web's pages run between Tessel's rounds.
BROWSER_TESSEL = """async ({bundle, input, sides, warmup}) => {
  const tessel = await import("/web_runtime/tessel.js");
  const bytes = Uint8Array.from(atob(input), (character) => character.charCodeAt(0));
  const models = [];
  for (const options of sides) models.push(await tessel.load(bundle, options));
  const feeds = {[models[0].inputNames[0]]: new Float32Array(bytes.buffer)};
  const first = (await models[0].run(feeds))[models[0].outputNames[0]].data;
  const worst = [];
  for (const model of models) {
    const data = (await model.run(feeds))[model.outputNames[0]].data;
    worst.push(data.reduce((most, value, index) => Math.max(most, Math.abs(value - first[index])), 0));
  }
  for (let round = 0; round < warmup; round++) for (const model of models) await model.run(feeds);
  window.bench = {
    async round() {
      const times = [];
      for (const model of models) {
        const started = performance.now();
        await model.run(feeds);
        times.push(performance.now() - started);
      }
      return times;
    },
    dispose() {
      for (const model of models) model.dispose();
    },
  };
  const variants = models.map((model) => model.variant);
  return {worst, first: Array.from(first), variants, agent: navigator.userAgent};
}"""
# onnxruntime-web's wasm EP in a page of its own (it fixes its thread count once per page), warmed up.
BROWSER_ORT = """async ({model, input, dims, threads, warmup}) => {
  const ort = await import("/ort/ort.wasm.min.mjs");
  ort.env.wasm.wasmPaths = "/ort/";
  ort.env.wasm.numThreads = threads;
  const bytes = Uint8Array.from(atob(input), (character) => character.charCodeAt(0));
  const session = await ort.InferenceSession.create(model, {executionProviders: ["wasm"]});
  const feeds = {[session.inputNames[0]]: new ort.Tensor("float32", new Float32Array(bytes.buffer), dims)};
  for (let round = 0; round < warmup; round++) await session.run(feeds);
  window.bench = {
    async round() {
      const started = performance.now();
      await session.run(feeds);
      return [performance.now() - started];
    },
    dispose() {
      session.release();
    },
  };
  return {};
}"""


def run_in_chromium(entries, sides, repeat: int, threads: int) -> dict:
    """Each bundle's Tessel sides timed in one headless Chromium page, interleaved round by round with
    onnxruntime-web at 1 and at `threads` threads in pages of their own (the witness of what two threads gave any
    runtime in the same seconds); {name: {times, worst, variants, ort: {count: times}}}."""
    root = Path(tempfile.mkdtemp(prefix="tessel-wasm-browser-"))
    for name, model, module, _ in entries:
        module.export(root / "bundles" / name)
        (root / f"{name}.onnx").write_bytes(model.SerializeToString())
    results = {}
    try:
        with isolated_chromium(root) as (browser, url):
            for name, _, module, feeds in entries:
                array = np.ascontiguousarray(feeds[module.inputs[0].name], np.float32)
                data = base64.b64encode(array.tobytes()).decode()
                pages = {"tessel": browser.new_page()}
                pages["tessel"].goto(url)
                job = {"bundle": f"/bundles/{name}/", "input": data, "sides": sides, "warmup": WARMUP}
                results[name] = pages["tessel"].evaluate(BROWSER_TESSEL, job)
                for count in dict.fromkeys([1, threads]):
                    pages[count] = browser.new_page()
                    pages[count].goto(url)
                    job = {"model": f"/{name}.onnx", "input": data, "dims": list(array.shape), "threads": count}
                    pages[count].evaluate(BROWSER_ORT, {**job, "warmup": WARMUP})
                rounds = {key: [] for key in pages}
                for _ in range(repeat):
                    for key, page in pages.items():
                        rounds[key].append(page.evaluate("window.bench.round()"))
                for page in pages.values():
                    page.evaluate("window.bench.dispose()")
                    page.close()
                results[name]["times"] = [list(side) for side in zip(*rounds.pop("tessel"))]
                results[name]["ort"] = {count: [times[0] for times in rounds[count]] for count in rounds}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results


def browser_table(entries, sides, results: dict) -> None:
    """The Chromium table, after checking the first side's outputs against onnxruntime's CPU provider."""
    rows = []
    for name, model, _, feeds in entries:
        result = results[name]
        expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        check_close(
            f"{name} (Tessel in Chromium)",
            [np.array(result["first"], np.float32).reshape(expected[0].shape)],
            expected[:1],
        )
        if max(result["worst"]) > 1e-3:
            raise SystemExit(f"{name}: a Tessel side in Chromium differs from the first by {max(result['worst'])}")
        stats = [summary(times) for times in result["times"]]
        rivals = {count: summary(times) for count, times in result["ort"].items()}
        counts = list(rivals)
        rows.append(
            [
                name,
                *(spread(item) for item in stats),
                *(spread(rivals[count]) for count in counts),
                f"{stats[0]['median'] / stats[2]['median']:.2f}× faster",
                f"{rivals[counts[0]]['median'] / rivals[counts[-1]]['median']:.2f}× faster",
                f"{stats[0]['median'] / stats[1]['median']:.2f}× faster",
                f"{stats[2]['median'] / stats[3]['median']:.2f}× faster",
            ]
        )
    first = next(iter(results.values()))
    print(
        f"\nIn Chromium ({first['agent']}), cross-origin isolated, Tessel's sides in one page: "
        + "; ".join(f"{v['code']} on {v['threads']}" for v in first["variants"])
        + "; onnxruntime-web's wasm EP in a page per thread count; one run of each page per round"
    )
    threads = first["variants"][2]["threads"]
    print_table(
        [
            "model",
            *(f"{label} ms (median / min / max)" for label, _ in sides),
            *(f"onnxruntime-web {count} thread(s) ms" for count in first["ort"]),
            f"Tessel 1 / {threads} threads",
            f"onnxruntime-web 1 / {threads} threads",
            "relaxed SIMD gain (1 thread)",
            f"relaxed SIMD gain ({threads} threads)",
        ],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=[*DEFAULT_MODELS, UNUSUAL], choices=[*zoo.MODELS, UNUSUAL])
    parser.add_argument("--threads", type=int, default=2, help="threads of the threaded runs (both runtimes)")
    parser.add_argument("--repeat", type=int, default=30, help="timed runs of each, after warm-up (at least 30)")
    parser.add_argument("--slowest", type=int, default=5, help="slowest fused groups to list per model")
    parser.add_argument("--browser", action="store_true", help="also time the Tessel sides in headless Chromium")
    arguments = parser.parse_args()
    repeat, threads = max(30, arguments.repeat), arguments.threads

    modules, feeds_of, entries = {}, {}, []
    for name in arguments.models:
        model = unusual_model() if name == UNUSUAL else zoo.build_model(name)
        modules[name] = compiler.compile_model(model, target="wasm", wasm_variants=EVERY_WASM_VARIANT)
        rng = np.random.default_rng(0)
        feeds_of[name] = (
            {"input": rng.standard_normal((1, 7, 61, 43)).astype(np.float32)}
            if name == UNUSUAL
            else zoo.sample_input(name)
        )
        entries.append((name, model, modules[name], feeds_of[name]))
    sides = [
        ("Tessel 1 thread", {"threads": 1, "relaxedSimd": False}),
        ("Tessel 1 thread relaxed", {"threads": 1}),
        (f"Tessel {threads} threads", {"threads": threads, "relaxedSimd": False}),
        (f"Tessel {threads} threads relaxed", {"threads": threads}),
    ]
    options = [side for _, side in sides]
    load_before = os.getloadavg()
    reports = {
        count: run_in_node(entries, repeat, tessel_options=options, ort_threads=count, node_flags=NODE_FLAGS)
        for count in dict.fromkeys([1, threads])
    }
    load_after = os.getloadavg()

    versions = reports[1]["versions"]
    print(
        f"{datetime.date.today()}, {machine()}, Node {versions['node']} (V8 {versions['v8']}, {' '.join(NODE_FLAGS)}), "
        f"onnxruntime-web {versions['onnxruntime_web']}, SIMD128; load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after"
    )
    rows, profiles = [], {}
    for position, name in enumerate(arguments.models):
        by_count = {count: report["results"][position] for count, report in reports.items()}
        single = by_count[1]
        tessel = [summary(times) for times in single["tessel_runs"]]
        rivals = {count: summary(result["onnxruntime_web"]) for count, result in by_count.items()}
        best = min(rivals, key=lambda count: rivals[count]["median"])
        # Tessel's fastest threaded side, measured in the process where onnxruntime-web ran at its best count
        ours = min(summary(times)["median"] for times in by_count[best]["tessel_runs"][2:])
        wasmtime = modules[name].benchmark(repeat=repeat, feeds=feeds_of[name])
        rows.append(
            [
                name,
                *(spread(stats) for stats in tessel),
                *(spread(rivals[count]) for count in rivals),
                f"{tessel[0]['median'] / tessel[2]['median']:.2f}× faster",
                f"{tessel[0]['median'] / tessel[1]['median']:.2f}× faster",
                f"{ratio(ours, rivals[best]['median'])} (onnxruntime-web at {best})",
                f"{wasmtime['median_ms']:.2f}",
            ]
        )
        profiles[name] = modules[name].profile(repeat=10, feeds=feeds_of[name])
    variants = reports[1]["results"][0]["variants"]
    print(
        "Tessel sides ran: "
        + "; ".join(f"{label}: {v['code']} on {v['threads']}" for (label, _), v in zip(sides, variants))
    )
    print_table(
        [
            "model",
            *(f"{label} ms (median / min / max)" for label, _ in sides),
            *(f"onnxruntime-web {count} thread(s) ms" for count in reports),
            f"Tessel 1 / {threads} threads",
            "relaxed SIMD gain (1 thread)",
            f"Tessel {threads} threads / onnxruntime-web best",
            "Tessel in wasmtime ms (1 thread)",
        ],
        rows,
    )
    if arguments.browser:
        browser_table(entries, sides, run_in_chromium(entries, options, repeat, threads))
    for name, profile in profiles.items():
        print_slowest(f"{name} in wasmtime", profile, arguments.slowest)


if __name__ == "__main__":
    main()
