"""OpenCL runtime: kernels.cl (codegen/opencl.py) built with pyopencl on the first OpenCL device found (PoCL on a
CPU here), kernels called on numpy arrays, and whole models run from a bundle's dispatch list. Kernels take each
buffer as a whole cl_mem plus an element offset (codegen/opencl.py), so a model binds its regions directly."""

from __future__ import annotations

import functools
import os

import numpy as np

from compiler.errors import PlatformError, TargetError
from compiler.runtime import ArgSpec
from compiler.runtime.device import DispatchModel, kernel_call

# Where this machine has several OpenCL devices, TESSEL_OPENCL_DEVICE picks one by its position in the list of
# every platform's devices (0 unless given).
DEVICE_ENV = "TESSEL_OPENCL_DEVICE"
_INSTALL = "install pyopencl and an OpenCL driver (on Debian: pocl-opencl-icd for CPUs, or the GPU vendor's ICD)"


def _opencl():
    try:
        import pyopencl
    except ImportError as error:
        raise PlatformError(f"the opencl target needs pyopencl ({error}); {_INSTALL}") from None
    return pyopencl


@functools.cache
def opencl_queue():
    """The context and in-order command queue of the chosen device, made once per process."""
    cl = _opencl()
    try:
        devices = [device for platform in cl.get_platforms() for device in platform.get_devices()]
    except cl.Error as error:
        raise PlatformError(f"no OpenCL platform is installed ({error}); {_INSTALL}") from None
    if not devices:
        raise PlatformError(f"no OpenCL device was found; {_INSTALL}")
    text = os.environ.get(DEVICE_ENV, "0")
    if not text.isdigit() or int(text) >= len(devices):
        names = "; ".join(f"{position}: {device.name}" for position, device in enumerate(devices))
        raise PlatformError(f"{DEVICE_ENV}={text!r} names no OpenCL device; this machine has {names}")
    device = devices[int(text)]
    context = cl.Context([device])
    return context, cl.CommandQueue(context)


def device_name() -> str:
    context, _ = opencl_queue()
    device = context.devices[0]
    return f"{device.name.strip()} ({device.platform.name.strip()}, {device.version.strip()})"


def _build(source: str):
    cl = _opencl()
    context, _ = opencl_queue()
    program = cl.Program(context, source)
    try:
        return program.build(options=["-cl-std=CL1.2"])
    except cl.Error:
        log = program.get_build_info(context.devices[0], cl.program_build_info.LOG).strip()
        raise TargetError(
            f"the OpenCL driver refused the generated kernels.cl ({log[:2000]}); report this with the model"
        ) from None


def buffer(nbytes: int):
    cl = _opencl()
    context, _ = opencl_queue()
    # OpenCL has no empty buffers; a value of no elements still gets one word
    return cl.Buffer(context, cl.mem_flags.READ_WRITE, max(int(nbytes), 4))


def copy_in(device_buffer, array: np.ndarray, step: str = "copy in") -> None:
    _opencl().enqueue_copy(opencl_queue()[1], device_buffer, array, is_blocking=False)


def copy_out(array: np.ndarray, device_buffer) -> None:
    _opencl().enqueue_copy(opencl_queue()[1], array, device_buffer, is_blocking=False)


def wait() -> None:
    opencl_queue()[1].finish()


def free(buffers: list) -> None:
    """Nothing: pyopencl releases a buffer when it is collected."""


def launch_sizes(launch: dict) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """OpenCL's (local, global) work sizes of a launch: the global size counts work items, not groups."""
    block, grid = launch["block"], launch["grid"]
    return tuple(block), tuple(count * size for count, size in zip(grid, block))


def launch(kernel, part: dict, buffers: list) -> None:
    """Enqueue a lone kernel's part with each buffer whole (element offset 0)."""
    kernel.set_args(*[item for device_buffer in buffers for item in (device_buffer, np.int32(0))])
    local, total = launch_sizes(part)
    _opencl().enqueue_nd_range_kernel(opencl_queue()[1], kernel, total, local)


class OpenCLDevice:
    """The primitives device.py's kernel call and model are written over: copies and launches are enqueued on the one
    in-order queue, and `wait` finishes it."""

    allocate = staticmethod(buffer)
    copy_in = staticmethod(copy_in)
    copy_out = staticmethod(copy_out)
    launch = staticmethod(launch)
    wait = staticmethod(wait)
    free = staticmethod(free)


class OpenCLProgram:
    """kernels.cl, built for the device when a kernel is first asked for. `kernels[name]` describes each lone kernel
    `function` can call: {"parts": [{"kernel", "grid", "block"}...], "workspace": [bytes...]} (tir/gpu.py's
    split_launches: the parts run in order, each taking the arrays and then the workspace buffers)."""

    def __init__(self, source: str, kernels: dict[str, dict]):
        self.source = source
        self.kernels = kernels
        self.program = None

    def kernel(self, name: str):
        """A new kernel object of `name` (each holds its own arguments); the program is built for the device at the
        first kernel asked for."""
        if self.program is None:
            self.program = _build(self.source)
        return _opencl().Kernel(self.program, name)

    def function(self, name: str, specs: list[ArgSpec]):
        """A callable on numpy arrays that copies them in, runs the kernel's parts and copies them back; the device
        is first asked for at its first call."""
        _opencl()
        return kernel_call(name, specs, self.kernels[name], self.kernel, OpenCLDevice)


def element_offset(binding: dict, dtype: str, kernel: str) -> np.int32:
    """A binding's byte offset as the element offset the kernel takes."""
    itemsize = np.dtype(dtype).itemsize
    if binding["offset"] % itemsize:
        raise TargetError(
            f"kernel {kernel} binds {binding['region']} at byte {binding['offset']}, not a whole {dtype} element"
        )
    return np.int32(binding["offset"] // itemsize)


class OpenCLModel(OpenCLDevice, DispatchModel):
    """A whole model from its bundle (device.py's DispatchModel), each binding a region, index, byte offset and dtype:
    at the first run the program and one kernel object per dispatch, its arguments set, are made; a run enqueues
    every dispatch with one wait at the end."""

    def __init__(
        self,
        source: str,
        dispatches: list[dict],
        params: bytes,
        arena_bytes: int,
        inputs: list[ArgSpec],
        outputs: list[ArgSpec],
    ):
        super().__init__(OpenCLProgram(source, {}), dispatches, params, arena_bytes, inputs, outputs)

    def bind(self, dispatch: dict) -> tuple:
        name = dispatch["kernel"]
        kernel = self.program.kernel(name)
        arguments = []
        for binding in dispatch["bindings"]:
            region = self.regions[(binding["region"], binding["index"])]
            arguments += [region, element_offset(binding, binding["dtype"], name)]
        kernel.set_args(*arguments)
        return kernel, *launch_sizes(dispatch)

    def enqueue(self, bound: tuple) -> None:
        kernel, local, total = bound
        _opencl().enqueue_nd_range_kernel(opencl_queue()[1], kernel, total, local)
