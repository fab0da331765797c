"""Transfer (compiler/tune/cost_model.py): records of some tasks, read back from a records file, rebuild their tasks
and pretrain a cost model on loop-IR features; the xgb tuner of a task it never saw, warm-started by it, reaches
that task's optimum in fewer trials than a cold start."""

import json
import math

import numpy as np
import pytest

from compiler import zoo
from compiler.tune.cost_model import pretrain_records
from compiler.tune.records import read_records
from compiler.tune.task import extract_tasks, task_from_json
from compiler.tune.tuners import make_tuner


def seconds(task, config) -> float:
    """A synthetic cost that every MatMul by a packed weight shares, of its register block and k loop: best at 3 rows
    unrolled, the k loop unrolled by 2, the row tiles outermost and every tile a task, each doubling away from it 30%
    slower per unit of squared distance (10% for each other knob), times the task's work."""
    rows, unroll = config["tile_m"].size[-1], config["unroll_k"].size[-1]
    others = (config["unroll_m"].val != 1) + (config["tile_order"].perm != (0, 1)) + (config["parallel"].val != "tiles")
    work = math.prod(task.workload["ops"][0]["outputs"][0][0])
    return (
        1e-9
        * work
        * (1 + 0.3 * (math.log2(rows) - math.log2(3)) ** 2 + 0.3 * (math.log2(unroll) - 1) ** 2 + 0.1 * others)
    )


@pytest.fixture(scope="module")
def matmuls():
    tasks = extract_tasks(zoo.build_model("bert_tiny"), "llvm") + extract_tasks(zoo.build_model("vit_tiny"), "llvm")
    found = {}
    for task in tasks:
        if task.template == "dense_packed":
            found.setdefault(task.key, task)
    return list(found.values())


def test_a_records_task_is_rebuilt_from_its_workload(matmuls):
    for task in matmuls:
        rebuilt = task_from_json(json.loads(json.dumps(task.to_json())))
        assert rebuilt is not None and rebuilt.key == task.key and rebuilt.template == task.template
        assert [config.to_json() for config in rebuilt.space.valid_configs()] == [
            config.to_json() for config in task.space.valid_configs()
        ]
    other_version = {**matmuls[0].to_json(), "space_version": -1}
    assert task_from_json(other_version) is None


BUDGET = 40


def trials_to_optimum(task, pretrained, seed: int) -> int:
    """The trial that first measures the optimum (BUDGET + 1 when none of BUDGET does)."""
    best = min(seconds(task, config) for config in task.space.valid_configs())
    measured = []

    def measure(configs):
        measured.extend(configs)
        return [type("Result", (), {"config": c, "seconds": seconds(task, c)}) for c in configs]

    make_tuner("xgb", task, seed=seed, pretrained=pretrained).tune(BUDGET, measure, batch_size=8)
    return next((trial for trial, config in enumerate(measured, 1) if seconds(task, config) == best), BUDGET + 1)


def test_a_pretrained_model_warm_starts_a_new_task(matmuls, tmp_path):
    """Records of three MatMuls of other shapes (bert_tiny's and vit_tiny's projections, 48 configs each) train the model; the
    new task is the largest space whose fallback is not already the optimum (the first trial measures the fallback).
    (Measured: warm starts find the optimum at trial 2, right after the fallback, for every seed; cold starts at
    trials 9, 11 and 17.)"""

    def fallback_is_best(task) -> bool:
        return seconds(task, task.space.fallback) == min(seconds(task, c) for c in task.space.valid_configs())

    new = max((task for task in matmuls if not fallback_is_best(task)), key=lambda task: len(task.space))
    others = sorted((task for task in matmuls if task is not new), key=lambda task: -len(task.space))
    others = others[::3][:3]
    path = tmp_path / "others.jsonl"
    rng = np.random.default_rng(0)
    with path.open("w") as records:
        for task in others:
            configs = list(task.space.valid_configs())
            for position in rng.choice(len(configs), min(48, len(configs)), replace=False):
                config = configs[position]
                record = {"task": task.to_json(), "config": config.to_json(), "seconds": seconds(task, config)}
                records.write(json.dumps(record) + "\n")
    pretrained = pretrain_records(read_records(path), exclude=[new.key])
    assert pretrained is not None
    cold = [trials_to_optimum(new, None, seed) for seed in range(3)]
    warm = [trials_to_optimum(new, pretrained, seed) for seed in range(3)]
    # the fallback is trial 1; the pretrained model's first ranking already holds the optimum
    assert max(warm) <= 9 and np.mean(warm) < np.mean(cold), (warm, cold)
