"""Tuning logs (compiler/tune/records.py, RecordLog): a small real task tunes end to end into a log of whole JSON
lines, a second run resumes it without measuring again, compile_model applies the best config (checked against
onnxruntime), and the bundle's identity follows the configs applied, not the file's other lines."""

import json
import random

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler.build import compile_model
from compiler.errors import TuningError
from compiler.tune.measure import Measurer
from compiler.tune.records import RecordLog, best_records, read_records
from compiler.tune.task import extract_tasks

RNG = np.random.default_rng(0)


def conv_model() -> onnx.ModelProto:
    weight = numpy_helper.from_array(RNG.standard_normal((16, 8, 3, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 14, 14])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 7, 7])],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def tune(model, log_path, trials: int, seed: int = 0):
    """A few random configs of every task (a stand-in for the tuners of tune/tuners.py), measured into the log."""
    with RecordLog(log_path) as log:
        for task in extract_tasks(model, "llvm"):
            configs = list(task.space.valid_configs())
            random.Random(seed).shuffle(configs)
            with Measurer(task, workers=2, records=log) as measurer:
                measurer.measure(configs[:trials])


def test_a_small_model_tunes_into_a_log_that_compile_model_applies(tmp_path):
    model = conv_model()
    log_path = tmp_path / "log.jsonl"
    tune(model, log_path, trials=4)
    records = read_records(log_path)
    tasks = extract_tasks(model, "llvm")
    assert {json.dumps(record["task"], sort_keys=True) for record in records} == {
        json.dumps(task.to_json(), sort_keys=True) for task in tasks
    }
    for record in records:
        assert {"task", "config", "seconds", "error", "version", "timestamp", "fallback", "flops"} <= record.keys()
    assert sum(record["fallback"] for record in records) == len(tasks)
    best = best_records(records)
    module = compile_model(model, target="llvm", tuning_records=log_path)
    applied = [kernel["config"] for kernel in module.manifest["kernels"]]
    assert applied == [best[task.key]["config"] for task in tasks]
    feeds = {"x": RNG.standard_normal((1, 8, 14, 14)).astype(np.float32)}
    expected = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(module.run(feeds)["y"], expected, rtol=1e-4, atol=1e-5)

    # a resumed run answers the configs it has from the log (same seconds) and appends only new ones
    tune(model, log_path, trials=5)
    again = read_records(log_path)
    assert again[: len(records)] == records and len(again) == len(records) + len(tasks)

    # the identity follows the configs applied: a line that changes no choice leaves it alone, another best changes it
    before = module.manifest["content_hash"]
    with open(log_path, "a") as file:
        file.write(json.dumps(dict(best[tasks[0].key], seconds=1.0)) + "\n")
    assert compile_model(model, target="llvm", tuning_records=log_path).manifest["content_hash"] == before
    first = best[tasks[0].key]
    other = next(r for r in records if r["task"] == first["task"] and r["config"] != first["config"] and r["seconds"])
    with open(log_path, "a") as file:
        file.write(json.dumps(dict(other, seconds=1e-9)) + "\n")
    assert compile_model(model, target="llvm", tuning_records=log_path).manifest["content_hash"] != before


def test_a_run_killed_mid_line_resumes_and_a_corrupted_line_is_an_error(tmp_path):
    model = conv_model()
    log_path = tmp_path / "log.jsonl"
    tune(model, log_path, trials=1)
    whole = log_path.read_text()
    log_path.write_text(whole + '{"task": {"template": "con')
    with RecordLog(log_path) as log:
        assert sum(len(done) for done in log.done.values()) == len(whole.splitlines())
    assert log_path.read_text() == whole
    lines = whole.splitlines()
    log_path.write_text("\n".join([lines[0], "not json", *lines[1:]]) + "\n")
    with pytest.raises(TuningError, match="line 2 is not a record"):
        RecordLog(log_path)
    with pytest.raises(TuningError, match="line 2 is not a record"):
        compile_model(model, target="llvm", tuning_records=log_path)
