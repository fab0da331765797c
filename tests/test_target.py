"""Target strings: parse, print, round-trip, derived fields and the error for unknown forms."""

from __future__ import annotations

import llvmlite.binding as llvm
import pytest

from compiler.errors import TargetError
from compiler.target import Target


@pytest.mark.parametrize(
    "text",
    [
        "llvm",
        "wasm",
        "llvm -mtriple=aarch64-linux-gnu",
        "llvm -mtriple=armv7-linux-gnueabihf",
        "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72",
        "llvm -mattr=-avx512f",
    ],
)
def test_round_trip(text):
    target = Target.parse(text)
    assert str(target) == text
    assert Target.parse(str(target)) == target


def test_host_uses_llvm_host_cpu_and_features():
    target = Target.parse("llvm")
    assert target.kind == "llvm" and target.is_host
    assert target.triple == llvm.get_process_triple()
    assert target.cpu == llvm.get_host_cpu_name()
    host = {item[1:] for item in llvm.get_host_cpu_features().flatten().split(",") if item.startswith("+")}
    for feature in ("avx2", "fma", "avx512f", "avx512bw"):
        assert (feature in target.feature_set) == (feature in host)
    expected = 64 if "avx512f" in host else 32 if "avx2" in host else 16
    assert target.vector_bytes == expected
    assert target.pointer_bytes == 8


def test_mattr_can_switch_a_host_feature_off():
    target = Target.parse("llvm -mattr=-avx512f,-avx2,-avx")
    assert "avx512f" not in target.feature_set
    assert target.vector_bytes == 16


def test_cross_targets():
    aarch64 = Target.parse("llvm -mtriple=aarch64-linux-gnu")
    assert (aarch64.kind, aarch64.arch, aarch64.is_host) == ("llvm", "aarch64", False)
    assert "neon" in aarch64.feature_set and aarch64.vector_bytes == 16 and aarch64.pointer_bytes == 8
    armv7 = Target.parse("llvm -mtriple=armv7-linux-gnueabihf")
    assert armv7.triple.startswith("armv7") and armv7.triple.endswith("gnueabihf")
    assert {"neon", "vfp4"} <= armv7.feature_set and armv7.pointer_bytes == 4
    assert Target.parse("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72").cpu == "cortex-a72"


def test_wasm():
    target = Target.parse("wasm")
    assert (target.kind, target.triple, target.is_host) == ("wasm", "wasm32-unknown-unknown", False)
    assert "simd128" in target.feature_set and target.vector_bytes == 16 and target.pointer_bytes == 4
    assert target.can_run_here


@pytest.mark.parametrize(
    "text", ["cuda9", "", "llvm -mtriple=mips-linux-gnu", "llvm -O3", "llvm -mcpu", "wasm -mtriple=wasm64"]
)
def test_unknown_targets_list_the_valid_forms(text):
    with pytest.raises(TargetError, match="llvm -mtriple=aarch64-linux-gnu|wasm32"):
        Target.parse(text)


@pytest.mark.parametrize("text", ["webgpu", "opencl", "cuda", "cuda -arch=sm_90"])
def test_gpu_targets_round_trip_and_carry_device_limits(text):
    target = Target.parse(text)
    assert str(target) == text and Target.parse(str(target)) == target
    assert target.is_gpu and target.device.max_threads <= target.device.max_block[0] * target.device.max_block[1]
    assert "float32" in target.device.dtypes


def test_gpu_target_limits_follow_each_platform():
    webgpu, cuda = Target.parse("webgpu"), Target.parse("cuda")
    # WGSL has no 64-bit types (bytes live in the lanes of u32 words); the WebGPU defaults allow 256 invocations, 16 KB
    assert not {"float64", "int64"} & webgpu.device.dtypes and {"bool", "int8", "uint8"} <= webgpu.device.dtypes
    assert (webgpu.device.max_threads, webgpu.device.shared_bytes, webgpu.device.max_buffers) == (256, 16384, 8)
    assert cuda.cpu == "sm_80" and Target.parse("cuda -arch=sm_90").cpu == "sm_90"
    assert cuda.device.max_threads == 1024 and "int64" in cuda.device.dtypes
    assert not Target.parse("llvm").is_gpu and Target.parse("wasm").device is None


@pytest.mark.parametrize("text", ["cuda -arch=sm_10", "cuda -mcpu=x", "webgpu -arch=sm_80", "opencl fast"])
def test_gpu_target_options_are_checked(text):
    with pytest.raises(TargetError, match="unknown target option"):
        Target.parse(text)
