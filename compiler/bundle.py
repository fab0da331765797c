"""Bundles: the directory a compiled model is exported to and loaded from (DESIGN.md §4): manifest.json,
the code (model.so or model.wasm) and params.bin. build.py writes the manifest; this module writes the
files atomically and checks, on loading, the format version and every file's sha256."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from compiler.errors import TesselError

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
PARAMS_FILE = "params.bin"
CODE_FILES = {"llvm": "model.so", "wasm": "model.wasm"}


class BundleError(TesselError):
    """A bundle directory that is missing, incomplete, corrupted or of another format version."""


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_bundle(directory: str | Path, manifest: dict, files: dict[str, bytes]) -> Path:
    """Write `files` and a manifest listing their digests into `directory`, replacing what is there.

    Everything is written into a temporary directory beside the destination and renamed into place, so
    a reader sees the old bundle or the new one, never half of one."""
    directory = Path(directory).absolute()
    directory.parent.mkdir(parents=True, exist_ok=True)
    if directory.exists() and not (directory / MANIFEST_FILE).is_file() and any(directory.iterdir()):
        raise BundleError(f"{directory} exists and is not a bundle; choose an empty or new directory")
    manifest = {**manifest, "files": {name: _digest(data) for name, data in sorted(files.items())}}
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        staging.chmod(0o755)
        for name, data in files.items():
            (staging / name).write_bytes(data)
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        if directory.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old.", dir=directory.parent))
            os.replace(directory, retired / "bundle")
            os.replace(staging, directory)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def read_bundle(directory: str | Path) -> tuple[dict, dict[str, bytes]]:
    """The manifest and the files of a bundle, after checking its format version and every file's digest."""
    directory = Path(directory)
    if not directory.is_dir():
        raise BundleError(f"{directory} is not a bundle directory: no such directory")
    manifest_path = directory / MANIFEST_FILE
    if not manifest_path.is_file():
        raise BundleError(f"{directory} is not a bundle: {MANIFEST_FILE} is missing; export the model again")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise BundleError(f"{manifest_path} is corrupted (not JSON: {error}); export the model again") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{manifest_path} is corrupted (not a JSON object); export the model again")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise BundleError(
            f"{directory} has bundle format version {version!r}; this Tessel reads version {FORMAT_VERSION}: "
            "compile the model again with this version"
        )
    listed = manifest.get("files")
    if not isinstance(listed, dict) or not listed:
        raise BundleError(f"{manifest_path} lists no files; export the model again")
    files = {}
    for name, digest in listed.items():
        path = directory / name
        if Path(name).name != name or not path.is_file():
            raise BundleError(f"{directory} is incomplete: {name} is missing; export the model again")
        data = path.read_bytes()
        if _digest(data) != digest:
            raise BundleError(f"{path} is corrupted: its sha256 does not match the manifest; export the model again")
        files[name] = data
    return manifest, files
