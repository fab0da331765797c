"""The compile queue: jobs wait in line, then run compiler.compile_model in a pool of worker processes
sized to the cores (never on the event loop), report progress back over a pipe, and leave bundles in the
Store; under `tessel serve --ray` the same queue runs them as Ray tasks instead (server/ray_jobs.py). app.py submits jobs and reads their state; a restart marks jobs it interrupted as failed."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import multiprocessing
import os
import resource
import secrets
import shutil
import sys
import threading
import time
import traceback
import warnings
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from compiler.build import EVERY_WASM_VARIANT, compile_model
from compiler.data import train_chars
from compiler.errors import ModelError, TargetError, TesselError, UnsupportedOpError
from compiler.frontend.onnx import load_onnx
from compiler.schedules.space import TuningWarning
from compiler.version import COMPILER_VERSION
from server.store import Store
from server.uploads import opened_model

QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"
FINISHED = (DONE, FAILED)
RESTART_MESSAGE = "the server restarted before this job finished; upload the model again"
# What the server asks of compile_model beyond the target, per target: every wasm bundle carries its threaded and
# relaxed-SIMD variants, so tessel.js runs the fastest one the page's engine has (docs/server.md, "Threaded wasm").
TARGET_OPTIONS = {"wasm": {"wasm_variants": EVERY_WASM_VARIANT}}


def error_status(error: TesselError) -> int:
    """The HTTP status a compiler error stands for: 400 for a bad request, 422 for a model Tessel cannot
    compile as given."""
    if isinstance(error, ModelError | TargetError):
        return 400
    return 422


def error_body(error: TesselError) -> dict:
    body: dict = {"message": str(error), "status": error_status(error)}
    if isinstance(error, UnsupportedOpError):
        body["ops"] = error.ops
    return body


def bundle_key(
    model_sha256: str,
    target: str,
    input_shapes: dict[str, list[int]],
    records_sha256: str | None = None,
    dims: dict | None = None,
) -> str:
    """The content address of a bundle: what decides its bytes (the model, the target, the options, the tuning log
    uploaded with it, the symbolic sizes it is compiled for, the compiler's version), so an identical upload finds the
    bundle already stored."""
    identity = {
        "model": model_sha256,
        "target": target,
        "input_shapes": dict(sorted(input_shapes.items())),
        "compiler": COMPILER_VERSION,
    }
    if target in TARGET_OPTIONS:
        identity["options"] = TARGET_OPTIONS[target]
    if records_sha256 is not None:
        identity["tuning_records"] = records_sha256
    if dims:
        identity["dims"] = plain_dims(dims)
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def plain_dims(dims: dict | None) -> dict | None:
    """compile_model's `dims` ({name: (low, high) or an expression such as "past+seq"}) as JSON keeps them: ranges as
    lists, names sorted; None for none."""
    if not dims:
        return None
    return {name: value if isinstance(value, str) else list(value) for name, value in sorted(dims.items())}


def compile_dims(dims: dict | None) -> dict | None:
    """A job record's dims as compile_model takes them: ranges as (low, high) tuples."""
    if not dims:
        return None
    return {name: value if isinstance(value, str) else tuple(value) for name, value in dims.items()}


def job_key(builds: dict[str, str]) -> str:
    """What makes two jobs identical: the same bundles to make."""
    return hashlib.sha256(json.dumps(sorted(builds.values())).encode()).hexdigest()


@dataclass
class Job:
    """One upload to compile for one or more targets. `builds` maps each target to its bundle id; the
    record is saved on every change of state, progress lives only in memory."""

    id: str
    builds: dict[str, str]
    input_shapes: dict[str, list[int]]
    model: dict
    records: dict | None = None  # the uploaded tuning log's bytes and sha256, when there is one
    dims: dict | None = None  # symbolic sizes to compile with (a model the server itself queues, such as /generate's)
    state: str = QUEUED
    progress: float = 0.0
    step: str = ""
    log: list[str] = field(default_factory=list)
    error: dict | None = None
    result: dict | None = None
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    version: int = 0

    @property
    def key(self) -> str:
        return job_key(self.builds)

    def record(self) -> dict:
        return {
            "id": self.id,
            "state": self.state,
            "targets": list(self.builds),
            "builds": self.builds,
            "input_shapes": self.input_shapes,
            "model": self.model,
            "records": self.records,
            "dims": self.dims,
            "progress": self.progress,
            "step": self.step,
            "log": self.log,
            "error": self.error,
            "result": self.result,
            "created": self.created,
            "started": self.started,
            "finished": self.finished,
        }

    @classmethod
    def from_record(cls, record: dict) -> Job:
        names = ("id", "builds", "input_shapes", "model", "state", "progress", "step", "log", "error", "result")
        optional = ("records", "dims", "created", "started", "finished")
        return cls(**{name: record[name] for name in names}, **{name: record.get(name) for name in optional})


class QueueFull(Exception):
    """More jobs are waiting than the queue holds."""


# ---- the worker process ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompileTask:
    store_root: str
    model_path: str
    builds: tuple[tuple[str, str], ...]
    input_shapes: dict[str, list[int]]
    max_extracted_bytes: int
    records_path: str | None = None
    dims: dict | None = None


def bundle_summary(store: Store, bundle_id: str, reused: bool) -> dict:
    manifest = store.manifest(bundle_id) or {}
    info = store.build_info(bundle_id)
    return {
        "id": bundle_id,
        "reused": reused,
        "fused_groups": len(manifest.get("calls", [])),
        "kernels": len(manifest.get("kernels", [])),
        "files": store.bundle_files(bundle_id),
        "compile_seconds": info.get("compile_seconds", 0.0),
        "url": f"/bundles/{bundle_id}/",
        "zip": f"/bundles/{bundle_id}.zip",
    }


def compile_build(model, target: str, input_shapes, records_path, progress, log, folder: Path, dims=None) -> dict:
    """Compile `model` for `target` and export the bundle into `folder`, its warnings to `log`: the build info
    (target, compile seconds, when). What a local worker and a Ray task (server/ray_jobs.py) both run. `dims`: symbolic
    sizes, as a job record holds them (compile_model's dims, ranges as lists)."""
    started = time.perf_counter()
    sizes = {"dims": compile_dims(dims)} if dims else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TuningWarning)
        module = compile_model(
            model,
            target=target,
            input_shapes=input_shapes,
            tuning_records=records_path,
            progress=progress,
            **sizes,
            **TARGET_OPTIONS.get(target, {}),
        )
    for warning in caught:
        log(f"{target}: warning: {warning.message}")
    module.export(folder)
    return {"target": target, "compile_seconds": round(time.perf_counter() - started, 3), "compiled": time.time()}


