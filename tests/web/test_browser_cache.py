"""tessel.js's cache of bundle files, in headless Chromium on a small static server that counts
the requests it answers (each response is Cache-Control: no-store, so only tessel.js's own cache can spare one) and
sends COOP/COEP, so the page and its workers are cross-origin isolated."""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from test_browser import ATOL, CHROMIUM_ARGS, RTOL, _run_onnxruntime

from compiler import compile_model, zoo

RUNTIME = Path(__file__).resolve().parents[2] / "web_runtime"

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
        super().do_GET()

    def end_headers(self):
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, *arguments):
        return None


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """digits and mlp as wasm bundles (mlp's files are later put where digits' were), and the page."""
    root = tmp_path_factory.mktemp("cache-site")
    (root / "runtime").symlink_to(RUNTIME)
    (root / "index.html").write_text('<!doctype html><meta charset="utf-8"><title>cache</title>')
    cases = {}
    for name in ("digits", "mlp"):
        model = zoo.build_model(name)
        compile_model(model, "wasm").export(root / "bundles" / name)
        feeds = zoo.sample_input(name, seed=2)
        cases[name] = ({key: value.ravel().tolist() for key, value in feeds.items()}, _run_onnxruntime(model, feeds))
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
def context(tmp_path_factory):
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("Debian's chromium is not installed; run `make test`, which installs it (apt package chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("cache-profile")), executable_path=executable, headless=True, args=CHROMIUM_ARGS
        )
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
