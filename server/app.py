"""The compile service (`tessel serve`): a Starlette app that takes ONNX uploads, queues them on jobs.py's
worker processes, reports progress as JSON and server-sent events, and serves the bundles from the
Store with the JS runtime and the pages in static/ that run them in the browser."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import mimetypes
import shutil
import time
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath
from urllib.parse import urlencode

import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from compiler import zoo
from compiler.backends import BACKENDS
from compiler.data import train_chars
from compiler.errors import TargetError, TesselError
from compiler.frontend.onnx import parse_input_shapes as parse_onnx_input_shapes
from compiler.tune.ray_runner import RayBuilder
from compiler.tune.records import read_records
from server.jobs import (
    FINISHED,
    TEXT_MODEL,
    ImportRefused,
    Job,
    JobQueue,
    QueueFull,
    bundle_key,
    default_workers,
    new_job_id,
    text_model_job,
)
from server.ray_jobs import RayRunner
from server.store import JOB_ID, Store
from server.tuning import Sessions, parse_answer

# Links to the repository's static/ and web_runtime/, which an install copies into the package.
PAGES = Path(__file__).resolve().parent / "pages"
STATIC_DIR = PAGES / "static"
RUNTIME_DIR = PAGES / "web_runtime"
MiB = 2**20
# Files one upload may hold: a model and its external data files (torch writes one, onnx one per tensor at most).
MAX_FILES = 256
# Room for the multipart framing and the small form fields around the model file.
FORM_OVERHEAD = 64 * 1024
KEEPALIVE_S = 15.0
PREBUILT_WAIT_S = 30.0
# A page asking for the next candidate to time waits this long before it is told to ask again.
TUNE_POLL_S = 10.0
IMMUTABLE = "public, max-age=31536000, immutable"
# What static/demo.js draws and reads (its SIZE * SIZE pixels and ten digit scores).
DEMO_PIXELS, DEMO_CLASSES = 64, 10
ISOLATION_HEADERS = [
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-embedder-policy", b"require-corp"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"x-content-type-options", b"nosniff"),
]
CONTENT_TYPES = {
    ".wasm": "application/wasm",
    ".json": "application/json",
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".zip": "application/zip",
}


def targets() -> list[str]:
    """Every target the compiler can make a bundle for, wasm (the browser's) first."""
    return sorted(BACKENDS, key=lambda name: (name != "wasm", name))


class CrossOriginIsolation:
    """Adds the headers that make a page cross-origin isolated (so WASM threads and SharedArrayBuffer
    work) to every response, streamed ones included."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_isolated(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *ISOLATION_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_isolated)


def error(status: int, message: str, headers: dict | None = None, **details) -> JSONResponse:
    return JSONResponse({"error": message, **details}, status_code=status, headers=headers)


async def _http_error(request: Request, exception: HTTPException) -> Response:
    messages = {404: f"no such page {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
    message = messages.get(exception.status_code, str(exception.detail))
    return error(exception.status_code, message, headers=exception.headers)


async def _server_error(request: Request, exception: Exception) -> Response:
    # Sent from outside the middleware stack, so the isolation headers are added here.
    headers = {name.decode(): value.decode() for name, value in ISOLATION_HEADERS}
    return error(500, "internal server error; the server log has the details", headers=headers)


# ---- form parsing --------------------------------------------------------------------------------------


class UploadTooLarge(Exception):
    pass


async def _limited(stream: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """The request body, stopping with UploadTooLarge as soon as more than `limit` bytes arrive."""
    received = 0
    async for chunk in stream:
        received += len(chunk)
        if received > limit:
            raise UploadTooLarge
        yield chunk


def parse_targets(values: list[str]) -> list[str]:
    """Form values such as ["wasm", "llvm"] or ["wasm,llvm"] as known target names, in the compiler's order."""
    names = [name.strip() for value in values for name in value.split(",") if name.strip()] or ["wasm"]
    unknown = [name for name in names if name not in BACKENDS]
    if unknown:
        raise TargetError(f"unknown target {unknown[0]!r}; choose from {', '.join(targets())}")
    return [name for name in targets() if name in names]


def parse_input_shapes(values: list[str]) -> dict[str, list[int]]:
    """Form values such as ["input=1,3,224,224"] (several inputs separated by ';' or given as repeated
    fields) as {name: shape}, with lists so the job record stays JSON."""
    specs = [part.strip() for value in values for part in value.replace("\n", ";").split(";") if part.strip()]
    return {name: list(shape) for name, shape in parse_onnx_input_shapes(specs).items()}


def _save_upload(source, destination: Path) -> tuple[str, int]:
    """Copy the spooled upload into the store, hashing it on the way."""
    digest, size = hashlib.sha256(), 0
    source.seek(0)
    with destination.open("wb") as stream:
        while chunk := source.read(MiB):
            digest.update(chunk)
            size += len(chunk)
            stream.write(chunk)
    return digest.hexdigest(), size


def _save_as_zip(uploads: list[UploadFile], destination: Path) -> tuple[str, int]:
    """Several files of one upload (a model and its external data) stored as one zip, which server/uploads.py
    opens like an uploaded one: members in name order with a fixed date, so the same files give the same bytes
    and the same bundle id."""
    with zipfile.ZipFile(destination, "w", zipfile.ZIP_STORED) as archive:
        for name, upload in sorted(zip(_file_names(uploads), uploads)):
            upload.file.seek(0)
            with archive.open(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), "w") as member:
                shutil.copyfileobj(upload.file, member, MiB)
    digest, size = hashlib.sha256(), 0
    with destination.open("rb") as stream:
        while chunk := stream.read(MiB):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _file_names(uploads: list[UploadFile]) -> list[str]:
    """Each file's own name (a folder the client sent is dropped), refused when empty, odd or repeated."""
    names = [PurePosixPath((upload.filename or "").replace("\\", "/")).name for upload in uploads]
    for name in names:
        if name in ("", ".", "..") or any(ord(character) < 32 for character in name):
            raise UploadRefused(f"every file of a several-file upload needs a plain file name, got {name!r}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise UploadRefused(f"the upload holds {repeated[0]!r} twice; send each file once")
    return names


class UploadRefused(Exception):
    pass


# ---- routes --------------------------------------------------------------------------------------------


async def compile_model_route(request: Request) -> Response:
    state = request.app.state
    limit = state.max_upload_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit + FORM_OVERHEAD:
        return _too_large(limit)
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        return error(400, "send the model as multipart/form-data with the ONNX file in the field 'file'")
    parser = MultiPartParser(
        request.headers,
        _limited(request.stream(), limit + FORM_OVERHEAD),
        max_files=MAX_FILES,
        max_fields=16,
        max_part_size=FORM_OVERHEAD,
    )
    try:
        form = await parser.parse()
    except UploadTooLarge:
        return _too_large(limit)
    except MultiPartException as exception:
        return error(400, f"the upload is not valid multipart/form-data: {exception.message}")
    job_id = new_job_id()
    upload_path = state.store.upload_path(job_id)
    try:
        uploads = [value for value in form.getlist("file") if isinstance(value, UploadFile)]
        if not uploads:
            return error(
                400, "attach the ONNX model, or a zip of it and its data files, or all those files, as the field 'file'"
            )
        records_uploads = [value for value in form.getlist("records") if isinstance(value, UploadFile)]
        if len(records_uploads) > 1:
            return error(400, "attach at most one tuning log (tessel tune's JSON lines) as the field 'records'")
        if sum(upload.size or 0 for upload in [*uploads, *records_uploads]) > limit:
            return _too_large(limit)
        try:
            names = parse_targets([value for value in form.getlist("targets") if isinstance(value, str)])
            shapes = parse_input_shapes([value for value in form.getlist("input_shapes") if isinstance(value, str)])
            records = await _save_records(records_uploads, state.store.records_path(job_id))
        except TesselError as exception:
            return error(400, str(exception))
        if len(uploads) == 1:
            digest, size = await asyncio.to_thread(_save_upload, uploads[0].file, upload_path)
        else:
            try:
                digest, size = await asyncio.to_thread(_save_as_zip, uploads, upload_path)
            except UploadRefused as exception:
                return error(400, str(exception))
        filename = uploads[0].filename if len(uploads) == 1 else f"{len(uploads)} files"
        model = {"filename": filename or "model.onnx", "bytes": size, "sha256": digest}
        records_digest = records["sha256"] if records else None
        builds = {name: bundle_key(digest, name, shapes, records_digest) for name in names}
        job = Job(job_id, builds, shapes, model, records)
        return await _submit(state.queue, job)
    finally:
        await form.close()
        if job_id not in state.queue.jobs:
            upload_path.unlink(missing_ok=True)
            state.store.records_path(job_id).unlink(missing_ok=True)


async def _save_records(uploads: list[UploadFile], destination: Path) -> dict | None:
    """An upload's tuning log, saved beside its model and read once now, so that a corrupted one is refused (400)
    before the job queues; its bytes and sha256, or None without one."""
    if not uploads:
        return None
    filename = uploads[0].filename or "records.jsonl"
    digest, size = await asyncio.to_thread(_save_upload, uploads[0].file, destination)
    try:
        await asyncio.to_thread(read_records, destination)
    except TesselError as exception:
        raise TesselError(str(exception).replace(str(destination), repr(filename))) from None
    return {"filename": filename, "bytes": size, "sha256": digest}


async def _submit(queue: JobQueue, job: Job) -> Response:
    """Queue a job (the caller removes its upload if it is refused), importing its model first unless
    its bundles are stored or an identical job is in flight."""
    try:
        if not queue.all_stored(job.builds) and queue.find_in_flight(job.builds) is None:
            queue.check_room()
            await queue.import_upload(queue.store.upload_path(job.id), job.input_shapes)
        submitted = queue.submit(job)
    except QueueFull as exception:
        return error(429, str(exception), headers={"Retry-After": "30"}, max_queue=queue.max_queue)
    except ImportRefused as exception:
        details = {"ops": exception.body["ops"]} if "ops" in exception.body else {}
        return error(exception.body["status"], exception.body["message"], **details)
    body = {"job": submitted.id, "position": queue.position(submitted), "state": submitted.state}
    return JSONResponse({**body, "url": f"/api/jobs/{submitted.id}"}, status_code=202)


# ---- tuning on the visitor's device (server/tuning.py) -------------------------------------------------


async def tune_route(request: Request) -> Response:
    """Start tuning an uploaded model (field 'file') for wasm, timed by the page that asked (field 'trials')."""
    state = request.app.state
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > state.max_upload_bytes + FORM_OVERHEAD:
        return _too_large(state.max_upload_bytes)
    try:
        async with request.form(max_files=1, max_fields=4) as form:
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                return error(400, "attach the ONNX model to tune as the field 'file'")
            if (upload.size or 0) > state.max_upload_bytes:
                return _too_large(state.max_upload_bytes)
            model = await upload.read()
            trials_text = form.get("trials", "32")
        trials = int(trials_text) if isinstance(trials_text, str) and trials_text.strip().isdigit() else -1
        session = await asyncio.to_thread(state.tuning.start, model, trials)
    except MultiPartException as exception:
        return error(400, f"the upload is not valid multipart/form-data: {exception.message}")
    except TesselError as exception:
        return error(400, str(exception))
    return JSONResponse(session.status(), status_code=202)


def _session(request: Request):
    return request.app.state.tuning.get(request.path_params["session_id"])


def _no_session(request: Request) -> JSONResponse:
    return error(404, f"no tuning session {request.path_params['session_id']!r}; start one with POST /api/tune")


async def tune_status_route(request: Request) -> Response:
    session = _session(request)
    return _no_session(request) if session is None else JSONResponse({"state": session.state, **session.status()})


async def tune_next_route(request: Request) -> Response:
    session = _session(request)
    if session is None:
        return _no_session(request)
    return JSONResponse(await asyncio.to_thread(session.next_candidate, TUNE_POLL_S))


async def tune_answer_route(request: Request) -> Response:
    session = _session(request)
    if session is None:
        return _no_session(request)
    try:
        session.answer(parse_answer(await request.body()))
    except TesselError as exception:
        return error(400, str(exception))
    return JSONResponse({"ok": True})


async def tune_records_route(request: Request) -> Response:
    session = _session(request)
    if session is None:
        return _no_session(request)
    return Response(request.app.state.tuning.records(session), media_type="application/x-ndjson")


def _too_large(limit: int) -> JSONResponse:
    return error(
        413,
        f"the upload is larger than this server's limit of {limit / MiB:g} MiB; "
        "compile it locally with `tessel compile` or ask the operator for a larger --max-upload-mb",
        limit_bytes=limit,
    )


def _job(request: Request) -> Job | None:
    job_id = request.path_params["job_id"]
    return request.app.state.queue.jobs.get(job_id) if JOB_ID.fullmatch(job_id) else None


def _no_job(request: Request) -> JSONResponse:
    return error(404, f"no job {request.path_params['job_id']!r}; jobs are named by the id POST /api/compile returned")


async def job_route(request: Request) -> Response:
    job = _job(request)
    if job is None:
        return _no_job(request)
    return JSONResponse(request.app.state.queue.snapshot(job), headers={"Cache-Control": "no-store"})


def bundle_set(job: Job) -> dict:
    """A job's browser bundles as the bundle set tessel.js chooses from (docs/web.md): backend name -> bundle URL."""
    bundles = (job.result or {}).get("bundles", {})
    return {
        "bundles": {target: bundle["url"] for target, bundle in bundles.items() if BACKENDS[target].runs_in_browser}
    }


async def bundle_set_route(request: Request) -> Response:
    job = _job(request)
    if job is None:
        return _no_job(request)
    if job.state != "done":
        return error(409, f"job {job.id} is {job.state}; its bundle set exists once it is done")
    found = bundle_set(job)
    if not found["bundles"]:
        runnable = ", ".join(name for name in targets() if BACKENDS[name].runs_in_browser)
        return error(404, f"job {job.id} made no bundle that runs in a browser; compile it for {runnable}")
    return JSONResponse(found)


def _event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


async def _job_events(queue: JobQueue, job: Job) -> AsyncIterator[str]:
    """Every log line, progress change and state change of a job, from its start, until it finishes."""
    lines_sent, last_state, last_progress = 0, None, None
    while True:
        version = job.version
        snapshot = queue.snapshot(job)
        # The log can grow while a line is being sent, so count only the lines actually sent.
        while lines_sent < len(job.log):
            yield _event("log", {"line": job.log[lines_sent]})
            lines_sent += 1
        progress = (snapshot["progress"], snapshot["step"])
        if progress != last_progress:
            yield _event("progress", {"progress": progress[0], "step": progress[1]})
            last_progress = progress
        state = {key: snapshot[key] for key in ("state", "position", "error", "result")}
        if state != last_state:
            yield _event("state", state)
            last_state = state
        # the snapshot's state, not the job's: the job may have finished while the lines above were sent
        if snapshot["state"] in FINISHED:
            return
        await queue.wait_changed(job, version, KEEPALIVE_S)
        if job.version == version:
            yield ": keepalive\n\n"


async def job_events_route(request: Request) -> Response:
    job = _job(request)
    if job is None:
        return _no_job(request)
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(_job_events(request.app.state.queue, job), media_type="text/event-stream", headers=headers)


async def targets_route(request: Request) -> Response:
    entries = []
    for name in targets():
        backend = BACKENDS[name]
        entries.append(
            {
                "name": name,
                "label": backend.label,
                "runs_in_browser": backend.runs_in_browser,
                "default": name == "wasm",
            }
        )
    return JSONResponse({"targets": entries})


def _content_type(name: str) -> str:
    return CONTENT_TYPES.get(Path(name).suffix) or mimetypes.guess_type(name)[0] or "application/octet-stream"


async def bundle_file_route(request: Request) -> Response:
    store: Store = request.app.state.store
    bundle_id, name = request.path_params["bundle_id"], request.path_params["name"]
    if not store.has_bundle(bundle_id):
        return _no_bundle(bundle_id)
    path = store.bundle_file(bundle_id, name)
    if path is None:
        listed = ", ".join(store.bundle_files(bundle_id))
        return error(404, f"bundle {bundle_id} has no file {name!r}; its files are {listed}")
    return FileResponse(path, media_type=_content_type(name), headers={"Cache-Control": IMMUTABLE})


async def bundle_zip_route(request: Request) -> Response:
    store: Store = request.app.state.store
    bundle_id = request.path_params["bundle_id"]
    path = await asyncio.to_thread(store.bundle_zip, bundle_id) if store.has_bundle(bundle_id) else None
    if path is None:
        return _no_bundle(bundle_id)
    return FileResponse(
        path,
        media_type="application/zip",
        filename=f"tessel-{bundle_id[:12]}.zip",
        headers={"Cache-Control": IMMUTABLE},
    )


def _no_bundle(bundle_id: str) -> JSONResponse:
    return error(404, f"no bundle {bundle_id!r}; bundle ids come from a finished job's result")


def _safe_file(root: Path, relative: str) -> Path | None:
    """`root/relative` when it is a plain file inside `root` after following every link; None otherwise (a
    control character such as an encoded NUL included: the file system cannot name it)."""
    if not relative or relative.startswith("/") or "\\" in relative or ".." in relative.split("/"):
        return None
    if any(ord(character) < 32 for character in relative):
        return None
    base = root.resolve()
    try:
        path = (base / relative).resolve()
        return path if path.is_relative_to(base) and path.is_file() else None
    except OSError:  # a name longer than the file system takes, a loop of links
        return None


def _page_file(root: Path, relative: str, what: str) -> Response:
    path = _safe_file(root, relative)
    if path is None:
        return error(404, f"no {what} {relative!r}")
    return FileResponse(path, media_type=_content_type(path.name), headers={"Cache-Control": "no-cache"})


async def index_route(request: Request) -> Response:
    return _page_file(request.app.state.static_dir, "index.html", "upload page (static file)")


async def favicon_route(request: Request) -> Response:
    """The icon browsers ask every page's origin for: static/favicon.svg (an SVG, which browsers take at this path)."""
    return _page_file(request.app.state.static_dir, "favicon.svg", "icon")


async def static_route(request: Request) -> Response:
    return _page_file(request.app.state.static_dir, request.path_params["path"], "static file")


async def runtime_route(request: Request) -> Response:
    return _page_file(request.app.state.runtime_dir, request.path_params["path"], "runtime file")


async def demo_route(request: Request) -> Response:
    state = request.app.state
    name = request.path_params["bundle_id"]
    if name in state.prebuilt:
        job = state.queue.jobs[state.prebuilt[name]]
        # Right after start-up the model may still be compiling: hold the request briefly rather than fail it.
        deadline = time.monotonic() + PREBUILT_WAIT_S
        while job.state not in FINISHED and time.monotonic() < deadline:
            await state.queue.wait_changed(job, job.version, deadline - time.monotonic())
        if job.state == "failed":
            return error(500, f"the {name} model failed to compile: {job.error['message']}")
        if job.state != "done":
            return error(503, f"the {name} model is still compiling ({job.state}); try again in a moment")
        bundle_id = job.result["bundles"]["wasm"]["id"]
        if not demo_fits(state.store.manifest(bundle_id)):
            return error(404, f"the drawing demo takes an 8x8 digits model; {name} does not fit it")
        # With a WebGPU build beside the wasm one, the page loads the job's bundle set and tessel.js picks.
        query = dict(request.query_params)
        if len(bundle_set(job)["bundles"]) > 1:
            query["set"] = f"/api/jobs/{job.id}/bundle-set.json"
        suffix = f"?{urlencode(query)}" if query else ""
        return RedirectResponse(f"/demo/{bundle_id}{suffix}", status_code=307)
    if not state.store.has_bundle(name):
        return _no_bundle(name)
    return _page_file(state.static_dir, "demo.html", "demo page (static file)")


async def text_model_route(request: Request) -> Response:
    """The text model for /generate: its compile job (queued on the first request), its wasm bundle once the job is
    done, and the characters its tokens stand for. A page following a job asks with ?job=<its id>, which is answered
    with that job's failure rather than a new job; a request without it queues the model again after a failure."""
    state = request.app.state
    try:
        job = text_model_job(state, retry=request.query_params.get("job") != state.text_model)
    except QueueFull as exception:
        return error(429, str(exception), headers={"Retry-After": "30"}, max_queue=state.queue.max_queue)
    about, bundles = train_chars.load_vocabulary(), (job.result or {}).get("bundles", {})
    body = {"name": TEXT_MODEL, "job": job.id, "state": job.state, "progress": round(job.progress, 4), "step": job.step}
    body.update(url=f"/api/jobs/{job.id}", bundle=bundles["wasm"]["url"] if "wasm" in bundles else None)
    body.update(error=job.error, vocabulary=about["vocabulary"], context=about["context"])
    return JSONResponse(body, headers={"Cache-Control": "no-store"})


async def generate_page_route(request: Request) -> Response:
    return _page_file(request.app.state.static_dir, "generate.html", "text generation page (static file)")


def demo_fits(manifest: dict | None) -> bool:
    """Whether static/demo.js can drive the bundle: it draws 8x8 float32 pixels and reads 10 class scores."""

    def elements(spec: dict) -> int:
        return math.prod(spec["shape"])

    if not manifest or len(manifest["inputs"]) != 1 or not manifest["outputs"]:
        return False
    (source,), output = manifest["inputs"], manifest["outputs"][0]
    return source["dtype"] == "float32" and elements(source) == DEMO_PIXELS and elements(output) == DEMO_CLASSES


async def zoo_route(request: Request) -> Response:
    """The prebuilt models; `demo` links the drawing demo only for a finished model that fits it."""
    state = request.app.state
    models = []
    for name, job_id in state.prebuilt.items():
        job = state.queue.jobs[job_id]
        bundles = {target: bundle["id"] for target, bundle in (job.result or {}).get("bundles", {}).items()}
        fits = "wasm" in bundles and demo_fits(state.store.manifest(bundles["wasm"]))
        demo = f"/demo/{name}" if fits else None
        models.append({"name": name, "job": job_id, "state": job.state, "bundles": bundles, "demo": demo})
    return JSONResponse({"models": models})


async def health_route(request: Request) -> Response:
    queue: JobQueue = request.app.state.queue
    return JSONResponse(
        {
            "ok": True,
            "queued": len(queue.waiting),
            "running": len(queue.running),
            "workers": queue.max_workers,
            "max_queue": queue.max_queue,
            "compiles": queue.compiles,
        }
    )


# ---- the app -------------------------------------------------------------------------------------------


async def _prebuild(state, names: tuple[str, ...]) -> None:
    """Queue the zoo models the demo pages use, for wasm and (where registered) webgpu, so the demo's `auto` has both
    to choose from; a cached bundle makes this instant."""
    for name in names:
        if name == TEXT_MODEL:
            text_model_job(state)
            continue
        data = await asyncio.to_thread(lambda name=name: zoo.build_model(name).SerializeToString())
        digest = hashlib.sha256(data).hexdigest()
        model = {"filename": f"{name}.onnx", "bytes": len(data), "sha256": digest}
        targets_built = [name for name in ("wasm", "webgpu") if name in BACKENDS]
        job = Job(new_job_id(), {name: bundle_key(digest, name, {}) for name in targets_built}, {}, model)
        state.store.upload_path(job.id).write_bytes(data)
        state.prebuilt[name] = state.queue.submit(job).id


def check_prebuild(names) -> tuple[str, ...]:
    """Zoo model names, and TEXT_MODEL (the /generate page's model)."""
    names = tuple(names)
    unknown = [name for name in names if name not in zoo.MODELS and name != TEXT_MODEL]
    if unknown:
        raise TesselError(
            f"unknown zoo model {unknown[0]!r} to prebuild; choose from {', '.join((*zoo.MODELS, TEXT_MODEL))}"
        )
    return names


def create_app(
    store_dir: str | Path = "var",
    max_upload_bytes: int = 256 * MiB,
    max_workers: int | None = None,
    max_queue: int = 64,
    job_timeout_s: float = 600.0,
    import_memory_bytes: int = 2048 * MiB,
    prebuild: tuple[str, ...] = (),
    static_dir: str | Path = STATIC_DIR,
    runtime_dir: str | Path = RUNTIME_DIR,
    ray: str | None = None,
) -> Starlette:
    """The service over the store at `store_dir`. Workers start when the app's lifespan starts (the
    TestClient's `with` block, or uvicorn) and stop with it. `ray`: a Ray cluster's address ("auto", HOST:PORT, or
    "local" for one in this process) to compile on instead of local processes (server/ray_jobs.py)."""
    prebuild = check_prebuild(prebuild)
    runner = RayRunner(ray) if ray is not None else None  # None: the queue's local worker processes
    store = Store(store_dir)
    workers = max_workers or (runner.default_workers() if runner else default_workers())
    queue = JobQueue(store, workers, max_queue, job_timeout_s, import_memory_bytes, runner=runner)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        await queue.start()
        await _prebuild(app.state, prebuild)
        try:
            yield
        finally:
            await queue.close()

    routes = [
        Route("/", index_route),
        Route("/healthz", health_route),
        Route("/favicon.ico", favicon_route),
        Route("/api/targets", targets_route),
        Route("/api/zoo", zoo_route),
        Route("/api/text-model", text_model_route),
        Route("/api/compile", compile_model_route, methods=["POST"]),
        Route("/api/jobs/{job_id}", job_route),
        Route("/api/jobs/{job_id}/events", job_events_route),
        Route("/api/tune", tune_route, methods=["POST"]),
        Route("/api/tune/{session_id}", tune_status_route),
        Route("/api/tune/{session_id}/next", tune_next_route),
        Route("/api/tune/{session_id}/answer", tune_answer_route, methods=["POST"]),
        Route("/api/tune/{session_id}/records", tune_records_route),
        Route("/api/jobs/{job_id}/bundle-set.json", bundle_set_route),
        Route("/bundles/{bundle_id}.zip", bundle_zip_route),
        Route("/bundles/{bundle_id}/{name}", bundle_file_route),
        Route("/runtime/{path:path}", runtime_route),
        Route("/static/{path:path}", static_route),
        Route("/demo/{bundle_id}", demo_route),
        Route("/generate", generate_page_route),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(CrossOriginIsolation)],
        exception_handlers={HTTPException: _http_error, Exception: _server_error},
        lifespan=lifespan,
    )
    app.state.store = store
    app.state.queue = queue
    app.state.max_upload_bytes = max_upload_bytes
    app.state.static_dir = Path(static_dir)
    app.state.runtime_dir = Path(runtime_dir)
    app.state.prebuilt = {}
    app.state.text_model = None  # the id of the job compiling TEXT_MODEL, once one is queued
    app.state.tuning = Sessions(store.uploads, RayBuilder if ray is not None else None)
    return app