def _compile(task: CompileTask, send) -> dict:
    """Compile every build the store lacks; the bundles of the others are reused as they are."""
    store = Store(task.store_root)
    shapes = {name: tuple(shape) for name, shape in task.input_shapes.items()} or None
    with opened_model(Path(task.model_path), task.max_extracted_bytes) as model:
        bundles = {}
        for position, (target, bundle_id) in enumerate(task.builds):
            if store.has_bundle(bundle_id):
                send(("log", f"{target}: bundle {bundle_id[:12]} already stored, reused"))
                bundles[target] = bundle_summary(store, bundle_id, reused=True)
                continue

            def progress(step: str, fraction: float, target=target, position=position) -> None:
                send(("progress", (position + fraction) / len(task.builds), f"{target}: {step}"))

            staging = store.new_staging_dir()
            info = compile_build(
                model,
                target,
                shapes,
                task.records_path,
                progress,
                lambda line: send(("log", line)),
                staging / "bundle",
                task.dims,
            )
            (staging / "bundle" / "build.json").write_text(json.dumps(info) + "\n")
            store.install_bundle(staging / "bundle", bundle_id)
            shutil.rmtree(staging, ignore_errors=True)
            seconds = info["compile_seconds"]
            send(("log", f"{target}: compiled in {seconds:.2f} s into bundle {bundle_id[:12]}"))
            bundles[target] = {**bundle_summary(store, bundle_id, reused=False), "compile_seconds": seconds}
        return bundles


