"""Every zoo model compiled for opencl with compiler/schedules/gpu.py runs on PoCL and matches onnxruntime (rtol 1e-4,
atol 1e-5 of the output's range, at least 1), and every zoo model's kernels.cu compiles with NVRTC for sm_80 and sm_90. The first run of each opencl
model includes PoCL's build of its kernels.cl, which PoCL caches across processes."""

from __future__ import annotations

import onnxruntime as ort
import pytest

import compiler
from compiler import zoo
from compiler.runtime.cuda import compile_nvrtc
from tests.model_checks import assert_close_in_range


@pytest.mark.slow
@pytest.mark.parametrize("name", zoo.MODELS)
def test_zoo_model_on_opencl_matches_onnxruntime(name):
    model = zoo.build_model(name)
    inputs = zoo.sample_input(name)
    module = compiler.compile_model(model, target="opencl")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, inputs)
    for output, wanted in zip(module.run(inputs).values(), expected):
        assert_close_in_range(output, wanted)


@pytest.mark.slow
@pytest.mark.parametrize("name", zoo.MODELS)
def test_zoo_model_kernels_compile_with_nvrtc_for_sm80_and_sm90(name):
    """compile_model builds the cubin for the target's arch (sm_80); the same kernels.cu must build for sm_90."""
    module = compiler.compile_model(zoo.build_model(name), target="cuda -arch=sm_80")
    assert module.runtime.program.cubin[:4] == b"\x7fELF"
    assert compile_nvrtc(module.sources["cu"], "sm_90")[:4] == b"\x7fELF"
