"""Hand-written thread-bound TE schedules that the GPU tests (lowering, codegen, runtimes) share: an injective op, a
matmul with shared-memory tiles, two stages with different thread extents, and a serial shared copy."""

from __future__ import annotations

import numpy as np

import compiler.te as te


def injective(n: int = 1000, threads: int = 64):
    """B = A * 2 + 1, one element per thread; n need not divide."""
    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] * 2.0 + 1.0, name="B")
    s = te.create_schedule(b.op)
    bx, tx = s[b].split(b.op.axis[0], threads)
    s[b].bind(bx, te.thread_axis("blockIdx.x"))
    s[b].bind(tx, te.thread_axis("threadIdx.x"))
    return s, [a, b], lambda x: x * 2 + 1


def matmul_shared(n: int = 32, tile: int = 16, threads: int = 8, k_tile: int = 8, copy_threads: int | None = None):
    """C = A @ B: a tile x tile block of C per block, threads x threads threads each holding a local register tile,
    A and B tiles fetched into shared memory cooperatively by copy_threads x copy_threads threads."""
    copy_threads = copy_threads or threads
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    s = te.create_schedule(c.op)
    a_shared, b_shared = s.cache_read(a, "shared", [c]), s.cache_read(b, "shared", [c])
    c_local = s.cache_write(c, "local")
    i, j = c.op.axis
    block_i, inner_i = s[c].split(i, tile)
    block_j, inner_j = s[c].split(j, tile)
    thread_i, rows = s[c].split(inner_i, nparts=threads)
    thread_j, columns = s[c].split(inner_j, nparts=threads)
    s[c].reorder(block_i, block_j, thread_i, thread_j, rows, columns)
    s[c].bind(block_i, te.thread_axis("blockIdx.y"))
    s[c].bind(block_j, te.thread_axis("blockIdx.x"))
    s[c].bind(thread_i, te.thread_axis("threadIdx.y"))
    s[c].bind(thread_j, te.thread_axis("threadIdx.x"))
    s[c_local].compute_at(s[c], thread_j)
    k_outer, k_inner = s[c_local].split(s[c_local].op.reduce_axis[0], k_tile)
    s[c_local].reorder(k_outer, k_inner, *s[c_local].op.axis)
    for shared in (a_shared, b_shared):
        s[shared].compute_at(s[c_local], k_outer)
        fused = s[shared].fuse(*s[shared].op.axis)
        thread_y, rest = s[shared].split(fused, nparts=copy_threads)
        thread_x, _ = s[shared].split(rest, nparts=copy_threads)
        s[shared].bind(thread_y, te.thread_axis("threadIdx.y"))
        s[shared].bind(thread_x, te.thread_axis("threadIdx.x"))
    return s, [a, b, c], lambda x, y: x @ y


def two_extents(n: int = 256):
    """C[i] = B[2i] + B[2i+1] with B = A * 2 staged in shared memory: B's copy runs on 64 threads, C on 32."""
    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] * 2.0, name="B")
    c = te.compute((n // 2,), lambda i: b[2 * i] + b[2 * i + 1], name="C")
    s = te.create_schedule(c.op)
    s[b].set_scope("shared")
    block, thread = s[c].split(c.op.axis[0], 32)
    s[c].bind(block, te.thread_axis("blockIdx.x"))
    s[c].bind(thread, te.thread_axis("threadIdx.x"))
    s[b].compute_at(s[c], block)
    s[b].bind(s[b].op.axis[0], te.thread_axis("threadIdx.x"))
    return s, [a, c], lambda x: (x * 2).reshape(-1, 2).sum(axis=1)


def serial_shared_copy(n: int = 8):
    """C = A @ B with A's rows for a block copied into shared memory by a copy that no thread loop covers."""
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    s = te.create_schedule(c.op)
    a_shared = s.cache_read(a, "shared", [c])
    i, j = c.op.axis
    block, thread = s[c].split(i, 4)
    s[c].reorder(block, j, thread)
    s[c].bind(block, te.thread_axis("blockIdx.x"))
    s[c].bind(thread, te.thread_axis("threadIdx.x"))
    s[a_shared].compute_at(s[c], j)
    return s, [a, b, c], lambda x, y: x @ y


def root_stages(n: int = 256):
    """B = A * 2 and C[i] = B[n - 1 - i] + 1 as two root stages over their own blocks: C reads B across blocks, so
    they are two launches, B the kernel's workspace."""
    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] * 2.0, name="B")
    c = te.compute((n,), lambda i: b[n - 1 - i] + 1.0, name="C")
    s = te.create_schedule(c.op)
    for stage in (s[b], s[c]):
        block, thread = stage.split(stage.op.axis[0], 64)
        stage.bind(block, te.thread_axis("blockIdx.x"))
        stage.bind(thread, te.thread_axis("threadIdx.x"))
    return s, [a, c], lambda x: (x * 2)[::-1] + 1


def _dims(tensor) -> list[int]:
    return [int(getattr(extent, "value", extent)) for extent in tensor.shape]


def random_inputs(args, rng) -> list[np.ndarray]:
    """Random arrays for every argument: the last is the output, zero-filled."""
    arrays = [rng.standard_normal(_dims(tensor)).astype(tensor.dtype) for tensor in args[:-1]]
    return [*arrays, np.zeros(_dims(args[-1]), args[-1].dtype)]
