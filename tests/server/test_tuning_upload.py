"""An upload may carry a tuning log (the field 'records'): its bundles are compiled with the log's best configs
(checked against onnxruntime), their ids differ from the same model's without it, a record that no longer fits its
template is a warning in the job's log, and a corrupted log is refused with a 400 naming the file and line."""

import json

import numpy as np
import onnxruntime

from compiler.build import load_module
from compiler.tune.task import extract_tasks
from tests.server.server_helpers import wait_finished
from tests.tune.test_records import RNG, conv_model


def post(client, model: bytes, records: str | None = None, **fields):
    files = {"file": ("conv.onnx", model, "application/octet-stream")}
    if records is not None:
        files["records"] = ("log.jsonl", records.encode(), "application/json")
    return client.post("/api/compile", files=files, data={"targets": "llvm", **fields})


def log_choosing(config_of, target: str = "llvm") -> str:
    """A tuning log whose fastest record of each of conv_model's tasks has the config `config_of(task)`."""
    lines = []
    for task in extract_tasks(conv_model(), target):
        lines.append({"task": task.to_json(), "config": config_of(task), "seconds": 1e-6, "error": None})
    return "".join(json.dumps(line) + "\n" for line in lines)


def test_an_uploaded_log_chooses_the_kernels_configs(serve, tmp_path):
    client = serve()
    model = conv_model().SerializeToString()
    chosen = {}

    def last_valid(task):
        chosen[task.key] = list(task.space.valid_configs())[-1].to_json()
        return chosen[task.key]

    job = wait_finished(client, post(client, model, log_choosing(last_valid)).json()["job"])
    assert job["state"] == "done", job["error"]
    assert job["records"]["filename"] == "log.jsonl"
    plain = wait_finished(client, post(client, model).json()["job"])
    tuned_bundle, plain_bundle = (j["result"]["bundles"]["llvm"] for j in (job, plain))
    assert tuned_bundle["id"] != plain_bundle["id"]
    directory = tmp_path / "bundle"
    directory.mkdir()
    for name in tuned_bundle["files"]:
        (directory / name).write_bytes(client.get(f"{tuned_bundle['url']}{name}").content)
    module = load_module(directory)
    assert [kernel["config"] for kernel in module.manifest["kernels"]] == list(chosen.values())
    feeds = {"x": RNG.standard_normal((1, 8, 14, 14)).astype(np.float32)}
    expected = onnxruntime.InferenceSession(model).run(None, feeds)[0]
    np.testing.assert_allclose(module.run(feeds)["y"], expected, rtol=1e-4, atol=1e-5)


def test_a_record_that_no_longer_fits_is_a_warning_in_the_jobs_log(serve):
    client = serve()
    model = conv_model().SerializeToString()
    job = wait_finished(client, post(client, model, log_choosing(lambda task: {"a_knob_long_gone": 1})).json()["job"])
    assert job["state"] == "done", job["error"]
    assert any("warning:" in line and "a_knob_long_gone" in line for line in job["log"])


def test_a_corrupted_log_is_refused(serve):
    client = serve()
    response = post(client, conv_model().SerializeToString(), '{"task": {}}\nnot json\n')
    assert response.status_code == 400
    message = response.json()["error"]
    assert "'log.jsonl' line 1 is not a record" in message and "uploads" not in message


def test_tuning_sessions_refuse_bad_requests(serve):
    client = serve()
    model = ("conv.onnx", conv_model().SerializeToString(), "application/octet-stream")
    response = client.post("/api/tune", files={"file": model}, data={"trials": "0"})
    assert response.status_code == 400 and "trials must be between 1 and" in response.json()["error"]
    assert client.post("/api/tune", data={"trials": "4"}).status_code == 400
    assert client.get("/api/tune/nosuchsession/next").status_code == 404
    assert "no tuning session" in client.get("/api/tune/nosuchsession").json()["error"]
