"""mobilenet_v2 cross-compiled for AArch64: the bundle's model.so is an AArch64 ELF shared object, and
the same object code linked into a test program runs under qemu-user (tests/qemu_programs.py) and matches
onnxruntime."""

import json
import struct

import numpy as np
import onnxruntime as ort
import pytest
from qemu_programs import link_program, run_program

from compiler import zoo
from compiler.build import compile_model
from compiler.link import THREAD_POOL_SOURCE

pytestmark = pytest.mark.slow

TARGET = "llvm -mtriple=aarch64-linux-gnu"
EM_AARCH64 = 183

# Loads params.bin and the input into 64-byte-aligned memory, calls the model's run entry once and
# writes the output; parallel loops run on Tessel's thread pool (thread_pool.c, linked in) at its default thread
# count, the cores qemu reports.
MAIN_C = r"""
#include <stdio.h>
#include <stdlib.h>
void run(const void *input, void *output, const void *params, void *arena);
static void *read_file(const char *path) {
    FILE *file = fopen(path, "rb");
    if (!file) { perror(path); exit(1); }
    fseek(file, 0, SEEK_END);
    long size = ftell(file);
    fseek(file, 0, SEEK_SET);
    void *data = aligned_alloc(64, (size + 64) / 64 * 64);
    if (fread(data, 1, size, file) != (size_t)size) { perror(path); exit(1); }
    fclose(file);
    return data;
}
int main(int argc, char **argv) {
    long output_bytes = atol(argv[4]), arena_bytes = atol(argv[5]);
    void *params = read_file(argv[1]), *input = read_file(argv[2]);
    void *output = aligned_alloc(64, (output_bytes + 64) / 64 * 64);
    void *arena = aligned_alloc(64, (arena_bytes + 64) / 64 * 64);
    run(input, output, params, arena);
    FILE *file = fopen(argv[3], "wb");
    fwrite(output, 1, output_bytes, file);
    fclose(file);
    return 0;
}
"""


@pytest.fixture(scope="module")
def module():
    return compile_model(zoo.build_model("mobilenet_v2"), target=TARGET)


def test_aarch64_bundle_is_an_aarch64_shared_object(module, tmp_path):
    bundle = module.export(tmp_path / "mobilenet_v2")
    library = (bundle / "model.so").read_bytes()
    assert library[:4] == b"\x7fELF" and library[4] == 2  # ELFCLASS64
    assert struct.unpack_from("<H", library, 16)[0] == 3  # ET_DYN: a shared object
    assert struct.unpack_from("<H", library, 18)[0] == EM_AARCH64
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["triple"].startswith("aarch64") and manifest["code"] == "model.so"


def test_aarch64_object_runs_under_qemu(module, tmp_path):
    (tmp_path / "main.c").write_text(MAIN_C)
    (tmp_path / "model.o").write_bytes(module.compiled.object)
    (tmp_path / "params.bin").write_bytes(module.params)
    feeds = zoo.sample_input("mobilenet_v2")
    feeds["input"].tofile(tmp_path / "input.bin")
    program = tmp_path / "program"
    link_program("aarch64", [tmp_path / "main.c", tmp_path / "model.o", THREAD_POOL_SOURCE], program)
    (output,) = module.outputs
    output_bytes = int(np.prod(output.shape)) * np.dtype(output.dtype).itemsize
    arguments = [
        "params.bin",
        "input.bin",
        "output.bin",
        str(output_bytes),
        str(module.manifest["memory"]["arena_bytes"]),
    ]
    run_program("aarch64", program, *arguments, cwd=tmp_path, timeout=300)
    actual = np.fromfile(tmp_path / "output.bin", output.dtype).reshape(output.shape)
    (expected,) = ort.InferenceSession(zoo.build_model("mobilenet_v2").SerializeToString()).run(None, feeds)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
