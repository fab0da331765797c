"""Compiling on Ray (`tessel serve --ray`, server/ray_jobs.py) with a local instance of two CPUs, as the tuner's Ray
runner is tested: the same bundle as a local compile, progress reaching the client, a worker killed mid-compile
failing its job cleanly with nothing half-stored while the queue goes on, and an unreachable address refused at once."""

import asyncio
import os
import re
import signal
import sys
import time

import numpy as np
import pytest
from server_helpers import model_bytes, upload, wait_finished

from compiler import load_module, zoo
from compiler.errors import TesselError
from server.app import create_app
from server.jobs import CompileTask
from server.ray_jobs import RayRunner, compile_task

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'tessel[ray]')")


@pytest.fixture(scope="module")
def cluster():
    from server.ray_jobs import connect

    connect("local", num_cpus=2, include_dashboard=False)
    # the Ray workers cannot import this test module by name, so the slow task below travels by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.shutdown()


def slow_compile(*args):
    """compile_task, stopping for a long while at its first progress step: a job to kill mid-compile."""
    for message in compile_task(*args):
        yield message
        if message[0] == "progress":
            time.sleep(300)


def stored_files(client, job) -> dict[str, bytes]:
    bundle = job["result"]["bundles"]["wasm"]
    return {name: client.get(f"{bundle['url']}{name}").content for name in bundle["files"]}


def test_a_compile_on_ray_makes_the_bundle_a_local_compile_makes(cluster, serve, tmp_path):
    on_ray = serve(ray="local", store_dir=tmp_path / "ray")
    local = serve(store_dir=tmp_path / "local")
    assert on_ray.get("/healthz").json()["workers"] == 2
    data = model_bytes("mlp")
    remote_job = wait_finished(on_ray, upload(on_ray, data).json()["job"])
    local_job = wait_finished(local, upload(local, data).json()["job"])
    assert remote_job["state"] == "done", remote_job
    assert any(line.startswith("compiling on Ray node") for line in remote_job["log"])
    assert any(line.startswith("wasm: ") and "variant" in line for line in remote_job["log"])  # progress steps
    bundle = remote_job["result"]["bundles"]["wasm"]
    assert bundle["id"] == local_job["result"]["bundles"]["wasm"]["id"] and not bundle["reused"]
    assert stored_files(on_ray, remote_job) == stored_files(local, local_job)  # manifest (its digests) and code
    feeds = zoo.sample_input("mlp")
    (remote,) = load_module(tmp_path / "ray" / "bundles" / bundle["id"]).run(feeds).values()
    (expected,) = load_module(tmp_path / "local" / "bundles" / bundle["id"]).run(feeds).values()
    np.testing.assert_array_equal(remote, expected)
    # an identical upload is served from the store without a Ray task
    again = wait_finished(on_ray, upload(on_ray, data).json()["job"])
    assert again["result"]["bundles"]["wasm"]["reused"] and on_ray.get("/healthz").json()["compiles"] == 1
    # with one bundle stored, only the other is compiled on Ray
    both = wait_finished(on_ray, upload(on_ray, data, targets="wasm,llvm").json()["job"])
    assert both["state"] == "done", both
    assert both["result"]["bundles"]["wasm"]["reused"] and not both["result"]["bundles"]["llvm"]["reused"]
    assert on_ray.get("/healthz").json()["compiles"] == 2


def test_a_ray_worker_whose_bundles_were_stored_meanwhile_starts_no_task(cluster, serve):
    client = serve(ray="local")
    job = wait_finished(client, upload(client, model_bytes("mlp")).json()["job"])
    bundle_id = job["result"]["bundles"]["wasm"]["id"]
    store, runner = client.app.state.store, client.app.state.queue.runner
    worker = asyncio.run(runner.take())
    worker.start(CompileTask(str(store.root), "/nonexistent.onnx", (("wasm", bundle_id),), {}, 2**20))

    async def messages():
        return [await worker.receive(), await worker.receive()]

    logged, done = asyncio.run(messages())
    assert logged == ("log", f"wasm: bundle {bundle_id[:12]} already stored, reused")
    assert done[0] == "done" and done[1]["wasm"]["reused"] and worker.generator is None


def test_a_worker_killed_mid_compile_fails_its_job_and_the_next_job_compiles(cluster, serve, tmp_path):
    client = serve(ray="local")
    queue = client.app.state.queue
    queue.runner = RayRunner("local", function=slow_compile)
    job_id = upload(client, model_bytes("digits")).json()["job"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        job = client.get(f"/api/jobs/{job_id}").json()
        pids = [re.search(r"worker process (\d+)", line) for line in job["log"]]
        if job["step"].startswith("wasm: ") and any(pids):  # in its first compile step
            break
        time.sleep(0.1)
    assert job["state"] == "running", job
    os.kill(int(next(match for match in pids if match).group(1)), signal.SIGKILL)
    job = wait_finished(client, job_id)
    assert job["state"] == "failed" and job["error"]["status"] == 500
    assert job["error"]["message"].startswith("the Ray worker compiling this job died")
    store = client.app.state.store
    assert list(store.bundles.iterdir()) == [] and list(store.staging.iterdir()) == []
    health = client.get("/healthz").json()
    assert health["ok"] and health["running"] == 0 and health["compiles"] == 0

    queue.runner = RayRunner("local")
    job = wait_finished(client, upload(client, model_bytes("digits")).json()["job"])
    assert job["state"] == "done", job
    assert store.has_bundle(job["result"]["bundles"]["wasm"]["id"])


def test_a_job_over_the_time_limit_on_ray_is_stopped(cluster, serve):
    client = serve(ray="local", job_timeout_s=3)
    client.app.state.queue.runner = RayRunner("local", function=slow_compile)
    job = wait_finished(client, upload(client, model_bytes("mlp")).json()["job"])
    assert job["state"] == "failed" and job["error"]["status"] == 504
    assert list(client.app.state.store.bundles.iterdir()) == []
    deadline = time.monotonic() + 30  # the stopped task's worker is killed, so its CPU is free again
    while ray.available_resources().get("CPU") != 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU") == 2


def test_an_unreachable_ray_address_is_one_clear_error(cluster, tmp_path):
    with pytest.raises(TesselError, match=r"cannot reach a Ray cluster at '127.0.0.1:1' .*ray start --head"):
        create_app(tmp_path, ray="127.0.0.1:1")
    with pytest.raises(TesselError, match="'nowhere' is not a cluster address; give HOST:PORT"):
        create_app(tmp_path, ray="nowhere")


def test_a_tuning_session_builds_its_candidates_on_ray(cluster, serve):
    from compiler.tune.ray_runner import RayBuilder

    client = serve(ray="local")
    files = {"file": ("mlp.onnx", model_bytes("mlp"), "application/octet-stream")}
    started = client.post("/api/tune", files=files, data={"trials": "1"})
    assert started.status_code == 202, started.text
    session = client.app.state.tuning.get(started.json()["session"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        answer = client.get(f"/api/tune/{session.id}/next").json()
        if "candidate" in answer or answer["state"] != "tuning":
            break
    assert answer["candidate"]["wasm"] and answer["state"] == "tuning", answer  # the fallback, built by a Ray task
    assert session.make_builder is RayBuilder
