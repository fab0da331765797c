"""The npm package tessel-runtime (web_runtime/), tried as a user would: `npm pack` it, install the tarball into a
scratch app, type-check the app against the package's declarations with tsc, bundle it with esbuild, and run the
bundled app in headless Chromium on a page that serves the model's files beside it (cross-origin isolated, so the
threaded variant runs), on wasm and on WebGPU (SwiftShader), against onnxruntime. esbuild and typescript come from
tests/web/package-lock.json (npm ci, once, as benchmarks/ installs onnxruntime-web). Also: the three places the
runtime version lives agree, and bundles record it."""

from __future__ import annotations

import functools
import http.server
import json
import re
import shutil
import subprocess
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest
from test_browser import ATOL, CHROMIUM_ARGS, RTOL, _run_onnxruntime, launch_chromium

from compiler import compile_model, zoo
from compiler.build import EVERY_WASM_VARIANT
from compiler.bundle import RUNTIME_VERSION

HERE = Path(__file__).resolve().parent
RUNTIME = HERE.parents[1] / "web_runtime"
PACKAGE_FILES = {"package.json", "README.md", "tessel.js", "tessel-webgpu.js", "index.d.ts"}

# The scratch app: what a user of the package writes. Typed against the package's index.d.ts (strict), bundled with
# esbuild for the browser; window.tesselApp is what the test drives.
APP_SOURCE = """
import {
  load, registerBackend, hasWasmSimd, clearCache, TesselError, VERSION, float32ToFloat16Bits, float16BitsToFloat32,
  type LoadOptions, type LoadProgress, type Model, type Tensor, type TesselErrorCode, type TensorInput, type TypedArrayOf,
} from "tessel-runtime";

// float16: inputs as bits or float32 values, results as Float16Array or bits (lib es2022 has no Float16Array)
const halfBits: TypedArrayOf["float16"] = float32ToFloat16Bits(Float32Array.of(0.1, 65520));
const halfInputs: TensorInput[] = [halfBits, { data: Float32Array.of(0.1, 2), dims: [2] }, new Uint8ClampedArray(4)];
const halfValues: Float32Array = float16BitsToFloat32(halfBits as Uint16Array);

async function run(bundle: string, backend: "wasm" | "webgpu", input: number[], threads?: number, worker?: string) {
  const phases: LoadProgress["phase"][] = [];
  const options: LoadOptions = { backend, cache: "reload", onProgress: (progress) => void phases.push(progress.phase) };
  if (threads !== undefined) options.threads = threads;
  // one file bundles tessel.js into the app, so worker mode is given the package's tessel.js served on its own
  if (worker !== undefined) options.worker = worker;
  const model: Model = await load(bundle, options);
  const outputs: Record<string, Tensor> = await model.run({ input: { data: Float32Array.from(input), dims: [1, 1, 8, 8] } });
  const first: Tensor = outputs[model.outputNames[0]];
  const result = {
    version: VERSION,
    simd: hasWasmSimd(),
    isolated: globalThis.crossOriginIsolated === true,
    backend: model.backend,
    reason: model.backendReason,
    variant: model.variant,
    phases: [...new Set(phases)],
    dims: first.dims,
    data: Array.from(first.data as Float32Array),
  };
  model.dispose();
  return result;
}

async function failure(bundle: string): Promise<{ code: TesselErrorCode; field: string | null; message: string } | null> {
  try {
    await load(bundle, { backend: "wasm" });
    return null;
  } catch (error) {
    if (!(error instanceof TesselError)) throw error;
    return { code: error.code, field: error.field, message: error.message };
  }
}

// registerBackend takes a partial backend; its fields are typed
registerBackend({ name: "wasm", probe: async () => (hasWasmSimd() ? null : "no SIMD") });

const cleared: Promise<void> = clearCache();
(globalThis as unknown as { tesselApp: object }).tesselApp = { run, failure, cleared, halfInputs, halfValues };
"""

# Misuses the declarations must refuse: if tsc accepted these, the types would be `any` and the check worthless.
WRONG_SOURCE = """
import { load, TesselError, float16BitsToFloat32, type TensorInput } from "tessel-runtime";
const model = await load(42);
await model.run("not feeds");
const code: "nonsense" = new TesselError("manifest", null, "x").code;
model.backend = "webgpu";
await load("/m/", { cache: "sometimes" });
float16BitsToFloat32(new Float32Array(2));
const feed: TensorInput = [1, 2];
"""
WRONG_LINES = 7

TSCONFIG = {
    "compilerOptions": {
        "target": "es2022",
        "module": "esnext",
        "moduleResolution": "bundler",
        "lib": ["es2022", "dom"],
        "strict": True,
        "noEmit": True,
        "skipLibCheck": False,
        "types": [],
    },
}


def test_the_runtime_version_is_the_same_in_all_three_places(tmp_path):
    """package.json is the source of truth: tessel.js's VERSION and compiler/bundle.py's RUNTIME_VERSION must equal
    it, and a compiled bundle records it."""
    version = json.loads((RUNTIME / "package.json").read_text())["version"]
    (in_js,) = re.findall(r'^export const VERSION = "([^"]+)";$', (RUNTIME / "tessel.js").read_text(), re.M)
    assert version == in_js == RUNTIME_VERSION, (version, in_js, RUNTIME_VERSION)
    bundle = compile_model(zoo.build_model("digits"), "wasm").export(tmp_path / "digits")
    assert json.loads((bundle / "manifest.json").read_text())["runtime_version"] == version


