"""compiler.build end to end: TE schedules lowered by tir/lower.py, compiled and run on both CPU
runtimes against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import compiler
from compiler import te

RNG = np.random.default_rng(11)


@pytest.mark.parametrize("target", ["llvm", "wasm"])
def test_parallel_vectorized_elementwise(target, every_parallel_loop_pooled):
    n = 1000
    a, b = te.placeholder((n,), name="a"), te.placeholder((n,), name="b")
    c = te.compute((n,), lambda i: te.sigmoid(a[i]) * b[i] + te.sqrt(te.abs(a[i])), name="c")
    schedule = te.create_schedule(c.op)
    outer, inner = schedule[c].split(c.op.axis[0], factor=8)
    schedule[c].parallel(outer)
    schedule[c].vectorize(inner)
    kernel = compiler.build(schedule, [a, b, c], target=target, name="fused")
    x, y, out = (
        RNG.standard_normal(n).astype("float32"),
        RNG.standard_normal(n).astype("float32"),
        np.zeros(n, "float32"),
    )
    kernel(x, y, out)
    np.testing.assert_allclose(out, 1 / (1 + np.exp(-x)) * y + np.sqrt(np.abs(x)), rtol=2e-6, atol=1e-6)
    assert "vectorized" in kernel.source("tir") and "parallel" in kernel.source("tir")
    assert ("tessel_parallel" in kernel.source("ll")) == (target == "llvm")


@pytest.mark.parametrize("target", ["llvm", "wasm"])
def test_tiled_matmul(target):
    n, m, k_size = 48, 40, 24
    a, b = te.placeholder((n, k_size), name="a"), te.placeholder((k_size, m), name="b")
    k = te.reduce_axis((0, k_size), name="k")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    schedule = te.create_schedule(c.op)
    i, j = c.op.axis
    j_outer, j_inner = schedule[c].split(j, factor=8)
    schedule[c].reorder(i, j_outer, k, j_inner)
    schedule[c].parallel(i)
    schedule[c].vectorize(j_inner)
    kernel = compiler.build(schedule, [a, b, c], target=target, name="matmul")
    x, y = RNG.standard_normal((n, k_size)).astype("float32"), RNG.standard_normal((k_size, m)).astype("float32")
    out = np.zeros((n, m), "float32")
    kernel(x, y, out)
    np.testing.assert_allclose(out, x @ y, rtol=1e-5, atol=1e-5)
    assert "x float>" in kernel.source("ll")


def test_gpu_style_schedule_runs_serially_on_cpu():
    """Blocks and threads bound to GPU axes, with a shared-memory copy of the input: on CPU the
    thread loops become serial loops and the barrier a no-op."""
    n = 256
    a = te.placeholder((n,), name="a")
    b = te.compute((n,), lambda i: a[i] * 2.0 + 1.0, name="b")
    schedule = te.create_schedule(b.op)
    shared = schedule.cache_read(a, "shared", [b])
    block, thread = schedule[b].split(b.op.axis[0], factor=64)
    schedule[b].bind(block, te.thread_axis("blockIdx.x"))
    schedule[b].bind(thread, te.thread_axis("threadIdx.x"))
    schedule[shared].compute_at(schedule[b], block)
    schedule[shared].bind(schedule[shared].op.axis[0], te.thread_axis("threadIdx.x"))
    kernel = compiler.build(schedule, [a, b], target="llvm", name="gpu_style")
    x, out = RNG.standard_normal(n).astype("float32"), np.zeros(n, "float32")
    kernel(x, out)
    np.testing.assert_allclose(out, x * 2 + 1, rtol=1e-6)
