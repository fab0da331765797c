"""tessel.js's cache of bundle files, its streamed params and its worker mode, in headless Chromium on a small static server that counts
the requests it answers (each response is Cache-Control: no-store, so only tessel.js's own cache can spare one) and
sends COOP/COEP, so the page and its workers are cross-origin isolated."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_browser import ATOL, CHROMIUM_ARGS, RTOL, _run_onnxruntime, launch_chromium
from test_node_cache import _matmul_model as _three_piece_model

from compiler import compile_model, zoo
from compiler.build import EVERY_WASM_VARIANT

RUNTIME = Path(__file__).resolve().parents[2] / "web_runtime"
# the params of the "stalled" bundle (2 MiB: two 1 MiB pieces of its chunked digest) stop for STALL_S after STALL_AT
STALLED = "/stalled/params.bin"
STALL_AT, STALL_S = 3 << 19, 1.0

RUN = """async ({bundle, feeds, options}) => {
  const tessel = await import("/runtime/tessel.js");
  const inputs = Object.fromEntries(Object.entries(feeds).map(([name, values]) => [name, Float32Array.from(values)]));
  const phases = [];
  const model = await tessel.load(bundle, {threads: 1, ...options, onProgress: ({phase}) => phases.push(phase)});
  const outputs = await model.run(inputs);
  model.dispose();
  return {phases: [...new Set(phases)], outputs: Object.fromEntries(Object.entries(outputs).map(([name, t]) => [name, Array.from(t.data)]))};
}"""


class _CountingHandler(http.server.SimpleHTTPRequestHandler):
    """Static files, cross-origin isolated and never cached by the browser; each request's path is recorded."""

    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".wasm": "application/wasm"}

    def __init__(self, *arguments, requests: list[str], **keywords):
        self.requests = requests
        super().__init__(*arguments, **keywords)

    def do_GET(self):
        self.requests.append(self.path)
        if self.path == STALLED:
            # params.bin's first STALL_AT bytes, a pause, then the rest: what arrived must be in use before the end
            data = (Path(self.directory) / self.path.lstrip("/")).read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[:STALL_AT])
            self.wfile.flush()
            time.sleep(STALL_S)
            self.wfile.write(data[STALL_AT:])
            return
        super().do_GET()

    def end_headers(self):
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, *arguments):
        return None


def _conv_model() -> onnx.ModelProto:
    """One 3x3 convolution, 64 -> 64 channels on 128x128: tens of milliseconds a run on one wasm thread."""
    rng = np.random.default_rng(0)
    weight = helper.make_tensor(
        "w", TensorProto.FLOAT, (64, 64, 3, 3), rng.standard_normal((64, 64, 3, 3)).astype(np.float32).ravel() * 0.05
    )
    node = helper.make_node("Conv", ["input", "w"], ["output"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, (1, 64, 128, 128))],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, (1, 64, 128, 128))],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _matmul_model() -> onnx.ModelProto:
    """input [1, 512] @ a [512, 1024] weight: 2 MiB of params."""
    weight = np.random.default_rng(1).standard_normal((512, 1024)).astype(np.float32) * 0.05
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "w"], ["output"])],
        "matmul",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, (1, 512))],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, (1, 1024))],
        [helper.make_tensor("w", TensorProto.FLOAT, weight.shape, weight.ravel())],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """digits and mlp as wasm bundles (mlp's files are later put where digits' were), a 2 MiB MatMul whose params
    stall midway, the convolution, digits with its threaded variants, and the page."""
    root = tmp_path_factory.mktemp("cache-site")
    (root / "runtime").symlink_to(RUNTIME)
    (root / "index.html").write_text('<!doctype html><meta charset="utf-8"><title>cache</title>')
    cases = {}
    for name in ("digits", "mlp"):
        model = zoo.build_model(name)
        compile_model(model, "wasm").export(root / "bundles" / name)
        feeds = zoo.sample_input(name, seed=2)
        cases[name] = ({key: value.ravel().tolist() for key, value in feeds.items()}, _run_onnxruntime(model, feeds))
    compile_model(_conv_model(), "wasm").export(root / "conv")
    compile_model(zoo.build_model("digits"), "wasm", wasm_variants=EVERY_WASM_VARIANT).export(root / "threaded")
    stalled = _matmul_model()
    compile_model(stalled, "wasm").export(root / "stalled")
    feeds = {"input": np.random.default_rng(3).standard_normal((1, 512)).astype(np.float32)}
    cases["stalled"] = ({"input": feeds["input"].ravel().tolist()}, _run_onnxruntime(stalled, feeds))
    gpu = _three_piece_model()
    compile_model(gpu, "webgpu").export(root / "gpu")
    feeds = {"input": np.random.default_rng(6).standard_normal((1, 640)).astype(np.float32)}
    cases["gpu"] = ({"input": feeds["input"].ravel().tolist()}, _run_onnxruntime(gpu, feeds))
    return root, cases