def _npm(*arguments: str, cwd: Path) -> str:
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm (Node.js 20) is not installed; run `make test`, which installs it")
    completed = subprocess.run(
        [npm, *arguments, "--no-audit", "--no-fund"], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, f"npm {' '.join(arguments)} failed:\n{completed.stdout}\n{completed.stderr}"
    return completed.stdout


@functools.cache
def _tools() -> Path:
    """tests/web/node_modules/.bin, installed from the lockfile (npm ci) when a tool is missing."""
    bin_dir = HERE / "node_modules" / ".bin"
    if not ((bin_dir / "esbuild").exists() and (bin_dir / "tsc").exists()):
        _npm("ci", cwd=HERE)
    return bin_dir


def _tool(name: str, *arguments: str, cwd: Path, expect_failure: bool = False) -> str:
    completed = subprocess.run([str(_tools() / name), *arguments], cwd=cwd, capture_output=True, text=True, timeout=300)
    report = completed.stdout + completed.stderr
    assert (completed.returncode != 0) == expect_failure, f"{name} {' '.join(arguments)}:\n{report}"
    return report


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """The packed, installed, type-checked and bundled scratch app, with the digits model's wasm bundle (every
    variant, as `tessel compile --target wasm` writes it) and webgpu bundle, and onnxruntime's outputs."""
    root = tmp_path_factory.mktemp("package")
    packed = json.loads(_npm("pack", str(RUNTIME), "--pack-destination", str(root), "--json", cwd=root))[0]
    tarball = root / packed["filename"]
    with tarfile.open(tarball) as archive:
        assert {name.removeprefix("package/") for name in archive.getnames()} == PACKAGE_FILES
    site = root / "app"
    site.mkdir()
    (site / "package.json").write_text(json.dumps({"name": "scratch-app", "private": True, "type": "module"}))
    _npm("install", str(tarball), cwd=site)
    (site / "tsconfig.json").write_text(json.dumps({**TSCONFIG, "files": ["main.ts"]}))
    (site / "main.ts").write_text(APP_SOURCE)
    _tool("tsc", "-p", "tsconfig.json", cwd=site)
    (site / "wrong.ts").write_text(WRONG_SOURCE)
    (site / "tsconfig.wrong.json").write_text(json.dumps({**TSCONFIG, "files": ["wrong.ts"]}))
    errors = _tool("tsc", "-p", "tsconfig.wrong.json", cwd=site, expect_failure=True)
    assert len(re.findall(r"wrong\.ts\(\d+,\d+\): error TS", errors)) >= WRONG_LINES, errors
    report = _tool(
        "esbuild", "main.ts", "--bundle", "--format=esm", "--platform=browser", "--outfile=dist/app.js", cwd=site
    )
    assert "warning" not in report.lower(), report
    (site / "vendor").mkdir()
    shutil.copy(site / "node_modules" / "tessel-runtime" / "tessel.js", site / "vendor" / "tessel.js")
    (site / "index.html").write_text(
        '<!doctype html><meta charset="utf-8"><script type="module" src="dist/app.js"></script>'
    )
    model = zoo.build_model("digits")
    compile_model(model, "wasm", wasm_variants=EVERY_WASM_VARIANT).export(site / "model")
    compile_model(model, "webgpu").export(site / "model-gpu")
    (site / "broken").mkdir()
    feeds = zoo.sample_input("digits", seed=3)
    expected = _run_onnxruntime(model, feeds)["probabilities"]
    return site, feeds["input"], expected, (site / "dist" / "app.js").stat().st_size


class _IsolatedHandler(http.server.SimpleHTTPRequestHandler):
    """Static files with the two headers that make a page cross-origin isolated (threads)."""

    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".wasm": "application/wasm"}

    def end_headers(self):
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def log_message(self, *arguments):
        return None


@pytest.fixture(scope="module")
def served(app):
    site = app[0]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_IsolatedHandler, directory=site))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_packed_package_bundled_by_esbuild_runs_in_chromium_on_wasm_and_webgpu(app, served, tmp_path):
    from playwright.sync_api import sync_playwright

    site, input_array, expected, bundle_bytes = app
    values = input_array.ravel().tolist()
    with sync_playwright() as playwright:
        context = launch_chromium(playwright, tmp_path / "profile", [*CHROMIUM_ARGS, "--enable-unsafe-webgpu"])
        try:
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(f"{served}/index.html")
            page.wait_for_function("window.tesselApp !== undefined")
            wasm = page.evaluate("([input]) => tesselApp.run('/model/', 'wasm', input, 2)", [values])
            in_worker = page.evaluate(
                "([input]) => tesselApp.run('/model/', 'wasm', input, 2, '/vendor/tessel.js')", [values]
            )
            webgpu = page.evaluate("([input]) => tesselApp.run('/model-gpu/', 'webgpu', input)", [values])
            missing = page.evaluate("tesselApp.failure('/broken/')")
        finally:
            context.close()
    assert not errors, errors
    assert wasm["version"] == json.loads((RUNTIME / "package.json").read_text())["version"]
    assert wasm["isolated"] and wasm["simd"]
    assert wasm["backend"] == "wasm" and wasm["variant"]["threads"] == 2, wasm
    assert "threads" in wasm["variant"]["features"], wasm["variant"]
    assert wasm["phases"] == ["manifest", "code", "params", "ready"], wasm["phases"]
    assert {key: in_worker[key] for key in ("variant", "phases", "data")} == {
        key: wasm[key] for key in ("variant", "phases", "data")
    }, in_worker
    assert webgpu["backend"] == "webgpu" and "adapter" in webgpu["reason"], webgpu
    for result in (wasm, webgpu):
        assert result["dims"] == list(expected.shape)
        np.testing.assert_allclose(np.array(result["data"], np.float32).reshape(expected.shape), expected, RTOL, ATOL)
    assert missing["code"] == "file" and missing["field"] == "manifest.json", missing
    print(f"\nthe esbuild bundle of the scratch app: {bundle_bytes} bytes")
