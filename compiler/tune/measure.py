"""Measuring tuning candidates: a builder compiles configs of a task's template into libraries (a pool of worker
processes), a runner times them where a crash or a hang cannot take the tuner down (a worker process; Ray actors in
tune/ray_runner.py), after checking each one's outputs against the fallback config's. Beside the drivers: it reads
tune/task.py's tasks and uses the schedules, lowering, codegen and build.py's link like compile_model does."""

from __future__ import annotations

import json
import math
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Protocol

import numpy as np

from compiler.backends import backend_for
from compiler.compute import group_to_te
from compiler.errors import TuningError
from compiler.runtime import ArgSpec
from compiler.runtime.native import aligned_buffer, default_num_threads
from compiler.schedules import schedule_group
from compiler.schedules.space import Config, ConfigSpace
from compiler.target import Target
from compiler.tir.lower import lower
from compiler.tune.records import RecordLog, config_key
from compiler.tune.task import Task

# Each repeat calls the kernel this long at least (when `number` is not given), so a repeat's mean is not timer noise.
MIN_REPEAT_SECONDS = 0.01
# A build that takes longer is abandoned (an LLVM optimisation that never ends is a failed candidate, too).
BUILD_SECONDS = 120.0
# Candidate outputs agree with the fallback's within this (other tilings sum in other orders).
RTOL, ATOL = 1e-4, 1e-5
# Confirmation (Measurer.confirm): the search's best few configs and the fallback are measured again in this many
# interleaved rounds, and a config replaces the fallback only when its fastest round is at least MIN_GAIN below the
# fallback's, its median below the fallback's, and the rounds' paired ratios support it (confirmed_faster).
CONFIRM_ROUNDS = 5
CONFIRM_CANDIDATES = 3
MIN_GAIN = 0.02


@dataclass(frozen=True)
class Timing:
    """How a runner times a candidate: `repeat` means of `number` calls each (None: enough calls to fill
    MIN_REPEAT_SECONDS), the seconds it may take in all before it counts as hung, and the threads it runs on."""

    repeat: int = 3
    number: int | None = None
    timeout: float = 10.0
    num_threads: int | None = None  # native kernels' threads (None: the runtime's default, as a model runs)


@dataclass
class Built:
    """One compiled candidate, self-contained so that any runner (a local process, a Ray actor) can time it: its
    library, its kernel's arguments (the last `outputs` of them are written), the inputs' seed and the outputs to
    match (None for the fallback's own run)."""

    config: dict
    target: Target
    name: str
    library: bytes | None
    specs: tuple[ArgSpec, ...] = ()
    outputs: int = 0
    error: str | None = None
    build_seconds: float = 0.0
    timing: Timing = field(default_factory=Timing)
    seed: int = 0
    reference: list[np.ndarray] | None = None


@dataclass
class MeasureResult:
    config: Config
    seconds: float | None  # min over repeats of the mean time of one call; None when error
    error: str | None  # "build: ...", "run: ...", "timeout: ...", "wrong result: ..."
    build_seconds: float


@dataclass
class Confirmation:
    """A task's confirmation: the seconds of each re-measured config in each round (None for a failed one, keyed by
    records.config_key) and the config a compile should use: the one with the fastest round among those
    confirmed_faster than the fallback, else the fallback. The seconds are fastest rounds (round_seconds)."""

    rounds: dict[str, list[float | None]]
    chosen: Config
    chosen_seconds: float | None
    fallback_seconds: float | None


def round_seconds(times: Sequence[float | None], statistic=min) -> float | None:
    """A statistic (the fastest, by default) of a config's rounds; None when any failed (a config that fails once
    is not trusted). Load only ever adds time, so the fastest round is the closest to the kernel's own time."""
    if not times or any(seconds is None for seconds in times):
        return None
    return float(statistic(times))


