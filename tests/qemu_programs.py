"""Test programs for AArch64 and ARMv7 run under qemu-user: a C main and Tessel's object code linked by zig against
glibc, dynamically, and run with Debian's cross glibc (libc6-arm64-cross, libc6-armhf-cross) as qemu's sysroot. A
static musl link would need no sysroot, but zig builds musl from source at its first use of each architecture: about
2 minutes a cold cache spends in every CI run, against about 15 s for glibc's link stubs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# arch: (zig target, qemu-user binary, Debian's cross glibc sysroot)
MACHINES = {
    "aarch64": ("aarch64-linux-gnu.2.36", "qemu-aarch64-static", "/usr/aarch64-linux-gnu"),
    "armv7": ("arm-linux-gnueabihf.2.36", "qemu-arm-static", "/usr/arm-linux-gnueabihf"),
}


def link_program(arch: str, sources: list[Path], program: Path) -> None:
    """`sources` (C files and objects) linked into `program` for `arch`, with libm and pthreads."""
    zig_target = MACHINES[arch][0]
    command = [sys.executable, "-m", "ziglang", "cc", "-target", zig_target, "-O2", "-o", str(program)]
    linked = subprocess.run([*command, *map(str, sources), "-lm", "-lpthread"], capture_output=True, text=True)
    assert linked.returncode == 0, linked.stderr


def run_program(arch: str, program: Path, *arguments: str, cwd: Path | None = None, timeout: float = 60) -> str:
    """`program` run under qemu-user with the cross glibc; its stdout. A missing emulator or sysroot fails the test
    with the command that installs it."""
    _, qemu, sysroot = MACHINES[arch]
    emulator = shutil.which(qemu)
    if emulator is None or not Path(sysroot, "lib").is_dir():
        pytest.fail(
            f"{qemu} or {sysroot} is missing: run `make test` (it installs Debian's qemu-user-static and cross glibc)"
        )
    command = [emulator, "-L", sysroot, str(program), *arguments]
    return subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True, timeout=timeout).stdout
