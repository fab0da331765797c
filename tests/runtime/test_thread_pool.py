"""Tessel's thread pool (codegen/thread_pool.c) and the work rule (tir/work.py): parallel loops give the results of
one thread at every thread count, over repeated calls and from several Python threads at once; a loop below the
work threshold is emitted without a pool call and never reaches the pool; whole models match one thread."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import compiler
from compiler import te, zoo
from compiler.build import build_func
from compiler.te.expr import Const, Var
from compiler.tir import work
from compiler.tir.nodes import Buffer, For, ForKind, Load, PrimFunc, Store


def affine_func(size: int) -> PrimFunc:
    """out[i] = x[i] * 3 + 1 over one parallel loop: 3 operations per iteration (a load, a multiply, an add) and
    the store."""
    x, out = Buffer("x", (size,), "float32"), Buffer("out", (size,), "float32")
    i = Var("i")
    body = Store(out, i, Load(x, i) * Const(3.0, "float32") + Const(1.0, "float32"))
    return PrimFunc("affine", [x, out], For(i, Const(0, "int32"), Const(size, "int32"), ForKind.PARALLEL, body))


def test_work_counts_operations_times_iterations_and_vectors_once():
    assert work.stmt_work(affine_func(1000).body) == 1000 * 4
    x, out = Buffer("x", (64, 16), "float32"), Buffer("out", (64, 16), "float32")
    row, lane = Var("row"), Var("lane")
    flat = row * 16 + lane
    exp = Store(out, flat, te.exp(Load(x, flat)))
    lanes = For(lane, Const(0, "int32"), Const(16, "int32"), ForKind.VECTORIZED, exp)
    rows = For(row, Const(0, "int32"), Const(64, "int32"), ForKind.PARALLEL, lanes)
    assert work.stmt_work(rows) == 64 * (1 + work.CALL_OPERATIONS["exp"] + 1)
    unknown = For(row, Const(0, "int32"), Var("n"), ForKind.PARALLEL, exp)
    assert work.stmt_work(unknown) is None and work.worth_parallel(unknown)


def test_a_vectorized_access_that_is_not_contiguous_costs_per_lane():
    """A channel shuffle or layout transform gathers: counted as one vector load, such loops were estimated below the
    threshold and ran on one thread for 20-40 us each."""
    x, out = Buffer("x", (16, 64), "float32"), Buffer("out", (64, 16), "float32")
    row, lane = Var("row"), Var("lane")

    def loop(index):
        lanes = For(lane, Const(0, "int32"), Const(16, "int32"), ForKind.VECTORIZED, Store(out, row * 16 + lane, index))
        return For(row, Const(0, "int32"), Const(64, "int32"), ForKind.PARALLEL, lanes)

    assert work.stmt_work(loop(Load(x, row * 16 + lane))) == 64 * 2  # contiguous: one vector load and one store
    assert work.stmt_work(loop(Load(x, row + lane * 2))) == 64 * (2 + 1)  # stride 2: about two vectors' span
    assert work.stmt_work(loop(Load(x, row + lane * 64))) == 64 * (16 + 1)  # a transpose: a load per lane
    shuffled = lane % Const(2, "int32") * 8 + lane // Const(2, "int32")
    gather = work.stmt_work(loop(Load(x, row * 16 + shuffled)))
    assert gather == 64 * (16 + work.expr_operations(row * 16 + shuffled) + 1)  # not affine: its index too


def test_chunks_cover_every_iteration_once_at_every_extent_and_thread_count():
    """The pool's chunks are [k*n/pieces, (k+1)*n/pieces): no iteration is skipped or run twice, whatever the extent
    against the thread count (fewer iterations than chunks included)."""
    for extent in (1, 2, 3, 5, 7, 8, 13, 21, 28, 31):
        width = work.PARALLEL_MIN_WORK // (3 * extent) + 1  # 3 operations an element: just above the threshold
        out = Buffer("out", (extent * width,), "float32")
        i, j = Var("i"), Var("j")
        flat = i * width + j
        inner = For(
            j,
            Const(0, "int32"),
            Const(width, "int32"),
            ForKind.SERIAL,
            Store(out, flat, Load(out, flat) + Const(1.0, "float32")),
        )
        func = PrimFunc("count", [out], For(i, Const(0, "int32"), Const(extent, "int32"), ForKind.PARALLEL, inner))
        kernel = build_func(func, num_threads=2)
        assert "call void @tessel_parallel" in kernel.source("ll")
        for threads in (2, 3, 5, 1):
            kernel.num_threads = threads
            buffer = np.zeros(extent * width, "float32")
            for _ in range(10):  # dense calls: the workers are woken and take chunks
                kernel(buffer)
            np.testing.assert_array_equal(buffer, np.full_like(buffer, 10.0), err_msg=f"{extent} x {threads}")
        assert kernel.runtime.pool_jobs == 30


def test_a_loop_below_the_threshold_stays_on_the_calling_thread():
    small = work.PARALLEL_MIN_WORK // 4 - 1  # 4 operations per iteration: just below the threshold
    large = work.PARALLEL_MIN_WORK // 4 + 1
    kernel_small, kernel_large = (
        build_func(affine_func(small), num_threads=4),
        build_func(affine_func(large), num_threads=4),
    )
    assert "tessel_parallel" not in kernel_small.source("ll")
    (call,) = [line for line in kernel_large.source("ll").splitlines() if "call void @tessel_parallel" in line]
    assert f"i64 {large * 4})" in call  # the estimate goes to the pool, which decides on waking
    for kernel, size in ((kernel_small, small), (kernel_large, large)):
        x = np.arange(size, dtype="float32")
        out = np.zeros_like(x)
        kernel(x, out)
        np.testing.assert_array_equal(out, x * 3 + 1)
    assert kernel_small.runtime.pool_jobs == 0
    assert kernel_large.runtime.pool_jobs == 1


def test_every_thread_count_and_repeated_calls_give_one_threads_results():
    size = 1 << 16
    kernel = build_func(affine_func(size), num_threads=1)
    x = np.random.default_rng(0).standard_normal(size).astype("float32")
    expected = np.zeros_like(x)
    kernel(x, expected)
    jobs = 0
    for threads in (2, 3, 0, 5, 2, 1):
        kernel.num_threads = threads
        for _ in range(50):
            out = np.zeros_like(x)
            kernel(x, out)
            np.testing.assert_array_equal(out, expected)
        jobs += 50 if threads != 1 else 0
        assert kernel.runtime.pool_jobs == jobs


def test_workers_confined_to_the_callers_only_cpu_still_give_one_threads_results():
    """A worker on the caller's CPU moves off it (thread_pool.c, leave_callers_cpu) unless no other CPU is allowed:
    with the process confined to one CPU, every job at 2 and 3 threads collides, and the worker stays and works."""
    size = 1 << 16
    x = np.random.default_rng(1).standard_normal(size).astype("float32")
    with confined_to(min(os.sched_getaffinity(0))):
        kernel = build_func(affine_func(size), num_threads=1)
        expected = np.zeros_like(x)
        kernel(x, expected)
        np.testing.assert_allclose(expected, x * 3 + 1, rtol=1e-6, atol=1e-6)
        for threads in (2, 3, 2):
            kernel.num_threads = threads
            for _ in range(20):
                out = np.zeros_like(x)
                kernel(x, out)
                np.testing.assert_array_equal(out, expected)
        assert kernel.runtime.pool_jobs == 60


def threads_of_this_process() -> set[int]:
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def kernel_and_its_worker(size: int):
    """A 2-thread kernel of `size` elements (4 operations each), its buffers, and the ids of the worker thread its
    first call started."""
    x = np.ones(size, "float32")
    out = np.zeros_like(x)
    kernel = build_func(affine_func(size), num_threads=2)
    before = threads_of_this_process()
    kernel(x, out)
    workers = threads_of_this_process() - before
    assert workers
    return kernel, x, out, workers


@contextlib.contextmanager
def confined_to(cpu: int):
    """The calling thread confined to `cpu` inside the block, its affinity given back after; yields that affinity."""
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield saved
    finally:
        os.sched_setaffinity(0, saved)


def let_workers_sleep() -> None:
    """Wait until idle workers sleep: they spin 0.3 ms, then sleep."""
    time.sleep(0.05)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_caller_takes_its_cpu_out_of_sleeping_workers_affinity_before_waking_them():
    """A sleeping worker woken onto the caller's CPU cannot run until the caller blocks (thread_pool.c,
    keep_workers_off): before waking sleepers, the caller leaves its CPU out of their affinity."""
    size = 1 << 21  # 4 operations an element: above the pool's wake threshold
    kernel, x, out, workers = kernel_and_its_worker(size)
    for cpu in sorted(os.sched_getaffinity(0))[:2]:
        with confined_to(cpu) as saved:
            let_workers_sleep()
            kernel(x, out)
            for tid in workers:
                assert os.sched_getaffinity(tid) == saved - {cpu}
    np.testing.assert_array_equal(out, x * 3 + 1)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_caller_that_moved_takes_its_cpu_out_of_the_workers_affinity_at_its_next_job_without_waking_them():
    """A caller that wakes on its worker's CPU would share it with the worker pinned there (thread_pool.c,
    keep_workers_off): at every job, not only when it wakes sleepers, the caller leaves its CPU out of the workers'
    affinity. One job of 262,144 operations wakes no sleeper, so only that rule can move the worker."""
    size = 1 << 16  # 4 operations an element: pooled, far under the pool's wake threshold
    kernel, x, out, workers = kernel_and_its_worker(size)
    for cpu in sorted(os.sched_getaffinity(0))[:2]:
        with confined_to(cpu) as saved:
            let_workers_sleep()
            jobs = kernel.runtime.pool_jobs
            kernel(x, out)
            assert kernel.runtime.pool_jobs == jobs + 1
            for tid in workers:
                assert os.sched_getaffinity(tid) == saved - {cpu}
    np.testing.assert_array_equal(out, x * 3 + 1)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_jobs_below_the_wake_threshold_wake_sleepers_once_their_work_adds_up_to_it():
    """Each call is a job of 3.1M operations, under the 4.2M that wakes sleepers alone, and 4 calls are fewer than the
    8 dense jobs that also do: the work of the jobs that come close together is what must wake them (thread_pool.c,
    WAKE_MIN_WORK). Waking is seen as keep_workers_off's change to the worker's affinity."""
    size = 786_432  # 4 operations an element
    kernel, x, out, workers = kernel_and_its_worker(size)
    cpu = min(os.sched_getaffinity(0))
    with confined_to(cpu) as saved:
        let_workers_sleep()
        for _ in range(4):
            kernel(x, out)
        for tid in workers:
            assert os.sched_getaffinity(tid) == saved - {cpu}
    np.testing.assert_array_equal(out, x * 3 + 1)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_worker_descheduled_inside_its_chunk_is_moved_onto_the_callers_cpu_and_the_results_hold():
    """Another process spins on the worker's CPU, so the worker, in chunks of ~1 ms (2M elements), is descheduled
    inside them for that process's time slices: the caller, done with its own chunks, moves it onto its CPU and
    yields that CPU to it (thread_pool.c, rescue). Measured 6-12 rescues in 20 such calls; 40 are made here."""
    size = 1 << 24
    x = (np.arange(size) % 7).astype("float32")
    cpu, other = sorted(os.sched_getaffinity(0))[:2]
    with confined_to(cpu):
        kernel, _, out, _ = kernel_and_its_worker(size)
        spin = f"import os\nos.sched_setaffinity(0, {{{other}}})\nwhile True: pass"
        neighbour = subprocess.Popen([sys.executable, "-c", spin])
        try:
            time.sleep(0.2)
            counter = functools.partial(ctypes.c_uint64.in_dll, kernel.runtime.handle)
            joins, rescues = counter("tessel_pool_joins").value, counter("tessel_pool_rescues").value
            for _ in range(40):
                out[:] = 0
                kernel(x, out)
                np.testing.assert_array_equal(out, x * 3 + 1)
            assert counter("tessel_pool_joins").value > joins
            assert counter("tessel_pool_rescues").value > rescues
        finally:
            neighbour.kill()
            neighbour.wait()


def test_several_python_threads_calling_one_library_at_once_get_their_own_results():
    """ctypes lets go of the GIL, so the calls overlap: one holds the pool, the others run their loop alone; each
    caller's output must be its own input's."""
    size = 1 << 16
    kernel = build_func(affine_func(size), num_threads=2)
    inputs = [np.full(size, float(caller), np.float32) for caller in range(4)]
    failures = []

    def call(caller: int) -> None:
        for _ in range(100):
            out = np.zeros(size, np.float32)
            kernel(inputs[caller], out)
            if not np.array_equal(out, inputs[caller] * 3 + 1):
                failures.append(caller)

    callers = [threading.Thread(target=call, args=(caller,)) for caller in range(4)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert failures == []
    assert 0 < kernel.runtime.pool_jobs <= 400


@functools.cache
def compiled(name: str):
    """A zoo model compiled once for the tests below, each of which sets its thread count."""
    return compiler.compile_model(zoo.build_model(name), target="llvm", num_threads=1)


@pytest.mark.parametrize("name", ["mlp", "dwconv_block"])
def test_whole_models_give_one_threads_outputs_at_every_thread_count(name):
    module = compiled(name)
    module.num_threads = 1
    feeds = zoo.sample_input(name)
    expected = module.run(feeds)
    for threads in (2, 3, 0):
        module.num_threads = threads
        for _ in range(5):
            outputs = module.run(feeds)
            for spec in module.outputs:
                np.testing.assert_array_equal(outputs[spec.name], expected[spec.name])
    assert module.runtime.library.pool_jobs > 0


def test_a_reduction_gives_the_same_bits_at_one_and_two_threads():
    """The pool and the one-thread path call the same outlined body (kept out of line), so a reduction that LLVM
    vectorizes with partial sums adds in the same order at every thread count."""
    rows = 4096
    x = te.placeholder((rows, 64), name="x")
    k = te.reduce_axis((0, 64), name="k")
    y = te.compute((rows,), lambda i: te.sum(x[i, k], axis=k), name="y")
    schedule = te.create_schedule(y.op)
    schedule[y].parallel(y.op.axis[0])
    kernel = compiler.build(schedule, [x, y], target="llvm", name="row_sums", num_threads=1)
    data = np.random.default_rng(1).standard_normal((rows, 64)).astype("float32")
    one, two = np.zeros(rows, "float32"), np.zeros(rows, "float32")
    kernel(data, one)
    kernel.num_threads = 2
    kernel(data, two)
    assert kernel.runtime.pool_jobs == 1
    np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(one, data.sum(axis=1), rtol=1e-5, atol=1e-5)


WAKE_MIN_WORK = 4_194_304  # thread_pool.c: the work that wakes sleeping workers


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
@pytest.mark.parametrize("name", ["mlp", "dwconv_block"])
def test_a_run_announces_its_pooled_work_and_wakes_sleepers_as_it_starts_only_when_that_pays(name):
    """A model's run entry calls tessel_pool_run with the work of every loop its kernels hand to the pool (each kernel
    called once here, so the sum of the tessel_parallel estimates); after a pause, when the workers sleep, a run of
    that much work wakes them before its first kernel (dwconv_block, 25M operations) and a smaller one does not
    (mlp, 0.3M): tessel_pool_run_wakes counts the wakes."""
    module = compiled(name)
    source = module.source("ll")
    announced = [int(work) for work in re.findall(r"call void @tessel_pool_run\(i32 %[\w.]+, i64 (-?\d+)\)", source)]
    pooled = [int(work) for work in re.findall(r"call void @tessel_parallel\(.*, i64 (-?\d+)\)", source)]
    assert announced == [sum(pooled)] and pooled
    library = module.runtime.library
    wakes = ctypes.c_uint64.in_dll(library.handle, "tessel_pool_run_wakes")
    feeds = zoo.sample_input(name)
    module.num_threads = 1
    expected = module.run(feeds)
    module.num_threads = 2
    module.run(feeds)  # starts the worker
    for _ in range(3):
        time.sleep(0.05)  # the worker spins 0.3 ms, then sleeps
        before = wakes.value
        outputs = module.run(feeds)
        assert wakes.value - before == (1 if announced[0] >= WAKE_MIN_WORK else 0)
        for spec in module.outputs:
            np.testing.assert_array_equal(outputs[spec.name], expected[spec.name])
