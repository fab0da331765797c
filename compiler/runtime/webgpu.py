"""WebGPU runtime through wgpu-py (lavapipe here; any Vulkan, Metal or D3D12 adapter elsewhere): runs the WGSL that
codegen/wgsl.py wrote, from its entry-point descriptions alone (the same dicts a bundle's manifest holds), so it
reads no compiler IR. Buffers, pipelines and bind groups are made once; a call or a run is one command buffer."""

from __future__ import annotations

import math
import os
import struct
import tempfile

import numpy as np

from compiler.errors import PlatformError, RunError, TargetError
from compiler.runtime import ArgSpec, check_args, check_status
from compiler.runtime.device import region_sizes

_MISSING = (
    "no WebGPU adapter was found: install a Vulkan driver (on Debian, mesa-vulkan-drivers gives lavapipe, a CPU "
    "adapter; or your GPU's driver) and the wgpu Python package"
)
_device = None
_features: frozenset[str] = frozenset()


def device():
    """The process's one WebGPU device (with shader-f16 where the adapter has it); TargetError when there is none."""
    global _device, _features
    if _device is not None:
        return _device
    # wgpu's Vulkan loader warns on stderr without a runtime directory; a private one silences it
    if not os.environ.get("XDG_RUNTIME_DIR"):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="tessel-xdg-")
    try:
        import wgpu

        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except ImportError as error:
        raise PlatformError(f"{_MISSING} ({error})") from None
    except Exception as error:  # wgpu raises its own RuntimeError subclasses when no backend loads
        raise PlatformError(f"{_MISSING} ({error})") from None
    if adapter is None:
        raise PlatformError(_MISSING)
    wanted = [name for name in ("shader-f16",) if name in adapter.features]
    _device = adapter.request_device_sync(required_features=wanted)
    _features = frozenset(wanted)
    return _device


def has_shader_f16() -> bool:
    device()
    return "shader-f16" in _features


def _usage():
    import wgpu

    return wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC


def _buffer(size: int, usage=None):
    # a binding's size is a multiple of 4 bytes and never 0
    return device().create_buffer(size=max(4, math.ceil(size / 4) * 4), usage=usage if usage is not None else _usage())


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 4)


class _Pipelines:
    """One shader module and a compute pipeline per entry point, made at load."""

    def __init__(self, code: str, entries: list[dict]):
        gpu = device()
        self.code = code
        self.module = gpu.create_shader_module(code=code)
        self.entries = {entry["name"]: entry for entry in entries}
        self.layouts = {entry["name"]: self._layout(entry) for entry in entries}
        self.pipelines = {
            entry["name"]: gpu.create_compute_pipeline(
                layout=gpu.create_pipeline_layout(bind_group_layouts=[self.layouts[entry["name"]]]),
                compute={"module": self.module, "entry_point": entry["name"]},
            )
            for entry in entries
        }

    @staticmethod
    def _layout(entry: dict):
        """The bind group layout the entry describes. Not "auto": that one leaves out the bindings a shader never
        reads (an input of an empty reduction), and a bind group giving them would be refused."""
        import wgpu

        kinds = {"read": wgpu.BufferBindingType.read_only_storage, "read_write": wgpu.BufferBindingType.storage}
        items = [
            {
                "binding": region["binding"],
                "visibility": wgpu.ShaderStage.COMPUTE,
                "buffer": {"type": kinds[region["access"]]},
            }
            for region in entry["regions"]
        ]
        if entry["offsets_binding"] is not None:
            items.append(
                {
                    "binding": entry["offsets_binding"],
                    "visibility": wgpu.ShaderStage.COMPUTE,
                    "buffer": {"type": wgpu.BufferBindingType.uniform},
                }
            )
        if entry.get("status_binding") is not None:
            items.append(
                {
                    "binding": entry["status_binding"],
                    "visibility": wgpu.ShaderStage.COMPUTE,
                    "buffer": {"type": wgpu.BufferBindingType.storage},
                }
            )
        return device().create_bind_group_layout(entries=items)

    def bind_group(self, name: str, regions: list, offsets: tuple | None, status=None):
        """`regions`: per region of the entry, (GPU buffer, byte size); `offsets`: the uniform buffer, its byte
        offset and size, when the entry reads element offsets; `status`: the 4-byte buffer where an entry that checks
        indices records a failed call."""
        entry = self.entries[name]
        layout = self.layouts[name]
        items = [
            {"binding": spec["binding"], "resource": {"buffer": buffer, "offset": 0, "size": size}}
            for spec, (buffer, size) in zip(entry["regions"], regions)
        ]
        if entry["offsets_binding"] is not None:
            buffer, offset, size = offsets
            items.append(
                {"binding": entry["offsets_binding"], "resource": {"buffer": buffer, "offset": offset, "size": size}}
            )
        if entry.get("status_binding") is not None:
            items.append({"binding": entry["status_binding"], "resource": {"buffer": status, "offset": 0, "size": 4}})
        return device().create_bind_group(layout=layout, entries=items)

    def encode(self, encoder, steps) -> None:
        """One compute pass over `steps`: (entry name, bind group) pairs, dispatched in order. WebGPU orders the
        storage writes of one dispatch before the reads of the next in the same pass."""
        compute = encoder.begin_compute_pass()
        for name, group in steps:
            compute.set_pipeline(self.pipelines[name])
            compute.set_bind_group(0, group)
            compute.dispatch_workgroups(*self.entries[name]["grid"])
        compute.end()


