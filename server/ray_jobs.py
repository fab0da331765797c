"""Compile jobs as Ray tasks (`tessel serve --ray ADDRESS|auto`): the queue of jobs.py stays on the server, and each
job it starts becomes one Ray task (one CPU) anywhere on the cluster instead of a local worker process. The task gets
the upload through Ray's object store, compiles in a folder of its own node, and streams back its progress and each
finished bundle's files as messages of a Ray generator; the server writes every bundle into its store itself, in one
rename as a local compile does, so a task that dies leaves nothing half-written. Ray is an optional extra."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import shutil
import socket
import sys
import tempfile
import threading
import traceback
from pathlib import Path, PurePosixPath

from compiler.errors import TesselError
from compiler.tune import ray_runner
from server.jobs import CompileTask, WorkerDied, bundle_summary, compile_build, error_body
from server.store import BUILD_INFO_FILE, Store
from server.uploads import opened_model

# How long `tessel serve --ray HOST:PORT` waits for the cluster's address to answer before it gives up.
CONNECT_SECONDS = 5.0


def _ray():
    try:
        import ray
    except ImportError:
        raise TesselError("--ray needs Ray: pip install 'tessel[ray]'") from None
    return ray


def _check_reachable(address: str) -> None:
    """Fail at once, naming the address, when nothing answers there (ray.init would retry for minutes)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise TesselError(
            f"--ray {address!r} is not a cluster address; give HOST:PORT (the head node's, 6379 by default) or auto"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as error:
        raise TesselError(
            f"cannot reach a Ray cluster at {address!r} ({error.strerror or error}); start one there with "
            "`ray start --head`, or check the address and that this machine may connect to it"
        ) from None


def connect(address: str, **options) -> None:
    """Join the cluster at `address`: HOST:PORT (checked reachable first, so a wrong one is one error at once rather
    than Ray's retries), "auto" or "local", as the tuner's Ray runner does (compiler/tune/ray_runner.py, connect).
    Workers of a cluster on this machine get this checkout on their path; other machines install tessel."""
    if address not in ("auto", "local"):
        _check_reachable(address)
    ray_runner.connect(address, **options)


# ---- the task, on a Ray worker -------------------------------------------------------------------------


def compile_task(
    model: bytes, builds, input_shapes: dict, max_extracted_bytes: int, records: bytes | None, dims: dict | None = None
):
    """A Ray generator task: compile `builds` ((target, bundle id) pairs) of the upload `model`, yielding
    ("log", line), ("progress", fraction, step), ("bundle", target, bundle id, {file name: bytes}, build info) for each
    bundle, or ("failed", error body) and nothing after it."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    yield ("log", f"compiling on Ray node {node[:12]}, worker process {os.getpid()}")
    with tempfile.TemporaryDirectory(prefix="tessel-ray-") as folder:
        upload = Path(folder) / "model.onnx"
        upload.write_bytes(model)
        records_path = None
        if records is not None:
            records_path = Path(folder) / "records.jsonl"
            records_path.write_bytes(records)
        try:
            with opened_model(upload, max_extracted_bytes) as opened:
                for position, (target, bundle_id) in enumerate(builds):
                    where = Path(folder) / bundle_id
                    count = len(builds)
                    yield from _compile_one(
                        opened, target, bundle_id, position, count, input_shapes, records_path, where, dims
                    )
        except TesselError as error:
            yield ("failed", error_body(error))
        except Exception as error:
            traceback.print_exc(file=sys.stderr)
            message = f"internal compiler error ({type(error).__name__}: {error}); please report it with the model"
            yield ("failed", {"message": message, "status": 500})


def _compile_one(model, target, bundle_id, position, count, input_shapes, records_path, folder: Path, dims=None):
    """Compile one bundle in a thread, yielding its progress as it comes, then its files."""
    messages: queue.Queue = queue.Queue()
    shapes = {name: tuple(shape) for name, shape in input_shapes.items()} or None

    def progress(step: str, fraction: float) -> None:
        messages.put(("progress", (position + fraction) / count, f"{target}: {step}"))

    def log(line: str) -> None:
        messages.put(("log", line))

    def compile_() -> None:
        try:
            records = str(records_path) if records_path else None
            messages.put(("exported", compile_build(model, target, shapes, records, progress, log, folder, dims)))
        except BaseException as error:  # noqa: BLE001 - handed to the generator, which raises it
            messages.put(("raised", error))

    threading.Thread(target=compile_, daemon=True, name="tessel-ray-compile").start()
    while True:
        message = messages.get()
        if message[0] == "raised":
            raise message[1]
        if message[0] == "exported":
            break
        yield message
    files = {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}
    yield ("bundle", target, bundle_id, files, message[1])


# ---- the server's side ---------------------------------------------------------------------------------


def _install(store: Store, bundle_id: str, files: dict[str, bytes], info: dict) -> None:
    """Write a bundle the task sent into the store: staged, then moved into place in one rename."""
    staging = store.new_staging_dir()
    try:
        folder = staging / "bundle"
        for name, data in files.items():
            parts = PurePosixPath(name).parts
            if not parts or name.startswith("/") or ".." in parts:
                raise TesselError(f"the Ray task sent a bundle file named {name!r}, which is not a bundle's")
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)
        (folder / BUILD_INFO_FILE).write_text(json.dumps(info) + "\n")
        store.install_bundle(folder, bundle_id)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


class RayWorker:
    """One job's Ray task, seen by the queue as a worker (jobs.Worker's interface): bundles already stored are
    reused here without a task; the task's messages are turned into the queue's ("log"/"progress", then "done" with
    the bundles' summaries, or "failed")."""

    def __init__(self, runner: RayRunner):
        self.runner = runner
        self.task: CompileTask | None = None
        self.generator = None
        self.pending: list[tuple] = []
        self.bundles: dict[str, dict] = {}
        self.submitted = False
        self.finished = False
        self.death = "the Ray task compiling this job was lost"

    def start(self, task: CompileTask) -> None:
        self.task = task

    def _submit(self) -> None:
        task = self.task
        store = Store(task.store_root)
        missing = []
        for target, bundle_id in task.builds:
            if store.has_bundle(bundle_id):
                self.pending.append(("log", f"{target}: bundle {bundle_id[:12]} already stored, reused"))
                self.bundles[target] = bundle_summary(store, bundle_id, reused=True)
            else:
                missing.append((target, bundle_id))
        if not missing:
            return
        ray = _ray()
        model = ray.put(Path(task.model_path).read_bytes())
        records = Path(task.records_path).read_bytes() if task.records_path else None
        self.generator = self.runner.remote.remote(
            model, tuple(missing), task.input_shapes, task.max_extracted_bytes, records, task.dims
        )

    async def _next(self):
        """The task's next message, awaited on the event loop (no thread waits on Ray); None once it sent its last."""
        ray = _ray()
        try:
            return await (await self.generator.__anext__())
        except StopAsyncIteration:
            return None
        except ray.exceptions.RayError as error:
            reason = str(error).strip().splitlines()[0]
            self.death = (
                f"the Ray worker compiling this job died ({reason}); the job was not retried and nothing of it "
                "was stored: upload the model again, and if it fails again it may need more memory than a node has"
            )
            raise WorkerDied(self.death) from None

    async def receive(self):
        if not self.submitted:
            self.submitted = True
            await asyncio.to_thread(self._submit)
        while True:
            if self.pending:
                return self.pending.pop(0)
            if self.finished or self.generator is None:
                self.finished = True
                return ("done", self.bundles)
            message = await self._next()
            if message is None:
                self.finished = True
                return ("done", self.bundles)
            if message[0] != "bundle":
                if message[0] == "failed":
                    self.finished = True
                return message
            _, target, bundle_id, files, info = message
            store = Store(self.task.store_root)
            await asyncio.to_thread(_install, store, bundle_id, files, info)
            seconds = info["compile_seconds"]
            self.bundles[target] = {**bundle_summary(store, bundle_id, reused=False), "compile_seconds": seconds}
            return ("log", f"{target}: compiled in {seconds:.2f} s into bundle {bundle_id[:12]}")

    def kill(self) -> None:
        if self.generator is not None and not self.finished:
            self.finished = True
            ray = _ray()
            ray.cancel(self.generator, force=True)

    def death_message(self) -> str:
        return self.death


class RayRunner:
    """Where jobs compile under `--ray`: one Ray task per job (one CPU, not retried: a task that dies fails its
    job). `function` is the generator each task runs (compile_task; a test may put a slower one in its place)."""

    def __init__(self, address: str, function=compile_task, **options):
        connect(address, **options)
        self.address = address
        self.function = function
        self.remote = _ray().remote(num_cpus=1, max_retries=0)(function)

    def default_workers(self) -> int:
        """As many jobs at once as the cluster has CPUs."""
        return max(1, int(_ray().cluster_resources().get("CPU", 1)))

    async def take(self) -> RayWorker:
        return RayWorker(self)

    def give_back(self, worker: RayWorker) -> None:
        return None

    async def close(self) -> None:
        return None
