"""The compile service's store: no request path reaches outside it (dot segments, encoded dots, absolute
paths, links), and a restart keeps finished jobs and bundles while failing the jobs it interrupted."""

import hashlib
import os

from onnx import TensorProto, helper
from server_helpers import assert_isolated, call_asgi, model_bytes, upload, wait_finished
from starlette.testclient import TestClient

from compiler.bundle import write_bundle
from server.app import create_app
from server.jobs import RESTART_MESSAGE

SECRET = b"the store must never serve this"


def fake_bundle(directory, files: dict[str, bytes]):
    manifest = {"format_version": 1, "target": "wasm", "code": "model.wasm", "calls": [], "kernels": []}
    return write_bundle(directory, manifest, files)


def test_no_request_path_leaves_the_store(serve, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET)
    static = tmp_path / "static"
    static.mkdir()
    (static / "index.html").write_text("upload")
    (static / "leak.txt").symlink_to(secret)
    client = serve(static_dir=static, runtime_dir=static)
    store = client.app.state.store
    bundle_id = hashlib.sha256(b"fake").hexdigest()
    bundle = fake_bundle(store.bundles / bundle_id, {"model.wasm": b"\0asm", "params.bin": b"1234"})
    (bundle / "build.json").write_text("{}")
    assert client.get(f"/bundles/{bundle_id}/params.bin").content == b"1234"

    # A listed file that became a link, and a bundle directory that is a link out of the store.
    (bundle / "model.wasm").unlink()
    (bundle / "model.wasm").symlink_to(secret)
    outside = fake_bundle(tmp_path / "outside", {"secret.txt": SECRET})
    linked_id = hashlib.sha256(b"linked").hexdigest()
    (store.bundles / linked_id).symlink_to(outside)

    attempts = [
        f"/bundles/{bundle_id}/model.wasm",
        f"/bundles/{bundle_id}/build.json",
        f"/bundles/{linked_id}/secret.txt",
        f"/bundles/{linked_id}.zip",
        f"/bundles/{bundle_id}/%2e%2e",
        f"/bundles/{bundle_id}/%2e%2e%2f%2e%2e%2f%2e%2e%2fsecret.txt",
        f"/bundles/{bundle_id}/..%2f..%2f..%2fsecret.txt",
        "/bundles/%2e%2e/secret.txt",
        "/bundles/..%2f..%2fsecret.txt/x",
        f"/bundles/{bundle_id}/%2fetc%2fpasswd",
        "/static/leak.txt",
        "/static/%2e%2e/secret.txt",
        "/static/%2e%2e%2fsecret.txt",
        "/static//etc/passwd",
        "/static/..%5csecret.txt",
        f"/static/{secret}",
        "/runtime/%2e%2e/secret.txt",
        "/demo/%2e%2e",
    ]
    for path in attempts:
        response = client.get(path)
        assert response.status_code in (400, 404), path
        assert SECRET not in response.content and "error" in response.json(), path
        assert_isolated(response)
    # The same paths as a client that does not normalise them would send.
    for raw in (
        f"/bundles/{bundle_id}/../../../secret.txt",
        f"/bundles/{bundle_id}/../{bundle_id}/params.bin/../../../../secret.txt",
        "/static/../../secret.txt",
        "/static/../secret.txt",
        "/runtime/../secret.txt",
        f"/static/{secret}",
    ):
        status, body, _ = call_asgi(client.app, "GET", raw.encode(), [], iter(()))
        assert status in (400, 404) and SECRET not in body, raw


def test_weights_in_an_external_file_cannot_pull_in_a_server_file(serve, tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(SECRET)
    weights = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4], data_location=TensorProto.EXTERNAL)
    weights.external_data.add(key="location", value=str(secret))
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "external",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        initializer=[weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    client = serve()
    response = upload(client, model)
    assert response.status_code == 400 and "external file" in response.json()["error"]
    assert client.app.state.queue.jobs == {}


def test_a_restart_keeps_finished_bundles_and_fails_interrupted_jobs(tmp_path):
    store_dir = tmp_path / "var"
    with TestClient(create_app(store_dir, max_workers=1)) as client:
        finished = wait_finished(client, upload(client, model_bytes("mlp")).json()["job"])
        interrupted = upload(client, model_bytes("mobilenet_v2")).json()["job"]
        waiting = upload(client, model_bytes("digits")).json()["job"]
        assert client.get(f"/api/jobs/{waiting}").json()["state"] == "queued"
        assert client.get(f"/api/jobs/{interrupted}").json()["state"] == "running"
    # Leaving the block stopped the app the way a crash would: the worker killed mid-compile.
    assert len(os.listdir(store_dir / "uploads")) == 1, "the waiting job's upload was left behind"

    with TestClient(create_app(store_dir, max_workers=1)) as client:
        job = client.get(f"/api/jobs/{finished['id']}").json()
        assert job["state"] == "done" and job["result"] == finished["result"]
        bundle = finished["result"]["bundles"]["wasm"]
        for name, size in bundle["files"].items():
            response = client.get(f"/bundles/{bundle['id']}/{name}")
            assert response.status_code == 200 and len(response.content) == size
        for job_id in (interrupted, waiting):
            job = client.get(f"/api/jobs/{job_id}").json()
            assert job["state"] == "failed" and job["error"]["message"] == RESTART_MESSAGE
            assert job["log"][-1] == RESTART_MESSAGE
        assert os.listdir(store_dir / "uploads") == [] and os.listdir(store_dir / "tmp") == []
        again = upload(client, model_bytes("mlp")).json()
        assert again["state"] == "done" and client.app.state.queue.compiles == 0
