"""The pages in a real browser: Debian's chromium, headless, driven by Playwright, against the real app
(server.app.create_app under uvicorn on a free port). A model uploaded through the page is compiled, run in
the tab on WASM and compared with onnxruntime; the digits demo classifies held-out digits drawn with the
mouse. Screenshots go to each test's pytest tmp dir, under screenshots/."""

from __future__ import annotations

import json
import shutil
import socket
import struct
import threading
import time
import urllib.request
import zlib
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from compiler import compile_model, zoo
from compiler.build import EVERY_WASM_VARIANT
from compiler.data.train_digits import held_out_split

CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
RTOL, ATOL = 1e-4, 1e-5
DIGITS_TO_DRAW = 3


def launch_chromium(playwright, profile, args=CHROMIUM_ARGS, **options):
    """Debian's chromium, headless, with a profile of its own in the folder `profile`; the test fails (it does not
    skip) when chromium is missing."""
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("Debian's chromium is not installed; run `make test`, which installs it (apt package chromium)")
    return playwright.chromium.launch_persistent_context(
        str(profile), executable_path=executable, headless=True, args=list(args), **options
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def store_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("store")


@pytest.fixture(scope="module")
def server(store_root):
    """The real app on 127.0.0.1, with the digits demo prebuilt, stopped when the module's tests end."""
    from server.app import create_app

    app = create_app(store_root, max_workers=2, prebuild=("digits",))
    yield from serve_app(app)


def serve_app(app):
    """Run `app` under uvicorn on a free port of 127.0.0.1, in a thread: yields its URL, stops it afterwards."""
    import uvicorn

    port = _free_port()
    instance = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not instance.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            pytest.fail("the Tessel app did not start under uvicorn within 30 s")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    instance.should_exit = True
    thread.join(30)


@pytest.fixture
def screenshots(tmp_path) -> Path:
    """Where a test saves its screenshots: tmp_path/screenshots."""
    folder = tmp_path / "screenshots"
    folder.mkdir()
    return folder


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _run_onnxruntime(model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return {output.name: result for output, result in zip(session.get_outputs(), session.run(None, feeds))}


@pytest.mark.slow
def test_upload_compile_and_run_in_the_page(server, page, screenshots, tmp_path):
    model_path = zoo.save_model("mlp", tmp_path / "mlp.onnx")
    # two cores whatever the machine has, so the page's default is a pool of two threads
    page.add_init_script("Object.defineProperty(Navigator.prototype, 'hardwareConcurrency', {get: () => 2})")
    page.goto(f"{server}/?seed=7&backend=wasm")
    page.wait_for_selector("#targets input[value=wasm]:checked")
    assert page.evaluate("crossOriginIsolated"), "the page is not cross-origin isolated (COOP/COEP headers)"
    page.set_input_files("#file-input", str(model_path))
    page.click("#compile-button")
    card = page.wait_for_selector(".result[data-target=wasm]", timeout=90_000)
    page.screenshot(path=str(screenshots / "compiled.png"), full_page=True)

    bundle_id = page.evaluate("document.querySelector('.result [data-field=zip]').getAttribute('href')")
    bundle_id = bundle_id.removeprefix("/bundles/").removesuffix(".zip")
    manifest = _get_json(f"{server}/bundles/{bundle_id}/manifest.json")
    assert card.query_selector("[data-field=groups]").inner_text() == str(len(manifest["calls"]))
    listed = [row.inner_text().split("\t")[0] for row in card.query_selector_all("[data-field=files] tr")]
    # the server compiles every wasm variant (server/jobs.py TARGET_OPTIONS); the isolated page runs a threaded one
    variants = ["model.relaxed-simd.wasm", "model.threads.relaxed-simd.wasm", "model.threads.wasm"]
    assert listed == ["manifest.json", *variants, "model.wasm", "params.bin"]
    assert "Compiling" in page.inner_text("#progress-card") and "done" in page.inner_text("#log")

    card.query_selector("[data-field=run]").click()
    page.wait_for_selector(".result [data-field=panel][data-state=done]", timeout=30_000)
    page.screenshot(path=str(screenshots / "ran.png"), full_page=True)
    run = page.evaluate("window.tesselLastRun")
    assert run["backend"] == "wasm" and card.query_selector("[data-field=backend]").inner_text() == "wasm"
    assert run["variant"] == {
        "code": "model.threads.relaxed-simd.wasm",
        "features": ["threads", "relaxed-simd"],
        "threads": 2,
    }
    assert run["latencyMs"] >= 0 and "ms" in card.query_selector("[data-field=latency]").inner_text()
    feeds = {name: np.array(item["data"], np.float32).reshape(item["dims"]) for name, item in run["inputs"].items()}
    expected = _run_onnxruntime(zoo.build_model("mlp"), feeds)
    for name, result in expected.items():
        shown = np.array(run["outputs"][name]["data"], np.float32).reshape(run["outputs"][name]["dims"])
        np.testing.assert_allclose(shown, result, rtol=RTOL, atol=ATOL)
    top = card.query_selector("[data-field=outputs] .bar-row .figure").inner_text()
    assert float(top) == pytest.approx(float(expected["output"].max()), rel=1e-3)


@pytest.mark.slow
def test_a_model_with_its_data_file_chosen_together_compiles_and_runs(server, page, tmp_path):
    """torch.onnx.export's default: model.onnx and model.onnx.data, chosen (or dropped) together; the page sends both
    and the bundle runs right. Two .onnx files are refused in the page, saying what to drop."""
    import onnx

    path = tmp_path / "mlp.onnx"
    onnx.save(zoo.build_model("mlp"), path, save_as_external_data=True, location="mlp.onnx.data", size_threshold=1024)
    page.goto(f"{server}/?seed=3&backend=wasm")
    page.wait_for_selector("#targets input[value=wasm]:checked")
    page.set_input_files("#file-input", [str(path), str(tmp_path / "mlp.onnx.data")])
    assert page.inner_text("#drop-title") == "mlp.onnx + 1 data file"
    assert page.is_disabled("#tune-button") and not page.is_disabled("#compile-button")
    page.click("#compile-button")
    card = page.wait_for_selector(".result[data-target=wasm]", timeout=90_000)
    card.query_selector("[data-field=run]").click()
    page.wait_for_selector(".result [data-field=panel][data-state=done]", timeout=30_000)
    run = page.evaluate("window.tesselLastRun")
    feeds = {name: np.array(item["data"], np.float32).reshape(item["dims"]) for name, item in run["inputs"].items()}
    expected = _run_onnxruntime(zoo.build_model("mlp"), feeds)["output"]
    np.testing.assert_allclose(np.array(run["outputs"]["output"]["data"], np.float32), expected.ravel(), RTOL, ATOL)
    other = tmp_path / "other.onnx"
    other.write_bytes(path.read_bytes())
    page.set_input_files("#file-input", [str(path), str(other)])
    assert "drop one .onnx model with its data files" in page.inner_text("#upload-error")
    assert page.is_disabled("#compile-button")


def test_random_inputs_of_every_integer_and_half_dtype_run_in_the_page(server, page, tmp_path):
    """A model of int8, uint8, int16 and float16 inputs and a float16 output: the page makes random inputs of each
    (a float16 one as float32, which tessel.js rounds) and shows the float16 output as numbers, whether the browser
    has Float16Array or gives the bits."""
    import onnx
    from onnx import TensorProto, helper

    inputs = [("a", TensorProto.INT8), ("b", TensorProto.UINT8), ("c", TensorProto.INT16), ("h", TensorProto.FLOAT16)]
    nodes = [helper.make_node("Cast", [name], [f"{name}16"], to=TensorProto.FLOAT16) for name, _ in inputs[:3]]
    nodes += [
        helper.make_node("Add", ["a16", "b16"], ["ab"]),
        helper.make_node("Add", ["ab", "c16"], ["abc"]),
        helper.make_node("Mul", ["abc", "h"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "dtypes",
        [helper.make_tensor_value_info(name, dtype, [2, 3]) for name, dtype in inputs],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT16, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "dtypes.onnx"
    onnx.save(model, path)
    page.goto(f"{server}/?seed=5&backend=wasm")
    page.wait_for_selector("#targets input[value=wasm]:checked")
    page.set_input_files("#file-input", str(path))
    page.click("#compile-button")
    card = page.wait_for_selector(".result[data-target=wasm]", timeout=90_000)
    card.query_selector("[data-field=run]").click()
    page.wait_for_selector(".result [data-field=panel][data-state=done]", timeout=30_000)
    run = page.evaluate("window.tesselLastRun")
    dtypes = {"a": np.int8, "b": np.uint8, "c": np.int16, "h": np.float16}
    feeds = {
        name: np.array(item["data"]).astype(dtypes[name]).reshape(item["dims"]) for name, item in run["inputs"].items()
    }
    expected = _run_onnxruntime(model, feeds)["out"].astype(np.float32)
    np.testing.assert_allclose(np.array(run["outputs"]["out"]["data"], np.float32), expected.ravel(), rtol=1e-3)


def _grey_png(pixels: np.ndarray) -> bytes:
    """An 8-bit greyscale PNG of `pixels` (uint8 [height, width]), written out by hand: no imaging library."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    height, width = pixels.shape
    rows = b"".join(b"\x00" + row.tobytes() for row in pixels)
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


@pytest.mark.slow
def test_an_image_model_runs_on_a_chosen_image(server, page, screenshots):
    """digits takes 1x1x8x8, so the page offers an image; the same upload as the prebuilt demo is reused."""
    images, labels = held_out_split()
    page.goto(f"{server}/?backend=wasm")
    page.wait_for_selector("#targets input[value=wasm]:checked")
    page.set_input_files("#file-input", str(zoo.DIGITS_PATH))
    page.click("#compile-button")
    card = page.wait_for_selector(".result[data-target=wasm]", timeout=90_000)
    assert card.query_selector("[data-field=seconds]").inner_text() == "cached"
    card.query_selector("[data-field=run]").click()
    page.wait_for_selector(".result [data-field=panel][data-state=done]", timeout=30_000)
    assert card.query_selector("[data-field=image-picker]").is_visible()
    assert card.query_selector("[data-field=demo]").is_visible()

    pixels = np.round(images[0, 0] * 255).astype(np.uint8)
    picture = {"name": "digit.png", "mimeType": "image/png", "buffer": _grey_png(pixels)}
    card.query_selector("[data-field=image]").set_input_files(picture)
    page.wait_for_function(
        "window.tesselLastRun && window.tesselLastRun.inputs.input && "
        "document.querySelector('[data-field=input-description]').textContent === 'digit.png'"
    )
    page.wait_for_selector(".result [data-field=panel][data-state=done]")
    page.screenshot(path=str(screenshots / "image.png"), full_page=True)
    run = page.evaluate("window.tesselLastRun")
    seen = np.array(run["inputs"]["input"]["data"], np.float32).reshape(1, 1, 8, 8)
    np.testing.assert_allclose(seen[0, 0], pixels / 255, atol=1.5 / 255)
    expected = _run_onnxruntime(zoo.build_model("digits"), {"input": seen})["probabilities"]
    shown = np.array(run["outputs"]["probabilities"]["data"], np.float32).reshape(expected.shape)
    np.testing.assert_allclose(shown, expected, rtol=RTOL, atol=ATOL)
    assert int(shown.argmax()) == int(labels[0])


def _digits_to_draw() -> list[tuple[np.ndarray, int]]:
    """Held-out digits of different classes that onnxruntime classifies right, with a clear margin, when
    drawn as strokes of partial coverage (the binarised image at 0.6 and at 1.0 intensity)."""
    images, labels = held_out_split()
    session = onnxruntime.InferenceSession(str(zoo.DIGITS_PATH), providers=["CPUExecutionProvider"])
    chosen: dict[int, np.ndarray] = {}
    for image, label in zip(images, labels):
        label = int(label)
        if label in chosen:
            continue
        cells = (image[0] > 0.5).astype(np.float32)
        sure = all(session.run(None, {"input": (cells * level)[None, None]})[0][0, label] > 0.9 for level in (0.6, 1.0))
        if sure:
            chosen[label] = cells
        if len(chosen) == DIGITS_TO_DRAW:
            break
    return [(cells, label) for label, cells in chosen.items()]


def _draw(page, cells: np.ndarray) -> None:
    """Draw each row's runs of inked cells as one horizontal mouse stroke through the cells' centres."""
    box = page.query_selector("#pad").bounding_box()
    cell = box["width"] / 8

    def centre(row: int, column: float) -> tuple[float, float]:
        return box["x"] + (column + 0.5) * cell, box["y"] + (row + 0.5) * cell

    for row in range(8):
        column = 0
        while column < 8:
            if not cells[row, column]:
                column += 1
                continue
            end = column
            while end + 1 < 8 and cells[row, end + 1]:
                end += 1
            page.mouse.move(*centre(row, column - 0.15))
            page.mouse.down()
            page.mouse.move(*centre(row, end + 0.15), steps=max(2, 3 * (end - column)))
            page.mouse.up()
            column = end + 1


@pytest.mark.slow
def test_digits_demo_classifies_drawn_digits(server, page, screenshots):
    failed = []
    page.on("response", lambda response: failed.append(response.url) if response.status >= 400 else None)
    page.goto(f"{server}/demo/digits?backend=wasm")
    page.wait_for_selector("body[data-ready=true]", timeout=90_000)
    assert page.inner_text("#backend") == "wasm"
    # nothing drawn yet: every probability bar is empty, and no request of the page failed (the favicon was a 404)
    widths = page.eval_on_selector_all("#bars .fill", "fills => fills.map(fill => fill.getBoundingClientRect().width)")
    assert len(widths) == 10 and widths == [0] * 10, widths
    assert not failed, failed
    session = onnxruntime.InferenceSession(str(zoo.DIGITS_PATH), providers=["CPUExecutionProvider"])
    digits = _digits_to_draw()
    assert len(digits) == DIGITS_TO_DRAW
    for cells, label in digits:
        page.click("#clear")
        runs = page.evaluate("window.tesselDemo.runs")
        _draw(page, cells)
        page.wait_for_function(f"window.tesselDemo.runs > {runs}")
        page.evaluate("new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")
        page.screenshot(path=str(screenshots / f"digit-{label}.png"), full_page=True)
        shown = page.evaluate("window.tesselDemo")
        drawn = np.array(shown["input"], np.float32).reshape(1, 1, 8, 8)
        assert ((drawn[0, 0] > 0.25) == cells.astype(bool)).all(), f"the page saw another drawing of {label}:\n{drawn}"
        expected = session.run(None, {"input": drawn})[0][0]
        np.testing.assert_allclose(shown["probabilities"], expected, rtol=RTOL, atol=ATOL)
        assert shown["prediction"] == label, f"drew a {label}, the page says {shown['prediction']}"
        assert page.inner_text("#prediction") == str(label)


@pytest.mark.slow
def test_demo_explains_why_webgpu_cannot_run(server, page):
    """This chromium runs without --enable-unsafe-webgpu, so it gives no adapter; the prebuilt digits has both builds."""
    page.goto(f"{server}/demo/digits")
    page.wait_for_selector("body[data-ready=true]", timeout=90_000)
    assert page.inner_text("#backend") == "wasm"
    page.goto(f"{server}/demo/digits?backend=webgpu")
    page.wait_for_selector("#error:not(.hidden)", timeout=10_000)
    assert "cannot use the webgpu backend: WebGPU gave no adapter" in page.inner_text("#error")
    assert page.inner_text("#backend") == "unavailable"


@pytest.mark.slow
def test_a_file_that_is_not_onnx_gets_the_servers_message(server, page):
    page.goto(server)
    page.wait_for_selector("#targets input[value=wasm]:checked")
    page.set_input_files("#file-input", {"name": "notes.onnx", "mimeType": "text/plain", "buffer": b"not a model"})
    page.click("#compile-button")
    error = page.wait_for_selector("#upload-error:not(.hidden)", timeout=30_000)
    assert "is not an ONNX model" in error.inner_text()
    assert page.is_hidden("#progress-card")


def test_a_tuning_log_chosen_in_the_page_reaches_the_compile(server, page, tmp_path):
    from tests.server.test_tuning_upload import log_choosing
    from tests.tune.test_records import conv_model

    model_path, log_path = tmp_path / "conv.onnx", tmp_path / "conv.jsonl"
    model_path.write_bytes(conv_model().SerializeToString())
    chosen = {}
    last = lambda task: chosen.setdefault(task.key, list(task.space.valid_configs())[-1].to_json())  # noqa: E731
    log_path.write_text(log_choosing(last, "wasm"))
    page.goto(f"{server}/?backend=wasm")
    page.wait_for_selector("#targets input[value=wasm]:checked")
    page.set_input_files("#file-input", str(model_path))
    page.set_input_files("#records-input", str(log_path))
    page.click("#compile-button")
    page.wait_for_selector(".result[data-target=wasm]", timeout=90_000)
    bundle_id = page.evaluate("document.querySelector('.result [data-field=zip]').getAttribute('href')")
    manifest = _get_json(f"{server}/bundles/{bundle_id.removeprefix('/bundles/').removesuffix('.zip')}/manifest.json")
    assert [kernel["config"] for kernel in manifest["kernels"]] == list(chosen.values())


def test_tune_on_this_device_times_candidates_in_the_page_and_compiles_with_them(server, page, tmp_path):
    """The service proposes, the page times each candidate in Chromium's own wasm engine and posts its time and its
    outputs (checked by the service against the fallback's), and the bundle is compiled with the resulting log."""
    from compiler.tune.records import best_records
    from tests.tune.test_records import conv_model

    model_path = tmp_path / "conv.onnx"
    model_path.write_bytes(conv_model().SerializeToString())
    page.goto(f"{server}/?backend=wasm")
    page.wait_for_selector("#targets input[value=wasm]:checked")
    page.set_input_files("#file-input", str(model_path))
    page.fill("#tune-trials", "5")
    page.click("#tune-button")
    page.wait_for_selector(".result[data-target=wasm]", timeout=120_000)
    session = page.evaluate("window.tesselTuning.session")
    status = _get_json(f"{server}/api/tune/{session}")
    assert status["state"] == "done" and status["measured"] >= 5, status
    with urllib.request.urlopen(f"{server}/api/tune/{session}/records", timeout=10) as response:
        records = [json.loads(line) for line in response.read().decode().splitlines()]
    assert len(records) >= 5 and all(record["seconds"] > 0 and record["error"] is None for record in records)
    assert all(record["task"]["target"]["kind"] == "wasm" for record in records)
    bundle_id = page.evaluate("document.querySelector('.result [data-field=zip]').getAttribute('href')")
    manifest = _get_json(f"{server}/bundles/{bundle_id.removeprefix('/bundles/').removesuffix('.zip')}/manifest.json")
    best = [record["config"] for record in best_records(records).values()]
    assert [kernel["config"] for kernel in manifest["kernels"]] == best


# ---- threaded and relaxed-SIMD wasm in the page ----------------------------------------------------------------

THREAD_MODELS = ("mlp", "digits", "squeezenet")
# Loads a bundle once per option set, runs it twice on the same input and returns what ran and what came out.
RUN_VARIANTS = """async ({bundle, feeds, configs}) => {
  const tessel = await import("/runtime/tessel.js");
  const inputs = Object.fromEntries(Object.entries(feeds).map(([name, values]) => [name, Float32Array.from(values)]));
  const results = [];
  for (const options of configs) {
    const model = await tessel.load(bundle, options);
    await model.run(inputs);
    const outputs = await model.run(inputs);
    const joins = model.executor.instance.exports.tessel_pool_joins;
    results.push({
      variant: model.variant,
      joins: joins ? joins() : null,
      outputs: Object.fromEntries(Object.entries(outputs).map(([name, value]) => [name, Array.from(value.data)])),
    });
    model.dispose();
  }
  return {results, isolated: crossOriginIsolated, relaxed: tessel.hasWasmRelaxedSimd()};
}"""


@pytest.fixture(scope="module")
def variant_bundles(store_root):
    """mlp, digits and squeezenet (small inputs: Playwright passes them as JSON) compiled with every wasm variant, put straight into the app's store, with a
    seeded input and onnxruntime's outputs for it."""
    from server.store import Store

    store, bundles = Store(store_root), {}
    for name in THREAD_MODELS:
        model = zoo.build_model(name)
        module = compile_model(model, target="wasm", wasm_variants=EVERY_WASM_VARIANT)
        bundle_id = module.manifest["content_hash"]
        if not store.has_bundle(bundle_id):
            staging = store.new_staging_dir()
            module.export(staging / "bundle")
            store.install_bundle(staging / "bundle", bundle_id)
        feeds = zoo.sample_input(name, seed=4)
        bundles[name] = (f"/bundles/{bundle_id}/", feeds, _run_onnxruntime(model, feeds))
    return bundles


def _run_variants(page, bundle: str, feeds: dict, configs: list[dict]) -> dict:
    plain = {name: array.ravel().tolist() for name, array in feeds.items()}
    return page.evaluate(RUN_VARIANTS, {"bundle": bundle, "feeds": plain, "configs": configs})


@pytest.mark.slow
def test_threaded_wasm_in_a_cross_origin_isolated_page(server, page, variant_bundles):
    """Each model on 1 and 2 threads (plain SIMD): bit for bit the same and onnxruntime's; relaxed SIMD, which
    Chromium has, is picked by default and stays within tolerance."""
    page.goto(f"{server}/")
    configs = [{"threads": 1, "relaxedSimd": False}, {"threads": 2, "relaxedSimd": False}, {"threads": 2}]
    for name, (bundle, feeds, expected) in variant_bundles.items():
        report = _run_variants(page, bundle, feeds, configs)
        assert report["isolated"] and report["relaxed"], report
        single, threaded, relaxed = report["results"]
        assert single["variant"] == {"code": "model.wasm", "features": [], "threads": 1}
        assert threaded["variant"] == {"code": "model.threads.wasm", "features": ["threads"], "threads": 2}
        assert relaxed["variant"]["features"] == ["threads", "relaxed-simd"]
        if name == "squeezenet":
            assert threaded["joins"] > 0, "no worker joined a parallel loop"
        for output, result in expected.items():
            one = np.array(single["outputs"][output], np.float32)
            np.testing.assert_array_equal(np.array(threaded["outputs"][output], np.float32), one)
            np.testing.assert_allclose(one.reshape(result.shape), result, rtol=RTOL, atol=ATOL)
            np.testing.assert_allclose(np.array(relaxed["outputs"][output], np.float32), one, rtol=RTOL, atol=ATOL)


@pytest.mark.slow
def test_a_page_that_is_not_cross_origin_isolated_runs_one_thread_and_says_why(server, page, variant_bundles):
    """The same app page served without COOP/COEP (the headers stripped on the way): one thread, one warning."""

    def without_isolation(route):
        response = route.fetch()
        headers = {key: value for key, value in response.headers.items() if not key.startswith("cross-origin-")}
        route.fulfill(response=response, headers=headers)

    page.route(f"{server}/", without_isolation)
    warnings = []
    page.on("console", lambda message: warnings.append(message.text) if message.type == "warning" else None)
    page.goto(f"{server}/")
    bundle, feeds, expected = variant_bundles["squeezenet"]
    report = _run_variants(page, bundle, feeds, [{}, {"threads": 2}])
    assert not report["isolated"]
    for result in report["results"]:
        assert result["variant"]["threads"] == 1 and "threads" not in result["variant"]["features"]
        for output, values in expected.items():
            np.testing.assert_allclose(np.array(result["outputs"][output]).reshape(values.shape), values, RTOL, ATOL)
    threads_warnings = [text for text in warnings if "running on 1 thread" in text]
    assert len(threads_warnings) == 1, warnings
    assert "Cross-Origin-Opener-Policy: same-origin" in threads_warnings[0]
    assert "Cross-Origin-Embedder-Policy: require-corp" in threads_warnings[0]


DAMAGED_RUNS = """async ({bundle, feeds, configs}) => {
  const tessel = await import("/runtime/tessel.js");
  // a first visit: an earlier test's load of the same bundle left its intact params in tessel.js's cache
  await tessel.clearCache();
  const inputs = Object.fromEntries(Object.entries(feeds).map(([name, values]) => [name, Float32Array.from(values)]));
  const errors = [];
  for (const options of configs) {
    const model = await tessel.load(bundle, options);
    for (const attempt of [0, 1]) {
      errors.push(await model.run(inputs).then(() => "a result", (error) => error.message));
    }
    model.dispose();
  }
  return errors;
}"""


@pytest.mark.slow
def test_a_damaged_params_download_holds_back_every_result_in_the_page(server, page, variant_bundles):
    """params.bin with one byte flipped on the way (in its second 1 MiB piece, hashed as it arrives): every run
    rejects, on one thread and on two (each piece copied out of shared memory to be hashed)."""
    bundle, feeds, _ = variant_bundles["squeezenet"]

    def damaged(route):
        response = route.fetch()
        body = bytearray(response.body())
        assert len(body) > (1 << 20) + 4096, "squeezenet's params no longer span two pieces"
        body[(1 << 20) + 4096] ^= 0x01
        route.fulfill(response=response, body=bytes(body))

    page.route(f"{server}{bundle}params.bin", damaged)
    page.goto(f"{server}/")
    plain = {name: array.ravel().tolist() for name, array in feeds.items()}
    configs = [{"threads": 1}, {"threads": 2}]
    errors = page.evaluate(DAMAGED_RUNS, {"bundle": bundle, "feeds": plain, "configs": configs})
    assert len(errors) == 4 and all("params.bin does not match the manifest's sha256" in text for text in errors), (
        errors
    )


@pytest.mark.slow
def test_an_engine_without_simd_gets_the_simd_error(server, page, variant_bundles):
    page.add_init_script("WebAssembly.validate = () => false;")
    page.goto(f"{server}/")
    bundle, feeds, _ = variant_bundles["mlp"]
    with pytest.raises(Exception, match="does not support WebAssembly SIMD"):
        _run_variants(page, bundle, feeds, [{"backend": "wasm"}])