def confirmed_faster(candidate: Sequence[float | None], fallback: Sequence[float | None]) -> bool:
    """Whether a candidate's rounds show it faster than the fallback's, by three tests that each catch a way load
    fools one: its fastest round is below 1 - MIN_GAIN times the fallback's (on a machine whose load switches
    between a fast and a several-times slower state from one timing to the next, the medians and ratios follow
    which config happened to draw the slow state; the fastest rounds do not); its median is below the fallback's
    (a single lucky round); and round by round (each round measures both within moments of each other, so a load
    that comes and goes affects both alike) the median of the ratios is below 1 - MIN_GAIN and stays below 1 when
    raised by twice its standard error (from the ratios' median absolute deviation)."""
    if round_seconds(candidate) is None or round_seconds(fallback) is None or len(candidate) != len(fallback):
        return False
    if round_seconds(candidate) >= (1.0 - MIN_GAIN) * round_seconds(fallback):
        return False
    if round_seconds(candidate, np.median) >= round_seconds(fallback, np.median):
        return False
    ratios = np.asarray(candidate, dtype=float) / np.asarray(fallback, dtype=float)
    middle = float(np.median(ratios))
    spread = 1.4826 * float(np.median(np.abs(ratios - middle)))
    return middle < 1.0 - MIN_GAIN and middle + 2.0 * spread / math.sqrt(len(ratios)) < 1.0


@dataclass(frozen=True)
class BuildJob:
    """What a builder needs for one config: the task's fused node, the target, the knob values and a kernel name."""

    node: object
    target: Target
    config: dict
    name: str = "candidate"


class Builder(Protocol):
    def build(self, jobs: list[BuildJob]) -> list[Built]: ...


class Runner(Protocol):
    """Anything that takes built candidates and returns (seconds, error) for each. A runner that also has
    `outputs(built) -> list[np.ndarray]` computes the fallback's reference outputs too; otherwise a local one does."""

    def run(self, built: list[Built]) -> list[tuple[float | None, str | None]]: ...


# -- building (runs in builder processes) ----------------------------------------------------------------------------


def build_candidate(job: BuildJob) -> Built:
    """Schedule the task's group with the job's config by its target family's templates, lower it, and compile it
    with its backend's kernel builder (backends.py), as compile_model does."""
    started = time.perf_counter()
    try:
        group = group_to_te(job.node)
        cfg = ConfigSpace(job.config)
        schedule = schedule_group(group, job.target, cfg)
        if cfg.misfits():
            raise TuningError(f"the config does not fit template {cfg.template!r}: {'; '.join(cfg.misfits())}")
        func = lower(schedule, [*group.inputs, *group.outputs], job.name)
        library = backend_for(job.target).build_kernel(func, job.target).library
    except Exception as error:  # noqa: BLE001 - any failure of one candidate is recorded and the search goes on
        return Built(job.config, job.target, job.name, None, error=f"build: {type(error).__name__}: {error}")
    specs = tuple(ArgSpec(buffer.name, tuple(buffer.shape), buffer.dtype) for buffer in func.params)
    return Built(
        job.config, job.target, job.name, library, specs, len(group.outputs), None, time.perf_counter() - started
    )


# -- running (runs in runner processes) ------------------------------------------------------------------------------


def probe_arrays(specs: Sequence[ArgSpec], outputs: int, seed: int) -> list[np.ndarray]:
    """The kernel's arguments, 64-byte aligned: float inputs standard normal, integer inputs zero (an index valid for
    any axis), booleans random; outputs NaN (floats) or random bytes, so an element a candidate leaves unwritten
    shows as a difference from the fallback's."""
    generator = np.random.default_rng(seed)
    arrays = []
    for position, spec in enumerate(specs):
        dtype = np.dtype(spec.dtype)
        array = aligned_buffer(math.prod(spec.shape) * dtype.itemsize).view(dtype).reshape(spec.shape)
        written = position >= len(specs) - outputs
        if dtype.kind == "f":
            array[...] = np.nan if written else generator.standard_normal(spec.shape)
        elif written:
            raw = array.reshape(-1).view(np.uint8)
            raw[...] = generator.integers(0, 256, raw.shape, np.uint8)
        elif dtype.kind == "b":
            array[...] = generator.integers(0, 2, spec.shape).astype(bool)
        arrays.append(array)
    return arrays


