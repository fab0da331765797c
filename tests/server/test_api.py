"""The compile service's main path: upload, progress, events, bundle download, running the downloaded
bundle against onnxruntime, reuse of identical uploads, and the pages and runtime files it serves."""

import argparse
import asyncio
import io
import json
import zipfile

import numpy as np
import onnxruntime
import pytest
from server_helpers import assert_isolated, model_bytes, upload, wait_finished

import server.app
from compiler import load_module, zoo
from compiler.errors import TesselError
from server.app import add_arguments, create_app, run_from_args
from server.jobs import TARGET_OPTIONS, Job, JobQueue, bundle_key
from server.store import Store

ONNX_RTOL, ONNX_ATOL = 1e-4, 1e-5


def onnxruntime_outputs(name: str, feeds: dict) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(model_bytes(name), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def download_bundle(client, bundle_id: str, files: dict, directory):
    directory.mkdir()
    for name in files:
        response = client.get(f"/bundles/{bundle_id}/{name}")
        assert response.status_code == 200, response.text
        assert_isolated(response)
        assert response.headers["cache-control"] == "public, max-age=31536000, immutable"
        expected = {".wasm": "application/wasm", ".json": "application/json"}.get(
            name[name.rfind(".") :], "application/octet-stream"
        )
        assert response.headers["content-type"].split(";")[0] == expected
        assert len(response.content) == files[name]
        (directory / name).write_bytes(response.content)
    return directory


def test_upload_compiles_for_both_targets_and_the_downloaded_bundles_match_onnxruntime(serve, tmp_path):
    client = serve()
    response = upload(client, model_bytes("digits"), "digits.onnx", targets="wasm,llvm")
    assert response.status_code == 202
    assert_isolated(response)
    accepted = response.json()
    assert accepted["position"] == 0 and accepted["state"] in ("queued", "running")

    job = wait_finished(client, accepted["job"])
    assert job["state"] == "done", job["error"]
    assert job["progress"] == 1.0 and job["error"] is None
    assert job["targets"] == ["wasm", "llvm"]
    assert job["model"]["filename"] == "digits.onnx" and job["model"]["bytes"] == len(model_bytes("digits"))
    assert any("lowering" in line for line in job["log"])
    steps = [line for line in job["log"] if line.startswith("wasm: generating the")]
    assert steps == [f"wasm: generating the {name} variant" for name in TARGET_OPTIONS["wasm"]["wasm_variants"]]
    variants_manifest = client.get(f"/bundles/{job['result']['bundles']['wasm']['id']}/manifest.json").json()
    threaded = next(variant for variant in variants_manifest["variants"] if variant["features"] == ["threads"])
    assert threaded["wasm_import"]["shared"] is True and threaded["stack_bytes"] > 0
    feeds = zoo.sample_input("digits")
    (expected,) = onnxruntime_outputs("digits", feeds)
    # the wasm bundle carries every variant the server compiles (TARGET_OPTIONS), each a step of the job's progress
    variants = ["model.threads.wasm", "model.relaxed-simd.wasm", "model.threads.relaxed-simd.wasm"]
    for target, code in (("wasm", ["model.wasm", *variants]), ("llvm", ["model.so"])):
        bundle = job["result"]["bundles"][target]
        assert bundle["reused"] is False and bundle["compile_seconds"] > 0
        assert bundle["fused_groups"] == 6
        assert set(bundle["files"]) == {"manifest.json", *code, "params.bin"}
        directory = download_bundle(client, bundle["id"], bundle["files"], tmp_path / target)
        module = load_module(directory)  # checks each variant's digest and seal against the manifest
        assert module.manifest["target"] == target
        assert [variant["code"] for variant in module.manifest.get("variants", [])] == code[1:]
        (actual,) = module.run(feeds).values()
        np.testing.assert_allclose(actual, expected, rtol=ONNX_RTOL, atol=ONNX_ATOL)


def test_a_bundle_id_changes_with_the_variants_the_server_compiles(monkeypatch):
    digest = "0" * 64
    with_variants = bundle_key(digest, "wasm", {})
    monkeypatch.setitem(TARGET_OPTIONS, "wasm", {"wasm_variants": ("threads",)})
    fewer = bundle_key(digest, "wasm", {})
    monkeypatch.delitem(TARGET_OPTIONS, "wasm")
    assert len({with_variants, fewer, bundle_key(digest, "wasm", {})}) == 3


def test_zip_download_holds_a_loadable_bundle(serve, tmp_path):
    client = serve()
    job = wait_finished(client, upload(client, model_bytes("mlp")).json()["job"])
    bundle_id = job["result"]["bundles"]["wasm"]["id"]
    response = client.get(f"/bundles/{bundle_id}.zip")
    assert response.status_code == 200 and response.headers["content-type"] == "application/zip"
    assert response.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert_isolated(response)
    zipfile.ZipFile(io.BytesIO(response.content)).extractall(tmp_path)
    feeds = zoo.sample_input("mlp")
    (actual,) = load_module(tmp_path / bundle_id).run(feeds).values()
    np.testing.assert_allclose(actual, onnxruntime_outputs("mlp", feeds)[0], rtol=ONNX_RTOL, atol=ONNX_ATOL)
    assert client.get(f"/bundles/{bundle_id}.zip").content == response.content


def read_events(client, job_id: str) -> list[tuple[str, dict]]:
    events, name = [], None
    with client.stream("GET", f"/api/jobs/{job_id}/events") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert_isolated(response)
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((name, json.loads(line.removeprefix("data: "))))
    return events


def test_events_stream_progress_and_log_until_the_job_is_done(serve):
    client = serve()
    job_id = upload(client, model_bytes("digits")).json()["job"]
    events = read_events(client, job_id)
    progress = [data["progress"] for name, data in events if name == "progress"]
    assert progress == sorted(progress) and progress[-1] == 1.0 and len(progress) > 3
    lines = [data["line"] for name, data in events if name == "log"]
    assert any("linking" in line for line in lines)
    states = [data for name, data in events if name == "state"]
    assert states[-1]["state"] == "done" and states[-1]["result"]["bundles"]["wasm"]["fused_groups"] == 6
    assert events[-1][0] == "state"
    # A finished job's stream replays its history and ends at once.
    assert [name for name, _ in read_events(client, job_id)].count("state") == 1
    assert lines == client.get(f"/api/jobs/{job_id}").json()["log"]


def test_event_stream_sends_log_lines_appended_while_it_was_sending(tmp_path):
    """A line logged while the stream is suspended on a send is sent too, in order (a lost line once
    failed CI)."""

    async def consume() -> list[str]:
        queue = JobQueue(Store(tmp_path), max_workers=1, max_queue=1, job_timeout_s=60)
        job = Job(id="a" * 32, builds={}, input_shapes={}, model={}, log=["queued", "started"])
        lines = []
        async for text in server.app._job_events(queue, job):
            if text.startswith("event: log"):
                lines.append(json.loads(text.split("data: ", 1)[1])["line"])
                if len(lines) == 1:
                    job.log.append("logged during a send")
                    job.state = "done"
        return lines

    assert asyncio.run(consume()) == ["queued", "started", "logged during a send"]


def test_identical_uploads_reuse_the_stored_bundle_without_compiling(serve):
    client = serve()
    queue = client.app.state.queue
    first, twin = upload(client, model_bytes("mlp")).json(), upload(client, model_bytes("mlp")).json()
    assert twin["job"] == first["job"], "an identical upload while the first is in flight joins it"
    done = wait_finished(client, first["job"])
    again = upload(client, model_bytes("mlp"), "renamed.onnx")
    assert again.status_code == 202 and again.json()["state"] == "done"
    reused = client.get(f"/api/jobs/{again.json()['job']}").json()
    bundle = reused["result"]["bundles"]["wasm"]
    assert bundle["reused"] is True and bundle["id"] == done["result"]["bundles"]["wasm"]["id"]
    assert bundle["files"] == done["result"]["bundles"]["wasm"]["files"]
    assert queue.compiles == 1 and client.get("/healthz").json()["compiles"] == 1
    # Other options are another bundle: a batch of 2 compiles anew.
    other = wait_finished(client, upload(client, model_bytes("mlp"), input_shapes="input=2,784").json()["job"])
    assert other["state"] == "done" and other["input_shapes"] == {"input": [2, 784]}
    manifest = client.get(f"/bundles/{other['result']['bundles']['wasm']['id']}/manifest.json").json()
    assert manifest["inputs"][0]["shape"] == [2, 784]
    assert queue.compiles == 2


def test_targets_health_and_pages(serve, tmp_path):
    static, runtime = tmp_path / "static", tmp_path / "runtime"
    static.mkdir()
    runtime.mkdir()
    (static / "index.html").write_text("<h1>upload</h1>")
    (static / "demo.html").write_text("<h1>demo</h1>")
    (static / "style.css").write_text("body {}")
    (runtime / "tessel.js").write_text("export const load = () => null;")
    client = serve(static_dir=static, runtime_dir=runtime)
    targets = client.get("/api/targets").json()["targets"]
    names = [target["name"] for target in targets]
    # every backend of the registry, the browser's first
    assert names[0] == "wasm" and names[1:] == sorted(names[1:]) and {"llvm", "opencl", "cuda"} <= set(names)
    assert targets[0]["runs_in_browser"] and targets[0]["default"]
    health = client.get("/healthz")
    assert health.json()["ok"] is True and health.json()["workers"] == 2
    page = client.get("/")
    assert page.status_code == 200 and page.text == "<h1>upload</h1>"
    assert page.headers["content-type"].startswith("text/html")
    assert client.get("/static/style.css").headers["content-type"].startswith("text/css")
    script = client.get("/runtime/tessel.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    for response in (health, page, script):
        assert_isolated(response)
    job = wait_finished(client, upload(client, model_bytes("mlp")).json()["job"])
    demo = client.get(f"/demo/{job['result']['bundles']['wasm']['id']}")
    assert demo.status_code == 200 and demo.text == "<h1>demo</h1>"
    assert client.get("/demo/" + "0" * 64).status_code == 404


def test_missing_pages_are_json_404s(serve, tmp_path):
    client = serve(static_dir=tmp_path / "nothing", runtime_dir=tmp_path / "nothing")
    for path in ("/", "/static/app.js", "/runtime/tessel.js"):
        response = client.get(path)
        assert response.status_code == 404 and "error" in response.json()
        assert_isolated(response)


def test_prebuilt_zoo_models_are_listed_and_the_demo_name_redirects(serve):
    client = serve(prebuild=("digits", "mlp"))
    # Asked for at once, the redirect waits for the compile that start-up queued.
    redirect = client.get("/demo/digits?backend=wasm", follow_redirects=False)
    digits, mlp = client.get("/api/zoo").json()["models"]
    job = client.get(f"/api/jobs/{digits['job']}").json()
    assert job["state"] == "done"
    bundle_id = job["result"]["bundles"]["wasm"]["id"]
    # the demo page is also told where the job's bundle set is, so `auto` can choose among its bundles
    bundle_set = f"%2Fapi%2Fjobs%2F{digits['job']}%2Fbundle-set.json"
    assert redirect.status_code == 307
    assert redirect.headers["location"] == f"/demo/{bundle_id}?backend=wasm&set={bundle_set}"
    assert digits["name"] == "digits" and digits["demo"] == "/demo/digits"
    assert digits["bundles"] == {kind: bundle["id"] for kind, bundle in job["result"]["bundles"].items()}
    assert digits["bundles"]["wasm"] == bundle_id
    served = client.get(f"/api/jobs/{digits['job']}/bundle-set.json").json()["bundles"]
    assert served == {kind: f"/bundles/{bundle_id}/" for kind, bundle_id in digits["bundles"].items()}
    assert client.get(f"/api/jobs/{'0' * 32}/bundle-set.json").status_code == 404


def test_the_demo_is_not_offered_for_a_model_it_does_not_fit(serve):
    client = serve(prebuild=("mlp",))
    refused = client.get("/demo/mlp")
    assert refused.status_code == 404 and "mlp does not fit it" in refused.json()["error"]
    (entry,) = client.get("/api/zoo").json()["models"]
    assert entry["name"] == "mlp" and entry["state"] == "done" and entry["demo"] is None


def test_prebuild_of_an_unknown_model_is_refused(tmp_path):
    with pytest.raises(TesselError, match="unknown zoo model 'nope'"):
        create_app(tmp_path, prebuild=("nope",))


def test_command_line_arguments_reach_serve(monkeypatch):
    calls = []
    monkeypatch.setattr(server.app, "serve", lambda *args, **kwargs: calls.append((args, kwargs)))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    arguments = (
        "--port 9000 --store /tmp/x --prebuild digits,mobilenet_v2 --workers 3 --max-upload-mb 1 --job-timeout 5 "
        "--import-memory-mb 64 --ray 10.0.0.7:6379"
    )
    assert run_from_args(parser.parse_args(arguments.split())) == 0
    (args, kwargs), *_ = calls
    assert args == ("127.0.0.1", 9000, "/tmp/x")
    assert kwargs == {
        "prebuild": ("digits", "mobilenet_v2"),
        "max_upload_bytes": 2**20,
        "max_workers": 3,
        "max_queue": 64,
        "job_timeout_s": 5.0,
        "import_memory_bytes": 64 * 2**20,
        "ray": "10.0.0.7:6379",
    }
    with pytest.raises(TesselError, match="unknown zoo model"):
        run_from_args(parser.parse_args(["--prebuild", "nope"]))


def test_a_waiting_job_stream_sends_keepalives(serve, monkeypatch):
    monkeypatch.setattr(server.app, "KEEPALIVE_S", 0.05)
    client = serve(max_workers=1)
    upload(client, model_bytes("mobilenet_v2"))
    waiting = upload(client, model_bytes("mlp")).json()
    assert waiting["position"] == 1
    seen = []
    with client.stream("GET", f"/api/jobs/{waiting['job']}/events") as response:
        for line in response.iter_lines():
            seen.append(line)
            if line == ": keepalive":
                break
    assert 'data: {"state": "queued", "position": 1, "error": null, "result": null}' in seen


def test_the_favicon_is_served_and_every_page_names_it(serve):
    """/favicon.ico, which browsers ask every origin for, is static/favicon.svg (it was a 404 on every page)."""
    client = serve()
    icon = client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    assert icon.text.startswith("<svg") and 'viewBox="0 0 32 32"' in icon.text
    for page in ("/", "/static/demo.html"):
        assert '<link rel="icon" href="/favicon.ico" type="image/svg+xml" />' in client.get(page).text
