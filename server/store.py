"""The server's disk: a content-addressed store of bundles (what compiler.Module.export writes), the job
records that survive a restart, and the transient uploads and staging directories. jobs.py writes into
it from the worker processes; app.py serves from it. Every path a request names is checked here."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path

from compiler.bundle import MANIFEST_FILE

BUNDLE_ID = re.compile(r"[0-9a-f]{64}")
JOB_ID = re.compile(r"[0-9a-f]{32}")
BUILD_INFO_FILE = "build.json"


class Store:
    """`root/bundles/<id>/` holds one bundle (plus build.json, which is never served), `root/bundles/<id>.zip`
    its archive, `root/jobs/<id>.json` one job record; `root/uploads/` and `root/tmp/` hold files that
    live only while a job or a write is in flight."""

    def __init__(self, root: str | Path):
        self.root = Path(root).absolute()
        self.bundles = self.root / "bundles"
        self.jobs = self.root / "jobs"
        self.uploads = self.root / "uploads"
        self.staging = self.root / "tmp"
        for directory in (self.bundles, self.jobs, self.uploads, self.staging):
            directory.mkdir(parents=True, exist_ok=True)

    def clear_transient(self) -> None:
        """Drop uploads and half-written files a previous process left behind."""
        for directory in (self.uploads, self.staging):
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True, exist_ok=True)

    # ---- bundles ----------------------------------------------------------------------------------

    def bundle_dir(self, bundle_id: str) -> Path | None:
        """The directory of a stored bundle, or None for a malformed id, a missing bundle, or a directory
        that is a link or leads outside the store."""
        if not BUNDLE_ID.fullmatch(bundle_id):
            return None
        directory = self.bundles / bundle_id
        if directory.is_symlink() or not (directory / MANIFEST_FILE).is_file():
            return None
        if directory.resolve().parent != self.bundles.resolve():
            return None
        return directory

    def has_bundle(self, bundle_id: str) -> bool:
        return self.bundle_dir(bundle_id) is not None

    def manifest(self, bundle_id: str) -> dict | None:
        directory = self.bundle_dir(bundle_id)
        if directory is None:
            return None
        return json.loads((directory / MANIFEST_FILE).read_text())

    def bundle_file(self, bundle_id: str, name: str) -> Path | None:
        """A file of a bundle, only when its name is manifest.json or one the manifest lists, and it is a
        plain file inside the bundle's directory (not a link)."""
        manifest = self.manifest(bundle_id)
        if manifest is None or (name != MANIFEST_FILE and name not in manifest.get("files", {})):
            return None
        directory = self.bundles / bundle_id
        path = directory / name
        if path.is_symlink() or not path.is_file() or path.resolve().parent != directory.resolve():
            return None
        return path

    def bundle_files(self, bundle_id: str) -> dict[str, int]:
        """Every served file of a bundle and its size in bytes, manifest.json first."""
        manifest = self.manifest(bundle_id) or {}
        names = [MANIFEST_FILE, *sorted(manifest.get("files", {}))]
        return {name: path.stat().st_size for name in names if (path := self.bundle_file(bundle_id, name))}

    def build_info(self, bundle_id: str) -> dict:
        directory = self.bundle_dir(bundle_id)
        path = directory / BUILD_INFO_FILE if directory else None
        return json.loads(path.read_text()) if path and path.is_file() else {}

    def new_staging_dir(self) -> Path:
        return Path(tempfile.mkdtemp(dir=self.staging))

    def install_bundle(self, staging: Path, bundle_id: str) -> bool:
        """Move a finished bundle directory into place in one rename; False when an identical bundle got
        there first (content-addressed, so the one already stored is as good)."""
        try:
            os.rename(staging, self.bundles / bundle_id)
        except OSError:
            if not self.has_bundle(bundle_id):
                raise
            shutil.rmtree(staging, ignore_errors=True)
            return False
        return True

    def bundle_zip(self, bundle_id: str) -> Path | None:
        """The bundle as a zip archive holding `<id>/<file>`, written once on first request and kept, since
        a bundle never changes."""
        files = self.bundle_files(bundle_id)
        if not files:
            return None
        path = self.bundles / f"{bundle_id}.zip"
        if path.is_file() and not path.is_symlink():
            return path
        handle, partial = tempfile.mkstemp(dir=self.staging, suffix=".zip")
        with os.fdopen(handle, "wb") as stream, zipfile.ZipFile(stream, "w", zipfile.ZIP_DEFLATED) as archive:
            for name in files:
                archive.write(self.bundles / bundle_id / name, f"{bundle_id}/{name}")
        os.replace(partial, path)
        return path

    # ---- job records ------------------------------------------------------------------------------

    def save_job(self, record: dict) -> None:
        """Write a job record atomically: a reader sees the old record or the new one."""
        handle, partial = tempfile.mkstemp(dir=self.staging, suffix=".json")
        with os.fdopen(handle, "w") as stream:
            json.dump(record, stream, indent=1)
        os.replace(partial, self.jobs / f"{record['id']}.json")

    def load_jobs(self) -> list[dict]:
        """Every readable job record; a record that is not valid JSON (a disk fault) is skipped."""
        records = []
        for path in sorted(self.jobs.glob("*.json")):
            if not JOB_ID.fullmatch(path.stem):
                continue
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(record, dict) and record.get("id") == path.stem:
                records.append(record)
        return records

    def upload_path(self, job_id: str) -> Path:
        return self.uploads / f"{job_id}.onnx"

    def records_path(self, job_id: str) -> Path:
        """Where an upload's tuning log (tessel tune) waits for its compile."""
        return self.uploads / f"{job_id}.records.jsonl"
