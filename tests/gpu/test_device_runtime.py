"""compiler/runtime/device.py's shared model, replay and kernel call over host-memory primitives (numpy byte
buffers; the oracle is numpy), so the logic CUDA runs is exercised where no CUDA driver is; and CudaModel's argument
packing (region pointer + byte offset) from a real NVRTC-compiled program, without loading it."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.errors import TargetError
from compiler.runtime import ArgSpec
from compiler.runtime import cuda as cuda_runtime
from compiler.runtime.device import DispatchModel, kernel_call, region_sizes


def _view(buffer: np.ndarray, offset: int, count: int) -> np.ndarray:
    return buffer[offset : offset + 4 * count].view(np.float32)


class HostDevice:
    """Buffers are numpy bytes; a "kernel" adds 1 to its first argument's floats into its second's."""

    launched: list[str] = []

    @staticmethod
    def allocate(nbytes):
        return np.zeros(max(int(nbytes), 4), np.uint8)

    @staticmethod
    def copy_in(buffer, array, step="copy in"):
        buffer[: array.nbytes] = np.frombuffer(array.tobytes(), np.uint8)

    @staticmethod
    def copy_out(array, buffer):
        array[...] = np.frombuffer(buffer[: array.nbytes].tobytes(), array.dtype).reshape(array.shape)

    @staticmethod
    def launch(kernel, part, buffers):
        HostDevice.launched.append(part["kernel"])
        count = part["grid"][0]
        _view(buffers[1], 0, count)[...] = _view(buffers[0], 0, count) + kernel

    @staticmethod
    def wait():
        pass

    @staticmethod
    def free(buffers):
        buffers.clear()


class HostModel(HostDevice, DispatchModel):
    def bind(self, dispatch):
        return dispatch, [
            (self.regions[(item["region"], item["index"])], item["offset"]) for item in dispatch["bindings"]
        ]

    def enqueue(self, bound):
        dispatch, ((source, source_offset), (target, target_offset)) = bound
        count = dispatch["grid"][0]
        _view(target, target_offset, count)[...] = _view(source, source_offset, count) + 1
        HostDevice.launched.append(dispatch["kernel"])


def _binding(region, offset=0, index=0):
    return {"region": region, "index": index, "offset": offset, "dtype": "float32"}


PLAN = [
    {
        "kernel": "add_part0",
        "call": 0,
        "grid": [4, 1, 1],
        "block": [1, 1, 1],
        "bindings": [_binding("input"), _binding("arena", 16)],
    },
    {
        "kernel": "add_part1",
        "call": 0,
        "grid": [4, 1, 1],
        "block": [1, 1, 1],
        "bindings": [_binding("arena", 16), _binding("arena")],
    },
    {
        "kernel": "bump",
        "call": 1,
        "grid": [4, 1, 1],
        "block": [1, 1, 1],
        "bindings": [_binding("arena"), _binding("output")],
    },
]
SPECS = [ArgSpec("x", (2, 2), "float32")], [ArgSpec("y", (2, 2), "float32")]


def test_region_sizes_are_params_arena_then_inputs_and_outputs():
    sizes = region_sizes(
        12, 64, [ArgSpec("x", (2, 3), "float16"), ArgSpec("n", (), "int64")], [ArgSpec("y", (0, 4), "float32")]
    )
    assert list(sizes.items()) == [
        (("params", 0), 12),
        (("arena", 0), 64),
        (("input", 0), 12),
        (("input", 1), 8),
        (("output", 0), 0),
    ]


def test_model_runs_and_replays_every_dispatch_in_order():
    model = HostModel(None, PLAN, b"", 32, *SPECS)
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    HostDevice.launched.clear()
    (y,) = model.run([x])
    np.testing.assert_array_equal(y, x + 3)
    assert HostDevice.launched == ["add_part0", "add_part1", "bump"]
    replay = model.replay([x + 10])
    replay.kernel("add", [])()
    replay.kernel("bump", [])()
    np.testing.assert_array_equal(replay.outputs()[0], x + 13)


def test_replay_refuses_a_call_of_another_kernel():
    replay = HostModel(None, PLAN, b"", 32, *SPECS).replay([np.zeros((2, 2), np.float32)])
    with pytest.raises(TargetError, match="call 0 of the manifest is bump, but its dispatches run another kernel"):
        replay.kernel("bump", [])


def test_kernel_call_copies_in_launches_the_parts_and_copies_out():
    description = {
        "parts": [{"kernel": "f_part0", "grid": [3, 1, 1]}, {"kernel": "f_part1", "grid": [3, 1, 1]}],
        "workspace": [8],
    }
    call = kernel_call(
        "f",
        [ArgSpec("a", (3,), "float32"), ArgSpec("b", (3,), "float32")],
        description,
        {"f_part0": 1.0, "f_part1": 2.0}.get,
        HostDevice,
    )
    a, b = np.ones(3, np.float32), np.zeros(3, np.float32)
    HostDevice.launched.clear()
    call(a, b)
    np.testing.assert_array_equal(b, a + 2)
    assert HostDevice.launched == ["f_part0", "f_part1"]


SOURCE = 'extern "C" __global__ void copy(float *a, float *b) { b[threadIdx.x] = a[threadIdx.x]; }\n'


@pytest.mark.skipif(cuda_runtime._nvrtc() is None and cuda_runtime.nvcc_path() is None, reason="no NVRTC or nvcc")
def test_cuda_model_binds_each_region_pointer_plus_its_byte_offset():
    dispatch = {
        "kernel": "copy",
        "call": 0,
        "grid": [1, 1, 1],
        "block": [4, 1, 1],
        "bindings": [_binding("params", 8), _binding("arena", 32)],
    }
    model = cuda_runtime.CudaModel(SOURCE, [dispatch], b"", 64, [], [], "sm_80")
    model.kernels = {"copy": "the kernel"}
    model.regions = {("params", 0): 4096, ("arena", 0): 8192}
    assert model.bind(dispatch) == (dispatch, "the kernel", [4104, 8224])