class WebGPUKernels:
    """A kernel runtime like NativeLibrary: `function(name, specs)` gives a callable on numpy arrays. The device,
    the shader module and the pipelines are made at the first call, so building a kernel needs no adapter.
    `kernels[name]`, for a kernel of several launches (tir/gpu.py split_launches), lists its parts in order and its
    workspace buffers ({"size", "dtype"}), which each part takes after the arrays."""

    def __init__(self, code: str, entries: list[dict], kernels: dict[str, dict] | None = None):
        self.code, self.entries, self.kernels = code, entries, kernels or {}
        self.pipelines: _Pipelines | None = None

    def _entry(self, kernel: str) -> str:
        entry = next((entry["name"] for entry in self.entries if entry["kernel"] == kernel), None)
        if entry is None:
            raise TargetError(f"the WGSL module has no kernel {kernel!r}")
        return entry

    def function(self, name: str, specs: list[ArgSpec]):
        """The call of kernel `name`: its parts' entry points in turn, over the arrays and a zeroed workspace."""
        described = self.kernels.get(name, {"parts": [name], "workspace": []})
        entries = [self._entry(part) for part in described["parts"]]
        workspace = [
            ArgSpec(f"workspace_{index}", (buffer["size"],), buffer["dtype"])
            for index, buffer in enumerate(described["workspace"])
        ]
        calls: list[_KernelCall] = []

        def call(*arrays) -> None:
            if not calls:
                self.pipelines = self.pipelines or _Pipelines(self.code, self.entries)
                calls.extend(_KernelCall(self.pipelines, entry, [*specs, *workspace]) for entry in entries)
            scratch = [np.zeros(spec.shape, spec.dtype) for spec in workspace]
            for kernel in calls:
                kernel(*arrays, *scratch)

        return call


