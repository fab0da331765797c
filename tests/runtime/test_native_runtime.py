"""The native runtime: thread count control, library export, and cross builds that refuse to run."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from compiler.build import build_func
from compiler.errors import TargetError
from compiler.runtime.native import NUM_THREADS_ENV, default_num_threads
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
    assert default_num_threads() == len(os.sched_getaffinity(0))
    assert build_func(double_func(), "llvm").num_threads == len(os.sched_getaffinity(0))
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
    library = ctypes.CDLL(str(path))  # standalone: the thread pool is linked in, no OpenMP runtime is loaded
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