def json_error_protocol():
    """uvicorn's HTTP protocol with its answer to a request it cannot parse (a malformed Content-Length, a bad
    request line) given as this service's JSON error body instead of plain text."""

    class JsonErrorProtocol(AutoHTTPProtocol):
        def send_400_response(self, msg: str) -> None:
            body = json.dumps({"error": f"the request is not valid HTTP/1.1 ({msg}); check its headers"}).encode()
            head = [b"HTTP/1.1 400 Bad Request", b"content-type: application/json", b"connection: close"]
            head += [
                b"content-length: " + str(len(body)).encode(),
                *(name + b": " + value for name, value in ISOLATION_HEADERS),
            ]
            self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
            self.transport.close()

    return JsonErrorProtocol


def serve(host: str = "127.0.0.1", port: int = 8000, store_dir: str | Path = "var", prebuild=(), **limits) -> None:
    """Run the service with uvicorn until interrupted; `limits` are create_app's keyword arguments."""
    app = create_app(store_dir, prebuild=tuple(prebuild), **limits)
    uvicorn.run(app, host=host, port=port, http=json_error_protocol())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    parser.add_argument("--store", default="var", help="directory of bundles and job records (default var)")
    parser.add_argument(
        "--prebuild",
        default="",
        help="comma-separated zoo models to compile for wasm at start-up, e.g. digits,mobilenet_v2 "
        "(and chars: the text generation demo's model, else compiled when /generate first asks)",
    )
    parser.add_argument("--max-upload-mb", type=float, default=256, help="largest accepted upload in MiB (default 256)")
    parser.add_argument("--workers", type=int, default=None, help="compile processes (default: one per core)")
    parser.add_argument("--max-queue", type=int, default=64, help="most jobs waiting for a worker (default 64)")
    parser.add_argument("--job-timeout", type=float, default=600, help="seconds one compile may take (default 600)")
    parser.add_argument(
        "--import-memory-mb", type=float, default=2048, help="memory one upload's import may use in MiB (default 2048)"
    )
    parser.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="compile on the Ray cluster at ADDRESS (HOST:PORT, or auto for the one `ray start` began here) "
        "instead of local processes; --workers then defaults to the cluster's CPUs",
    )


def run_from_args(args: argparse.Namespace) -> int:
    if args.workers is not None and args.workers < 1:
        raise TesselError(f"--workers must be at least 1, got {args.workers}")
    if args.max_queue < 0 or args.job_timeout <= 0 or args.max_upload_mb <= 0 or args.import_memory_mb <= 0:
        raise TesselError(
            "--max-queue must be 0 or more, --job-timeout, --max-upload-mb and --import-memory-mb above 0"
        )
    names = check_prebuild(name.strip() for name in args.prebuild.split(",") if name.strip())
    serve(
        args.host,
        args.port,
        args.store,
        prebuild=names,
        max_upload_bytes=int(args.max_upload_mb * MiB),
        max_workers=args.workers,
        max_queue=args.max_queue,
        job_timeout_s=args.job_timeout,
        import_memory_bytes=int(args.import_memory_mb * MiB),
        ray=args.ray,
    )
    return 0


__all__ = ["add_arguments", "create_app", "run_from_args", "serve"]