def _bound(built: Built):
    """How a runner process calls a built candidate over its probe arrays, placed once: its backend's `bind`."""
    arrays = probe_arrays(built.specs, built.outputs, built.seed)
    return backend_for(built.target).bind(
        built.library, built.name, built.specs, arrays, built.outputs, built.target, built.timing.num_threads
    )


def candidate_outputs(built: Built) -> list[np.ndarray]:
    """The outputs of one call of the candidate on its probe inputs."""
    call, read = _bound(built)
    call()
    return read()


def mismatch(outputs: list[np.ndarray], reference: list[np.ndarray]) -> str | None:
    """Why a candidate's outputs are not the fallback's, or None when they agree."""
    for position, (output, expected) in enumerate(zip(outputs, reference)):
        if expected.dtype.kind != "f":
            wrong = output != expected
        else:
            finite = np.abs(expected[np.isfinite(expected)])
            atol = ATOL * max(1.0, float(finite.max()) if finite.size else 1.0)
            close = np.isclose(output, expected, rtol=RTOL, atol=atol, equal_nan=True)
            wrong = ~close
        if wrong.any():
            index = tuple(int(i) for i in np.argwhere(wrong)[0])
            return (
                f"wrong result: output {position} differs from the fallback config's at {int(wrong.sum())} of "
                f"{wrong.size} elements (first at {list(index)}: {output[index]!r}, expected {expected[index]!r})"
            )
    return None


def time_candidate(built: Built) -> tuple[float | None, str | None]:
    """Check the candidate's outputs against its reference, then the minimum over repeats of the mean of `number`
    calls."""
    try:
        call, read = _bound(built)
        call()
        if built.reference is not None:
            wrong = mismatch(read(), built.reference)
            if wrong:
                return None, wrong
        number = built.timing.number
        if number is None:
            started = time.perf_counter()
            call()
            number = max(1, math.ceil(MIN_REPEAT_SECONDS / max(time.perf_counter() - started, 1e-9)))
        means = []
        for _ in range(built.timing.repeat):
            started = time.perf_counter()
            for _ in range(number):
                call()
            means.append((time.perf_counter() - started) / number)
        return min(means), None
    except Exception as error:  # noqa: BLE001 - a failing candidate is recorded, the search goes on
        return None, f"run: {type(error).__name__}: {error}"


# -- worker processes ------------------------------------------------------------------------------------------------


def _serve(connection) -> None:
    """A worker's loop: call (function, argument) pairs and send back (result, None) or (None, error). Ctrl-C
    reaches the whole process group, so a worker ignores SIGINT from its first line: the driver handles it and
    stops its workers."""
    while True:
        try:
            function, argument = connection.recv()
        except EOFError:
            return
        try:
            connection.send((function(argument), None))
        except Exception as error:  # noqa: BLE001
            connection.send((None, f"{type(error).__name__}: {error}"))


# A worker is a fresh interpreter on the driver's import path, not a fork of the driver: it inherits no threads, no
# loaded candidate and no Ray or display state, and it never re-runs the driver's __main__ (as spawn would).
_WORKER = """
import json, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
sys.path[:0] = json.loads(sys.argv[1])
from multiprocessing.connection import Connection
from compiler.tune.measure import _serve
connection = Connection(int(sys.argv[2]))
connection.send("ready")
_serve(connection)
"""
# A worker is started when it has imported the compiler: none is still importing while a candidate is timed.
START_SECONDS = 120.0


class _Worker:
    def __init__(self):
        self.launch()

    def launch(self) -> None:
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WORKER, json.dumps(sys.path), str(theirs.fileno())], pass_fds=[theirs.fileno()]
        )
        theirs.close()
        self.connection = Connection(ours.detach())

    def wait_ready(self) -> None:
        try:
            ready = self.connection.poll(START_SECONDS) and self.connection.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            raise TuningError(f"a measuring worker process did not start in {START_SECONDS:g} s ({self.death()})")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.connection.close()

    def restart(self) -> None:
        self.stop()
        self.launch()
        self.wait_ready()

    def death(self) -> str:
        """Why the worker is gone: the signal that killed it or its exit status."""
        try:
            code = self.process.wait(5)
        except subprocess.TimeoutExpired:
            return "the process stopped answering"
        if code < 0:
            return f"the process was killed by {signal.Signals(-code).name}"
        return f"the process exited with status {code}"


