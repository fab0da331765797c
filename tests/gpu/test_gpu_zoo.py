"""Every zoo model compiled for opencl with compiler/schedules/gpu.py runs on PoCL and matches onnxruntime (rtol 1e-4,
atol 1e-5). The first run of each includes PoCL's build of its kernels.cl, which PoCL caches across processes."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import compiler
from compiler import zoo


@pytest.mark.slow
@pytest.mark.parametrize("name", zoo.MODELS)
def test_zoo_model_on_opencl_matches_onnxruntime(name):
    model = zoo.build_model(name)
    inputs = zoo.sample_input(name)
    module = compiler.compile_model(model, target="opencl")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, inputs)
    for output, wanted in zip(module.run(inputs).values(), expected):
        np.testing.assert_allclose(output, wanted, rtol=1e-4, atol=1e-5)
