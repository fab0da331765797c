"""Parallel-loop speedup of native kernels: one compute-heavy elementwise kernel and one matmul,
built from TE schedules with a parallel outer loop, timed with 1 and 2 threads of Tessel's pool (median of
many runs). Run: .venv/bin/python benchmarks/parallel.py"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

import compiler
from compiler import te


def activation_kernel(size: int):
    x = te.placeholder((size,), name="x")
    y = te.compute((size,), lambda i: te.erf(x[i]) * te.tanh(x[i]) + te.sigmoid(x[i]) * te.exp(x[i] * -0.5), name="y")
    schedule = te.create_schedule(y.op)
    outer, inner = schedule[y].split(y.op.axis[0], factor=16)
    schedule[y].parallel(outer)
    schedule[y].vectorize(inner)
    kernel = compiler.build(schedule, [x, y], target="llvm", name="activation")
    data = np.random.default_rng(0).uniform(-4, 4, size).astype("float32")
    return kernel, [data, np.zeros_like(data)]


def matmul_kernel(size: int):
    a = te.placeholder((size, size), name="a")
    b = te.placeholder((size, size), name="b")
    k = te.reduce_axis((0, size), name="k")
    c = te.compute((size, size), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    schedule = te.create_schedule(c.op)
    i, j = c.op.axis
    j_outer, j_inner = schedule[c].split(j, factor=16)
    schedule[c].reorder(i, j_outer, k, j_inner)
    schedule[c].parallel(i)
    schedule[c].vectorize(j_inner)
    kernel = compiler.build(schedule, [a, b, c], target="llvm", name="matmul")
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((size, size)).astype("float32") for _ in range(2)]
    return kernel, [*arrays, np.zeros((size, size), "float32")]


def median_seconds(kernel, arrays, threads: int, repeats: int) -> float:
    kernel.num_threads = threads
    kernel(*arrays)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        kernel(*arrays)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    print(f"cores: {os.cpu_count()}")
    for label, (kernel, arrays) in (
        ("activation 1<<22 (erf*tanh + sigmoid*exp)", activation_kernel(1 << 22)),
        ("matmul 384x384x384", matmul_kernel(384)),
    ):
        one = median_seconds(kernel, arrays, 1, 41)
        two = median_seconds(kernel, arrays, 2, 41)
        print(f"{label}: 1 thread {one * 1e3:.2f} ms, 2 threads {two * 1e3:.2f} ms, speedup {one / two:.2f}x")


if __name__ == "__main__":
    main()
