"""Linking: object code from codegen → a shared library (native and cross targets) or a .wasm
module (wasm-ld from the ziglang wheel). The runtimes and `export_library` take the bytes it returns."""

from __future__ import annotations

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


def _zig() -> list[str]:
    if importlib.util.find_spec("ziglang") is None:
        raise TargetError("linking needs the zig toolchain: pip install ziglang (it is in Tessel's dependencies)")
    return [sys.executable, "-m", "ziglang"]


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise TargetError(f"{what} failed ({' '.join(command[:4])} ...):\n{result.stderr.strip()}")


def shared_library_command(target: Target) -> list[str]:
    if target.kind != "llvm":
        raise TargetError(f"target {target} does not make shared libraries; use link_wasm")
    if target.is_host:
        compiler = shutil.which("cc")
        if compiler is not None:
            return [compiler, "-shared"]
        return [*_zig(), "cc", "-shared"]
    return [*_zig(), "cc", "-target", _ZIG_TARGETS[target.arch], "-shared"]


def link_shared(object_code: bytes, target: Target) -> bytes:
    """A shared library holding the object's kernels; libgomp is resolved when it is loaded, libm (float64
    transcendentals, codegen/llvm.py) is linked."""
    command = shared_library_command(target)
    with tempfile.TemporaryDirectory(prefix="tessel-link-") as folder:
        source, output = Path(folder, "kernel.o"), Path(folder, "kernel.so")
        source.write_bytes(object_code)
        _run([*command, "-o", str(output), str(source), "-lm"], f"linking a shared library for {target}")
        return output.read_bytes()


def link_wasm(object_code: bytes, exports: list[str]) -> bytes:
    """A wasm module that imports its memory as env.memory and exports `exports` and __heap_base.

    The host creates the memory, so one memory can hold a whole model's arena and params and can be
    grown or shared by the host before any kernel runs."""
    with tempfile.TemporaryDirectory(prefix="tessel-link-") as folder:
        source, output = Path(folder, "kernel.o"), Path(folder, "kernel.wasm")
        source.write_bytes(object_code)
        command = [
            *_zig(),
            "wasm-ld",
            "--no-entry",
            "--import-memory",
            "--stack-first",
            "-z",
            f"stack-size={WASM_STACK_BYTES}",
            "--export=__heap_base",
            *(f"--export={name}" for name in exports),
            "-o",
            str(output),
            str(source),
        ]
        _run(command, "linking a wasm module")
        return output.read_bytes()
