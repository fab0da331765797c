"""Device-memory runtime shared by the C-dialect GPU backends (cuda.py, opencl.py): a bundle's region sizes, the model
that runs a manifest's dispatch list, its kernel-at-a-time replay and a lone kernel's call, written over the few
primitives each backend supplies (allocate, copy_in, copy_out, launch, wait, free) and its own argument packing."""

from __future__ import annotations

import numpy as np

from compiler.errors import TargetError
from compiler.runtime import ArgSpec, check_args


def region_sizes(
    params_bytes: int, arena_bytes: int, inputs: list[ArgSpec], outputs: list[ArgSpec]
) -> dict[tuple[str, int], int]:
    """The byte size of each region a manifest's bindings name: params, the arena, then each input and output."""
    sizes = {("params", 0): params_bytes, ("arena", 0): arena_bytes}
    for kind, specs in (("input", inputs), ("output", outputs)):
        for index, spec in enumerate(specs):
            sizes[(kind, index)] = np.dtype(spec.dtype).itemsize * int(np.prod(spec.shape, dtype=np.int64))
    return sizes


def kernel_call(name: str, specs: list[ArgSpec], description: dict, kernel, device):
    """A lone kernel's callable on numpy arrays: one device buffer per array plus the workspace, the arrays copied in,
    the kernel's parts launched in order (each fetched with `kernel(name)` at the first call) and the arrays copied
    back. `description` is {"parts": [{"kernel", "grid", "block"}...], "workspace": [bytes...]} (tir/gpu.py's
    split_launches); `device` supplies the primitives."""
    parts = []

    def call(*arrays):
        check_args(name, specs, arrays)
        if not parts:
            parts.extend((kernel(part["kernel"]), part) for part in description["parts"])
        buffers = [device.allocate(array.nbytes) for array in arrays]
        buffers += [device.allocate(nbytes) for nbytes in description["workspace"]]
        try:
            for array, buffer in zip(arrays, buffers):
                if array.nbytes:
                    device.copy_in(buffer, array)
            for compiled, part in parts:
                device.launch(compiled, part, buffers)
            for array, buffer in zip(arrays, buffers):
                if array.nbytes:
                    device.copy_out(array, buffer)
            device.wait()
        finally:
            device.free(buffers)

    return call


class DispatchModel:
    """A whole model from its bundle: the program, the manifest's dispatch list, params.bin and the arena size. At the
    first run, every region's buffer (params copied once) and each dispatch's bound launch are made; a run copies the
    inputs in, launches every dispatch in order and copies the outputs out. A backend supplies the primitives
    (allocate, copy_in, copy_out, wait) and binds a dispatch (`bind`) and launches what it bound (`enqueue`)."""

    def __init__(
        self,
        program,
        dispatches: list[dict],
        params: bytes,
        arena_bytes: int,
        inputs: list[ArgSpec],
        outputs: list[ArgSpec],
    ):
        self.program = program
        self.plan = dispatches
        self.params, self.arena_bytes = params, arena_bytes
        self.inputs, self.outputs = inputs, outputs
        self.regions: dict[tuple[str, int], object] = {}
        self.dispatches: list = []
        self.loaded = False

    def prepare(self) -> None:
        """What a backend makes before any buffer (nothing unless it says)."""

    def load(self) -> None:
        if self.loaded:
            return
        self.prepare()
        sizes = region_sizes(len(self.params), self.arena_bytes, self.inputs, self.outputs)
        self.regions = {key: self.allocate(size) for key, size in sizes.items()}
        if self.params:
            self.copy_in(self.regions[("params", 0)], np.frombuffer(self.params, np.uint8), "copy params")
        self.dispatches = [self.bind(dispatch) for dispatch in self.plan]
        self.wait()
        self.loaded = True

    def launch_dispatch(self, position: int) -> None:
        self.enqueue(self.dispatches[position])

    def write_inputs(self, inputs: list[np.ndarray]) -> None:
        self.load()
        for index, array in enumerate(inputs):
            if array.nbytes:
                self.copy_in(self.regions[("input", index)], array)

    def read_outputs(self) -> list[np.ndarray]:
        results = [np.empty(spec.shape, spec.dtype) for spec in self.outputs]
        for index, array in enumerate(results):
            if array.nbytes:
                self.copy_out(array, self.regions[("output", index)])
        self.wait()
        return results

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        self.write_inputs(inputs)
        for position in range(len(self.dispatches)):
            self.launch_dispatch(position)
        return self.read_outputs()

    def replay(self, inputs: list[np.ndarray]) -> DispatchReplay:
        return DispatchReplay(self, inputs)


class DispatchReplay:
    """One kernel call at a time (Module.replay): the inputs are written once, each call launches its dispatches (one
    per launch of the kernel) and waits for them, so it can be timed."""

    def __init__(self, model: DispatchModel, inputs: list[np.ndarray]):
        self.model = model
        model.write_inputs(inputs)
        model.wait()
        self.position = 0

    def kernel(self, name: str, args: list):
        """The dispatches of the next call, which must be of kernel `name` (calls come in the manifest's order)."""
        position = self.position
        self.position += 1
        mine = [index for index, dispatch in enumerate(self.model.plan) if dispatch["call"] == position]
        if not mine or self.model.plan[mine[0]]["kernel"] not in (name, f"{name}_part0"):
            raise TargetError(f"call {position} of the manifest is {name}, but its dispatches run another kernel")

        def call() -> None:
            for index in mine:
                self.model.launch_dispatch(index)
            self.model.wait()

        return call

    def outputs(self) -> list[np.ndarray]:
        return self.model.read_outputs()