def _worker_main(connection) -> None:
    """A worker's life: take a task, answer with progress messages and one ("done", result) or ("failed",
    error); end when the server closes its end of the pipe (or is gone)."""
    while True:
        try:
            task = connection.recv()
        except (EOFError, OSError):
            return
        try:
            reply = ("done", _compile(task, connection.send))
        except TesselError as error:
            reply = ("failed", error_body(error))
        except BrokenPipeError:
            return
        except Exception as error:
            traceback.print_exc(file=sys.stderr)
            message = f"internal compiler error ({type(error).__name__}: {error}); please report it with the model"
            reply = ("failed", {"message": message, "status": 500})
        try:
            connection.send(reply)
        except OSError:
            return


# ---- importing an upload --------------------------------------------------------------------------------


class ImportRefused(Exception):
    """An upload's import failed in its process: `body` is the JSON error, with its HTTP status."""

    def __init__(self, body: dict):
        super().__init__(body["message"])
        self.body = body


def _virtual_bytes() -> int:
    with open("/proc/self/statm") as stream:
        return int(stream.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _import_main(connection, model_path: str, input_shapes: dict, memory_bytes: int) -> None:
    """Import the upload as the compiler will (uploads.opened_model), with the address space capped
    `memory_bytes` above what the process already maps, so a model that folds into a huge constant fails here
    with a MemoryError; `memory_bytes` also bounds what a zip may extract to."""
    limit = _virtual_bytes() + memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    shapes = {name: tuple(shape) for name, shape in input_shapes.items()} or None
    try:
        with opened_model(Path(model_path), memory_bytes) as model:
            load_onnx(model, input_shapes=shapes)
        reply = None
    except (TesselError, MemoryError) as error:
        # the importer names the node a MemoryError stopped at, but here it is this process's limit that was hit
        exhausted = isinstance(error, MemoryError) or isinstance(error.__cause__, MemoryError)
        reply = {"message": _memory_message(memory_bytes), "status": 413} if exhausted else error_body(error)
    except Exception as error:
        traceback.print_exc(file=sys.stderr)
        reply = {"message": f"the model could not be imported ({type(error).__name__}: {error})", "status": 422}
    connection.send(reply)


def _memory_message(memory_bytes: int) -> str:
    return (
        f"importing the model needs more than this server's {memory_bytes / 2**20:g} MiB "
        "(a constant it computes is too large); compile it locally with `tessel compile`"
    )


async def import_in_process(context, model_path: Path, input_shapes: dict, memory_bytes: int, timeout_s: float):
    """Run the upload's import in a process of its own with `memory_bytes` and `timeout_s` as its limits, so
    nothing an upload makes the importer do can grow the server or stall its event loop; ImportRefused says
    why it failed."""
    receiving, sending = context.Pipe(duplex=False)
    process = context.Process(
        target=_import_main,
        args=(sending, str(model_path), input_shapes, memory_bytes),
        daemon=True,
        name="tessel-import",
    )
    await asyncio.to_thread(process.start)
    sending.close()
    try:
        ready = await asyncio.to_thread(receiving.poll, timeout_s)
        reply = receiving.recv() if ready else TimeoutError
    except (EOFError, OSError):
        reply = EOFError
    finally:
        receiving.close()
        process.kill()
        await asyncio.to_thread(process.join, 5)
    if reply is TimeoutError:
        raise ImportRefused({"message": f"importing the model took longer than {timeout_s:g} s", "status": 422})
    if reply is EOFError:
        raise ImportRefused({"message": _memory_message(memory_bytes), "status": 413})
    if reply is not None:
        raise ImportRefused(reply)


class WorkerDied(Exception):
    """The worker's end of the pipe closed (the process crashed or was killed), or its Ray task's worker died."""


class Worker:
    """One compile process and the server's end of its pipe. What the queue asks of a worker (a Ray task's
    server/ray_jobs.RayWorker answers the same): `start(task)`, `await receive()` for the next message, `kill()`,
    and `death_message()` once receive raised WorkerDied."""

    def __init__(self, context):
        self.lock = threading.Lock()
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child,), daemon=True, name="tessel-compile")
        self.process.start()
        child.close()

    def start(self, task: CompileTask) -> None:
        self.connection.send(task)

    def death_message(self) -> str:
        return (
            f"the compiler process died (exit code {self.process.exitcode}); "
            "the model may need more memory than this server has"
        )

    async def receive(self):
        """The next message, awaited with the pipe registered on the event loop (no thread blocks)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        descriptor = self.connection.fileno()

        def readable() -> None:
            loop.remove_reader(descriptor)
            if future.done():
                return
            try:
                future.set_result(self.connection.recv())
            except (EOFError, OSError):
                future.set_exception(WorkerDied())

        loop.add_reader(descriptor, readable)
        try:
            return await future
        finally:
            loop.remove_reader(descriptor)

    def kill(self) -> None:
        # A cancelled job and the queue's shutdown may both kill one worker, from two threads.
        with self.lock:
            if self.connection.closed:
                return
            self.process.kill()
            self.process.join(5)
            self.connection.close()


def _context():
    # forkserver: workers fork from a clean process that has imported the compiler once, so a new worker
    # (after a timeout killed one) starts in milliseconds and never inherits the server's threads.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["compiler.build", "compiler.compute", "compiler.schedules.cpu", "server.jobs"])
    return context


class ProcessRunner:
    """Where jobs compile by default: worker processes on this machine, kept for the next job once one ends."""

    def __init__(self, context):
        self.context = context
        self.idle: list[Worker] = []

    async def take(self) -> Worker:
        while self.idle:
            worker = self.idle.pop()
            if worker.process.is_alive():
                return worker
            worker.connection.close()
        return await asyncio.to_thread(Worker, self.context)

    def give_back(self, worker: Worker) -> None:
        self.idle.append(worker)

    async def close(self) -> None:
        for worker in self.idle:
            await asyncio.to_thread(worker.kill)
        self.idle.clear()


# ---- the queue -----------------------------------------------------------------------------------------


class JobQueue:
    """Jobs in submission order: up to `max_workers` run at once, at most `max_queue` wait. Identical
    uploads share one in-flight job and reuse stored bundles; `compiles` counts bundles compiled."""

    def __init__(
        self,
        store: Store,
        max_workers: int,
        max_queue: int,
        job_timeout_s: float,
        import_memory_bytes: int = 2 << 30,
        import_timeout_s: float = 60.0,
        runner=None,
    ):
        self.store = store
        self.import_memory_bytes = import_memory_bytes
        self.import_timeout_s = import_timeout_s
        # as many imports at once as compiles: each holds a process and a thread waiting on its pipe
        self.import_slots = asyncio.Semaphore(max(1, max_workers))
        self.max_workers = max(1, max_workers)
        self.max_queue = max_queue
        self.job_timeout_s = job_timeout_s
        self.jobs: dict[str, Job] = {}
        self.waiting: deque[Job] = deque()
        self.running: dict[str, asyncio.Task] = {}
        self.busy: dict[str, Worker] = {}
        self.compiles = 0
        self._changed = asyncio.Event()
        self.context = _context()
        # where compiles run: local worker processes, or Ray tasks (server/ray_jobs.RayRunner), chosen by create_app
        self.runner = runner if runner is not None else ProcessRunner(self.context)

    async def start(self) -> None:
        """Load the saved jobs; one that was queued or running when the last process ended has lost its
        upload and its worker, so it is marked failed."""
        self.store.clear_transient()
        for record in self.store.load_jobs():
            try:
                job = Job.from_record(record)
            except (KeyError, TypeError):
                continue
            if job.state not in FINISHED:
                job.state, job.finished = FAILED, time.time()
                job.error = {"message": RESTART_MESSAGE, "status": 503}
                job.log.append(RESTART_MESSAGE)
                self.store.save_job(job.record())
            self.jobs[job.id] = job

    async def close(self) -> None:
        tasks = list(self.running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for worker in self.busy.values():
            await asyncio.to_thread(worker.kill)
        self.busy.clear()
        await self.runner.close()

    async def import_upload(self, model_path: Path, input_shapes: dict) -> None:
        """Import an upload in a process of its own under this queue's limits; ImportRefused if it fails."""
        async with self.import_slots:
            await import_in_process(
                self.context, model_path, input_shapes, self.import_memory_bytes, self.import_timeout_s
            )

    def position(self, job: Job) -> int:
        """1 for the next job to start, 2 for the one after...; 0 once a job runs or has finished."""
        for place, waiting in enumerate(self.waiting, 1):
            if waiting is job:
                return place
        return 0

    def snapshot(self, job: Job) -> dict:
        record = job.record()
        del record["builds"]
        return {**record, "position": self.position(job), "progress": round(job.progress, 4)}

    def find_in_flight(self, builds: dict[str, str]) -> Job | None:
        key = job_key(builds)
        return next((job for job in self.jobs.values() if job.state not in FINISHED and job.key == key), None)

    def all_stored(self, builds: dict[str, str]) -> bool:
        return all(self.store.has_bundle(bundle_id) for bundle_id in builds.values())

    def check_room(self) -> None:
        """Raise QueueFull unless a new job would start at once or find a place in the waiting line."""
        if len(self.running) >= self.max_workers and len(self.waiting) >= self.max_queue:
            raise QueueFull(f"{len(self.waiting)} jobs are waiting, the most this server queues; try again in a minute")

    def submit(self, job: Job) -> Job:
        """Queue a job whose upload is at store.upload_path(job.id). An identical job already in flight is
        returned instead; a job whose bundles are all stored finishes at once, compiling nothing."""
        if self.all_stored(job.builds):
            self._discard_upload(job)
            bundles = {target: bundle_summary(self.store, bundle_id, True) for target, bundle_id in job.builds.items()}
            job.log.append("every bundle was already stored; nothing to compile")
            self._finish(job, DONE, result={"bundles": bundles, "compile_seconds": 0.0})
            self.jobs[job.id] = job
            return job
        twin = self.find_in_flight(job.builds)
        if twin is not None:
            self._discard_upload(job)
            return twin
        self.check_room()
        self.jobs[job.id] = job
        job.log.append("queued")
        self.waiting.append(job)
        self.store.save_job(job.record())
        self._pump()
        return job

    def _discard_upload(self, job: Job) -> None:
        self.store.upload_path(job.id).unlink(missing_ok=True)
        self.store.records_path(job.id).unlink(missing_ok=True)

    def _pump(self) -> None:
        while self.waiting and len(self.running) < self.max_workers:
            job = self.waiting.popleft()
            job.state, job.started = RUNNING, time.time()
            job.log.append("started")
            self.store.save_job(job.record())
            self.running[job.id] = asyncio.get_running_loop().create_task(self._run(job))
        for job in self.waiting:
            self._touch(job)

    def _touch(self, job: Job) -> None:
        job.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self, job: Job, seen: int, timeout: float) -> None:
        """Return when `job` has changed since version `seen`, or after `timeout` seconds."""
        if job.version != seen:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    def _finish(self, job: Job, state: str, result: dict | None = None, error: dict | None = None) -> None:
        job.state, job.finished, job.result, job.error = state, time.time(), result, error
        if state == DONE:
            job.progress, job.step = 1.0, "done"
        self.store.save_job(job.record())
        self._touch(job)

    async def _run(self, job: Job) -> None:
        task = CompileTask(
            str(self.store.root),
            str(self.store.upload_path(job.id)),
            tuple(job.builds.items()),
            job.input_shapes,
            self.import_memory_bytes,
            str(self.store.records_path(job.id)) if job.records else None,
            job.dims,
        )
        started = time.perf_counter()
        worker: Worker | None = None
        try:
            worker = await self.runner.take()
            self.busy[job.id] = worker
            worker.start(task)
            deadline = time.monotonic() + self.job_timeout_s
            while True:
                kind, *payload = await asyncio.wait_for(worker.receive(), max(0.0, deadline - time.monotonic()))
                if kind == "progress":
                    job.progress, job.step = payload[0], payload[1]
                    job.log.append(payload[1])
                    self._touch(job)
                elif kind == "log":
                    job.log.append(payload[0])
                    self._touch(job)
                elif kind == "done":
                    bundles = payload[0]
                    self.compiles += sum(not bundle["reused"] for bundle in bundles.values())
                    seconds = round(time.perf_counter() - started, 3)
                    job.log.append(f"done in {seconds:.2f} s")
                    self._finish(job, DONE, result={"bundles": bundles, "compile_seconds": seconds})
                    break
                else:
                    job.log.append(f"failed: {payload[0]['message']}")
                    self._finish(job, FAILED, error=payload[0])
                    break
            self.runner.give_back(worker)
        except TimeoutError:
            await asyncio.to_thread(worker.kill)
            message = (
                f"the compile took longer than this server's limit of {self.job_timeout_s:g} s and was stopped; "
                "try a smaller model or ask the operator for a longer --job-timeout"
            )
            job.log.append(message)
            self._finish(job, FAILED, error={"message": message, "status": 504})
        except WorkerDied:
            await asyncio.to_thread(worker.kill)
            message = worker.death_message()
            job.log.append(message)
            self._finish(job, FAILED, error={"message": message, "status": 500})
        except Exception as error:
            traceback.print_exc(file=sys.stderr)
            if worker is not None:
                await asyncio.to_thread(worker.kill)
            message = f"internal server error while compiling ({type(error).__name__}: {error})"
            job.log.append(message)
            self._finish(job, FAILED, error={"message": message, "status": 500})
        finally:
            self.busy.pop(job.id, None)
            self.running.pop(job.id, None)
            self._discard_upload(job)
            if job.state not in FINISHED:
                # Cancelled by close(): the record stays "running" so the next start marks it interrupted,
                # and the worker, still compiling, is stopped rather than left behind.
                self.store.save_job(job.record())
                if worker is not None:
                    worker.kill()
            else:
                self._pump()


