"""Every error and limit of the compile service answers with a JSON body {"error": ...} and the right
status: oversized uploads (refused before the body is read), a full queue, a job timeout, files that are
not ONNX, unsupported ops, bad form fields, unknown jobs and bundles, and server errors."""

import os
import time

import onnx
from onnx import TensorProto, helper
from server_helpers import assert_isolated, call_asgi, model_bytes, upload, wait_finished

import server.app
from server.app import FORM_OVERHEAD, create_app

BOUNDARY = b"tesselboundary"
MULTIPART = [(b"content-type", b"multipart/form-data; boundary=" + BOUNDARY)]


def det_model() -> bytes:
    """A model with Det, an op Tessel does not implement."""
    node = helper.make_node("Det", ["x"], ["y"], name="determinant")
    graph = helper.make_graph(
        [node],
        "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def symbolic_batch_model() -> bytes:
    model = onnx.load_from_string(model_bytes("mlp"))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    return model.SerializeToString()


def assert_error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert_isolated(response)
    body = response.json()
    assert isinstance(body["error"], str) and body["error"]
    assert "Traceback" not in response.text
    return body


def test_a_declared_oversized_upload_is_refused_before_its_body_is_read(serve, tmp_path):
    client = serve(max_upload_bytes=1000)
    huge = str(10**12).encode()

    def never_read():
        raise AssertionError("the app read the body of an upload it should have refused")
        yield

    status, body, read = call_asgi(
        client.app, "POST", b"/api/compile", [*MULTIPART, (b"content-length", huge)], never_read()
    )
    assert status == 413 and b"limit of" in body and read == 0
    response = client.post("/api/compile", content=b"x", headers={"content-length": str(10**12)})
    assert assert_error(response, 413)["limit_bytes"] == 1000


def test_a_chunked_upload_is_cut_off_once_it_passes_the_limit(serve):
    client = serve(max_upload_bytes=100_000)
    head = b"--" + BOUNDARY + b'\r\nContent-Disposition: form-data; name="file"; filename="big.onnx"\r\n\r\n'

    def endless():
        yield head
        while True:
            yield b"\0" * 16384

    status, body, read = call_asgi(client.app, "POST", b"/api/compile", MULTIPART, endless())
    assert status == 413
    assert read <= (100_000 + FORM_OVERHEAD) // 16384 + 2


def test_a_file_over_the_limit_within_the_form_allowance_is_refused(serve):
    client = serve(max_upload_bytes=1000)
    assert_error(upload(client, b"\0" * 2000), 413)


def test_a_full_queue_answers_429_and_shows_positions(serve):
    client = serve(max_workers=1, max_queue=1)
    running = upload(client, model_bytes("mobilenet_v2"))
    assert running.status_code == 202 and running.json()["position"] == 0
    waiting = upload(client, model_bytes("mlp"))
    assert waiting.status_code == 202 and waiting.json()["position"] == 1
    job = client.get(f"/api/jobs/{waiting.json()['job']}").json()
    assert job["state"] == "queued" and job["position"] == 1
    refused = upload(client, model_bytes("digits"))
    body = assert_error(refused, 429)
    assert body["max_queue"] == 1 and refused.headers["retry-after"] == "30"
    assert client.get("/healthz").json()["queued"] == 1


def test_a_job_over_the_time_limit_fails_and_its_worker_is_replaced(serve):
    client = serve(max_workers=1, job_timeout_s=0.3)
    queue = client.app.state.queue
    job = wait_finished(client, upload(client, model_bytes("mobilenet_v2")).json()["job"])
    assert job["state"] == "failed"
    assert "longer than this server's limit of 0.3 s" in job["error"]["message"]
    assert job["error"]["status"] == 504 and queue.runner.idle == []
    queue.job_timeout_s = 60
    after = wait_finished(client, upload(client, model_bytes("mlp")).json()["job"])
    assert after["state"] == "done", "a fresh worker takes the next job"


def test_a_worker_that_dies_fails_its_job_and_is_replaced(serve):
    client = serve(max_workers=1)
    queue = client.app.state.queue
    job_id = upload(client, model_bytes("mobilenet_v2")).json()["job"]
    deadline = time.monotonic() + 30
    while job_id not in queue.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    queue.busy[job_id].process.kill()
    job = wait_finished(client, job_id)
    assert job["state"] == "failed" and job["error"]["status"] == 500
    assert "compiler process died" in job["error"]["message"]
    assert wait_finished(client, upload(client, model_bytes("mlp")).json()["job"])["state"] == "done"


def test_uploads_the_compiler_rejects(serve):
    client = serve()
    not_onnx = assert_error(upload(client, b"this is not a model"), 400)["error"]
    assert "not an ONNX model" in not_onnx and str(client.app.state.store.root) not in not_onnx
    assert "empty" in assert_error(upload(client, b""), 400)["error"]
    unsupported = assert_error(upload(client, det_model()), 422)
    assert unsupported["ops"] == {"Det": ["determinant"]} and "Det" in unsupported["error"]
    assert "batch" in assert_error(upload(client, symbolic_batch_model()), 422)["error"]
    unknown_input = assert_error(upload(client, model_bytes("mlp"), input_shapes="pixels=1,784"), 422)
    assert "pixels" in unknown_input["error"]
    health = client.get("/healthz").json()
    assert health["queued"] == 0 and health["running"] == 0 and health["compiles"] == 0
    assert list(client.app.state.store.uploads.iterdir()) == [], "refused uploads leave no file behind"


def test_bad_form_fields(serve):
    client = serve()
    mlp = model_bytes("mlp")
    assert "unknown target 'metal'" in assert_error(upload(client, mlp, targets="wasm,metal"), 400)["error"]
    assert "NAME=D1,D2" in assert_error(upload(client, mlp, input_shapes="input=1,x"), 400)["error"]
    assert "below 1" in assert_error(upload(client, mlp, input_shapes="input=0,784"), 400)["error"]
    assert "twice" in assert_error(upload(client, mlp, input_shapes="input=1,784;input=1,784"), 400)["error"]
    assert (
        "'file'"
        in assert_error(client.post("/api/compile", data={"targets": "wasm"}, files={"x": ("a", b"1")}), 400)["error"]
    )
    assert "multipart" in assert_error(client.post("/api/compile", json={"file": "x"}), 400)["error"]
    broken = client.post("/api/compile", content=b"garbage", headers={"content-type": "multipart/form-data"})
    assert_error(broken, 400)


def test_unknown_jobs_bundles_and_routes_are_json_404s(serve):
    client = serve()
    for path in (
        "/api/jobs/" + "a" * 32,
        "/api/jobs/not-a-job",
        "/api/jobs/" + "a" * 32 + "/events",
        "/bundles/" + "b" * 64 + "/manifest.json",
        "/bundles/" + "b" * 64 + ".zip",
        "/bundles/short/manifest.json",
        "/nowhere",
    ):
        assert_error(client.get(path), 404)
    assert_error(client.get("/api/compile"), 405)


def test_a_server_error_is_json_and_isolated(serve, monkeypatch):
    client = serve(raise_errors=False)

    def broken():
        raise RuntimeError("secret detail")

    monkeypatch.setattr(server.app, "targets", broken)
    body = assert_error(client.get("/api/targets"), 500)
    assert "secret detail" not in body["error"]


def test_the_default_limits(tmp_path):
    app = create_app(tmp_path)
    assert app.state.max_upload_bytes == 256 * 2**20
    assert app.state.queue.max_workers == (os.cpu_count() or 1)
