"""Fuzzing what reaches Tessel from outside once a model is compiled: damaged bundles (flipped bytes,
truncations, manifest edits, each with and without the manifest's digests recomputed) loaded and run in a child
process, and hostile requests (bad multipart, odd and huge headers, traversal paths, bad form values, JSON
bodies) against the service, in process and over raw sockets against a real uvicorn. Every case must end in
success or in one TesselError / 4xx JSON answer: never another exception, a 500, a signal or a hang. The damaged
bundles also go through web_runtime/tessel.js in Node (fuzz_bundles.mjs), where success must be Python's result. Seeds are
fixed; the whole file takes about a minute on two cores. TESSEL_FUZZ_SCALE=10 runs ten times the cases."""

import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

from compiler import zoo
from compiler.build import compile_model, load_module
from server.app import create_app

ROOT = Path(__file__).resolve().parents[2]
SCALE = int(os.environ.get("TESSEL_FUZZ_SCALE", "1"))
BUNDLE_CASES = 150 * SCALE
REQUEST_CASES = 400 * SCALE
SOCKET_CASES = 100 * SCALE

# Loads and runs each bundle directory named on stdin, printing one JSON line per case; the parent reads which
# case was running if the process dies.
RUNNER = """
import json, sys
from compiler.build import load_module
from compiler.errors import TesselError
for line in sys.stdin:
    path = line.strip()
    print(json.dumps({"start": path}), flush=True)
    try:
        module = load_module(path)
        module.run(module.random_inputs())
        outcome = "ok"
    except TesselError as error:
        outcome = "error: " + type(error).__name__
    except Exception as error:
        import traceback
        outcome = "crash: " + "".join(traceback.format_exception(error))[-1500:]
    print(json.dumps({"done": path, "outcome": outcome}), flush=True)
"""


def _rehash(folder: Path, manifest: dict) -> None:
    manifest["files"] = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in manifest["files"]}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _mutate_json(value, rng: random.Random):
    """One random edit somewhere in a manifest: delete a key, change a type, or nudge a number."""
    if isinstance(value, dict) and value:
        key = rng.choice(sorted(value))
        roll = rng.random()
        if roll < 0.2:
            del value[key]
        elif roll < 0.35:
            value[key] = rng.choice([None, "x", -1, 2**70, [], {}, 1.5, True])
        else:
            value[key] = _mutate_json(value[key], rng)
        return value
    if isinstance(value, list) and value:
        index = rng.randrange(len(value))
        if rng.random() < 0.2:
            del value[index]
        else:
            value[index] = _mutate_json(value[index], rng)
        return value
    if isinstance(value, bool) or value is None:
        return rng.choice([0, "true", [], None])
    if isinstance(value, int):
        return rng.choice([value + 1, value - 1, -value, value * 2, 0, 2**63, str(value)])
    if isinstance(value, str):
        return rng.choice(["", value[:-1], value + "x", "../" + value, "\udcff", 7])
    return None


def _damaged(source: Path, folder: Path, rng: random.Random) -> str:
    """Copy the bundle at `source` into `folder` with one kind of damage; return the kind."""
    folder.mkdir(parents=True)
    for path in source.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    manifest = json.loads((folder / "manifest.json").read_text())
    kind = rng.choice(["flip", "truncate", "manifest", "manifest-text"])
    rehash = rng.random() < 0.7
    target = folder / rng.choice([*manifest["files"], "manifest.json"])
    if kind == "manifest":
        manifest = _mutate_json(manifest, rng)
        target = folder / "manifest.json"
    elif target.name != "manifest.json" or kind in ("flip", "truncate", "manifest-text"):
        data = bytearray(target.read_bytes())
        if kind == "truncate" and data:
            data = data[: rng.randrange(len(data))]
        else:
            for _ in range(rng.randint(1, 8)):
                if data:
                    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        target.write_bytes(bytes(data))
        if target.name == "manifest.json":
            return f"{kind} manifest.json"
    if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) and rehash:
        try:
            _rehash(folder, manifest)
        except (OSError, TypeError):
            (folder / "manifest.json").write_text(json.dumps(manifest))
    elif kind == "manifest":
        (folder / "manifest.json").write_text(json.dumps(manifest))
    return f"{kind} {target.name}{' rehashed' if rehash else ''}"


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-bundles")
    model = zoo.build_model("mlp")
    # the wasm bundle carries a threaded variant, as `tessel compile --target wasm` writes it, so tessel.js's
    # workers over shared memory meet the damage too
    return [
        compile_model(model, "llvm").export(root / "llvm"),
        compile_model(model, "wasm", wasm_variants=("threads",)).export(root / "wasm"),
    ]


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """Another model's wasm bundle, with the same variant."""
    root = tmp_path_factory.mktemp("fuzz-other")
    return compile_model(zoo.build_model("digits"), "wasm", wasm_variants=("threads",)).export(root / "digits")


