"""Helpers of the compile-service tests: zoo models as upload bytes, uploading, waiting for a job to
finish, checking the isolation headers, and calling the ASGI app directly with a body it reads on demand."""

import asyncio
import time

from starlette.testclient import TestClient

from compiler import zoo

ISOLATION = {
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-embedder-policy": "require-corp",
    "cross-origin-resource-policy": "same-origin",
}


def model_bytes(name: str) -> bytes:
    return zoo.build_model(name).SerializeToString()


def upload(client: TestClient, data: bytes, filename: str = "model.onnx", **fields):
    return client.post("/api/compile", files={"file": (filename, data, "application/octet-stream")}, data=fields)


def wait_finished(client: TestClient, job_id: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/api/jobs/{job_id}").json()
        if job["state"] in ("done", "failed"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish within {timeout} s: {job}")


def assert_isolated(response) -> None:
    for name, value in ISOLATION.items():
        assert response.headers.get(name) == value, (response.request.url, name, dict(response.headers))


def call_asgi(app, method: str, path: bytes, headers: list[tuple[bytes, bytes]], body_chunks) -> tuple[int, bytes, int]:
    """Send one request straight to the ASGI app, the body taken from the iterator `body_chunks` only as
    the app asks for it; returns the status, the response body and how many body chunks were read."""
    chunks = iter(body_chunks)
    read = 0
    messages = []

    async def receive():
        nonlocal read
        chunk = next(chunks, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        read += 1
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message):
        messages.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path.decode("latin-1"),
        "raw_path": path,
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    asyncio.run(app(scope, receive, send))
    start = next(message for message in messages if message["type"] == "http.response.start")
    body = b"".join(message.get("body", b"") for message in messages if message["type"] == "http.response.body")
    return start["status"], body, read
