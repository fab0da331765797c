"""WASM runtime: a .wasm from link.py run in wasmtime (SIMD128, relaxed SIMD and threads on). The host owns the
linear memory (the module imports it); each call copies the arrays into it, runs the kernel and copies every
argument back into the caller's arrays, so outputs are written in place as natively. A threaded module (its memory
shared) runs on one thread unless asked for more: WasmModel(threads=n) starts n - 1 Python threads, each running
the pool's worker (tessel_worker) in its own instance over the same memory; wasmtime-py's calls release the GIL, so
they run at once, as tessel.js's workers do."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable

import numpy as np
import wasmtime

from compiler.bundle import BINDING_SYMBOL, BundleError
from compiler.errors import TargetError
from compiler.link import WASM_STACK_BYTES
from compiler.runtime import ArgSpec, check_args, check_status

PAGE_BYTES = 65536
ALIGN = 64


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def memory_import(wasm: bytes) -> dict:
    """The limits of the module's imported memory, in 64 KiB pages: what a host must create before it
    instantiates the module (the JS runtime reads them from the manifest to stream-instantiate)."""
    engine = wasmtime.Engine(_config())
    imports = wasmtime.Module(engine, wasm).imports
    if [(item.module, item.name) for item in imports] != [("env", "memory")]:
        wanted = ", ".join(f"{item.module}.{item.name}" for item in imports)
        raise TargetError(f"a Tessel wasm module imports only env.memory; this one imports {wanted}")
    memory = imports[0].type
    limits = {"initial_pages": memory.limits.min, "maximum_pages": memory.limits.max}
    return {**limits, "shared": True} if memory.is_shared else limits


def _config() -> wasmtime.Config:
    config = wasmtime.Config()
    config.wasm_simd = True
    config.wasm_relaxed_simd = True
    config.wasm_threads = True
    config.shared_memory = True
    return config


class _SharedMemory(wasmtime.SharedMemory):
    """A shared memory with wasmtime.Memory's methods (which take the store), so the runtime reads either alike.
    wasmtime-py 50's SharedMemory also hands the C API a pointer to its pointer as an import (a TypeError on every
    instantiation); _as_extern passes the pointer itself, as the C union expects."""

    def _as_extern(self):
        union = wasmtime._ffi.wasmtime_extern_union(sharedmemory=self.ptr())
        return wasmtime._ffi.wasmtime_extern_t(wasmtime._ffi.WASMTIME_EXTERN_SHAREDMEMORY, union)

    def data_len(self, store=None) -> int:
        return super().data_len()

    def data_ptr(self, store=None):
        return super().data_ptr()

    def grow(self, store, delta: int) -> int:
        return super().grow(delta)

    def read(self, store, start: int, stop: int) -> bytearray:
        return bytearray(ctypes.string_at(ctypes.addressof(self.data_ptr().contents) + start, stop - start))


class WasmInstance:
    """One instantiated module with a bump allocator above __heap_base, reset at every call (a
    kernel call holds no memory afterwards)."""

    def __init__(self, wasm: bytes):
        self.engine = wasmtime.Engine(_config())
        self.store = wasmtime.Store(self.engine)
        module = wasmtime.Module(self.engine, wasm)
        if [(item.module, item.name) for item in module.imports] != [("env", "memory")]:
            wanted = ", ".join(f"{item.module}.{item.name}" for item in module.imports)
            raise TargetError(f"a Tessel wasm module imports only env.memory; this one imports {wanted}")
        memory = module.imports[0].type
        self.memory_limits = {"initial_pages": memory.limits.min, "maximum_pages": memory.limits.max}
        if memory.is_shared:
            self.memory_limits["shared"] = True
            self.memory = _SharedMemory(self.engine, memory)
        else:
            self.memory = wasmtime.Memory(self.store, memory)
        self.module = module
        self.instance = wasmtime.Instance(self.store, module, [self.memory])
        self.exports = self.instance.exports(self.store)
        self.heap_base = _round_up(self.exports["__heap_base"].value(self.store), ALIGN)

    def reserve(self, sizes: list[int]) -> list[int]:
        offsets, end = [], self.heap_base
        for size in sizes:
            offsets.append(end)
            end = _round_up(end + max(size, 1), ALIGN)
        missing = end - self.memory.data_len(self.store)
        if missing > 0:
            self.memory.grow(self.store, -(-missing // PAGE_BYTES))
        return offsets

    def function(self, name: str, specs: list[ArgSpec]):
        entry = self.exports[name]

        def call(*arrays):
            check_args(name, specs, arrays)
            offsets = self.reserve([array.nbytes for array in arrays])
            base = ctypes.addressof(self.memory.data_ptr(self.store).contents)
            for offset, array in zip(offsets, arrays):
                ctypes.memmove(base + offset, array.ctypes.data, array.nbytes)
            entry(self.store, *offsets)
            base = ctypes.addressof(self.memory.data_ptr(self.store).contents)
            for offset, array in zip(offsets, arrays):
                ctypes.memmove(array.ctypes.data, base + offset, array.nbytes)

        return call


class WasmModel:
    """A whole model in one wasm module. Linear memory holds, from __heap_base, the params (copied in
    once, here), the arena, then one slot per input and output; each call copies the inputs in, runs
    the exported entry `run(inputs..., outputs..., params, arena)` on those offsets and copies the
    outputs out, unless the entry returns a failed call (an index out of range), which `calls` names."""

    def __init__(
        self,
        wasm: bytes,
        params: bytes,
        arena_bytes: int,
        inputs: list[ArgSpec],
        outputs: list[ArgSpec],
        entry: str = "run",
        calls: list[str] | None = None,
        binding: str | None = None,
        memory_limits: dict | None = None,
        threads: int = 1,
        size_count: int = 0,
    ):
        try:
            self.instance = WasmInstance(wasm)
        except wasmtime.WasmtimeError as error:
            reason = str(error).strip().splitlines()[0]
            raise BundleError(f"model.wasm is not a valid wasm module ({reason}); export the model again") from None
        if binding is not None:
            self._check_binding(binding, entry, len(inputs) + len(outputs) + 2 + bool(size_count), memory_limits)
        self.calls = calls or []
        workers = threads - 1 if self.instance.memory_limits.get("shared") else 0
        sizes = [
            len(params),
            arena_bytes,
            *(_nbytes(spec) for spec in [*inputs, *outputs]),
            *[WASM_STACK_BYTES] * workers,
            *([4 * size_count] if size_count else []),
        ]
        self.params_offset, self.arena_offset, *slots = self.instance.reserve(sizes)
        # a symbolic model's size values: the entry's last argument
        self.sizes_offset = slots.pop() if size_count else None
        self.input_offsets = slots[: len(inputs)]
        self.output_offsets = slots[len(inputs) : len(inputs) + len(outputs)]
        stacks = slots[len(inputs) + len(outputs) :]
        self.outputs = outputs
        self.entry = self.instance.exports[entry]
        ctypes.memmove(self._base() + self.params_offset, params, len(params))
        self.threads = 1 + len(stacks)
        # bundles built before their run entry woke the pool itself (wasm_thread_pool.c, tessel_pool_run) export this
        # for the host to call as a run starts, as tessel.js does; newer ones do not
        self.wake_pool = self.instance.exports.get("tessel_pool_wake") if stacks else None
        for stack in stacks:
            threading.Thread(target=_worker, args=(self.instance, stack + WASM_STACK_BYTES), daemon=True).start()
        self._await_workers(len(stacks))

    def _await_workers(self, count: int) -> None:
        registered = self.instance.exports.get("tessel_pool_workers")
        deadline = time.monotonic() + 10
        while count and registered(self.instance.store) < count:
            if time.monotonic() > deadline:
                raise TargetError(f"the wasm thread pool's {count} workers did not start within 10 s")
            time.sleep(0.001)

    def _check_binding(self, binding: str, entry: str, arguments: int, memory_limits: dict | None) -> None:
        """The module must carry `binding` (bundle.py's digest of the manifest it was generated for), import the
        memory the manifest says (`memory_limits`, what tessel.js creates) and export an entry taking the
        manifest's number of arguments and returning the failed call."""
        exports, store = self.instance.exports, self.instance.store
        if memory_limits != self.instance.memory_limits:
            raise BundleError(
                f"manifest.json's memory.wasm_import {memory_limits} differs from model.wasm's "
                f"{self.instance.memory_limits}; export the model again"
            )
        getter, run = exports.get(BINDING_SYMBOL), exports.get(entry)
        wanted = "export the model again"
        if not isinstance(getter, wasmtime.Func) or not isinstance(run, wasmtime.Func):
            raise BundleError(f"model.wasm is not a Tessel model module (no {BINDING_SYMBOL} or {entry}); {wanted}")
        kind = run.type(store)
        if len(kind.params) != arguments or [str(item) for item in kind.results] != ["i32"]:
            raise BundleError(f"model.wasm's {entry} does not take the manifest's {arguments} arguments; {wanted}")
        address = getter(store)
        memory = self.instance.memory
        if not isinstance(address, int) or not 0 <= address <= memory.data_len(store) - len(binding):
            raise BundleError(f"model.wasm's binding digest lies outside its memory; {wanted}")
        found = bytes(memory.read(store, address, address + len(binding)))
        if found != binding.encode():
            raise BundleError(
                "model.wasm was not generated for this manifest.json (its binding digest differs: the manifest or the "
                f"code was edited or swapped); {wanted}"
            )

    def _base(self) -> int:
        return ctypes.addressof(self.instance.memory.data_ptr(self.instance.store).contents)

    def run(self, inputs: list[np.ndarray], sizes: np.ndarray | None = None) -> list[np.ndarray]:
        """`sizes`: the int32 values of a symbolic model's sizes, the entry's last argument."""
        base = self._base()
        for offset, array in zip(self.input_offsets, inputs):
            ctypes.memmove(base + offset, array.ctypes.data, array.nbytes)
        extra = []
        if sizes is not None:
            ctypes.memmove(base + self.sizes_offset, sizes.ctypes.data, sizes.nbytes)
            extra = [self.sizes_offset]
        if self.wake_pool is not None:
            self.wake_pool(self.instance.store)
        status = self.entry(
            self.instance.store,
            *self.input_offsets,
            *self.output_offsets,
            self.params_offset,
            self.arena_offset,
            *extra,
        )
        check_status(status, self.calls)
        base = self._base()
        outputs = []
        for offset, spec in zip(self.output_offsets, self.outputs):
            array = np.empty(spec.shape, spec.dtype)
            ctypes.memmove(array.ctypes.data, base + offset, array.nbytes)
            outputs.append(array)
        return outputs

    def replay(self, inputs: list[np.ndarray], sizes: np.ndarray | None = None) -> WasmReplay:
        return WasmReplay(self, inputs, sizes)


class WasmReplay:
    """Kernel calls on offsets into a WasmModel's linear memory: the inputs are copied in first (Module.replay)."""

    def __init__(self, runtime: WasmModel, inputs: list[np.ndarray], sizes: np.ndarray | None = None):
        self.runtime = runtime
        base = runtime._base()
        for offset, array in zip(runtime.input_offsets, inputs):
            ctypes.memmove(base + offset, array.ctypes.data, array.nbytes)
        self.bases = {"params": runtime.params_offset, "arena": runtime.arena_offset}
        if sizes is not None:
            ctypes.memmove(base + runtime.sizes_offset, sizes.ctypes.data, sizes.nbytes)
            self.bases["sizes"] = runtime.sizes_offset
        self.bases.update({f"input_{position}": offset for position, offset in enumerate(runtime.input_offsets)})
        self.bases.update({f"output_{position}": offset for position, offset in enumerate(runtime.output_offsets)})

    def kernel(self, name: str, args: list) -> Callable[[], None]:
        # the call tune/measure.py times a candidate with, so a kernel's profile and its tuning times agree
        instance = self.runtime.instance
        return direct_call(instance, instance.exports[name], [self.bases[buffer] + offset for buffer, offset in args])

    def outputs(self) -> list[np.ndarray]:
        base = self.runtime._base()
        results = []
        for offset, spec in zip(self.runtime.output_offsets, self.runtime.outputs):
            array = np.empty(spec.shape, spec.dtype)
            ctypes.memmove(array.ctypes.data, base + offset, array.nbytes)
            results.append(array)
        return results


def direct_call(instance: WasmInstance, entry: wasmtime.Func, offsets: list[int]) -> Callable[[], None]:
    """A call of `entry` on its i32 `offsets` straight through wasmtime's C API, the arguments converted once: the
    Python binding's own call looks up the type and converts every argument each time, 30-50 us more per call here
    (0.62 against 0.59 ms for a 77 x 768 x 192 MatMul), and up to 120 us on a busy machine, which swamps a small
    kernel's time. Where the binding's internals are not the ones this knows, its public call is used."""
    try:
        from wasmtime import _ffi as ffi
        from wasmtime._func import enter_wasm

        results = (ffi.wasmtime_val_t * len(entry.type(instance.store).results))()
        arguments = (ffi.wasmtime_val_t * len(offsets))()
        for slot, offset in zip(arguments, offsets):
            slot.kind, slot.of.i32 = ffi.WASMTIME_I32.value, offset
        context, function = instance.store._context(), ctypes.byref(entry._func)
    except (ImportError, AttributeError):
        return lambda: entry(instance.store, *offsets)

    def call() -> None:
        with enter_wasm(instance.store) as trap:
            error = ffi.wasmtime_func_call(context, function, arguments, len(offsets), results, len(results), trap)
            if error:
                raise wasmtime.WasmtimeError._from_ptr(error)

    return call


def _worker(instance: WasmInstance, stack_top: int) -> None:
    """One pool worker for the life of the process (wasmtime cannot wake a thread waiting in memory.atomic.wait32 to
    end it): its own store and instance over the shared memory, its stack moved to its own region."""
    store = wasmtime.Store(instance.engine)
    exports = wasmtime.Instance(store, instance.module, [instance.memory]).exports(store)
    exports["__stack_pointer"].set_value(store, stack_top)
    exports["tessel_worker"](store)


def _nbytes(spec: ArgSpec) -> int:
    return int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
