"""load_module trusts nothing in a bundle: the manifest's schema (every key, type and size), params.bin's size,
and that the code was generated for this very manifest (its embedded binding digest, and for wasm the entry's
arguments) are checked before any kernel runs. Each case edits a bundle and rehashes it, so the files'
sha256 match and only these checks stand between the edit and a kernel writing past its buffers."""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from compiler import zoo
from compiler.build import compile_model, load_module
from compiler.bundle import BundleError

TARGETS = ["llvm", "wasm"]


@pytest.fixture(scope="module", params=TARGETS)
def exported(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"bundles-{request.param}")
    mlp = compile_model(zoo.build_model("mlp"), target=request.param).export(root / "mlp")
    digits = compile_model(zoo.build_model("digits"), target=request.param).export(root / "digits")
    return mlp, digits


@pytest.fixture
def bundle(exported, tmp_path):
    copy = tmp_path / "bundle"
    copy.mkdir()
    for path in exported[0].iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    return copy


def _manifest(bundle):
    return json.loads((bundle / "manifest.json").read_text())


def rehash(bundle, manifest=None):
    """Write `manifest` (or the bundle's own) with every file's sha256 recomputed, as an editor would."""
    manifest = manifest if manifest is not None else _manifest(bundle)
    manifest["files"] = {name: hashlib.sha256((bundle / name).read_bytes()).hexdigest() for name in manifest["files"]}
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def _edit(bundle, change):
    manifest = _manifest(bundle)
    change(manifest)
    rehash(bundle, manifest)


def test_an_untouched_bundle_loads_and_runs(bundle):
    rehash(bundle)
    module = load_module(bundle)
    assert module.run(module.random_inputs())["output"].shape == (1, 10)


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m["outputs"][0].update(shape=[1, 5]),
        lambda m: m["inputs"][0].update(shape=[1, 392]),
        lambda m: m["outputs"][0].update(dtype="float64"),
        lambda m: m["memory"].update(arena_bytes=16),
        lambda m: m["params"]["layout"][0].update(offset=64),
        lambda m: m["calls"][0]["args"][0].__setitem__(1, 1 << 20),
        lambda m: m.update(content_hash="0" * 64),
    ],
    ids=["output-shape", "input-shape", "dtype", "arena-bytes", "param-offset", "call-offset", "content-hash"],
)
def test_edited_manifest_is_refused_by_the_code_binding(bundle, change):
    _edit(bundle, change)
    with pytest.raises(BundleError, match="was not generated for this manifest.json|does not fit"):
        load_module(bundle)


@pytest.mark.parametrize(
    "key", ["inputs", "outputs", "memory", "params", "calls", "kernels", "entry", "code", "target", "content_hash"]
)
def test_missing_key_is_one_bundle_error(bundle, key):
    _edit(bundle, lambda m: m.pop(key))
    with pytest.raises(BundleError, match=f"manifest.{key} is missing"):
        load_module(bundle)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m["inputs"][0].update(shape=[1, -784]), r"inputs\[0\].shape\[1\] must be a whole number"),
        (lambda m: m["inputs"][0].update(shape=[2**30, 2**30]), "larger than"),
        (lambda m: m["inputs"][0].update(dtype="complex64"), r"inputs\[0\].dtype must be one of"),
        (lambda m: m["memory"].update(arena_bytes="16"), "arena_bytes must be a whole number"),
        (lambda m: m["memory"].update(arena_bytes=2**70), "arena_bytes must be a whole number"),
        (lambda m: m.update(inputs={}), "manifest.inputs must be a list"),
        (lambda m: m["calls"][0].update(kernel="kernel_99"), "unknown kernel"),
        (lambda m: m["params"].update(bytes=m["params"]["bytes"] + 1), "params.bin has"),
    ],
    ids=["negative-dim", "huge-shape", "dtype", "arena-type", "arena-huge", "inputs-type", "call-kernel", "params"],
)
def test_wrong_types_and_sizes_are_named(bundle, change, message):
    _edit(bundle, change)
    with pytest.raises(BundleError, match=message):
        load_module(bundle)


def test_empty_params_rehashed_is_refused(bundle):
    (bundle / "params.bin").write_bytes(b"")
    rehash(bundle)
    with pytest.raises(BundleError, match="params.bin has 0 bytes, the manifest says"):
        load_module(bundle)


def _code(bundle):
    return bundle / _manifest(bundle)["code"]


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.999])
def test_truncated_code_rehashed_is_refused(bundle, keep):
    code = _code(bundle)
    data = code.read_bytes()
    code.write_bytes(data[: int(len(data) * keep)])
    rehash(bundle)
    with pytest.raises(BundleError, match="truncated|not a loadable library|not a Tessel|not a valid wasm module"):
        load_module(bundle)


def test_swapped_code_rehashed_is_refused(bundle, exported):
    digits = exported[1]
    _code(bundle).write_bytes((digits / _manifest(digits)["code"]).read_bytes())
    rehash(bundle)
    with pytest.raises(BundleError, match="was not generated for this manifest.json|does not take"):
        load_module(bundle)


def test_flipped_code_bytes_never_take_the_process_down(bundle):
    """Each damaged library is loaded in a child process that must exit cleanly with a BundleError or a
    result: a signal there would be a signal in a user's process."""
    code = _code(bundle)
    original = code.read_bytes()
    rng = np.random.default_rng(7)
    script = (
        "import sys\nfrom compiler.build import load_module\nfrom compiler.errors import TesselError\n"
        "try:\n    m = load_module(sys.argv[1]); m.run(m.random_inputs())\nexcept TesselError as e:\n    print(e)\n"
    )
    for _ in range(6):
        damaged = bytearray(original)
        for position in rng.integers(0, len(damaged), 8):
            damaged[position] ^= 0xFF
        code.write_bytes(bytes(damaged))
        rehash(bundle)
        done = subprocess.run(
            [sys.executable, "-c", script, str(bundle)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=os.getcwd(),
        )
        assert done.returncode == 0, done.stderr[-2000:]


def test_a_deeply_nested_manifest_is_one_bundle_error(bundle):
    (bundle / "manifest.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(BundleError, match="not JSON"):
        load_module(bundle)


def test_edited_wasm_memory_limits_are_refused(bundle):
    if _manifest(bundle)["code"] != "model.wasm":
        pytest.skip("only wasm bundles import a memory")
    _edit(bundle, lambda m: m["memory"]["wasm_import"].update(initial_pages=1))
    with pytest.raises(BundleError, match="memory.wasm_import .* differs from model.wasm's"):
        load_module(bundle)
