"""benchmarks/tune.py's own models (shapes nobody tuned for): transformer77 compiles and agrees with onnxruntime
with its fallback configs and with records that move each of its MatMuls and its attention away from the fallback,
and its MatMuls are the odd shapes it promises."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import compiler
from compiler.tune.task import extract_tasks

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def tune_benchmark():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("tune_benchmark", BENCHMARKS / "tune.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def expected_outputs(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_transformer77_has_the_shapes_it_promises(tune_benchmark):
    model, _ = tune_benchmark.model_of("transformer77")
    tasks = extract_tasks(model, "llvm")
    projections = {
        (tuple(task.workload["inputs"][0][0]), task.workload["ops"][0]["outputs"][0][0][-1])
        for task in tasks
        if task.template == "dense_packed"
    }
    assert ((1, 77, 120), 420) in projections and ((1, 77, 420), 120) in projections
    (attention,) = {tuple(task.workload["inputs"][0][0]) for task in tasks if task.template == "attention"}
    assert attention == (1, 5, 77, 24)


@pytest.mark.parametrize("target", ["llvm", "wasm"])
def test_transformer77_with_other_matmul_configs_agrees_with_onnxruntime(tune_benchmark, target, tmp_path):
    model, feeds = tune_benchmark.model_of("transformer77")
    expected = expected_outputs(model, feeds)
    tasks = [task for task in extract_tasks(model, target) if task.template in ("dense_packed", "attention")]
    assert {task.template for task in tasks} == {"dense_packed", "attention"}
    records = tmp_path / "records.jsonl"
    with records.open("w") as log:
        for number, task in enumerate(tasks):
            # every MatMul and attention away from its fallback
            others = [
                config for config in task.space.valid_configs() if config.to_json() != task.space.fallback.to_json()
            ]
            config = others[(number * 7) % len(others)]
            record = {"task": task.to_json(), "config": config.to_json(), "seconds": 1e-3, "error": None}
            log.write(json.dumps(record) + "\n")
    module = compiler.compile_model(model, target=target, tuning_records=records)
    for ours, theirs in zip(module.run(feeds).values(), expected):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