@pytest.fixture(scope="module")
def served(site):
    requests: list[str] = []
    handler = functools.partial(_CountingHandler, directory=site[0], requests=requests)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", requests
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def playwright():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as running:
        yield running


@pytest.fixture(scope="module")
def context(playwright, tmp_path_factory):
    browser = launch_chromium(playwright, tmp_path_factory.mktemp("cache-profile"))
    yield browser
    browser.close()


def _page(context, url: str, init_script: str | None = None):
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    if init_script:
        page.add_init_script(init_script)
    page.goto(f"{url}/index.html")
    return page, errors


def _check(result: dict, expected: dict) -> None:
    for name, values in expected.items():
        np.testing.assert_allclose(
            np.array(result["outputs"][name], np.float32).reshape(values.shape), values, RTOL, ATOL
        )


def test_a_second_load_downloads_nothing_and_a_changed_bundle_is_fetched_fresh(site, served, context):
    root, cases = site
    url, requests = served
    page, errors = _page(context, url)
    feeds, expected = cases["digits"]

    def load(options=None, case="digits"):
        requests.clear()
        result = page.evaluate(RUN, {"bundle": "/bundles/digits/", "feeds": cases[case][0], "options": options or {}})
        _check(result, cases[case][1])
        return sorted(path.removeprefix("/bundles/digits/") for path in requests if path.startswith("/bundles/"))

    everything = ["manifest.json", "model.wasm", "params.bin"]
    page.evaluate("import('/runtime/tessel.js').then((tessel) => tessel.clearCache())")
    assert load() == everything
    assert load() == ["manifest.json"], "the second load fetched code or params"
    assert load({"cache": "reload"}) == everything
    assert load() == ["manifest.json"]
    assert load({"cache": "none"}) == everything
    # an entry whose bytes do not match its digest is dropped and fetched again, then kept right
    page.evaluate(
        """async (digest) => (await caches.open("tessel-runtime")).put(
             `https://tessel-runtime.invalid/sha256/${digest}`, new Response(new Uint8Array(100)))""",
        json.loads((root / "bundles/digits/manifest.json").read_text())["files"]["params.bin"],
    )
    assert load() == ["manifest.json", "params.bin"]
    assert load() == ["manifest.json"]
    # and one of the right size with a byte flipped, found by the load's own check of the bytes it copies in
    page.evaluate(
        """async (digest) => {
             const cache = await caches.open("tessel-runtime");
             const key = `https://tessel-runtime.invalid/sha256/${digest}`;
             const bytes = new Uint8Array(await (await cache.match(key)).arrayBuffer());
             bytes[bytes.length >> 1] ^= 0x01;
             await cache.put(key, new Response(bytes));
           }""",
        json.loads((root / "bundles/digits/manifest.json").read_text())["files"]["params.bin"],
    )
    assert load() == ["manifest.json", "params.bin"]
    assert load() == ["manifest.json"]
    page.evaluate("import('/runtime/tessel.js').then((tessel) => tessel.clearCache())")
    assert load() == everything
    # the same URL now serves another model: new digests, so nothing stale is used
    for path in (root / "bundles/mlp").iterdir():
        shutil.copy(path, root / "bundles/digits" / path.name)
    assert load(case="mlp") == everything
    assert load(case="mlp") == ["manifest.json"]
    bad = page.evaluate(
        """() => import('/runtime/tessel.js').then((tessel) => tessel.load('/bundles/digits/', {cache: 'sometimes'}))
             .then(() => null, (error) => [error.name, error.code, error.field])"""
    )
    assert bad == ["TesselError", "options", "cache"]
    page.close()
    assert not errors, errors