def _run_cases(command: list[str], paths: list[str], feed_stdin: bool) -> dict[str, str]:
    """Run `command` over `paths` (on its stdin, one a line, or already in its arguments), restarting it past a case
    that kills it, until every case has an outcome or 300 s have passed; a case running when the process died or
    hung is a crash."""
    pending, outcomes, deadline = list(paths), {}, time.monotonic() + 300
    while pending and time.monotonic() < deadline:
        arguments = command if feed_stdin else [*command[:-1], _case_list(command[-1], pending)]
        runner = subprocess.Popen(
            arguments, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        runner.stdin.write("".join(path + "\n" for path in pending) if feed_stdin else "")
        runner.stdin.close()
        running = None
        for line in runner.stdout:
            message = json.loads(line)
            if "start" in message:
                running = message["start"]
            else:
                outcomes[message["done"]] = message["outcome"]
                running = None
        try:
            code = runner.wait(60)
        except subprocess.TimeoutExpired:
            runner.kill()
            code = runner.wait()
        if running is not None:
            name = signal.Signals(-code).name if code < 0 else f"exit {code}"
            outcomes[running] = f"crash: the process ended with {name}"
        pending = [path for path in pending if path not in outcomes]
    assert not pending, f"{len(pending)} cases did not finish in time (a hang?): {pending[:3]}"
    return outcomes


def _case_list(template: str, pending: list[str]) -> str:
    """The JSON file the Node runner reads: `template` (inputs and expected outputs) with the cases still pending."""
    path = Path(template)
    written = path.with_name(f"pending-{len(pending)}.json")
    written.write_text(json.dumps({**json.loads(path.read_text()), "cases": pending}))
    return str(written)


def _halve(value: int) -> int:
    return value // 2


# Edits of the wasm bundle's manifest that keep it well formed, each rehashed: the ones the issue saw tessel.js accept
# (a shape doubled or halved, a dtype or target changed, a file outside the bundle, an output's source or the entry
# renamed) and more of the fields the code relies on; the last one (memory limits, not bound to the code) must run.
TARGETED = {
    "input shape doubled": lambda m: m["inputs"][0]["shape"].__setitem__(1, m["inputs"][0]["shape"][1] * 2),
    "input shape halved": lambda m: m["inputs"][0]["shape"].__setitem__(1, _halve(m["inputs"][0]["shape"][1])),
    "output shape doubled": lambda m: m["outputs"][0]["shape"].__setitem__(1, m["outputs"][0]["shape"][1] * 2),
    "output shape halved": lambda m: m["outputs"][0]["shape"].__setitem__(1, _halve(m["outputs"][0]["shape"][1])),
    "output dtype int32": lambda m: m["outputs"][0].__setitem__("dtype", "int32"),
    "output dtype float64": lambda m: m["outputs"][0].__setitem__("dtype", "float64"),
    "a file outside the bundle": lambda m: m["files"].__setitem__("../../etc/passwd", m["files"]["params.bin"]),
    "target changed": lambda m: m.__setitem__("target", "wasm -mattr=+simd128"),
    "output source renamed": lambda m: m["outputs"][0].__setitem__("source", {"region": "weights", "index": 0}),
    "output source another output": lambda m: m["outputs"][0].__setitem__("source", {"region": "output", "index": 0}),
    "output source params": lambda m: m["outputs"][0].__setitem__("source", {"region": "params", "offset": 0}),
    "entry renamed": lambda m: m["entry"].__setitem__("name", "tessel_worker"),
    "arena halved": lambda m: m["memory"].__setitem__("arena_bytes", _halve(m["memory"]["arena_bytes"])),
    "param moved": lambda m: m["params"]["layout"][0].__setitem__("offset", 64),
    "calls reversed": lambda m: m["calls"].reverse(),
    "variant without threads": lambda m: m["variants"][0].__setitem__("features", []),
    "memory one page larger": lambda m: m["memory"]["wasm_import"].__setitem__(
        "initial_pages", m["memory"]["wasm_import"]["initial_pages"] + 1
    ),
}


def _targeted(source: Path, folder: Path, edit) -> None:
    shutil.copytree(source, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)
    for name in manifest["files"]:
        if "/" not in name:  # a file outside the bundle keeps the digest it was given
            manifest["files"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _damage_all(bundles, other, tmp_path) -> dict[str, str]:
    rng = random.Random(14)
    cases = {}
    for number in range(BUNDLE_CASES):
        folder = tmp_path / f"case{number}"
        cases[str(folder)] = _damaged(bundles[number % len(bundles)], folder, rng)
    for number, (kind, edit) in enumerate(TARGETED.items()):
        _targeted(bundles[1], tmp_path / f"targeted{number}", edit)
        cases[str(tmp_path / f"targeted{number}")] = kind
    # another model's code (and variant), rehashed: what a swapped or mislabelled model.wasm looks like
    swapped = tmp_path / "swapped"
    shutil.copytree(bundles[1], swapped)
    for name in ("model.wasm", "model.threads.wasm"):
        (swapped / name).write_bytes((other / name).read_bytes())
    _rehash(swapped, json.loads((swapped / "manifest.json").read_text()))
    cases[str(swapped)] = "another model's code, rehashed"
    return cases


def test_damaged_bundles_end_in_success_or_one_error(bundles, other, tmp_path):
    cases = _damage_all(bundles, other, tmp_path)
    outcomes = _run_cases([sys.executable, "-c", RUNNER], list(cases), feed_stdin=True)
    crashes = {cases[path]: outcome for path, outcome in outcomes.items() if outcome.startswith("crash")}
    assert not crashes, json.dumps(crashes, indent=1)[:6000]
    errors = sum(outcome.startswith("error") for outcome in outcomes.values())
    print(f"\n{len(outcomes)} damaged bundles: {errors} refused with one error, {len(outcomes) - errors} ran")
    assert errors > len(outcomes) // 2


def test_damaged_bundles_in_tessel_js_end_in_the_right_result_or_one_tessel_error(bundles, other, tmp_path):
    """The same damaged bundles (same seed) loaded and run by web_runtime/tessel.js in Node, every other case on two
    threads: each must give Python's outputs for the undamaged bundle or throw one TesselError, never another
    exception, a wrong result or a hang. The llvm bundles' cases are in too (tessel.js must refuse them cleanly)."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node (Node.js 20) is not installed; run `make test`, which installs it")
    cases = _damage_all(bundles, other, tmp_path / "cases")
    module = load_module(bundles[1])
    feeds = module.random_inputs()
    (expected,) = module.run(feeds).values()
    arrays = tmp_path / "arrays"
    arrays.mkdir()
    described = {}
    for kind, name, array in [("inputs", *next(iter(feeds.items()))), ("expected", module.outputs[0].name, expected)]:
        path = arrays / f"{kind}.bin"
        path.write_bytes(np.ascontiguousarray(array, np.float32).tobytes())
        described[kind] = {name: {"file": str(path), "shape": list(array.shape), "dtype": "float32"}}
    template = tmp_path / "cases.json"
    template.write_text(json.dumps(described))
    outcomes = _run_cases([node, str(ROOT / "tests/fuzz/fuzz_bundles.mjs"), str(template)], list(cases), False)
    bad = {
        f"{Path(path).name} {cases[path]}": outcome
        for path, outcome in outcomes.items()
        if not (outcome == "ok" or outcome.startswith("error: TesselError"))
    }
    assert not bad, json.dumps(bad, indent=1)[:6000]
    targeted = {cases[path]: outcome for path, outcome in outcomes.items() if "targeted" in path or "swapped" in path}
    assert targeted.pop("memory one page larger") == "ok"
    assert all(outcome.startswith("error") for outcome in targeted.values()), targeted
    errors = sum(outcome.startswith("error") for outcome in outcomes.values())
    kinds = sorted({outcome.split()[2] for outcome in outcomes.values() if outcome.startswith("error")})
    print(
        f"\ntessel.js, {len(outcomes)} damaged bundles: {errors} refused with one TesselError ({', '.join(kinds)}), "
        f"{len(outcomes) - errors} gave Python's result"
    )
    assert errors > len(outcomes) // 2


# ---- hostile requests ------------------------------------------------------------------------------------

PATH_PIECES = ["..", "%2e%2e", "%2E%2e%2f", "%00", "%0a", "//", "\\", "%5c", "~", "é", "%ff", "index.html", "a" * 300]
PREFIXES = ["/static/", "/runtime/", "/bundles/", "/api/jobs/", "/demo/", "/", "/bundles/x/", "/api/"]


def _hostile_path(rng: random.Random) -> str:
    return rng.choice(PREFIXES) + "/".join(rng.choice(PATH_PIECES) for _ in range(rng.randint(1, 5)))


def _multipart(rng: random.Random, model: bytes) -> tuple[bytes, str]:
    boundary = rng.choice(["b0undary", "x" * 70, "", "--", "a b"])
    fields = [
        ("file", "model.onnx", model if rng.random() < 0.5 else bytes(rng.getrandbits(8) for _ in range(64))),
        ("targets", None, rng.choice(["wasm", "llvm,wasm", "cuda", "", "wasm" * 100, "\x00"]).encode()),
        (
            "input_shapes",
            None,
            rng.choice(
                ["input=1,784", "input=99999999999999999999,8", "x=-1", "=", "input=1,784;input=2", "é=1"]
            ).encode(),
        ),
    ]
    parts = []
    for name, filename, data in rng.sample(fields, rng.randint(0, len(fields))):
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        parts.append(f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data + b"\r\n")
    body = b"".join(parts) + (f"--{boundary}--\r\n".encode() if rng.random() < 0.7 else b"")
    if rng.random() < 0.3 and body:
        body = body[: rng.randrange(len(body))]
    content_type = rng.choice([f"multipart/form-data; boundary={boundary}", "multipart/form-data", "application/json"])
    return body, content_type


def _check_answer(response, what: str) -> None:
    assert response.status_code < 500, f"{what}: {response.status_code} {response.text[:500]}"
    if response.status_code >= 400:
        assert "error" in response.json(), f"{what}: {response.text[:500]}"


def test_hostile_requests_get_success_or_one_json_4xx(tmp_path):
    rng = random.Random(1414)
    model = zoo.build_model("mlp").SerializeToString()
    app = create_app(tmp_path / "var", max_workers=1, max_upload_bytes=2**20)
    with TestClient(app, raise_server_exceptions=False) as client:
        for number in range(REQUEST_CASES):
            kind = number % 4
            if kind == 0:
                path = _hostile_path(rng)
                _check_answer(client.get("http://testserver" + path), f"GET {path}")
            elif kind == 1:
                body, content_type = _multipart(rng, model)
                response = client.post("/api/compile", content=body, headers={"content-type": content_type})
                _check_answer(response, f"multipart {body[:200]!r}")
            elif kind == 2:
                document = rng.choice(['{"file": 1}', "{", "[]", '{"targets": ["wasm"]}', "null", "\xff"])
                response = client.post(
                    "/api/compile", content=document.encode(), headers={"content-type": "application/json"}
                )
                _check_answer(response, f"JSON {document!r}")
            else:
                value = rng.choice(
                    [
                        "x" * 8000,
                        "\t",
                        "a\x7fb",
                        "é".encode().decode("latin-1"),
                        "multipart/form-data; boundary=" + "x" * 4000,
                    ]
                )
                name = rng.choice(["content-type", "x-odd", "accept", "range", "if-none-match"])
                response = client.post("/api/compile", content=b"abc", headers={name: value.encode("latin-1")})
                _check_answer(response, f"header {name}: {value[:80]!r}")


@pytest.fixture(scope="module")
def uvicorn_port(tmp_path_factory):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = tmp_path_factory.mktemp("fuzz-uvicorn") / "var"
    script = f"from server.app import serve; serve('127.0.0.1', {port}, {str(store)!r}, max_workers=1)"
    log = (store.parent / "uvicorn.log").open("w")
    process = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    yield port
    process.terminate()
    process.wait(10)
    log.close()


def _raw_request(rng: random.Random) -> bytes:
    method = rng.choice([b"GET", b"POST", b"PUT", b"G\x00T", b"", b"GET" * 50])
    target = rng.choice([b"/", b"/static/index.html%00.js", b"/" + b"a" * 20000, b"*", b"http://x/", b"/\xff"])
    version = rng.choice([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/9.9", b"", b"HTTP/1.1 extra"])
    headers = [b"Host: x"]
    for _ in range(rng.randint(0, 6)):
        name = rng.choice([b"Content-Length", b"Transfer-Encoding", b"X-" + b"h" * 100, b"Bad Name", b"\x01"])
        value = rng.choice([b"abc", b"-1", b"chunked", b"0", b"v" * 70000, b"1, 2", b"\x00", b"gzip, chunked"])
        headers.append(name + b": " + value)
    body = rng.choice([b"", b"0\r\n\r\n", b"zz\r\nhello\r\n", b"hello"])
    return method + b" " + target + b" " + version + b"\r\n" + b"\r\n".join(headers) + b"\r\n\r\n" + body


def test_raw_hostile_requests_against_uvicorn(uvicorn_port):
    rng = random.Random(41)
    for _ in range(SOCKET_CASES):
        request = _raw_request(rng)
        with socket.create_connection(("127.0.0.1", uvicorn_port), timeout=10) as connection:
            try:
                connection.sendall(request)
                connection.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the server may close as soon as it has read a header it refuses
            received = b""
            try:
                while chunk := connection.recv(65536):
                    received += chunk
            except ConnectionResetError:
                pass
        if not received:
            continue  # closed without an answer: nothing parsed enough to answer (h11 on a bare reset)
        head, _, rest = received.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
        status = int(lines[0].split(" ", 2)[1])
        # a request's leftover bytes may be answered as a second request: read the first answer only
        body = rest[: int(headers.get("content-length", len(rest)))]
        assert status < 500, (request[:300], received[:500])
        if status >= 400 and body:
            assert "error" in json.loads(body), (request[:300], received[:500])
