"""Tessel's WebGPU executor against onnxruntime-web's WebGPU execution provider, in one headless Chromium page on the
same adapter (issue 13 §4's WebGPU rows), or with --backend wasm Tessel's wasm executor against onnxruntime-web's wasm
one, each at its default thread count (the threads' speed-up and best-thread-count latency are benchmarks/wasm.py's).
Each zoo model is compiled for the backend by `tessel compile` (what a CLI user gets) and served with its .onnx, tessel.js and onnxruntime-web's build for that
backend from a local server; outputs are checked against onnxruntime (Python) first, then, interleaved: the time from
load() (InferenceSession.create) to the first result in a fresh page of a fresh browser profile (a first visit: no
cache) and again in a second page of that profile (a second visit: tessel.js reads code and params from its Cache API
store, onnxruntime-web from the HTTP cache, the files being served cacheable), the bytes of runtime and model the
first visit fetched, and the median latency of runs, in each call pattern: back to back, a run every 200 ms, and back to back
while another process keeps one core busy (its loads are timed again under that load too).
Never run in CI. Run: .venv/bin/python benchmarks/browser.py [--backend webgpu|wasm] [--models ...] [--repeat 20]
[--loads 3] [--patterns back-to-back every-200ms busy-core]"""

from __future__ import annotations

import argparse
import datetime
import functools
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import onnxruntime
from common import HERE, busy_core, install_onnxruntime_web, print_table, ratio, spread, summary

from compiler import zoo
from compiler.cli import main as cli_main

ROOT = HERE.parent
# onnxruntime-web's files per backend: its module first, then the wasm it loads
ORT_FILES = {
    "webgpu": ("ort.webgpu.min.mjs", "ort-wasm-simd-threaded.asyncify.mjs", "ort-wasm-simd-threaded.asyncify.wasm"),
    "wasm": ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm"),
}
# issue 13's models; bert_tiny is its transformer encoder block (two post-norm encoder layers over a float32 input of
# summed embeddings). resnet18 runs with --models resnet18: on SwiftShader a run takes about 4 s and ort-web's load 15 s.
DEFAULT = ("mobilenet_v2", "mlp", "dwconv_block", "bert_tiny", "vit_tiny")
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--enable-unsafe-webgpu", "--disable-background-networking"]


@dataclass(frozen=True)
class Pattern:
    """How a page calls the model: `interval_s` idle before each timed run; `busy_core`: another process keeps one
    core busy throughout, the loads included."""

    title: str
    interval_s: float = 0.0
    busy_core: bool = False


PATTERNS = {
    "back-to-back": Pattern("back to back"),
    "every-200ms": Pattern("a run every 200 ms", interval_s=0.2),
    "busy-core": Pattern("back to back, one core busy", busy_core=True),
}

# Both sides in the page: load, run once, time runs; `which` is "tessel" or "ort". Bytes are the encoded sizes of
# every resource the page fetched, from the Resource Timing entries (same origin, so they are exposed).
PAGE = """
<!doctype html><meta charset="utf-8"><title>bench</title>
<script type="module">
// Each side imports its runtime itself, so a page's fetched bytes are one side's alone.
const decode = (text) => new Float32Array(Uint8Array.from(atob(text), (c) => c.charCodeAt(0)).buffer);
const sides = {};
window.bench = {
  async load(which, backend, name, dims, data) {
    const input = decode(data);
    const started = performance.now();  // the runtime's download counts, as it does for a page
    let run;
    if (which === "tessel") {
      const tessel = await import("/runtime/tessel.js");
      const model = await tessel.load(`/bundles/${name}/`, { backend });
      run = async () => Object.values(await model.run({ [model.inputs[0].name]: { data: input, dims } }))[0].data;
      const variant = model.variant ? `, ${model.variant.code} on ${model.variant.threads} thread(s)` : "";
      sides[which] = { model, backend: `${model.backendReason}${variant}` };
    } else {
      const ort = await import(backend === "webgpu" ? "/ort/ort.webgpu.min.mjs" : "/ort/ort.wasm.min.mjs");
      ort.env.wasm.wasmPaths = "/ort/";
      // its WebGPU EP's wasm side runs on one thread; the wasm EP keeps its default thread count
      if (backend === "webgpu") ort.env.wasm.numThreads = 1;
      const session = await ort.InferenceSession.create(`/models/${name}.onnx`, { executionProviders: [backend] });
      const feeds = { [session.inputNames[0]]: new ort.Tensor("float32", input, dims) };
      run = async () => (await session.run(feeds))[session.outputNames[0]].getData();
      sides[which] = { session };
    }
    const loaded = performance.now() - started;
    const first = await run();
    const firstMs = performance.now() - started;
    sides[which].run = run;
    // tessel.js marks its load's steps (docs/web.md): each as ms since load() was called
    const phases = { loaded, first: firstMs };
    for (const entry of performance.getEntriesByType("mark")) {
      if (entry.name.startsWith("tessel:")) phases[entry.name.slice(7)] = entry.startTime - started;
    }
    const bytes = performance.getEntriesByType("resource").reduce((sum, entry) => sum + entry.encodedBodySize, 0);
    return { firstMs, bytes, phases, output: Array.from(first), backend: sides[which].backend || `${backend} EP` };
  },
  async time(which) {
    const started = performance.now();
    await sides[which].run();
    return performance.now() - started;
  },
};
window.benchReady = true;
</script>
"""