class WorkerPool:
    """Worker processes. `map` hands out one call per worker at a time; a worker that dies or overruns its timeout is
    replaced and its call fails, the others go on."""

    def __init__(self, size: int):
        self.workers = [_Worker() for _ in range(max(1, size))]
        for worker in self.workers:
            worker.wait_ready()

    def map(self, function: Callable, arguments: list, timeout: Callable | float) -> list[tuple[object, str | None]]:
        """(result, None) or (None, error) per argument, in order; `timeout`: seconds, or argument -> seconds."""
        seconds = timeout if callable(timeout) else lambda _: timeout
        results: list = [None] * len(arguments)
        pending = list(enumerate(arguments))[::-1]
        idle = list(self.workers)
        busy: dict = {}
        while pending or busy:
            while pending and idle:
                worker = idle.pop()
                index, argument = pending.pop()
                worker.connection.send((function, argument))
                busy[worker.connection] = (worker, index, time.monotonic() + seconds(argument))
            earliest = min(deadline for _, _, deadline in busy.values())
            for connection in wait(list(busy), timeout=max(0.0, earliest - time.monotonic())):
                worker, index, _ = busy.pop(connection)
                try:
                    results[index] = connection.recv()
                except (EOFError, OSError):
                    results[index] = (None, f"crashed: {worker.death()}")
                    worker.restart()
                idle.append(worker)
            now = time.monotonic()
            for connection, (worker, index, deadline) in list(busy.items()):
                if deadline <= now:
                    del busy[connection]
                    results[index] = (None, f"timeout: no answer in {seconds(arguments[index]):g} s")
                    worker.restart()
                    idle.append(worker)
        return results

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()


class LocalBuilder:
    """Builds in a pool of `workers` processes (default: one per core this process may use)."""

    def __init__(self, workers: int | None = None, function: Callable[[BuildJob], Built] = build_candidate):
        self.pool = WorkerPool(workers or default_num_threads())
        self.function = function

    def build(self, jobs: list[BuildJob]) -> list[Built]:
        built = []
        for job, (result, error) in zip(jobs, self.pool.map(self.function, jobs, BUILD_SECONDS)):
            built.append(
                result if error is None else Built(job.config, job.target, job.name, None, error=f"build: {error}")
            )
        return built

    def close(self) -> None:
        self.pool.close()


class LocalRunner:
    """Times candidates one at a time in one worker process, so they do not compete for the cores; a candidate that
    crashes or hangs costs a process restart."""

    def __init__(self):
        self.pool = WorkerPool(1)

    def run(self, built: list[Built]) -> list[tuple[float | None, str | None]]:
        answers = self.pool.map(time_candidate, built, lambda candidate: candidate.timing.timeout)
        return [result if error is None else (None, f"run: {error}") for result, error in answers]

    def outputs(self, built: Built) -> list[np.ndarray]:
        ((result, error),) = self.pool.map(candidate_outputs, [built], built.timing.timeout)
        if error is not None:
            raise TuningError(f"the fallback config's kernel does not run ({error}); tuning cannot check candidates")
        return result

    def close(self) -> None:
        self.pool.close()


# -- the measurer a tuner calls ---------------------------------------------------------------------------------------


def flops(task: Task) -> int:
    """The task's arithmetic: 2 x the multiply-adds of its anchor reduction, else one operation per output element
    (what GFLOP/s in the progress and the report count)."""
    group = group_to_te(task.node)
    anchor = group.anchor
    reduce_axis = getattr(anchor.op, "reduce_axis", ()) if anchor is not None else ()
    if reduce_axis:
        return 2 * math.prod(anchor.shape) * math.prod(axis.extent for axis in reduce_axis)
    return sum(math.prod(tensor.shape) for tensor in group.outputs)


