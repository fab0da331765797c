"""Bundles: export writes manifest.json, the code and params.bin atomically; load_module checks the
format version and every file's sha256 and names what is wrong; a loaded bundle matches onnxruntime."""

import hashlib
import json

import numpy as np
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from compiler import zoo
from compiler.build import compile_model, load_module
from compiler.bundle import CHUNK_BYTES, FORMAT_VERSION, BundleError, chunked_digest, read_bundle, write_bundle
from compiler.errors import TesselError


@pytest.fixture(scope="module")
def digits_module():
    return compile_model(zoo.build_model("digits"), target="wasm")


@pytest.fixture
def bundle(digits_module, tmp_path):
    return digits_module.export(tmp_path / "digits")


def _expected(name, feeds):
    session = ort.InferenceSession(zoo.build_model(name).SerializeToString())
    return session.run(None, feeds)


def test_export_writes_the_bundle_files_with_their_digests(bundle, digits_module):
    assert sorted(path.name for path in bundle.iterdir()) == ["manifest.json", "model.wasm", "params.bin"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSION
    assert manifest["target"] == "wasm" and manifest["code"] == "model.wasm"
    assert manifest["inputs"] == [{"name": "input", "shape": [1, 1, 8, 8], "dtype": "float32"}]
    assert set(manifest["files"]) == {"model.wasm", "params.bin"}
    assert manifest["memory"]["arena_bytes"] <= manifest["memory"]["intermediate_bytes"]
    assert manifest["params"]["bytes"] == (bundle / "params.bin").stat().st_size
    assert all(entry["offset"] % 64 == 0 for entry in manifest["params"]["layout"])
    assert (bundle / "model.wasm").read_bytes()[:4] == b"\0asm"
    assert len(manifest["content_hash"]) == 64 and manifest["content_hash"] == digits_module.manifest["content_hash"]


def test_params_layout_holds_the_model_weights(bundle):
    manifest = json.loads((bundle / "manifest.json").read_text())
    data = (bundle / "params.bin").read_bytes()
    weights = {init.name: init for init in zoo.build_model("digits").graph.initializer}
    found = 0
    for entry in manifest["params"]["layout"]:
        array = np.frombuffer(data, entry["dtype"], int(np.prod(entry["shape"])), entry["offset"])
        if entry["name"] in weights:
            np.testing.assert_array_equal(array.reshape(entry["shape"]), numpy_helper.to_array(weights[entry["name"]]))
            found += 1
    assert found >= 1


def test_loaded_bundle_matches_onnxruntime(bundle):
    module = load_module(bundle)
    feeds = zoo.sample_input("digits")
    (expected,) = _expected("digits", feeds)
    np.testing.assert_allclose(module.run(feeds)["probabilities"], expected, rtol=1e-4, atol=1e-5)


def test_same_model_target_and_options_give_the_same_bundle_id(digits_module):
    again = compile_model(zoo.build_model("digits"), target="wasm")
    native = compile_model(zoo.build_model("digits"), target="llvm")
    assert again.manifest["content_hash"] == digits_module.manifest["content_hash"]
    assert native.manifest["content_hash"] != digits_module.manifest["content_hash"]


def test_a_flipped_byte_in_params_is_reported(bundle):
    data = bytearray((bundle / "params.bin").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bundle / "params.bin").write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"params\.bin is corrupted"):
        load_module(bundle)


def test_params_get_a_chunked_digest_for_runtimes_that_hash_while_downloading(bundle, digits_module):
    manifest = json.loads((bundle / "manifest.json").read_text())
    params = (bundle / "params.bin").read_bytes()
    assert manifest["chunked_files"] == {"chunk_bytes": CHUNK_BYTES, "sha256": {"params.bin": chunked_digest(params)}}
    assert digits_module.manifest["chunked_files"] == manifest["chunked_files"]
    # the sha256 of the pieces' sha256 digests, the last piece shorter; no pieces for an empty file
    data = bytes(range(256)) * 5
    pieces = [hashlib.sha256(data[start : start + 512]).digest() for start in (0, 512, 1024)]
    assert chunked_digest(data, 512) == hashlib.sha256(b"".join(pieces)).hexdigest()
    assert chunked_digest(b"") == hashlib.sha256(b"").hexdigest()
    assert chunked_digest(data, 512) != chunked_digest(data[:-1] + b"\x00", 512)


def test_a_missing_code_file_is_reported(bundle):
    (bundle / "model.wasm").unlink()
    with pytest.raises(BundleError, match=r"model\.wasm is missing"):
        load_module(bundle)


def test_another_format_version_is_reported(bundle):
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["format_version"] = FORMAT_VERSION + 1
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=f"format version {FORMAT_VERSION + 1}.*reads version {FORMAT_VERSION}"):
        load_module(bundle)


def test_a_broken_manifest_or_a_missing_directory_is_reported(bundle, tmp_path):
    (bundle / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match="manifest.json is corrupted"):
        load_module(bundle)
    with pytest.raises(BundleError, match="no such directory"):
        load_module(tmp_path / "nowhere")
    assert issubclass(BundleError, TesselError)


def test_export_replaces_a_bundle_atomically_and_refuses_other_directories(digits_module, tmp_path):
    target = tmp_path / "out"
    digits_module.export(target)
    (target / "params.bin").write_bytes(b"stale")
    digits_module.export(target)
    read_bundle(target)  # the stale file is gone: the whole directory was replaced
    assert [path.name for path in tmp_path.iterdir()] == ["out"]  # no staging directory is left behind
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"meow")
    with pytest.raises(BundleError, match="is not a bundle"):
        write_bundle(other, {"format_version": FORMAT_VERSION}, {"params.bin": b""})
    assert (other / "cat.jpg").read_bytes() == b"meow"
