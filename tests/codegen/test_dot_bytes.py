"""te.dot_bytes (four uint8 activations times the four int8 bytes of an int32 word, summed) in a vectorized integer
matrix product: exact against numpy natively and in wasmtime at every vector width, and lowered to each machine's
integer dot product, checked in the assembly: AVX-512 VNNI's vpdpbusd, pmaddwd without VNNI, wasm SIMD128's
i32x4.dot_i16x8_s, AArch64's usdot with the int8 matrix extension (run under qemu too)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from qemu_programs import link_program, run_program

import compiler
from compiler import te
from compiler.codegen.llvm import compile_funcs
from compiler.graph.ops.dense import pack_byte_words, unpack_byte_words
from compiler.target import Target
from compiler.te.expr import TEError
from compiler.tir.lower import lower

RNG = np.random.default_rng(5)
# x86 feature sets, whatever the host has: AVX-512 with byte and word ops, or AVX2 alone
AVX512 = "+avx2,+fma,+avx512f,+avx512bw,+avx512vl"
NO_AVX512 = "+avx2,+fma,-avx512f,-avx512bw,-avx512vl,-avx512vnni"
ROWS, INNER, COLUMNS = 6, 36, 48


def _schedule(lanes: int):
    """C[i, j] = sum over k of dot_bytes(A[i, 4k .. 4k + 3], W[k, j]), its columns a vector loop of `lanes`."""
    a = te.placeholder((ROWS, INNER), dtype="uint8", name="a")
    words = te.placeholder((INNER // 4, COLUMNS), dtype="int32", name="w")
    k = te.reduce_axis((0, INNER // 4), "k")
    c = te.compute(
        (ROWS, COLUMNS),
        lambda i, j: te.sum(te.dot_bytes([a[i, 4 * k + byte] for byte in range(4)], words[k, j]), axis=k),
        name="c",
    )
    schedule = te.create_schedule(c.op)
    i, j = c.op.axis
    if lanes:
        outer, inner = schedule[c].split(j, factor=lanes)
        schedule[c].reorder(i, outer, k, inner)
        schedule[c].vectorize(inner)
    return schedule, [a, words, c]


def _operands():
    """Activations and levels at their extremes (0 and 255 by -128 and 127) and random ones; the words of the
    levels, column j's word g holding k = 4g .. 4g + 3."""
    activations = RNG.integers(0, 256, (ROWS, INNER)).astype(np.uint8)
    levels = RNG.integers(-128, 128, (INNER, COLUMNS)).astype(np.int8)
    activations[0], levels[:, 0], levels[:, 1] = 255, -128, 127
    words = levels.reshape(INNER // 4, 4, COLUMNS).transpose(0, 2, 1).copy().view("<i4").reshape(INNER // 4, COLUMNS)
    return activations, levels, words


def _instructions(kernel_asm: str) -> set[str]:
    pattern = r"\b(vpdpbusd|vpmaddwd|i32x4\.dot_i16x8_s|usdot)\b"
    return set(re.findall(pattern, kernel_asm))


@pytest.mark.parametrize("target", ["llvm", "wasm", "llvm -mattr=-avx512vnni,-avxvnni"])
@pytest.mark.parametrize("lanes", [0, 4, 8, 16])
def test_byte_products_are_exact(target, lanes):
    schedule, tensors = _schedule(lanes)
    kernel = compiler.build(schedule, tensors, target=target, name="dot")
    activations, levels, words = _operands()
    out = np.zeros((ROWS, COLUMNS), np.int32)
    kernel(activations, words, out)
    np.testing.assert_array_equal(out, activations.astype(np.int64) @ levels.astype(np.int64))


@pytest.mark.parametrize(
    "target, instruction",
    [
        (f"llvm -mattr={AVX512},+avx512vnni", "vpdpbusd"),
        (f"llvm -mattr={NO_AVX512},+avxvnni", "vpdpbusd"),  # AVX-VNNI: 256 bits, VEX-encoded
        (f"llvm -mattr={AVX512},-avx512vnni,-avxvnni", "vpmaddwd"),
        (f"llvm -mattr={NO_AVX512},-avxvnni", "vpmaddwd"),
        ("wasm", "i32x4.dot_i16x8_s"),
        ("llvm -mtriple=aarch64-linux-gnu -mattr=+i8mm", "usdot"),
    ],
)
def test_each_machine_gets_its_integer_dot_product(target, instruction):
    schedule, tensors = _schedule(16)
    func = lower(schedule, tensors, "dot")
    asm = compile_funcs([func], Target.parse(target)).asm
    assert _instructions(asm) == {instruction}


@pytest.mark.slow
def test_usdot_runs_under_qemu(tmp_path):
    """AArch64's usdot on a machine that has it (qemu's `max` CPU), against numpy."""
    schedule, tensors = _schedule(16)
    func = lower(schedule, tensors, "dot")
    target = Target.parse("llvm -mtriple=aarch64-linux-gnu -mattr=+i8mm")
    (tmp_path / "kernel.o").write_bytes(compile_funcs([func], target).object)
    activations, levels, words = _operands()

    def array(values) -> str:
        return "{" + ", ".join(str(int(v)) for v in values.reshape(-1)) + "}"

    main = f"""
#include <stdio.h>
#include <stdint.h>
void dot(uint8_t *a, int32_t *w, int32_t *c);
static uint8_t a[] = {array(activations)};
static int32_t w[] = {array(words)};
static int32_t c[{ROWS * COLUMNS}];
int main(void) {{
    dot(a, w, c);
    for (int i = 0; i < {ROWS * COLUMNS}; i++) printf("%d\\n", c[i]);
    return 0;
}}
"""
    (tmp_path / "main.c").write_text(main)
    link_program("aarch64", [tmp_path / "main.c", tmp_path / "kernel.o"], tmp_path / "program")
    out = np.array([int(line) for line in run_program("aarch64", tmp_path / "program").split()])
    np.testing.assert_array_equal(out.reshape(ROWS, COLUMNS), activations.astype(np.int64) @ levels.astype(np.int64))


def test_words_pack_four_levels_of_k_lowest_byte_first():
    levels = RNG.integers(-128, 128, (12, 10)).astype(np.int8)
    words = pack_byte_words(levels, 8)
    assert words.shape == (2, 3, 8) and words.dtype == np.int32
    assert words[0, 1, 2] == int.from_bytes(levels[4:8, 2].tobytes(), "little", signed=True)
    assert not words[1, :, 2:].any()  # columns past N
    np.testing.assert_array_equal(unpack_byte_words(words, 10), levels)


def test_dot_bytes_takes_uint8_activations_and_an_int32_word():
    a = te.placeholder((4,), dtype="int8", name="a")
    w = te.placeholder((1,), dtype="int32", name="w")
    with pytest.raises(TEError, match="four uint8 values and one int32 word"):
        te.dot_bytes([a[0], a[1], a[2], a[3]], w[0])