def test_without_the_cache_api_indexeddb_keeps_the_files(site, served, context):
    url, requests = served
    page, errors = _page(context, url, "Object.defineProperty(globalThis, 'caches', {value: undefined});")
    feeds, expected = site[1]["mlp"]
    bundle = "/bundles/mlp/"
    assert page.evaluate("typeof caches") == "undefined"
    counts = []
    for _ in range(2):
        requests.clear()
        _check(page.evaluate(RUN, {"bundle": bundle, "feeds": feeds, "options": {}}), expected)
        counts.append(sorted(path.removeprefix(bundle) for path in requests if path.startswith(bundle)))
    assert counts == [["manifest.json", "model.wasm", "params.bin"], ["manifest.json"]], counts
    assert page.evaluate("indexedDB.databases().then((all) => all.map((db) => db.name))") == ["tessel-runtime"]
    page.evaluate("import('/runtime/tessel.js').then((tessel) => tessel.clearCache())")
    assert page.evaluate("indexedDB.databases().then((all) => all.length)") == 0
    page.close()
    assert not errors, errors


# crypto.subtle.digest wrapped before the page's scripts: a copy of each input, hashed afterwards by the real digest
RECORD_HASHES = """window.hashed = [];
window.realDigest = crypto.subtle.digest.bind(crypto.subtle);
crypto.subtle.digest = (algorithm, data) => {
  const view = ArrayBuffer.isView(data) ? new Uint8Array(data.buffer, data.byteOffset, data.byteLength) : new Uint8Array(data);
  window.hashed.push(view.slice());
  return window.realDigest(algorithm, data);
};"""

GPU_LOAD = """async ({feeds}) => {
  const tessel = await import("/runtime/tessel.js");
  window.hashed.length = 0;
  const model = await tessel.load("/gpu/", {backend: "webgpu"});
  const outputs = await model.run({input: Float32Array.from(feeds.input)});
  model.dispose();
  const hex = async (bytes) => Array.from(new Uint8Array(await window.realDigest("SHA-256", bytes)), (b) => b.toString(16).padStart(2, "0")).join("");
  return {backend: model.backend, output: Array.from(outputs.output.data), hashed: await Promise.all(window.hashed.map(hex))};
}"""


@pytest.fixture(scope="module")
def gpu_context(playwright, tmp_path_factory):
    args = [*CHROMIUM_ARGS, "--enable-unsafe-webgpu"]
    browser = launch_chromium(playwright, tmp_path_factory.mktemp("cache-gpu-profile"), args)
    yield browser
    browser.close()


def test_webgpu_hashes_a_download_and_a_cache_hit_once_and_replaces_a_damaged_entry(site, served, gpu_context):
    """params.bin (2.5 MiB: three pieces of its chunked digest) streams into the mapped buffer and is hashed piece by
    piece as it arrives, from the network or the cache alike; kernels.wgsl is hashed once for its digest. A cached
    params.bin with a flipped byte is hashed once as it is copied in, refused by that check, and fetched again."""
    root, cases = site
    url, requests = served
    page, errors = _page(gpu_context, url, RECORD_HASHES)
    feeds, expected = cases["gpu"]
    params = (root / "gpu/params.bin").read_bytes()
    chunk = json.loads((root / "gpu/manifest.json").read_text())["chunked_files"]["chunk_bytes"]
    pieces = [hashlib.sha256(params[start : start + chunk]).hexdigest() for start in range(0, len(params), chunk)]
    code = hashlib.sha256((root / "gpu/kernels.wgsl").read_bytes()).hexdigest()
    assert len(pieces) == 3

    def load():
        requests.clear()
        report = page.evaluate(GPU_LOAD, {"feeds": feeds})
        assert report["backend"] == "webgpu"
        np.testing.assert_allclose(np.array(report["output"], np.float32), expected["output"].ravel(), RTOL, ATOL)
        fetched = sorted(path.removeprefix("/gpu/") for path in requests if path.startswith("/gpu/"))
        return fetched, [report["hashed"].count(piece) for piece in pieces], report["hashed"].count(code)

    page.evaluate("import('/runtime/tessel.js').then((tessel) => tessel.clearCache())")
    assert load() == (["kernels.wgsl", "manifest.json", "params.bin"], [1, 1, 1], 1), "the download"
    assert load() == (["manifest.json"], [1, 1, 1], 1), "the cache hit"
    page.evaluate(
        """async (digest) => {
             const cache = await caches.open("tessel-runtime");
             const key = `https://tessel-runtime.invalid/sha256/${digest}`;
             const bytes = new Uint8Array(await (await cache.match(key)).arrayBuffer());
             bytes[bytes.length >> 1] ^= 0x01;
             await cache.put(key, new Response(bytes));
           }""",
        json.loads((root / "gpu/manifest.json").read_text())["files"]["params.bin"],
    )
    # the damaged piece is the second: the cached read hashes the other two, then the download all three
    assert load() == (["manifest.json", "params.bin"], [2, 1, 2], 1), "the damaged entry"
    assert load() == (["manifest.json"], [1, 1, 1], 1), "the entry replaced"
    page.close()
    assert not errors, errors


