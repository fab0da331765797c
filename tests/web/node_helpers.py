"""Runs one of tests/web's `node --test` files over cases a Python test wrote (bundles, inputs, expected outputs),
and fails with Node's report unless every Node test passed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest


def run_node_tests(test_file: Path, cases_env: str, cases: dict, folder: Path, timeout: int) -> None:
    """Write `cases` to folder/cases.json, name it in the environment variable `cases_env` and run `test_file`."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node (Node.js 20) is not installed; run `make test`, which installs it")
    cases_file = folder / "cases.json"
    cases_file.write_text(json.dumps(cases, indent=2))
    completed = subprocess.run(
        [node, "--test", "--test-reporter=spec", str(test_file)],
        env={**os.environ, cases_env: str(cases_file)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    report = completed.stdout + completed.stderr
    assert completed.returncode == 0, f"node --test failed:\n{report}"
    assert re.search(r"\bfail 0\b", report) and not re.search(r"\bpass 0\b", report), report
