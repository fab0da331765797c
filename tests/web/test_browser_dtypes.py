"""tessel.js's dtypes in headless Chromium, which has Float16Array: a float16 wasm bundle takes Float16Array, its bits
(Uint16Array) and Float32Array inputs and gives Float16Array outputs, also in worker mode; and WebGPU bundles (Chromium's
SwiftShader adapter, which has no shader-f16, so no float16 there) read and write int8, uint8, int16, int32, int64 and
bool. The models and the inputs are test_node_dtypes.py's; onnxruntime is the oracle, compared byte for byte."""

from __future__ import annotations

import base64
import functools
import http.server
import threading
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from test_browser import CHROMIUM_ARGS, launch_chromium
from test_node_dtypes import dtype_feeds, dtype_model

from compiler import compile_model

RUNTIME = Path(__file__).resolve().parents[2] / "web_runtime"
WEBGPU_DTYPES = ("int8", "uint8", "int16", "int32", "int64", "bool")

RUN = """async ({bundle, backend, dtype, inputs, worker}) => {
  const tessel = await import("/runtime/tessel.js");
  const bytes = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0)).buffer;
  const text = (array) => btoa(String.fromCharCode(...new Uint8Array(array.buffer, array.byteOffset, array.byteLength)));
  const ARRAYS = {float16: Float16Array, float32: Float32Array, int8: Int8Array, uint8: Uint8Array, int16: Int16Array,
                  int32: Int32Array, int64: BigInt64Array, bool: Uint8Array};
  const model = await tessel.load(bundle, {backend, worker, threads: 1, cache: "none"});
  const f = new Float32Array(bytes(inputs.f));
  const x = new ARRAYS[dtype](bytes(inputs.x));
  const given = {[x.constructor.name]: x};
  if (dtype === "float16") {
    given.Uint16Array = new Uint16Array(x.buffer);
    given.Float32Array = Float32Array.from(x);
  }
  const report = {backend: model.backend, runs: {}};
  for (const [kind, input] of Object.entries(given)) {
    const outputs = await model.run({x: input, f});
    report.runs[kind] = Object.fromEntries(Object.entries(outputs).map(
      ([name, tensor]) => [name, {type: tensor.data.constructor.name, dtype: tensor.dtype, data: text(tensor.data)}]));
  }
  model.dispose();
  return report;
}"""


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".wasm": "application/wasm"}

    def end_headers(self):
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def log_message(self, *arguments):
        return None


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("dtype-site")
    (root / "runtime").symlink_to(RUNTIME)
    (root / "index.html").write_text('<!doctype html><meta charset="utf-8"><title>dtypes</title>')
    rng = np.random.default_rng(11)
    cases = {}
    for dtype, target in [("float16", "wasm"), *[(dtype, "webgpu") for dtype in WEBGPU_DTYPES]]:
        model = dtype_model(dtype)
        compile_model(model, target).export(root / f"{dtype}-{target}")
        feeds = dtype_feeds(dtype, rng, int64_as_int32=target == "webgpu")
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        expected = dict(zip([output.name for output in session.get_outputs()], session.run(None, feeds)))
        cases[dtype] = (target, feeds, expected)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=root))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", cases
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def page(site, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = launch_chromium(
            playwright, tmp_path_factory.mktemp("dtype-profile"), [*CHROMIUM_ARGS, "--enable-unsafe-webgpu"]
        )
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{site[0]}/index.html")
        yield page
        context.close()
        assert not errors, errors


def _run(page, dtype: str, cases: dict, worker: bool = False) -> tuple[dict, dict]:
    target, feeds, expected = cases[dtype]
    inputs = {name: base64.b64encode(np.ascontiguousarray(array).tobytes()).decode() for name, array in feeds.items()}
    arguments = {"bundle": f"/{dtype}-{target}/", "backend": target, "dtype": dtype, "inputs": inputs, "worker": worker}
    return page.evaluate(RUN, arguments), expected


def _same(report: dict, expected: dict, dtype: str, array_type: str) -> None:
    for kind, outputs in report["runs"].items():
        for name, values in expected.items():
            got = outputs[name]
            assert got["dtype"] == str(values.dtype), (kind, name, got["dtype"])
            assert got["type"] == ("Float32Array" if name == "as_float" else array_type), (kind, name, got["type"])
            assert base64.b64decode(got["data"]) == np.ascontiguousarray(values).tobytes(), (dtype, kind, name)


@pytest.mark.parametrize("worker", [False, True], ids=["page", "worker"])
def test_float16_in_chromium_is_float16array_in_and_out(page, site, worker):
    report, expected = _run(page, "float16", site[1], worker)
    assert report["backend"] == "wasm"
    assert set(report["runs"]) == {"Float16Array", "Uint16Array", "Float32Array"}, report["runs"].keys()
    _same(report, expected, "float16", "Float16Array")


@pytest.mark.parametrize("dtype", WEBGPU_DTYPES)
def test_webgpu_reads_and_writes_small_and_wide_integers_and_bool(page, site, dtype):
    report, expected = _run(page, dtype, site[1])
    assert report["backend"] == "webgpu"
    array = {"int8": "Int8Array", "uint8": "Uint8Array", "int16": "Int16Array", "int32": "Int32Array"}
    _same(report, expected, dtype, array.get(dtype, {"int64": "BigInt64Array", "bool": "Uint8Array"}.get(dtype)))