STREAMED = """async ({feeds}) => {
  const tessel = await import("/runtime/tessel.js");
  const hashed = [];
  const digest = crypto.subtle.digest.bind(crypto.subtle);
  crypto.subtle.digest = (algorithm, data) => {
    hashed.push({at: performance.now(), bytes: data.byteLength});
    return digest(algorithm, data);
  };
  const progress = [];
  const onProgress = ({phase, loaded, total}) => phase === "params" && progress.push({at: performance.now(), loaded, total});
  const model = await tessel.load("/stalled/", {threads: 1, cache: "none", onProgress});
  const outputs = await model.run({input: Float32Array.from(feeds.input)});
  return {hashed, progress, output: Array.from(outputs.output.data)};
}"""


def test_params_stream_in_with_progress_and_are_hashed_as_they_arrive(site, served, context):
    """params.bin (2 MiB) stops for a second after 1.5 MiB: by then progress has reported the bytes that arrived and
    the first 1 MiB piece has been hashed; the rest comes after the pause, and the outputs are onnxruntime's."""
    url, _ = served
    page, errors = _page(context, url)
    feeds, expected = site[1]["stalled"]
    report = page.evaluate(STREAMED, {"feeds": feeds})
    page.close()
    progress, total = report["progress"], 2 << 20
    end = progress[-1]["at"]
    assert progress[-1]["loaded"] == total and all(event["total"] == total for event in progress), progress
    loaded = [event["loaded"] for event in progress]
    assert loaded == sorted(loaded) and len(set(loaded)) >= 3, loaded
    before_pause = [event for event in progress if end - event["at"] > 0.5 * STALL_S * 1000]
    assert before_pause and max(event["loaded"] for event in before_pause) >= 1 << 20, progress
    pieces = [item for item in report["hashed"] if item["bytes"] == 1 << 20]
    assert len(pieces) == 2, report["hashed"]
    assert end - pieces[0]["at"] > 0.5 * STALL_S * 1000, (pieces, end)
    np.testing.assert_allclose(np.array(report["output"], np.float32), expected["output"].ravel(), RTOL, ATOL)
    assert not errors, errors


WORKER_RUNS = """async ({runs}) => {
  const tessel = await import("/runtime/tessel.js");
  const input = Float32Array.from({length: 64 * 128 * 128}, (_, i) => Math.sin(i));
  const report = {};
  for (const worker of [false, true]) {
    const phases = [];
    const model = await tessel.load("/conv/", {threads: 1, worker, onProgress: ({phase}) => phases.push(phase)});
    await model.run({input});
    let ticks = 0, last = performance.now(), maxGap = 0;
    const timer = setInterval(() => {
      const now = performance.now();
      maxGap = Math.max(maxGap, now - last);
      last = now;
      ticks++;
    }, 4);
    const start = performance.now();
    let outputs;
    for (let run = 0; run < runs; run++) outputs = await model.run({input});
    const elapsed = performance.now() - start;
    clearInterval(timer);
    maxGap = Math.max(maxGap, performance.now() - last);
    const out = outputs.output;
    // in the worker a run still pending when the model is disposed rejects; on the page a run is over before dispose
    const pending = model.run({input});
    model.dispose();
    const afterDispose = await pending.then(() => null, (error) => [error.name, error.code]);
    const disposedRun = await model.run({input}).then(() => null, (error) => [error.name, error.code]);
    report[worker ? "worker" : "main"] = {
      ticks, maxGap, elapsed, data: out.data, dims: out.dims, dtype: out.dtype, float32: out.data instanceof Float32Array,
      variant: model.variant, phases: [...new Set(phases)], afterDispose, disposedRun, inputKept: input.length === 64 * 128 * 128,
    };
  }
  const [a, b] = [report.main.data, report.worker.data];
  report.equal = a.length === b.length && a.every((value, i) => Object.is(value, b[i]));
  report.sample = Array.from(b.subarray(0, 16));
  delete report.main.data;
  delete report.worker.data;
  const error = (promise) => promise.then(() => null, (error) => [error.name, error.code, error.field]);
  report.missing = await error(tessel.load("/nothing/", {worker: true}));
  report.badWorker = await error(tessel.load("/conv/", {worker: "/no-such-tessel.js"}));
  // threads in the worker: its pool workers start from it, on the page's cross-origin isolation
  const digits = Float32Array.from({length: 64}, (_, i) => (i % 17) / 16);
  const threaded = [];
  for (const worker of [false, true]) {
    // the worker named by its script's URL, as an app bundled into one file does
    const model = await tessel.load("/threaded/", {threads: 2, relaxedSimd: false, worker: worker && "/runtime/tessel.js"});
    threaded.push({variant: model.variant, data: Array.from((await model.run({input: digits})).probabilities.data)});
    model.dispose();
  }
  report.threaded = threaded;
  const model = await tessel.load("/conv/", {threads: 1, worker: true});
  report.badInput = await error(model.run({input: new Float64Array(4)}));
  model.dispose();
  return report;
}"""


