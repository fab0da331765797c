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
        cl = _opencl()
        description = self.kernels[name]
        parts = []

        def call(*arrays):
            check_args(name, specs, arrays)
            _, queue = opencl_queue()
            if not parts:
                parts.extend((self.kernel(part["kernel"]), *launch_sizes(part)) for part in description["parts"])
            buffers = [buffer(array.nbytes) for array in arrays]
            buffers += [buffer(nbytes) for nbytes in description["workspace"]]
            for array, device_buffer in zip(arrays, buffers):
                if array.nbytes:
                    cl.enqueue_copy(queue, device_buffer, array, is_blocking=False)
            for kernel, local, total in parts:
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


def element_offset(binding: dict, dtype: str, kernel: str) -> np.int32:
    """A binding's byte offset as the element offset the kernel takes."""
    itemsize = np.dtype(dtype).itemsize
    if binding["offset"] % itemsize:
        raise TargetError(
            f"kernel {kernel} binds {binding['region']} at byte {binding['offset']}, not a whole {dtype} element"
        )
    return np.int32(binding["offset"] // itemsize)


class OpenCLModel:
    """A whole model from its bundle: kernels.cl, the manifest's dispatch list (each binding a region, index, byte
    offset and dtype), params.bin and the arena size. At the first run, the program, the region buffers (params
    written once) and one kernel object per dispatch, its arguments set, are made; a run copies the inputs in,
    enqueues every dispatch and copies the outputs out, with one wait at the end."""

    def __init__(
        self,
        source: str,
        dispatches: list[dict],
        params: bytes,
        arena_bytes: int,
        inputs: list[ArgSpec],
        outputs: list[ArgSpec],
    ):
        self.program = OpenCLProgram(source, {})
        self.plan = dispatches
        self.params, self.arena_bytes = params, arena_bytes
        self.inputs, self.outputs = inputs, outputs
        self.queue = None
        self.regions: dict[tuple[str, int], object] = {}
        self.dispatches: list[tuple] = []

    def load(self) -> None:
        if self.queue is not None:
            return
        cl = _opencl()
        _, queue = opencl_queue()
        self.regions = {("params", 0): buffer(len(self.params)), ("arena", 0): buffer(self.arena_bytes)}
        for kind, specs in (("input", self.inputs), ("output", self.outputs)):
            for index, spec in enumerate(specs):
                self.regions[(kind, index)] = buffer(np.dtype(spec.dtype).itemsize * int(np.prod(spec.shape)))
        if self.params:
            cl.enqueue_copy(queue, self.regions[("params", 0)], np.frombuffer(self.params, np.uint8))
        for dispatch in self.plan:
            name = dispatch["kernel"]
            kernel = self.program.kernel(name)
            arguments = []
            for binding in dispatch["bindings"]:
                region = self.regions[(binding["region"], binding["index"])]
                arguments += [region, element_offset(binding, binding["dtype"], name)]
            kernel.set_args(*arguments)
            self.dispatches.append((name, kernel, *launch_sizes(dispatch)))
        queue.finish()
        self.queue = queue

    def enqueue(self, position: int) -> None:
        _, kernel, local, total = self.dispatches[position]
        _opencl().enqueue_nd_range_kernel(self.queue, kernel, total, local)

    def write_inputs(self, inputs: list[np.ndarray]) -> None:
        cl = _opencl()
        self.load()
        for index, array in enumerate(inputs):
            if array.nbytes:
                cl.enqueue_copy(self.queue, self.regions[("input", index)], array, is_blocking=False)

    def read_outputs(self) -> list[np.ndarray]:
        cl = _opencl()
        results = [np.empty(spec.shape, spec.dtype) for spec in self.outputs]
        for index, array in enumerate(results):
            if array.nbytes:
                cl.enqueue_copy(self.queue, array, self.regions[("output", index)], is_blocking=False)
        self.queue.finish()
        return results

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        self.write_inputs(inputs)
        for position in range(len(self.dispatches)):
            self.enqueue(position)
        return self.read_outputs()

    def replay(self, inputs: list[np.ndarray]) -> OpenCLReplay:
        return OpenCLReplay(self, inputs)


class OpenCLReplay:
    """One kernel call at a time (Module.replay): the inputs are written once, each call enqueues its dispatches (one
    per launch of the kernel) and waits for them."""

    def __init__(self, model: OpenCLModel, inputs: list[np.ndarray]):
        self.model = model
        model.write_inputs(inputs)
        model.queue.finish()
        self.position = 0

    def kernel(self, name: str, args: list) -> callable:
        """The dispatches of the next call, which must be of kernel `name` (calls come in the manifest's order)."""
        position = self.position
        self.position += 1
        mine = [index for index, dispatch in enumerate(self.model.plan) if dispatch["call"] == position]
        if not mine or self.model.plan[mine[0]]["kernel"] not in (name, f"{name}_part0"):
            raise TargetError(f"call {position} of the manifest is {name}, but its dispatches run another kernel")

        def call() -> None:
            for index in mine:
                self.model.enqueue(index)
            self.model.queue.finish()

        return call

    def outputs(self) -> list[np.ndarray]:
        return self.model.read_outputs()
