"""OpenCL and CUDA kernels from codegen/c_source.py: the shared schedules and an expression zoo run on PoCL against
numpy, and every CUDA kernel compiles with NVRTC for sm_80 and sm_90 (and nvcc where present); the `gpu` tests run
them on a CUDA device and skip elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_schedules import injective, matmul_shared, random_inputs, root_stages, serial_shared_copy, two_extents

import compiler
import compiler.te as te
from compiler.errors import PlatformError
from compiler.runtime import cuda as cuda_runtime

RNG = np.random.default_rng(3)
CASES = {
    "injective": lambda: injective(1000, 64),
    "matmul_shared": lambda: matmul_shared(64, tile=16, threads=8),
    "two_extents": lambda: two_extents(256),
    "serial_shared_copy": lambda: serial_shared_copy(8),
    "root_stages": lambda: root_stages(256),
}


def cuda_device_reason() -> str | None:
    """Why the CUDA run tests cannot run here, or None when a device answers."""
    try:
        cuda_runtime.cuda_context()
    except PlatformError as error:
        return str(error)
    return None


@pytest.mark.parametrize("case", CASES)
def test_schedules_on_opencl(case):
    schedule, args, reference = CASES[case]()
    kernel = compiler.build(schedule, args, target="opencl", name=case)
    arrays = random_inputs(args, RNG)
    kernel(*arrays)
    np.testing.assert_allclose(arrays[-1], reference(*arrays[:-1]), rtol=1e-5, atol=1e-5)
    assert "__kernel" in kernel.source("cl") and "for (" in kernel.source("tir")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("case", CASES)
def test_schedules_compile_with_nvrtc(case, arch):
    schedule, args, _ = CASES[case]()
    kernel = compiler.build(schedule, args, target=f"cuda -arch={arch}", name=case)
    assert kernel.runtime.cubin[:4] == b"\x7fELF"


@pytest.mark.skipif(cuda_runtime.nvcc_path() is None, reason="nvcc is not installed")
def test_nvcc_compiles_the_same_source():
    schedule, args, _ = matmul_shared(64, tile=16, threads=8)
    kernel = compiler.build(schedule, args, target="cuda", name="matmul")
    assert cuda_runtime.compile_nvcc(kernel.source("cu"), "sm_90")[:4] == b"\x7fELF"


def erf(x):
    from math import erf as scalar_erf

    return np.vectorize(scalar_erf)(x.astype("float64")).astype(x.dtype)


# name: (input dtypes, output dtype, compute, numpy reference, rtol); one element per thread, 300 elements
EXPRESSIONS = {
    "exp_log_tanh": (
        ["float32"],
        "float32",
        lambda a: te.exp(a) + te.log(te.abs(a) + 1.0) + te.tanh(a),
        lambda a: np.exp(a) + np.log(np.abs(a) + 1) + np.tanh(a),
        1e-5,
    ),
    "sigmoid_erf_sqrt": (
        ["float32"],
        "float32",
        lambda a: te.sigmoid(a) * te.erf(a) + te.sqrt(te.abs(a)),
        lambda a: 1 / (1 + np.exp(-a)) * erf(a) + np.sqrt(np.abs(a)),
        1e-5,
    ),
    "round_floor_ceil": (
        ["float32"],
        "float32",
        lambda a: te.round(a * 3.0) + te.floor(a) * 10.0 - te.ceil(a) * 100.0,
        lambda a: np.round(a * 3) + np.floor(a) * 10 - np.ceil(a) * 100,
        0,
    ),
    "max_min_propagate_nan": (
        ["float32", "float32"],
        "float32",
        lambda a, b: te.maximum(a, b) - te.minimum(a, 0.0),
        lambda a, b: np.maximum(a, b) - np.minimum(a, 0),
        0,
    ),
    "int_division": (
        ["int32", "int32"],
        "int32",
        lambda a, b: (a // b) * 100 + a % b + (a / b) * 7,
        lambda a, b: a // b * 100 + a % b + np.fix(a / b).astype("int32") * 7,
        0,
    ),
    "int8_wraps": (["int8", "int8"], "int8", lambda a, b: a * b + a, lambda a, b: a * b + a, 0),
    "int64_and_casts": (
        ["int64", "float32"],
        "float32",
        lambda a, b: a.astype("float32") * b + (a * 3).astype("float32"),
        lambda a, b: a.astype("float32") * b + (a * 3).astype("float32"),
        1e-5,  # a multiply-add may be contracted into one rounding
    ),
    "int64_extreme_literals": (
        ["int64", "int64"],
        "int64",
        lambda a, b: te.maximum(a, te.const(-(2**63), "int64")) - te.minimum(b, te.const(2**63 - 1, "int64")) - 1,
        lambda a, b: a - b - 1,
        0,
    ),
    "float16_storage": (
        ["float16", "float16"],
        "float16",
        lambda a, b: a * b + a,
        lambda a, b: (a.astype("float32") * b.astype("float32") + a.astype("float32")).astype("float16"),
        1e-3,
    ),
    "bool_output": (
        ["float32", "float32"],
        "bool",
        lambda a, b: te.any(a > b, b > 1.0),
        lambda a, b: (a > b) | (b > 1),
        0,
    ),
    "float64": (["float64"], "float64", lambda a: te.exp(a) * 2.0 - a, lambda a: np.exp(a) * 2 - a, 1e-12),
}


def operand(dtype: str, position: int, size: int) -> np.ndarray:
    if dtype.startswith("int"):
        info = np.iinfo(dtype)
        low, high = (-50, 50) if dtype in ("int32", "int64") else (info.min, info.max)
        values = RNG.integers(low, high, size, endpoint=True)
        if position == 1 and dtype == "int32":  # a divisor: never zero
            values = np.where(values == 0, 3, values % 15 - 7 + (values % 15 == 7))
        return values.astype(dtype)
    values = RNG.standard_normal(size).astype(dtype) * 2
    if dtype == "float32" and position == 0:
        values[:3] = np.nan
    return values


def expression_kernel(name: str, target: str, size: int = 300):
    dtypes, out_dtype, compute, reference, rtol = EXPRESSIONS[name]
    inputs = [te.placeholder((size,), dtype, f"in{position}") for position, dtype in enumerate(dtypes)]
    out = te.compute((size,), lambda i: compute(*(tensor[i] for tensor in inputs)).astype(out_dtype), name="out")
    schedule = te.create_schedule(out.op)
    block, thread = schedule[out].split(out.op.axis[0], 64)
    schedule[out].bind(block, te.thread_axis("blockIdx.x"))
    schedule[out].bind(thread, te.thread_axis("threadIdx.x"))
    kernel = compiler.build(schedule, [*inputs, out], target=target, name=name)
    arrays = [operand(dtype, position, size) for position, dtype in enumerate(dtypes)]
    return kernel, arrays, np.zeros(size, out_dtype), reference, rtol


@pytest.mark.parametrize("name", EXPRESSIONS)
def test_expressions_on_opencl(name):
    kernel, arrays, out, reference, rtol = expression_kernel(name, "opencl")
    with np.errstate(all="ignore"):
        kernel(*arrays, out)
        expected = reference(*arrays).astype(out.dtype)
    np.testing.assert_allclose(out.astype("float64"), expected.astype("float64"), rtol=rtol, atol=rtol)


@pytest.mark.parametrize("name", EXPRESSIONS)
def test_expressions_compile_with_nvrtc(name):
    kernel = expression_kernel(name, "cuda -arch=sm_90")[0]
    assert kernel.runtime.cubin[:4] == b"\x7fELF"


@pytest.mark.skipif(cuda_device_reason() is None, reason="a CUDA driver is present")
def test_missing_cuda_driver_is_one_clear_error():
    schedule, args, _ = injective(64, 32)
    kernel = compiler.build(schedule, args, target="cuda")
    with pytest.raises(PlatformError, match="NVIDIA driver"):
        kernel(*random_inputs(args, RNG))


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_schedules_on_cuda_device(case):
    reason = cuda_device_reason()
    if reason is not None:
        pytest.skip(f"no CUDA device: {reason}")
    arch = cuda_runtime.device_arch()
    schedule, args, reference = CASES[case]()
    kernel = compiler.build(schedule, args, target=f"cuda -arch={arch}", name=case)
    arrays = random_inputs(args, RNG)
    kernel(*arrays)
    np.testing.assert_allclose(arrays[-1], reference(*arrays[:-1]), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("name", EXPRESSIONS)
def test_expressions_on_cuda_device(name):
    reason = cuda_device_reason()
    if reason is not None:
        pytest.skip(f"no CUDA device: {reason}")
    kernel, arrays, out, reference, rtol = expression_kernel(name, f"cuda -arch={cuda_runtime.device_arch()}")
    with np.errstate(all="ignore"):
        kernel(*arrays, out)
        expected = reference(*arrays).astype(out.dtype)
    np.testing.assert_allclose(out.astype("float64"), expected.astype("float64"), rtol=rtol, atol=rtol)
