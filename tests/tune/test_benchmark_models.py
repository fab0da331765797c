"""benchmarks/tune.py's own models (shapes nobody tuned for): transformer77 compiles and agrees with onnxruntime
with its fallback configs and with a record that moves its largest MatMul to other points of the new dense knobs
(unroll_k, parallel, pack_b), and its MatMuls are the odd shapes it promises."""

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
    dense = [task for task in extract_tasks(model, "llvm") if task.template == "dense"]
    shapes = {tuple(map(tuple, (task.workload["inputs"][0][0], task.workload["inputs"][1][0]))) for task in dense}
    assert ((1, 77, 120), (120, 420)) in shapes and ((1, 77, 420), (420, 120)) in shapes
    assert ((1, 5, 77, 24), (1, 5, 24, 77)) in shapes


@pytest.mark.parametrize("target", ["llvm", "wasm"])
def test_transformer77_with_other_dense_configs_agrees_with_onnxruntime(tune_benchmark, target, tmp_path):
    model, feeds = tune_benchmark.model_of("transformer77")
    expected = expected_outputs(model, feeds)
    tasks = [task for task in extract_tasks(model, target) if task.template == "dense"]
    records = tmp_path / "records.jsonl"
    with records.open("w") as log:
        for number, task in enumerate(tasks):
            # every MatMul away from its fallback: packed panels, k unrolled, the outer tile loop alone parallel
            # where the space has it
            unroll_k = 2 if (task.space.knobs["unroll_k"].extent % 2 == 0) else 1
            fitting = [
                config
                for config in task.space.valid_configs()
                if config["pack_b"].val == 1
                and config["unroll_k"].size[-1] == unroll_k
                and ("parallel" not in task.space.knobs or config["parallel"].val == "outer")
            ]
            config = fitting[number % len(fitting)]
            record = {"task": task.to_json(), "config": config.to_json(), "seconds": 1e-3, "error": None}
            log.write(json.dumps(record) + "\n")
    module = compiler.compile_model(model, target=target, tuning_records=records)
    for ours, theirs in zip(module.run(feeds).values(), expected):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