class _Handler(SimpleHTTPRequestHandler):
    """Files from the bench directory, cross-origin isolated (onnxruntime-web's threads want it), cacheable for an hour
    as a site would serve them (a first visit is a fresh browser profile, so nothing is cached before it)."""

    def end_headers(self):
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cache-Control", "max-age=3600")
        super().end_headers()

    def guess_type(self, path):
        if str(path).endswith((".mjs", ".js")):
            return "text/javascript"
        return super().guess_type(path)

    def log_message(self, *args):
        pass


def _prepare(directory: Path, names: list[str], backend: str) -> dict[str, dict]:
    """The served tree: /runtime (tessel.js), /ort (onnxruntime-web's build for `backend`), /bundles/<name>,
    /models."""
    install_onnxruntime_web()
    shutil.copytree(ROOT / "web_runtime", directory / "runtime")
    (directory / "ort").mkdir()
    for name in ORT_FILES[backend]:
        shutil.copy(HERE / "node_modules" / "onnxruntime-web" / "dist" / name, directory / "ort" / name)
    (directory / "models").mkdir()
    (directory / "index.html").write_text(PAGE)
    cases = {}
    for name in names:
        model = zoo.build_model(name)
        onnx_file = directory / "models" / f"{name}.onnx"
        onnx_file.write_bytes(model.SerializeToString())
        # the bundle a CLI user gets: `tessel compile MODEL.onnx --target BACKEND` (for wasm, every variant beside the
        # plain code; tessel.js picks the fastest the page can run)
        bundle = directory / "bundles" / name
        if cli_main(["compile", str(onnx_file), "--target", backend, "-o", str(bundle)]) != 0:
            raise SystemExit(f"tessel compile {onnx_file} --target {backend} failed")
        feeds = zoo.sample_input(name)
        (array,) = feeds.values()
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        cases[name] = {"input": array, "expected": session.run(None, feeds)[0]}
    return cases


def _phases(loads: list[dict]) -> str:
    """The median time of each step tessel.js marked, in the order they came: where a load's time went."""
    names = {name for phases in loads for name in phases}
    medians = {name: statistics.median(phases[name] for phases in loads if name in phases) for name in names}
    return ", ".join(f"{name} {ms:.0f}" for name, ms in sorted(medians.items(), key=lambda item: item[1]))


def _encoded(array: np.ndarray) -> str:
    import base64

    return base64.b64encode(array.astype(np.float32).tobytes()).decode()


def _load_in_fresh_page(context, url: str, which: str, backend: str, name: str, case: dict) -> dict:
    page = context.new_page()
    page.goto(url)
    page.wait_for_function("window.benchReady === true")
    result = page.evaluate(
        "([which, backend, name, dims, data]) => window.bench.load(which, backend, name, dims, data)",
        [which, backend, name, list(case["input"].shape), _encoded(case["input"])],
    )
    return page, result


def _load_both(browser, url: str, backend: str, name: str, case: dict, loads: int) -> tuple[dict, tuple]:
    """`loads` interleaved visits of each side, each a first visit in a fresh browser profile and a second visit in
    another page of that profile, every first output checked against onnxruntime: the pages of the last second
    visits (their profiles kept open), and the sides' first-result times (first and second visits) and the bytes
    the first visits fetched."""
    firsts, seconds = {"tessel": [], "ort": []}, {"tessel": [], "ort": []}
    phases = []
    sizes, pages, contexts, ran = {}, {}, {}, {}
    for _ in range(loads):
        for which in ("tessel", "ort"):
            if which in contexts:
                contexts[which].close()
            contexts[which] = browser.new_context()
            for visits in (firsts, seconds):
                if which in pages and not pages[which].is_closed():
                    pages[which].close()
                pages[which], result = _load_in_fresh_page(contexts[which], url, which, backend, name, case)
                got = np.array(result["output"], np.float32).reshape(case["expected"].shape)
                np.testing.assert_allclose(got, case["expected"], rtol=1e-3, atol=1e-4, err_msg=f"{name} {which}")
                visits[which].append(result["firstMs"])
                if visits is firsts:
                    sizes[which] = result["bytes"]
                    if which == "tessel":
                        phases.append(result["phases"])
            ran[which] = result["backend"]
    print(f"{name}: Tessel ran {ran['tessel']}; onnxruntime-web its {ran['ort']}", file=sys.stderr)
    print(f"{name}: Tessel's load, ms after load() (median of {len(phases)}): {_phases(phases)}", file=sys.stderr)
    return pages, (firsts, seconds, sizes)


