"""Measuring on a Ray cluster (`tessel tune --ray auto|ADDRESS`): builds are Ray tasks spread over the cluster, and
each node gets one measuring actor, which times candidates in a worker process of its own (measure.py's LocalRunner),
so a crashing candidate costs a process, never the actor. Only the driver writes the log. Ray is an optional extra."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from compiler.errors import TuningError
from compiler.tune.measure import BUILD_SECONDS, BuildJob, Built, LocalRunner, build_candidate

# The folder `compiler` is imported from: a local cluster's workers get it on their path (a cluster of other machines
# installs tessel on each node instead).
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def _ray():
    try:
        import ray
    except ImportError:
        raise TuningError("--ray needs Ray: pip install 'tessel[ray]'") from None
    return ray


def connect(address: str, **options) -> None:
    """Join the cluster at `address` ("auto": the one `ray start` began on this machine; "local": a new one in this
    process, with `options` such as num_cpus) unless this process already has."""
    ray = _ray()
    if ray.is_initialized():
        return
    try:
        ray.init(
            address=address,
            runtime_env={"env_vars": {"PYTHONPATH": PACKAGE_ROOT}},
            log_to_driver=False,
            **options,
        )
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise TuningError(
            f"cannot reach a Ray cluster at {address!r} ({str(error).strip().splitlines()[0]}); start one with "
            "`ray start --head` or give its address (HOST:6379)"
        ) from None


class RayBuilder:
    """Builds as Ray tasks (one CPU each); a task whose worker dies or overruns BUILD_SECONDS fails that candidate."""

    def __init__(self):
        ray = _ray()
        self.remote = ray.remote(num_cpus=1, max_retries=0)(build_candidate)

    def build(self, jobs: list[BuildJob]) -> list[Built]:
        ray = _ray()
        references = [self.remote.remote(job) for job in jobs]
        done, late = ray.wait(references, num_returns=len(references), timeout=BUILD_SECONDS)
        built = []
        for job, reference in zip(jobs, references):
            if reference in late:
                ray.cancel(reference, force=True)
                built.append(Built(job.config, job.target, job.name, None, error=f"build: timeout: {BUILD_SECONDS} s"))
                continue
            try:
                built.append(ray.get(reference))
            except ray.exceptions.RayError as error:
                reason = str(error).strip().splitlines()[0]
                built.append(Built(job.config, job.target, job.name, None, error=f"build: crashed: {reason}"))
        return built

    def close(self) -> None:
        return None


class _Timer:
    """A node's measuring actor: candidates one at a time, in its own worker process."""

    def __init__(self):
        self.runner = LocalRunner()

    def run(self, built: list[Built]) -> list[tuple[float | None, str | None]]:
        return self.runner.run(built)

    def outputs(self, built: Built) -> list[np.ndarray]:
        return self.runner.outputs(built)

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


class RayRunner:
    """One measuring actor per alive node of the cluster (`devices` of them); a batch is dealt out among them."""

    def __init__(self):
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        timer = ray.remote(num_cpus=1, max_restarts=-1)(_Timer)
        nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"] and node["Resources"].get("CPU", 0) >= 1]
        if not nodes:
            raise TuningError("the Ray cluster has no node with a CPU to measure on")
        self.actors = [
            timer.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
            for node in nodes
        ]

    @property
    def devices(self) -> int:
        return len(self.actors)

    def run(self, built: list[Built]) -> list[tuple[float | None, str | None]]:
        ray = _ray()
        references = [
            self.actors[position % len(self.actors)].run.remote([item]) for position, item in enumerate(built)
        ]
        answers = []
        for reference in references:
            try:
                answers += ray.get(reference)
            except ray.exceptions.RayError as error:
                answers.append((None, f"run: crashed: {str(error).strip().splitlines()[0]}"))
        return answers

    def outputs(self, built: Built) -> list[np.ndarray]:
        return _ray().get(self.actors[0].outputs.remote(built))

    def close(self) -> None:
        ray = _ray()
        for actor in self.actors:
            ray.kill(actor)


def ray_measuring(address: str, **options) -> tuple[RayBuilder, RayRunner]:
    connect(address, **options)
    return RayBuilder(), RayRunner()
