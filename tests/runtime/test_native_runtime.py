"""The native runtime: thread count control, library export, and cross builds that refuse to run."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

from compiler.build import build_func
from compiler.errors import TargetError
from compiler.runtime.native import NUM_THREADS_ENV, SPIN_ROUNDS, WAIT_POLICY_ENVS, default_num_threads
from compiler.te.expr import Const, Var
from compiler.tir.nodes import Buffer, For, ForKind, Load, PrimFunc, Store


def double_func(kind: ForKind = ForKind.PARALLEL) -> PrimFunc:
    x, out = Buffer("x", (1000,), "float32"), Buffer("out", (1000,), "float32")
    i = Var("i")
    body = Store(out, i, Load(x, i) * Const(2.0, "float32"))
    return PrimFunc("double", [x, out], For(i, Const(0, "int32"), Const(1000, "int32"), kind, body))


def test_num_threads_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(NUM_THREADS_ENV, "3")
    assert default_num_threads() == 3
    kernel = build_func(double_func(), "llvm")
    assert kernel.num_threads == 3
    monkeypatch.delenv(NUM_THREADS_ENV)
    assert default_num_threads() == 0
    monkeypatch.setenv(NUM_THREADS_ENV, "many")
    with pytest.raises(TargetError, match=NUM_THREADS_ENV):
        default_num_threads()


@pytest.mark.parametrize("threads", [1, 2, 0])
def test_every_thread_count_gives_the_same_result(threads):
    kernel = build_func(double_func(), "llvm", num_threads=threads)
    assert kernel.num_threads == threads
    x = np.random.default_rng(0).standard_normal(1000).astype("float32")
    out = np.zeros_like(x)
    kernel(x, out)
    np.testing.assert_array_equal(out, x * 2)


def test_export_library_writes_a_loadable_shared_object(tmp_path):
    kernel = build_func(double_func(), "llvm")
    path = kernel.export_library(tmp_path / "double.so")
    ctypes.CDLL("libgomp.so.1", mode=ctypes.RTLD_GLOBAL)
    library = ctypes.CDLL(str(path))
    x = np.arange(1000, dtype="float32")
    out = np.zeros_like(x)
    library.double(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(out.ctypes.data))
    np.testing.assert_array_equal(out, x * 2)


def test_source_levels():
    kernel = build_func(double_func(ForKind.SERIAL), "llvm")
    assert "define void @double(" in kernel.source("ll")
    assert "double:" in kernel.source("asm")
    with pytest.raises(TargetError, match="tir, ll or asm"):
        kernel.source("wgsl")


def test_cross_kernel_cannot_be_called_here():
    kernel = build_func(double_func(ForKind.SERIAL), "llvm -mtriple=aarch64-linux-gnu")
    with pytest.raises(TargetError, match="cross-compiled for aarch64"):
        kernel(np.zeros(1000, "float32"), np.zeros(1000, "float32"))


_LOAD_GOMP = (
    "from compiler.runtime import native; native._load_gomp(); import os; print('GOMP_SPINCOUNT' in os.environ)"
)


def _libgomp_settings(**environment: str) -> tuple[str, str]:
    """What libgomp itself reports (OMP_DISPLAY_ENV) for its spin count once the runtime has loaded it in a fresh
    process, and whether GOMP_SPINCOUNT is left in that process's environment."""
    env = {name: value for name, value in os.environ.items() if name not in WAIT_POLICY_ENVS}
    child = subprocess.run(
        [sys.executable, "-c", _LOAD_GOMP],
        env={**env, "OMP_DISPLAY_ENV": "VERBOSE", **environment},
        capture_output=True,
        text=True,
        check=True,
    )
    (line,) = [line for line in child.stderr.splitlines() if "GOMP_SPINCOUNT" in line]
    return line.split("=")[1].strip().strip("'"), child.stdout.strip()


def test_libgomp_workers_spin_briefly_by_default_and_the_user_can_choose():
    assert _libgomp_settings() == (str(SPIN_ROUNDS), "False")
    assert _libgomp_settings(OMP_WAIT_POLICY="PASSIVE") == ("0", "False")
    assert _libgomp_settings(GOMP_SPINCOUNT="12345") == ("12345", "True")
