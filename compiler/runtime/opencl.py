"""OpenCL runtime: kernels.cl (codegen/opencl.py) built with pyopencl on the first OpenCL device found (PoCL on a
CPU here), kernels called on numpy arrays, and whole models run from a bundle's dispatch list. Kernels take each
buffer as a whole cl_mem plus an element offset (codegen/opencl.py), so a model binds its regions directly."""

from __future__ import annotations

import functools
import os

import numpy as np

from compiler.errors import PlatformError, TargetError
from compiler.runtime import ArgSpec, check_args

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
    try:
        return cl.Program(context, source).build(options=["-cl-std=CL1.2"])
    except cl.Error as error:
        raise TargetError(
            f"the OpenCL driver refused the generated kernels.cl ({str(error).strip()[:2000]}); report this with "
            "the model"
        ) from None


def buffer(nbytes: int):
    cl = _opencl()
    context, _ = opencl_queue()
    # OpenCL has no empty buffers; a value of no elements still gets one word
    return cl.Buffer(context, cl.mem_flags.READ_WRITE, max(int(nbytes), 4))


class OpenCLProgram:
    """kernels.cl, built for the device when a kernel is first asked for; `launches[name]` is each kernel's {"grid": [...], "block": [...]}
    (tir/gpu.py). `function` gives a callable that copies its arrays in, runs the kernel and copies them back."""

    def __init__(self, source: str, launches: dict[str, dict]):
        self.source = source
        self.launches = launches
        self.program = None

    def kernel(self, name: str):
        """Kernel `name`; the program is built for the device at the first kernel asked for."""
        if self.program is None:
            self.program = _build(self.source)
        return getattr(self.program, name)

    def function(self, name: str, specs: list[ArgSpec]):
        cl = _opencl()
        _, queue = opencl_queue()
        kernel = self.kernel(name)
        launch = self.launches[name]
        local, total = launch_sizes(launch)

        def call(*arrays):
            check_args(name, specs, arrays)
            buffers = [buffer(array.nbytes) for array in arrays]
            for array, device_buffer in zip(arrays, buffers):
                if array.nbytes:
                    cl.enqueue_copy(queue, device_buffer, array, is_blocking=False)
            kernel.set_args(*[item for device_buffer in buffers for item in (device_buffer, np.int32(0))])
            cl.enqueue_nd_range_kernel(queue, kernel, total, local)
            for array, device_buffer in zip(arrays, buffers):
                if array.nbytes:
                    cl.enqueue_copy(queue, array, device_buffer, is_blocking=False)
            queue.finish()

        return call


def launch_sizes(launch: dict) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """OpenCL's (local, global) work sizes of a launch: the global size counts work items, not groups."""
    block, grid = launch["block"], launch["grid"]
    return tuple(block), tuple(count * size for count, size in zip(grid, block))