def test_worker_mode_gives_the_same_outputs_and_keeps_the_page_responsive(site, served, context):
    url, _ = served
    page, errors = _page(context, url)
    report = page.evaluate(WORKER_RUNS, {"runs": 4})
    page.close()
    main, worker = report["main"], report["worker"]
    print(f"\nmain thread: {main}\nworker: {worker}")
    assert report["equal"], "worker mode's outputs differ from the page's"
    for mode in (main, worker):
        assert mode["dims"] == [1, 64, 128, 128] and mode["dtype"] == "float32" and mode["float32"], mode
        assert mode["variant"]["threads"] == 1 and mode["inputKept"], mode
        assert mode["phases"] == ["manifest", "code", "params", "ready"], mode
        assert mode["disposedRun"] == ["TesselError", "disposed"], mode
    assert worker["afterDispose"] == ["TesselError", "disposed"], worker
    # on the page the runs starve the timer (only microtasks run between them); in the worker it keeps firing. Counted
    # in ticks, not timed: the gaps' lengths depend on the machine's load (a worker's longest gap was 7.5 ms alone and
    # 71 ms beside the rest of the suite)
    assert main["ticks"] == 0 and main["elapsed"] >= 40, main
    assert worker["ticks"] >= 4, worker
    assert report["missing"] == ["TesselError", "file", "manifest.json"], report["missing"]
    assert report["badWorker"] == ["TesselError", "backend", "worker"], report["badWorker"]
    on_page, in_worker = report["threaded"]
    assert (
        on_page["variant"]
        == in_worker["variant"]
        == {"code": "model.threads.wasm", "features": ["threads"], "threads": 2}
    )
    assert on_page["data"] == in_worker["data"], report["threaded"]
    assert report["badInput"] == ["TesselError", "input", "input"], report["badInput"]
    expected = _run_onnxruntime(
        _conv_model(),
        {"input": np.sin(np.arange(64 * 128 * 128, dtype=np.float64)).astype(np.float32).reshape(1, 64, 128, 128)},
    )
    np.testing.assert_allclose(
        np.array(report["sample"], np.float32), expected["output"].ravel()[:16], rtol=1e-3, atol=1e-4
    )
    assert not errors, errors


NOT_ISOLATED = """async () => {
  const tessel = await import("/runtime/tessel.js");
  const model = await tessel.load("/threaded/", {worker: true});
  const variant = model.variant;
  model.dispose();
  return {variant, isolated: crossOriginIsolated};
}"""


def test_worker_mode_on_a_page_without_coop_coep_says_in_one_line_what_is_missing(served, context):
    url, _ = served
    page = context.new_page()

    def without_isolation(route):
        response = route.fetch()
        headers = {key: value for key, value in response.headers.items() if not key.startswith("cross-origin-")}
        route.fulfill(response=response, headers=headers)

    page.route(f"{url}/index.html", without_isolation)
    warnings: list[str] = []
    page.on("console", lambda message: warnings.append(message.text) if message.type == "warning" else None)
    page.goto(f"{url}/index.html")
    report = page.evaluate(NOT_ISOLATED)
    page.close()
    assert not report["isolated"] and report["variant"]["threads"] == 1, report
    threads = [text for text in warnings if "running on 1 thread" in text]
    assert len(threads) == 1, warnings
    assert "Cross-Origin-Opener-Policy: same-origin" in threads[0], threads
    assert "Cross-Origin-Embedder-Policy: require-corp" in threads[0], threads