def new_job_id() -> str:
    return secrets.token_hex(16)


def default_workers() -> int:
    return os.cpu_count() or 1


# The text generation demo's model (compiler/data/train_chars.py), which /generate runs: compiled for wasm with its
# symbolic sizes through the job queue, when its page first asks for it or at start-up with --prebuild chars.
TEXT_MODEL = "chars"


def text_model_job(state, retry: bool = True) -> Job:
    """The job compiling the text model for wasm: the one queued or done already, else a new one (after a failed one
    too, if `retry`). A bundle stored from an earlier run finishes it at once. QueueFull when the queue has no room."""
    job = state.queue.jobs.get(state.text_model) if state.text_model else None
    if job is not None and (job.state != "failed" or not retry):
        return job
    data = train_chars.MODEL_PATH.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    dims = plain_dims(train_chars.dims())
    model = {"filename": train_chars.MODEL_PATH.name, "bytes": len(data), "sha256": digest}
    job = Job(new_job_id(), {"wasm": bundle_key(digest, "wasm", {}, dims=dims)}, {}, model, dims=dims)
    state.store.upload_path(job.id).write_bytes(data)
    try:
        job = state.queue.submit(job)
    except QueueFull:
        state.store.upload_path(job.id).unlink(missing_ok=True)
        raise
    state.text_model = job.id
    return job
