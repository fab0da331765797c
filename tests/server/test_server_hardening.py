"""The service as a hostile client meets it: an upload that folds into a huge constant is imported in a
process of its own (the server's memory stays put, the client gets a 4xx), an encoded NUL in a page path,
requests uvicorn cannot parse (answered with JSON, checked over a raw socket against a real uvicorn), the
zoo's demo links, and a non-editable install that serves the pages."""

import io
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from server_helpers import assert_isolated, upload, wait_finished

from compiler import zoo

ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20


def folds_into(count: int, elements: int = 2**20) -> bytes:
    """About 80 bytes of ONNX per constant of `elements` float32 that its import computes (ConstantOfShape, each
    kept as a param of an Add chain): every one is within a per-node folding limit, and 300 of them are 1.2 GiB
    from 24 KB."""
    nodes, previous = [], "x"
    for number in range(count):
        value = helper.make_tensor(f"v{number}", TensorProto.FLOAT, [1], [float(number)])
        nodes.append(helper.make_node("ConstantOfShape", ["s"], [f"c{number}"], value=value))
        nodes.append(helper.make_node("Add", [previous, f"c{number}"], [f"a{number}"]))
        previous = f"a{number}"
    graph = helper.make_graph(
        nodes,
        "amplified",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [elements])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [elements])],
        [helper.make_tensor("s", TensorProto.INT64, [1], [elements])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _resident_bytes() -> int:
    with open("/proc/self/statm") as stream:
        return int(stream.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_hostile_upload_cannot_grow_the_server(serve):
    client = serve(import_memory_bytes=256 * MiB)
    before, peak, done = _resident_bytes(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _resident_bytes())
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        response = upload(client, folds_into(300))  # 1.2 GiB of constants
    finally:
        done.set()
        sampler.join()
    assert response.status_code == 413, response.text
    assert "needs more than this server's 256 MiB" in response.json()["error"]
    assert_isolated(response)
    assert peak[0] - before < 64 * MiB, f"the server grew by {(peak[0] - before) / MiB:.0f} MiB"
    # the same limits let an ordinary model through
    assert upload(client, folds_into(2, 1024)).status_code == 202


def test_an_encoded_nul_in_a_page_path_is_a_404(serve):
    client = serve()
    for path in ("/static/index.html%00.js", "/runtime/tessel.js%00", "/static/%0a"):
        response = client.get(path)
        assert response.status_code == 404 and "error" in response.json(), (path, response.text)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def uvicorn_server(tmp_path_factory):
    """`tessel serve`'s own uvicorn set-up on 127.0.0.1, stopped when the module's tests end."""
    port = _free_port()
    store = tmp_path_factory.mktemp("uvicorn") / "var"
    script = f"from server.app import serve; serve('127.0.0.1', {port}, {str(store)!r}, max_workers=1)"
    log_path = store.parent / "uvicorn.log"
    log = log_path.open("w")
    process = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            time.sleep(0.1)
    else:
        process.kill()
        pytest.fail(f"uvicorn did not start: {log_path.read_text()[-2000:]}")
    yield port
    process.terminate()
    process.wait(10)
    log.close()


def raw_request(port: int, request: bytes, timeout: float = 10.0) -> tuple[int, dict, bytes]:
    """Send `request` as is and read the answer until the server closes or `timeout` passes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(request)
        connection.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines if ": " in line)
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize("length", [b"abc", b"-1", b"1e3", b"12, 13", b" "])
def test_a_malformed_content_length_gets_a_json_400(uvicorn_server, length):
    request = b"POST /api/compile HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\nhello"
    status, headers, body = raw_request(uvicorn_server, request)
    assert status == 400 and headers["content-type"] == "application/json"
    assert "not valid HTTP/1.1" in json.loads(body)["error"]
    assert headers["cross-origin-opener-policy"] == "same-origin"


def test_a_huge_content_length_is_refused_before_its_body(uvicorn_server):
    request = b"POST /api/compile HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n"
    status, headers, body = raw_request(uvicorn_server, request)
    assert status == 413 and "limit" in json.loads(body)["error"]


def test_a_garbage_request_line_gets_a_json_400(uvicorn_server):
    status, headers, body = raw_request(uvicorn_server, b"\x00\x01\x02 / HTTP/1.1\r\n\r\n")
    assert status == 400 and "error" in json.loads(body)


def test_a_non_editable_install_serves_the_pages(tmp_path):
    """`pip install --no-deps --target` of a copy of the project (its dependencies come from this interpreter's
    site-packages), then the installed package, not this checkout, serves the pages."""
    source = tmp_path / "source"
    for name in ("compiler", "server", "static", "web_runtime"):
        shutil.copytree(ROOT / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    target = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(source)]
    done = subprocess.run(install, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    check = (
        "import server, sys\n"
        f"assert server.__file__.startswith({str(target)!r}), server.__file__\n"
        "from starlette.testclient import TestClient\n"
        "from server.app import create_app\n"
        f"with TestClient(create_app({str(tmp_path / 'var')!r}, max_workers=1)) as client:\n"
        "    for path in ('/', '/static/index.html', '/runtime/tessel.js', '/static/demo.js'):\n"
        "        response = client.get(path)\n"
        "        assert response.status_code == 200, (path, response.status_code)\n"
        "print('served')\n"
    )
    environment = {**os.environ, "PYTHONPATH": str(target)}
    done = subprocess.run(
        [sys.executable, "-P", "-c", check], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "served" in done.stdout, done.stderr[-3000:]


# ---- zips of a model and its external data ------------------------------------------------------------


def _zip(members: dict[str, bytes], links: tuple[str, ...] = ()) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        for name in links:
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, "/etc/passwd")
    return buffer.getvalue()


def external_mlp(tmp_path: Path, location: str = "mlp.onnx.data") -> dict[str, bytes]:
    """zoo's mlp saved as torch.onnx.export and onnx.save(save_as_external_data=True) write it: the weights in a
    data file beside the model."""
    folder = tmp_path / "external"
    folder.mkdir(exist_ok=True)
    onnx.save(
        zoo.build_model("mlp"), folder / "mlp.onnx", save_as_external_data=True, location=location, size_threshold=0
    )
    return {path.name: path.read_bytes() for path in folder.iterdir()}


def test_a_zip_of_a_model_and_its_external_data_compiles(serve, tmp_path):
    client = serve()
    members = external_mlp(tmp_path)
    assert len(members["mlp.onnx"]) < 1000 < len(members["mlp.onnx.data"])
    response = upload(client, _zip({f"model/{name}": data for name, data in members.items()}), "mlp.zip")
    assert response.status_code == 202, response.text
    job = wait_finished(client, response.json()["job"])
    assert job["state"] == "done", job
    bundle = job["result"]["bundles"]["wasm"]["id"]
    inline = upload(client, zoo.build_model("mlp").SerializeToString())
    inline_job = wait_finished(client, inline.json()["job"])
    manifest = client.get(f"/bundles/{bundle}/manifest.json").json()
    assert (
        manifest["params"]["bytes"]
        == client.get(f"/bundles/{inline_job['result']['bundles']['wasm']['id']}/manifest.json").json()["params"][
            "bytes"
        ]
    )


@pytest.mark.parametrize(
    "members, links, message",
    [
        ({"../evil.onnx": b"x"}, (), "a path outside its own folder"),
        ({"/abs/model.onnx": b"x"}, (), "a path outside its own folder"),
        ({"model.onnx": b"x"}, ("mlp.onnx.data",), "as a symbolic link"),
        (
            {"a.onnx": b"x", "b.onnx": b"x"},
            (),
            "exactly one .onnx model beside its data files; it holds a.onnx, b.onnx",
        ),
        ({"weights.bin": b"x"}, (), "it holds none"),
    ],
    ids=["parent", "absolute", "link", "two-models", "no-model"],
)
def test_a_hostile_zip_is_one_clear_400(serve, members, links, message):
    client = serve()
    response = upload(client, _zip(members, links), "model.zip")
    assert response.status_code == 400 and message in response.json()["error"], response.text


@pytest.mark.parametrize(
    "location, drop, message",
    [
        ("../../../etc/passwd", False, "outside the model's folder"),
        ("mlp.onnx.data", True, "which the zip does not hold"),
    ],
    ids=["escaping", "missing"],
)
def test_external_data_must_be_a_file_in_the_zip(serve, tmp_path, location, drop, message):
    client = serve()
    members = external_mlp(tmp_path)
    model = onnx.load_from_string(members["mlp.onnx"])
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    members["mlp.onnx"] = model.SerializeToString()
    if drop:
        del members["mlp.onnx.data"]
    response = upload(client, _zip(members), "model.zip")
    assert response.status_code == 400 and message in response.json()["error"], response.text


def test_a_zip_bomb_stops_at_the_limit(serve):
    client = serve(import_memory_bytes=16 * MiB)
    bomb = _zip({"model.onnx": b"x", "zeros.bin": bytes(64 * MiB)})
    assert len(bomb) < MiB
    response = upload(client, bomb, "bomb.zip")
    assert response.status_code == 400 and "more than this server's 16 MiB once extracted" in response.json()["error"]


def test_a_damaged_zip_is_a_400(serve, tmp_path):
    client = serve()
    data = _zip(external_mlp(tmp_path))
    response = upload(client, data[: len(data) // 2], "model.zip")
    assert response.status_code == 400 and "zip" in response.json()["error"], response.text


def test_a_model_and_its_data_files_in_one_upload_compile(serve, tmp_path):
    client = serve()
    members = external_mlp(tmp_path)
    files = [("file", (name, data, "application/octet-stream")) for name, data in sorted(members.items())]
    response = client.post("/api/compile", files=files)
    assert response.status_code == 202, response.text
    job = wait_finished(client, response.json()["job"])
    assert job["state"] == "done", job
    # the same files in the other order are the same upload: its bundle is reused
    again = client.post("/api/compile", files=files[::-1])
    assert wait_finished(client, again.json()["job"])["result"]["bundles"]["wasm"]["reused"] is True
    repeated = client.post("/api/compile", files=[files[0], files[0]])
    assert repeated.status_code == 400 and "twice" in repeated.json()["error"]
    without_data = client.post("/api/compile", files=[files[0], ("file", ("notes.txt", b"x", "text/plain"))])
    assert without_data.status_code == 400 and "does not hold" in without_data.json()["error"], without_data.text