def _time_runs(pages: dict, repeat: int, interval_s: float) -> dict[str, list[float]]:
    """`repeat` runs of each side, interleaved, each after `interval_s` idle."""
    times = {"tessel": [], "ort": []}
    for _ in range(repeat):
        for which in ("tessel", "ort"):
            if interval_s:
                time.sleep(interval_s)
            times[which].append(pages[which].evaluate("(which) => window.bench.time(which)", which))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="webgpu", choices=sorted(ORT_FILES), help="both sides run on this")
    parser.add_argument("--models", nargs="+", default=list(DEFAULT), choices=zoo.MODELS)
    parser.add_argument("--repeat", type=int, default=20, help="timed runs of each side, interleaved")
    parser.add_argument("--loads", type=int, default=3, help="fresh-page loads of each side, interleaved")
    parser.add_argument(
        "--patterns", nargs="+", default=list(PATTERNS), choices=tuple(PATTERNS), help="call patterns to time"
    )
    arguments = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="tessel-browser-bench-") as folder:
        directory = Path(folder)
        backend = arguments.backend
        cases = _prepare(directory, arguments.models, backend)
        server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(directory)))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/index.html"
        rows = []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
            probe_context = browser.new_context()
            probe = probe_context.new_page()
            probe.goto(url)
            adapter = probe.evaluate(
                "navigator.gpu.requestAdapter().then((a) => a ? `${a.info.vendor} ${a.info.architecture}` : 'none')"
            )
            version = browser.version
            probe_context.close()
            for name in arguments.models:
                case = cases[name]
                pages, made = {}, {}  # per busy_core: the firsts and sizes of the loads made under it
                for key in arguments.patterns:
                    pattern = PATTERNS[key]
                    print(f"{name}: {pattern.title}, on {adapter}...", file=sys.stderr, flush=True)
                    hog = busy_core() if pattern.busy_core else None
                    try:
                        if pattern.busy_core not in made:
                            for page in pages.values():
                                page.close()
                            pages, made[pattern.busy_core] = _load_both(
                                browser, url, backend, name, case, arguments.loads
                            )
                        times = _time_runs(pages, arguments.repeat, pattern.interval_s)
                    finally:
                        if hog is not None:
                            hog.terminate()
                            hog.wait()
                    firsts, seconds, sizes = made[pattern.busy_core]
                    ours, theirs = summary(times["tessel"]), summary(times["ort"])
                    first_ours, first_theirs = statistics.median(firsts["tessel"]), statistics.median(firsts["ort"])
                    second_ours = statistics.median(seconds["tessel"])
                    second_theirs = statistics.median(seconds["ort"])
                    rows.append(
                        [
                            name,
                            pattern.title,
                            spread(ours),
                            spread(theirs),
                            ratio(ours["median"], theirs["median"]),
                            f"{first_ours:.0f}",
                            f"{first_theirs:.0f}",
                            ratio(first_ours, first_theirs),
                            f"{second_ours:.0f}",
                            f"{second_theirs:.0f}",
                            ratio(second_ours, second_theirs),
                            f"{sizes['tessel'] / 1e6:.2f}",
                            f"{sizes['ort'] / 1e6:.2f}",
                        ]
                    )
                for page in pages.values():
                    page.close()
            browser.close()
        server.shutdown()
    print(
        f"{datetime.date.today()}, Chromium {version}, WebGPU adapter {adapter}, onnxruntime-web {backend} EP; "
        f"{arguments.repeat} interleaved runs per call pattern; first result: median of {arguments.loads} first visits "
        "(a fresh browser profile each) and of the second visits after them (another page of the profile), under the "
        "busy core again for its rows"
    )
    print_table(
        [
            "model",
            "call pattern",
            f"Tessel {backend} ms (median / min / max)",
            f"ort-web {backend} ms (median / min / max)",
            "latency ratio",
            "Tessel load→first ms",
            "ort-web load→first ms",
            "first-result ratio",
            "Tessel 2nd visit→first ms",
            "ort-web 2nd visit→first ms",
            "2nd-visit ratio",
            "Tessel MB fetched",
            "ort-web MB fetched",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