class _KernelCall:
    """Buffers and a bind group for one entry point, made once. Each parameter lies in the region its entry says, at
    16-byte aligned element offsets when several share one; a call copies the arrays in and the written ones out."""

    def __init__(self, pipelines: _Pipelines, name: str, specs: list[ArgSpec]):
        self.pipelines, self.name, self.specs = pipelines, name, specs
        entry = pipelines.entries[name]
        self.entry = entry
        placed = entry["param_regions"]
        sizes = [0] * len(entry["regions"])
        self.places = []
        for spec, region in zip(specs, placed):
            nbytes = int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
            self.places.append((region, sizes[region]))
            sizes[region] += math.ceil(nbytes / 16) * 16
        self.buffers = [_buffer(size) for size in sizes]
        self.sizes = [max(4, math.ceil(size / 4) * 4) for size in sizes]
        offsets = None
        if entry["offsets_binding"] is not None:
            words = [offset // np.dtype(spec.dtype).itemsize for spec, (_, offset) in zip(specs, self.places)] + [0]
            data = struct.pack(f"<{len(words)}i", *words)
            data += b"\0" * (entry["offsets_bytes"] - len(data))
            import wgpu

            uniform = _buffer(len(data), wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
            device().queue.write_buffer(uniform, 0, data)
            offsets = (uniform, 0, entry["offsets_bytes"])
        # a lone kernel's index checks clamp, as on the CPU targets, where only a model's run reports them
        self.group = pipelines.bind_group(name, list(zip(self.buffers, self.sizes)), offsets, _buffer(4))
        self.written = {binding["binding"] for binding in entry["regions"] if binding["access"] == "read_write"}

    def __call__(self, *arrays) -> None:
        check_args(self.name, self.specs, arrays)
        gpu = device()
        for array, (region, offset) in zip(arrays, self.places):
            if array.nbytes:
                gpu.queue.write_buffer(self.buffers[region], offset, _padded(array.tobytes()))
        encoder = gpu.create_command_encoder()
        self.pipelines.encode(encoder, [(self.name, self.group)])
        gpu.queue.submit([encoder.finish()])
        contents = {region: gpu.queue.read_buffer(self.buffers[region]) for region in self.written}
        for array, (region, offset) in zip(arrays, self.places):
            if region in contents:
                data = contents[region].cast("B")[offset : offset + array.nbytes]
                array[...] = np.frombuffer(data, array.dtype).reshape(array.shape)


class WebGPUModel:
    """A whole model from its bundle's parts: the WGSL, the entry points and the dispatch list of its manifest
    (codegen/wgsl.py's model_shader), params.bin, the arena size and the manifest's webgpu.buffers. At the first run
    (so compiling needs no adapter) it makes one storage buffer per region (params written once, the arena, each
    input and output that webgpu.buffers does not place in the arena at an `arena_offset`), the uniform holding every
    dispatch's element offsets, a pipeline per entry point and a bind group per dispatch; every run writes the
    inputs, records every dispatch and the outputs' copies into one command buffer, and maps one readback buffer."""

    def __init__(
        self,
        code: str,
        entries: list[dict],
        dispatches: list[dict],
        params: bytes,
        arena_bytes: int,
        inputs: list[ArgSpec],
        outputs: list[ArgSpec],
        calls: list[str] | None = None,
        device_dtypes: list[str] | None = None,
        buffers: list[dict] | None = None,
    ):
        self.parts = (code, entries, dispatches, params, arena_bytes)
        # (region, index) -> the arena offset where an input or output lives instead of a buffer of its own
        self.in_arena = {(b["region"], b["index"]): b["arena_offset"] for b in buffers or [] if "arena_offset" in b}
        # the caller's specs, and those of the device buffers (int64 stored as int32: passes/narrow_int64.py)
        self.host_inputs, self.host_outputs = inputs, outputs
        dtypes = device_dtypes or [spec.dtype for spec in [*inputs, *outputs]]
        self.inputs = [ArgSpec(spec.name, spec.shape, dtype) for spec, dtype in zip(inputs, dtypes)]
        self.outputs = [ArgSpec(spec.name, spec.shape, dtype) for spec, dtype in zip(outputs, dtypes[len(inputs) :])]
        self.calls = calls or []
        self.loaded = False

    def load(self) -> None:
        """Make the device state once."""
        if self.loaded:
            return
        import wgpu

        code, entries, dispatches, params, arena_bytes = self.parts
        outputs = self.outputs
        gpu = device()
        self.pipelines = _Pipelines(code, entries)
        self.sizes = region_sizes(len(params), arena_bytes, self.inputs, outputs)
        nbytes = [self.sizes["output", position] for position in range(len(outputs))]
        self.buffers = {key: _buffer(size) for key, size in self.sizes.items() if key not in self.in_arena}
        if params:
            gpu.queue.write_buffer(self.buffers["params", 0], 0, _padded(params))
        uniform_bytes = max(
            (
                dispatch["uniform_offset"] + self.pipelines.entries[dispatch["entry"]]["offsets_bytes"]
                for dispatch in dispatches
            ),
            default=4,
        )
        uniform = _buffer(
            uniform_bytes, wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        )
        data = bytearray(uniform_bytes)
        self.status = _buffer(4)
        self.steps = []
        for dispatch in dispatches:
            entry = self.pipelines.entries[dispatch["entry"]]
            # the call number (from 1) an index check records on failure, after the element offsets
            words = [*dispatch["element_offsets"], dispatch["call"] + 1]
            struct.pack_into(f"<{len(words)}i", data, dispatch["uniform_offset"], *words)
            regions = [(region["region"], region["index"]) for region in dispatch["regions"]]
            bound = [(self.buffers[key], max(4, math.ceil(self.sizes[key] / 4) * 4)) for key in regions]
            offsets = (uniform, dispatch["uniform_offset"], entry["offsets_bytes"])
            group = self.pipelines.bind_group(dispatch["entry"], bound, offsets, self.status)
            self.steps.append((dispatch["entry"], group))
        gpu.queue.write_buffer(uniform, 0, bytes(data))
        self.uniform = uniform
        # every output lands in one readback buffer, at 256-byte aligned offsets, so a run maps once
        self.readback_offsets, total = [], 0
        for size in nbytes:
            self.readback_offsets.append(total)
            total += math.ceil(max(size, 4) / 256) * 256
        # then the status word: the number of a call whose index check failed, 0 when none did
        self.status_offset = total
        self.readback = _buffer(total + 4, wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        self.loaded = True

    def write_inputs(self, inputs: list[np.ndarray]) -> None:
        for position, array in enumerate(inputs):
            spec = self.inputs[position]
            if array.dtype != np.dtype(spec.dtype):
                narrow = np.iinfo(spec.dtype)
                if array.size and not (narrow.min <= int(array.min()) and int(array.max()) <= narrow.max):
                    raise RunError(
                        f"input {spec.name!r} holds int64 values outside int32's range, which webgpu stores it in "
                        "(it has no int64); pass values in [-2**31, 2**31) or run the model on another target"
                    )
                array = array.astype(spec.dtype)
            if array.nbytes:
                buffer, offset = self.place("input", position)
                device().queue.write_buffer(buffer, offset, _padded(array.tobytes()))

    def place(self, region: str, index: int):
        """(buffer, byte offset) of an input or output: its own buffer, or the arena where the bundle put it."""
        if (region, index) in self.in_arena:
            return self.buffers["arena", 0], self.in_arena[region, index]
        return self.buffers[region, index], 0

    def read_outputs(self, encoder=None) -> list[np.ndarray]:
        """Copy every output into the readback buffer (after what `encoder` holds), submit, map once, read."""
        import wgpu

        gpu = device()
        encoder = encoder or gpu.create_command_encoder()
        for position, offset in enumerate(self.readback_offsets):
            size = max(4, math.ceil(self.sizes["output", position] / 4) * 4)
            encoder.copy_buffer_to_buffer(*self.place("output", position), self.readback, offset, size)
        encoder.copy_buffer_to_buffer(self.status, 0, self.readback, self.status_offset, 4)
        gpu.queue.submit([encoder.finish()])
        self.readback.map_sync(wgpu.MapMode.READ)
        try:
            data = self.readback.read_mapped(copy=False)
            results = []
            for spec, offset in zip(self.outputs, self.readback_offsets):
                count = int(np.prod(spec.shape, dtype=np.int64))
                result = np.frombuffer(data, spec.dtype, count, offset).reshape(spec.shape)
                results.append(result.astype(self.host_outputs[len(results)].dtype))
            self.failed_call = int(np.frombuffer(data, np.uint32, 1, self.status_offset)[0])
        finally:
            self.readback.unmap()
        return results

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        self.load()
        self.write_inputs(inputs)
        device().queue.write_buffer(self.status, 0, bytes(4))
        encoder = device().create_command_encoder()
        self.pipelines.encode(encoder, self.steps)
        results = self.read_outputs(encoder)
        check_status(self.failed_call, self.calls)
        return results

    def replay(self, inputs: list[np.ndarray]) -> WebGPUReplay:
        return WebGPUReplay(self, inputs)


class WebGPUReplay:
    """Module.replay's kernel-at-a-time calls: the i-th kernel asked for is the i-th dispatch (the manifest's calls
    and dispatches are in the same order), submitted alone and waited for, so a call's time is its dispatch's."""

    def __init__(self, runtime: WebGPUModel, inputs: list[np.ndarray]):
        self.runtime = runtime
        self.position = 0
        runtime.load()
        runtime.write_inputs(inputs)

    def kernel(self, name: str, args: list):
        step = self.runtime.steps[self.position]
        self.position += 1
        gpu = device()

        def call() -> None:
            encoder = gpu.create_command_encoder()
            self.runtime.pipelines.encode(encoder, [step])
            gpu.queue.submit([encoder.finish()])
            # reading a buffer back waits for the dispatch (this wgpu's on_submitted_work_done_sync does not run)
            gpu.queue.read_buffer(self.runtime.uniform, 0, 4)

        return call

    def outputs(self) -> list[np.ndarray]:
        return self.runtime.read_outputs()
