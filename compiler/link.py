"""Linking: object code from codegen → a shared library (native and cross targets) or a .wasm
module (wasm-ld from the ziglang wheel). The runtimes and `export_library` take the bytes it returns."""

from __future__ import annotations

import functools
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from compiler.errors import TargetError
from compiler.target import Target

# zig's own target names for the cross triples Target produces.
_ZIG_TARGETS = {"aarch64": "aarch64-linux-gnu", "armv7": "arm-linux-gnueabihf"}
WASM_STACK_BYTES = 1 << 20
# The thread pool that native parallel loops call (tessel_parallel): compiled once per target and linked into
# every shared library, so a library needs no OpenMP runtime on the machine that loads it.
THREAD_POOL_SOURCE = Path(__file__).resolve().parent / "codegen" / "thread_pool.c"
# Its counterpart for threaded wasm modules (wasm32 + atomics over a shared memory), linked into each of them.
WASM_THREAD_POOL_SOURCE = THREAD_POOL_SOURCE.with_name("wasm_thread_pool.c")
# A shared memory must declare its maximum; wasm32's whole address space, so that no model is refused for its size
# (engines reserve it as address space, not memory).
WASM_MAX_MEMORY_BYTES = 1 << 32


def _zig() -> list[str]:
    if importlib.util.find_spec("ziglang") is None:
        raise TargetError("linking needs the zig toolchain: pip install ziglang (it is in Tessel's dependencies)")
    return [sys.executable, "-m", "ziglang"]


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise TargetError(f"{what} failed ({' '.join(command[:4])} ...):\n{result.stderr.strip()}")


def c_compiler_command(target: Target) -> list[str]:
    """The C compiler that links native libraries for `target`: the host's cc (zig cc where there is none), zig cc
    with zig's target name for the cross triples."""
    if target.kind != "llvm":
        raise TargetError(f"target {target} does not make shared libraries; use link_wasm")
    if target.is_host:
        compiler = shutil.which("cc")
        return [compiler] if compiler is not None else [*_zig(), "cc"]
    return [*_zig(), "cc", "-target", _ZIG_TARGETS[target.arch]]


def shared_library_command(target: Target) -> list[str]:
    return [*c_compiler_command(target), "-shared"]


@functools.cache
def _thread_pool_object(target: Target) -> bytes:
    with tempfile.TemporaryDirectory(prefix="tessel-pool-") as folder:
        output = Path(folder, "thread_pool.o")
        command = [*c_compiler_command(target), "-c", "-O2", "-fPIC", "-o", str(output), str(THREAD_POOL_SOURCE)]
        _run(command, f"compiling the thread pool for {target}")
        return output.read_bytes()


def link_shared(object_code: bytes, target: Target) -> bytes:
    """A shared library holding the object's kernels and the thread pool; libm (float64 transcendentals,
    codegen/llvm/) and pthreads are linked."""
    command = shared_library_command(target)
    with tempfile.TemporaryDirectory(prefix="tessel-link-") as folder:
        source, pool, output = Path(folder, "kernel.o"), Path(folder, "thread_pool.o"), Path(folder, "kernel.so")
        source.write_bytes(object_code)
        pool.write_bytes(_thread_pool_object(target))
        _run(
            [*command, "-o", str(output), str(source), str(pool), "-lm", "-lpthread"],
            f"linking a shared library for {target}",
        )
        return output.read_bytes()


@functools.cache
def _wasm_thread_pool_object() -> bytes:
    with tempfile.TemporaryDirectory(prefix="tessel-pool-") as folder:
        output = Path(folder, "wasm_thread_pool.o")
        command = [
            *_zig(),
            "cc",
            "-target",
            "wasm32-freestanding",
            "-mcpu=generic+atomics+bulk_memory+simd128",
            "-O2",
            "-c",
            "-o",
            str(output),
            str(WASM_THREAD_POOL_SOURCE),
        ]
        _run(command, "compiling the wasm thread pool")
        return output.read_bytes()


def link_wasm(object_code: bytes, exports: list[str], threads: bool = False) -> bytes:
    """A wasm module that imports its memory as env.memory and exports `exports` and __heap_base.

    The host creates the memory, so one memory can hold a whole model's arena and params and can be
    grown or shared by the host before any kernel runs. With `threads` (an object compiled with +atomics) the
    memory is shared, the wasm thread pool is linked in, and __stack_pointer is exported so that each worker
    instance can move its stack off the caller's."""
    with tempfile.TemporaryDirectory(prefix="tessel-link-") as folder:
        source, output = Path(folder, "kernel.o"), Path(folder, "kernel.wasm")
        source.write_bytes(object_code)
        objects = [str(source)]
        threading = []
        if threads:
            pool = Path(folder, "wasm_thread_pool.o")
            pool.write_bytes(_wasm_thread_pool_object())
            objects.append(str(pool))
            threading = ["--shared-memory", f"--max-memory={WASM_MAX_MEMORY_BYTES}", "--export=__stack_pointer"]
        command = [
            *_zig(),
            "wasm-ld",
            "--no-entry",
            "--import-memory",
            "--stack-first",
            "-z",
            f"stack-size={WASM_STACK_BYTES}",
            "--export=__heap_base",
            *threading,
            *(f"--export={name}" for name in exports),
            "-o",
            str(output),
            *objects,
        ]
        _run(command, "linking a wasm module")
        return output.read_bytes()
