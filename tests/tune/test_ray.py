"""Measuring on Ray (compiler/tune/ray_runner.py) with a local instance of two CPUs: builds as Ray tasks, timing in a
node's measuring actor, the log written by the driver alone, and a crashing candidate that costs the actor nothing."""

import functools
import json

import pytest

from compiler.tune.measure import Measurer
from compiler.tune.records import RecordLog, read_records
from tests.tune.test_measure import broken_build, small_conv_task

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'tessel[ray]')")


@pytest.fixture(scope="module")
def cluster():
    from compiler.tune.ray_runner import ray_measuring

    builder, runner = ray_measuring("local", num_cpus=2, include_dashboard=False)
    yield builder, runner
    runner.close()
    ray.shutdown()


def test_a_local_ray_cluster_tunes_a_small_task(cluster, tmp_path):
    builder, runner = cluster
    assert runner.devices == 1
    task = small_conv_task()
    configs = list(task.space.valid_configs())[:4]
    with RecordLog(tmp_path / "log.jsonl") as log, Measurer(task, builder=builder, runner=runner, records=log) as m:
        results = m.measure(configs)
    assert all(result.error is None and result.seconds > 0 for result in results)
    records = read_records(tmp_path / "log.jsonl")
    assert [record["config"] for record in records] == [task.space.fallback.to_json(), *(c.to_json() for c in configs)]


def test_a_crashing_candidate_on_ray_is_recorded_and_the_actor_goes_on(cluster):
    _, runner = cluster
    task = small_conv_task()
    configs = list(task.space.valid_configs())[:2]
    plan = {json.dumps(configs[0].to_json(), sort_keys=True): "crash"}
    from compiler.tune.measure import LocalBuilder

    local = LocalBuilder(1, functools.partial(broken_build, plan))
    try:
        with Measurer(task, builder=local, runner=runner) as measurer:
            crashed, fine = measurer.measure(configs)
    finally:
        local.close()
    assert crashed.error.startswith("run: crashed") and "SIGSEGV" in crashed.error
    assert fine.error is None and fine.seconds > 0