class Measurer:
    """Measures configs of one task on one target; built once per task and reused for every batch. Builder and
    runner are shared between measurers when given (the caller closes them), else made here and closed by close().
    With `records` (a RecordLog), configs the log already holds for the task are answered from it (a resumed run
    replays them at once) and every new measurement is appended to it. Each new result is handed to every callback
    (task, result) as it is known. The fallback config is measured first, once: the report's "default"."""

    def __init__(
        self,
        task: Task,
        target: Target | str | None = None,
        runner: Runner | None = None,
        repeat: int = 3,
        number: int | None = None,
        timeout: float = 10.0,
        workers: int | None = None,
        builder: Builder | None = None,
        records: RecordLog | None = None,
        callbacks: Sequence[Callable[[Task, MeasureResult], None]] = (),
        seed: int = 0,
        num_threads: int | None = None,
    ):
        self.task = task
        self.target = Target.parse(target if target is not None else task.target)
        self.timing = Timing(repeat, number, timeout, num_threads)
        self.records = records
        self.seed = seed
        self.callbacks = list(callbacks)
        self._owned = []
        if builder is None:
            builder = LocalBuilder(workers)
            self._owned.append(builder)
        if runner is None:
            runner = LocalRunner()
            self._owned.append(runner)
        self.builder, self.runner = builder, runner
        self._reference: list[np.ndarray] | None = None
        self._fallback_built: Built | None = None
        # this run's candidates that built, by config key, so confirm() times them again without rebuilding
        self._built: dict[str, Built] = {}
        self.default: MeasureResult | None = None
        self.flops = flops(task)

    def _jobs(self, configs: list[Config]) -> list[BuildJob]:
        return [BuildJob(self.task.node, self.target, config.to_json()) for config in configs]

    def reference(self) -> list[np.ndarray]:
        """The fallback config's outputs on the probe inputs (built and run once, on first use)."""
        if self._reference is None:
            (built,) = self.builder.build(self._jobs([self.task.space.fallback]))
            if built.error is not None:
                raise TuningError(f"the fallback config of task {self.task.template!r} does not build ({built.error})")
            built.timing, built.seed = self.timing, self.seed
            runner = self.runner if hasattr(self.runner, "outputs") else LocalRunner()
            try:
                self._reference = runner.outputs(built)
                self._fallback_built = built
            finally:
                if runner is not self.runner:
                    runner.close()
        return self._reference

    def _recorded(self, config: Config) -> MeasureResult | None:
        if self.records is None:
            return None
        record = self.records.done.get(self.task.key, {}).get(config_key(config.to_json()))
        if record is None:
            return None
        return MeasureResult(config, record["seconds"], record.get("error"), record.get("build_seconds", 0.0))

    def measure(self, configs: list[Config]) -> list[MeasureResult]:
        """Build every config (in parallel), then time the ones that built, one after another."""
        fallback = self.task.space.fallback
        if self.default is None:
            try:
                self.reference()
            except TuningError as error:
                # no candidate can be checked without the fallback's outputs: this task's configs fail (and are
                # logged so), the model's other tasks go on
                self.default = MeasureResult(fallback, None, f"no reference: {error}", 0.0)
            else:
                # the reference run's build is the default's: the fallback is compiled once per task
                self.default = self._recorded(fallback) or self._measure([fallback], [self._fallback_built])[0]
        if self._reference is None:
            failed = [
                Built(config.to_json(), self.target, "candidate", None, error=self.default.error) for config in configs
            ]
            return [self._finish(config, built, fallback, iter(())) for config, built in zip(configs, failed)]
        results = {
            index: self.default if config == fallback else self._recorded(config)
            for index, config in enumerate(configs)
        }
        # callbacks see fresh measurements only: the others were reported when they were measured
        fresh = [index for index, result in results.items() if result is None]
        results.update(zip(fresh, self._measure([configs[index] for index in fresh])))
        return [results[index] for index in range(len(configs))]

    def _measure(self, configs: list[Config], built: list[Built] | None = None) -> list[MeasureResult]:
        reference = self.reference()
        if built is None:
            built = self.builder.build(self._jobs(configs)) if configs else []
        for config, candidate in zip(configs, built):
            candidate.timing, candidate.seed, candidate.reference = self.timing, self.seed, reference
            if candidate.error is None:
                self._built[config_key(config.to_json())] = candidate
        # the runner gets as many candidates at a time as it has devices, so each is recorded as soon as it is timed
        # (a stopped run loses at most those) while every device stays busy
        devices = max(1, getattr(self.runner, "devices", 1))
        results = []
        fallback = self.task.space.fallback
        for start in range(0, len(built), devices):
            chunk = built[start : start + devices]
            ready = [candidate for candidate in chunk if candidate.error is None]
            times = iter(self.runner.run(ready) if ready else [])
            results += [
                self._finish(config, candidate, fallback, times) for config, candidate in zip(configs[start:], chunk)
            ]
        return results

    def _finish(self, config: Config, candidate: Built, fallback: Config, times) -> MeasureResult:
        seconds, error = (None, candidate.error) if candidate.error is not None else next(times)
        result = MeasureResult(config, seconds, error, candidate.build_seconds)
        if self.records is not None:
            self.records.write(
                self.task.to_json(),
                config.to_json(),
                seconds,
                error,
                build_seconds=round(candidate.build_seconds, 4),
                fallback=config == fallback,
                flops=self.flops,
            )
        for callback in self.callbacks:
            callback(self.task, result)
        return result

    def confirm(self, configs: Sequence[Config], rounds: int = CONFIRM_ROUNDS) -> Confirmation | None:
        """Measure the fallback and `configs` (the search's best) again, in `rounds` rounds that each time every one
        of them once, the order reversed every other round, and decide which config a compile gets (Confirmation).
        One measurement taken in a quiet moment then cannot decide it: on a loaded machine a config's single times
        vary several-fold. Each re-measured config's fastest round is appended to the log with its rounds
        ("confirmation") and whether it is the choice ("chosen"), which records.best_records prefers to any single
        measurement. None when the fallback itself does not run (nothing to compare with)."""
        fallback = self.task.space.fallback
        contenders = [fallback, *dict.fromkeys(config for config in configs if config != fallback)]
        try:
            self.reference()
        except TuningError:
            return None
        self._built.setdefault(config_key(fallback.to_json()), self._fallback_built)
        missing = [config for config in contenders if config_key(config.to_json()) not in self._built]
        # a resumed run's configs, measured by an earlier process: built here for the first time (not logged again)
        for config, candidate in zip(missing, self.builder.build(self._jobs(missing)) if missing else []):
            if candidate.error is None:
                candidate.timing, candidate.seed, candidate.reference = self.timing, self.seed, self._reference
                self._built[config_key(config.to_json())] = candidate
        ready = [config for config in contenders if config_key(config.to_json()) in self._built]
        times: dict[str, list[float | None]] = {config_key(config.to_json()): [] for config in ready}
        for number in range(rounds):
            for config in ready if number % 2 == 0 else ready[::-1]:
                # one candidate per call, so a runner with several devices times them all on one device
                ((seconds, _),) = self.runner.run([self._built[config_key(config.to_json())]])
                times[config_key(config.to_json())].append(seconds)
        fallback_times = times.get(config_key(fallback.to_json()), [None])
        faster = [
            config for config in ready[1:] if confirmed_faster(times[config_key(config.to_json())], fallback_times)
        ]
        chosen = min(faster, key=lambda config: round_seconds(times[config_key(config.to_json())]), default=fallback)
        if self.records is not None:
            for config in ready:
                rounds_of = times[config_key(config.to_json())]
                self.records.write(
                    self.task.to_json(), config.to_json(), round_seconds(rounds_of),
                    None if round_seconds(rounds_of) is not None else "confirmation: a round failed",
                    fallback=config == fallback, flops=self.flops, confirmation=rounds_of, chosen=config == chosen,
                )  # fmt: skip
        return Confirmation(
            times, chosen, round_seconds(times[config_key(chosen.to_json())]), round_seconds(fallback_times)
        )

    def close(self) -> None:
        for part in self._owned:
            part.close()
        self._owned = []

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
