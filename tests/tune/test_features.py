"""Features of candidate configs (compiler/tune/features.py) on real zoo tasks: finite, different between configs,
one length for every template (so a model trained on some tasks reads another's), and the FLOPs they count equal to
the workload's own count whatever the schedule."""

import math

import numpy as np
import pytest

from compiler import zoo
from compiler.tune.features import LOOP_FEATURES, Featurizer, knob_features
from compiler.tune.task import extract_tasks


@pytest.fixture(scope="module")
def tasks():
    return extract_tasks(zoo.build_model("bert_tiny"), "llvm") + extract_tasks(zoo.build_model("squeezenet"), "llvm")


def test_features_are_finite_and_tell_configs_apart(tasks):
    for template in ("dense_packed", "attention", "conv2d_nchwc", "pool_max"):
        task = max((task for task in tasks if task.template == template), key=lambda task: len(task.space))
        configs = list(task.space.valid_configs())
        rows = Featurizer(task)(configs)
        assert rows.shape == (len(configs), len(LOOP_FEATURES) + len(knob_features(configs[0])))
        assert np.isfinite(rows).all()
        assert len({tuple(row) for row in rows}) == len(configs)
        # the loop-IR statistics alone separate most configs (not all: a reorder of loops that are then fused
        # into one parallel loop changes only how its index is split)
        loops = rows[:, : len(LOOP_FEATURES)]
        assert len({tuple(row) for row in loops}) >= len(configs) // 2, template


def test_loop_features_have_one_layout_for_every_template(tasks):
    widths = {len(Featurizer(task).loops(task.space.fallback)) for task in tasks}
    assert widths == {len(LOOP_FEATURES)}


def test_flops_are_the_workloads_whatever_the_schedule(tasks):
    """bert_tiny's projection: (1, 128, 128) x (128, 128) + bias is 2 * 128^3 multiply-adds' flops plus 128^2
    additions, in every config whose row tile divides the 128 rows (every 7th of those, every knob's values among
    them); its register block of tile_m rows by a 64-column panel follows the config. (A shorter last row tile makes
    the parallel loop branch per task, and the features count both branches for every task: an overestimate.)"""
    task = next(
        task
        for task in tasks
        if task.template == "dense_packed"
        and task.ops == ["MatMulPacked", "Add"]
        and task.workload["ops"][0]["outputs"][0][0] == [1, 128, 128]
    )
    featurizer = Featurizer(task)
    flops = LOOP_FEATURES.index("flops")
    local = LOOP_FEATURES.index("local_bytes")
    expected = math.log2(1 + 2 * 128**3 + 128**2)
    panel = task.workload["inputs"][1][0][-1]
    configs = [config for config in task.space.valid_configs() if 128 % config["tile_m"].size[-1] == 0][::7]
    assert all(len({config.choices[knob] for config in configs}) > 1 for knob in task.space.knobs)
    for config in configs:
        row = featurizer.loops(config)
        assert row[flops] == pytest.approx(expected)
        assert row[local] == pytest.approx(math.log2(1 + 4 * config["tile_m"].size[-1] * panel))
