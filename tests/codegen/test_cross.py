"""Cross-compilation: AArch64 and ARMv7 kernels are linked with zig into shared libraries (checked
by their ELF header) and into test programs that run for real under qemu-user (tests/qemu_programs.py)."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from codegen_helpers import index, loop
from qemu_programs import link_program, run_program

from compiler.build import build_func
from compiler.codegen.llvm import compile_funcs
from compiler.errors import TargetError
from compiler.link import THREAD_POOL_SOURCE
from compiler.target import Target
from compiler.te.expr import Binary, Call, Cast, Var
from compiler.tir.nodes import Buffer, ForKind, PrimFunc, Seq, Store
from compiler.tir.nodes import Load as L

pytestmark = pytest.mark.slow

CROSS = {
    "aarch64": ("llvm -mtriple=aarch64-linux-gnu", 183, 2),
    "armv7": ("llvm -mtriple=armv7-linux-gnueabihf", 40, 1),
}
SIZE, LANES = 64, 8


def cross_func() -> PrimFunc:
    """A parallel row loop over vectorized lanes computing exp/tanh, integer floor division and a
    float16 store."""
    x, n = Buffer("x", (SIZE,), "float32"), Buffer("n", (SIZE,), "int32")
    out, q = Buffer("out", (SIZE,), "float32"), Buffer("q", (SIZE,), "int32")
    half = Buffer("half", (SIZE,), "float16")
    outer, inner = Var("outer"), Var("inner")
    i = outer * LANES + inner
    value = Call("exp", (L(x, i),), "float32") + Call("tanh", (L(x, i),), "float32")
    integer = Binary("floordiv", L(n, i), index(3)) * index(100) + Binary("floormod", L(n, i), index(-5))
    body = Seq((Store(out, i, value), Store(q, i, integer), Store(half, i, Cast("float16", L(x, i) * L(x, i)))))
    return PrimFunc(
        "cross_kernel",
        [x, n, out, q, half],
        loop(outer, SIZE // LANES, loop(inner, LANES, body, ForKind.VECTORIZED), ForKind.PARALLEL),
    )


def inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    return rng.uniform(-8, 8, SIZE).astype("float32"), rng.integers(-50, 50, SIZE).astype("int32")


def expected() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x, n = inputs()
    x64 = x.astype("float64")
    half_bits = (x * x).astype("float16").view("uint16")
    return np.exp(x64) + np.tanh(x64), np.floor_divide(n, 3) * 100 + np.mod(n, -5), half_bits


MAIN_C = """
#include <stdio.h>
void cross_kernel(float *x, int *n, float *out, int *q, unsigned short *half);
/* Three threads: the parallel loop runs on Tessel's thread pool (linked in from thread_pool.c) under qemu. */
extern int tessel_num_threads;
static float x[SIZE] = {X};
static int n[SIZE] = {N};
static float out[SIZE];
static int q[SIZE];
static unsigned short half[SIZE];
int main(void) {
    tessel_num_threads = 3;
    cross_kernel(x, n, out, q, half);
    for (int i = 0; i < SIZE; i++) printf("%.9g %d %u\\n", out[i], q[i], half[i]);
    return 0;
}
"""


@pytest.mark.parametrize("arch", list(CROSS))
def test_cross_shared_library_is_an_elf_for_the_machine(arch, tmp_path, every_parallel_loop_pooled):
    target, machine, elf_class = CROSS[arch]
    kernel = build_func(cross_func(), target)
    with pytest.raises(TargetError, match="cross-compiled"):
        kernel(*inputs(), np.zeros(SIZE, "float32"), np.zeros(SIZE, "int32"), np.zeros(SIZE, "float16"))
    assert "tessel_parallel" in kernel.source("ll")
    library = kernel.export_library(tmp_path / "kernel.so").read_bytes()
    assert library[:4] == b"\x7fELF" and library[4] == elf_class
    assert struct.unpack_from("<H", library, 16)[0] == 3  # ET_DYN: a shared object
    assert struct.unpack_from("<H", library, 18)[0] == machine


@pytest.mark.parametrize("arch", list(CROSS))
def test_cross_kernel_runs_under_qemu(arch, tmp_path, every_parallel_loop_pooled):
    target = CROSS[arch][0]
    x, n = inputs()
    source = MAIN_C.replace("SIZE", str(SIZE)).replace("{X}", "{" + ", ".join(f"{v!r}f" for v in x.tolist()) + "}")
    source = source.replace("{N}", "{" + ", ".join(str(v) for v in n.tolist()) + "}")
    (tmp_path / "main.c").write_text(source)
    (tmp_path / "kernel.o").write_bytes(compile_funcs([cross_func()], Target.parse(target)).object)
    program = tmp_path / "program"
    link_program(arch, [tmp_path / "main.c", tmp_path / "kernel.o", THREAD_POOL_SOURCE], program)
    stdout = run_program(arch, program)
    rows = [line.split() for line in stdout.splitlines()]
    out = np.array([float(row[0]) for row in rows])
    q = np.array([int(row[1]) for row in rows])
    half_bits = np.array([int(row[2]) for row in rows])
    expected_out, expected_q, expected_half = expected()
    np.testing.assert_allclose(out, expected_out, rtol=2e-6)
    np.testing.assert_array_equal(q, expected_q)
    np.testing.assert_array_equal(half_bits, expected_half)
    assert not any(math.isnan(value) for value in out)
