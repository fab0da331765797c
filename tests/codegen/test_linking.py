"""link.py: which linker each target uses, and the errors when a linker is missing or fails."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from compiler import link
from compiler.errors import TargetError
from compiler.target import Target


def test_linker_per_target():
    assert link.shared_library_command(Target.parse("llvm"))[-1] == "-shared"
    aarch64 = link.shared_library_command(Target.parse("llvm -mtriple=aarch64-linux-gnu"))
    assert aarch64 == [sys.executable, "-m", "ziglang", "cc", "-target", "aarch64-linux-gnu", "-shared"]
    armv7 = link.shared_library_command(Target.parse("llvm -mtriple=armv7-linux-gnueabihf"))
    assert armv7[-2:] == ["arm-linux-gnueabihf", "-shared"]
    with pytest.raises(TargetError, match="link_wasm"):
        link.shared_library_command(Target.parse("wasm"))


def test_host_falls_back_to_zig_without_cc(monkeypatch):
    monkeypatch.setattr(link.shutil, "which", lambda name: None)
    assert link.shared_library_command(Target.parse("llvm"))[:4] == [sys.executable, "-m", "ziglang", "cc"]


def test_missing_zig_says_what_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        link.importlib.util, "find_spec", lambda name: None if name == "ziglang" else real_find_spec(name)
    )
    with pytest.raises(TargetError, match="pip install ziglang"):
        link.link_wasm(b"", ["kernel"])
    with pytest.raises(TargetError, match="pip install ziglang"):
        link.shared_library_command(Target.parse("llvm -mtriple=aarch64-linux-gnu"))


def test_a_failing_link_reports_the_linker_message():
    with pytest.raises(TargetError, match="linking a wasm module failed"):
        link.link_wasm(b"not an object file", ["kernel"])
