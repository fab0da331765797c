"""The backends registry, a driver beside build.py: each target kind maps to the code generator, the packager (linker
and seal), the runtimes and the bundle's code file that turn its loop IR into something that runs. build.py, the bundle
checks, the CLI and the server read BACKENDS, so a new backend registers here and touches no driver."""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from compiler.bundle import BINDING_SYMBOL, BundleError, binding_digest, tensor_bytes, unsealed
from compiler.codegen.c_source import c_name
from compiler.codegen.cuda import generate_cuda
from compiler.codegen.llvm import compile_funcs
from compiler.codegen.opencl import generate_opencl
from compiler.codegen.wgsl import Layout, generate_wgsl, limits_used, model_shader
from compiler.errors import TargetError, TuningError
from compiler.link import link_shared, link_wasm
from compiler.memory_plan import align
from compiler.runtime import ArgSpec
from compiler.runtime.cuda import CudaModel, CudaProgram
from compiler.runtime.native import NativeLibrary, NativeModel, default_num_threads
from compiler.runtime.opencl import OpenCLModel, OpenCLProgram
from compiler.runtime.wasm import WasmInstance, WasmModel, direct_call, memory_import
from compiler.runtime.webgpu import WebGPUKernels, WebGPUModel
from compiler.target import Target
from compiler.tir.gpu import dispatch_list, lower_gpu, split_launches
from compiler.tir.nodes import PrimFunc
from compiler.tir.printer import format_func


@dataclass(frozen=True)
class KernelCode:
    """One kernel compiled on its own: the bytes its runtime loads and its generated text by kind ("ll", "asm"...);
    `compiled` is the code generator's own result, kept for whoever needs more (an object file)."""

    library: bytes
    sources: Mapping[str, str]
    compiled: object = None


@dataclass(frozen=True)
class ModelCode:
    """A whole model's code: the bundle's code file (build.py seals it), what the backend adds to the manifest (a GPU
    backend's dispatch list, wasm's memory limits), its generated text by kind and the code generator's own result."""

    code: bytes
    manifest: dict = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    compiled: object = None


@dataclass(frozen=True)
class ModelImage:
    """What a model runtime is built from: the manifest, the code file, params.bin, the inputs and outputs, each kernel
    call in words (for the error of a failed index check) and the binding digest the code must carry (None when the
    code was just generated in this process)."""

    manifest: dict
    code: bytes
    params: bytes
    inputs: list[ArgSpec]
    outputs: list[ArgSpec]
    calls: list[str]
    binding: str | None = None


# How a tuning runner calls one kernel over arrays placed once: (call(), read() -> its outputs' copies).
Binding = tuple[Callable[[], None], Callable[[], list[np.ndarray]]]


def _read_back(arrays: list[np.ndarray], outputs: int) -> Callable[[], list[np.ndarray]]:
    return lambda: [array.copy() for array in arrays[len(arrays) - outputs :]]


def _bind_native(library: bytes, name: str, arrays: list[np.ndarray], outputs: int, num_threads: int | None) -> Binding:
    """The kernel called through ctypes on the arrays' own memory."""
    loaded = NativeLibrary(library, default_num_threads() if num_threads is None else num_threads)
    entry = getattr(loaded.handle, name)
    entry.restype = None
    entry.argtypes = [ctypes.c_void_p] * len(arrays)
    pointers = [array.ctypes.data for array in arrays]

    def call() -> None:
        entry(*pointers)

    call.library = loaded  # the library stays mapped while the call lives
    return call, _read_back(arrays, outputs)


def _bind_wasm(library: bytes, name: str, arrays: list[np.ndarray], outputs: int, num_threads: int | None) -> Binding:
    """The arrays copied once into the instance's memory; each call runs on them there."""
    instance = WasmInstance(library)
    offsets = instance.reserve([array.nbytes for array in arrays])

    def base() -> int:
        return ctypes.addressof(instance.memory.data_ptr(instance.store).contents)

    for offset, array in zip(offsets, arrays):
        ctypes.memmove(base() + offset, array.ctypes.data, array.nbytes)
    call = direct_call(instance, instance.exports[name], offsets)

    def read() -> list[np.ndarray]:
        results = []
        for offset, array in list(zip(offsets, arrays))[len(arrays) - outputs :]:
            result = np.empty_like(array)
            ctypes.memmove(result.ctypes.data, base() + offset, array.nbytes)
            results.append(result)
        return results

    return call, read


@dataclass(frozen=True)
class Backend:
    """How one target kind is compiled and run.

    - `build_kernel(func, target)`: one PrimFunc as KernelCode; `kernel_runtime(library, target, num_threads)` loads
      it, giving an object whose `.function(name, specs)` is a callable on numpy arrays (None: cannot run here).
    - `build_model(kernels, run, manifest, target)`: every kernel and the `run` entry (a PrimFunc of KernelCalls)
      with the manifest so far (JSON-ready, every key but the backend's own) as ModelCode. A CPU backend compiles
      `run` into the code; a GPU one turns its calls into a dispatch list in the manifest.
    - `model_runtime(image, target, num_threads)`: an object with `run(inputs) -> outputs` and `replay(inputs)`
      (build.Module.replay's kernel-at-a-time calls), or None when the target cannot run here.
    - `code_file` names the code in a bundle, `seal` the style of the seal build.py appends and load_module checks
      (bundle.seal_code); `label` and `runs_in_browser` are what the server's page says of it.
    - `bind_arrays(library, name, arrays, outputs, num_threads)`: how a tuning runner calls one kernel over arrays
      placed once (`bind`); None goes through `kernel_runtime`, which copies the arrays in and out on every call,
      so a candidate's times include the transfers until the kind gets a binder of its own."""

    kind: str
    code_file: str
    seal: str
    build_kernel: Callable[[PrimFunc, Target], KernelCode]
    kernel_runtime: Callable[[bytes, Target, int | None], object]
    build_model: Callable[[list[PrimFunc], PrimFunc, dict, Target], ModelCode]
    model_runtime: Callable[[ModelImage, Target, int | None], object]
    label: str
    runs_in_browser: bool = False
    bind_arrays: Callable[[bytes, str, list[np.ndarray], int, int | None], Binding] | None = None

    def bind(
        self, library: bytes, name: str, specs, arrays: list[np.ndarray], outputs: int, target: Target, num_threads
    ) -> Binding:
        """(call(), read()) of kernel `name` in `library` over `arrays` (the last `outputs` of them its outputs)."""
        if target.kind == "llvm" and not target.can_run_here:
            raise TuningError(f"candidates for {target.triple} cannot run on this machine; tune on such a device")
        if self.bind_arrays is not None:
            return self.bind_arrays(library, name, arrays, outputs, num_threads)
        runtime = self.kernel_runtime(library, target, None)
        if runtime is None:
            raise TuningError(f"candidates for {target} cannot run on this machine; tune on such a device")
        function = runtime.function(name, list(specs))

        def call() -> None:
            function(*arrays)

        call.runtime = runtime
        return call, _read_back(arrays, outputs)


BACKENDS: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    """Add (or replace) the backend of `backend.kind`."""
    BACKENDS[backend.kind] = backend
    return backend


def backend_for(target: Target) -> Backend:
    kind = target.kind
    if kind not in BACKENDS:
        raise TargetError(f"target {kind!r} has no backend in this Tessel yet; choose one of {', '.join(BACKENDS)}")
    return BACKENDS[kind]


def code_files() -> dict[str, str]:
    """Target kind -> the bundle's code file name, for bundle.check_manifest."""
    return {kind: backend.code_file for kind, backend in BACKENDS.items()}


# ---- llvm and wasm: one LLVM module, linked into a shared library or a wasm module -----------------------------


class _LlvmSources(Mapping):
    """A compiled LLVM module's texts by kind: "ll", and "asm", emitted when first read (CompiledModule.asm)."""

    KINDS = ("ll", "asm")

    def __init__(self, compiled):
        self.compiled = compiled

    def __getitem__(self, kind: str) -> str:
        if kind not in self.KINDS:
            raise KeyError(kind)
        return getattr(self.compiled, kind)

    def __iter__(self):
        return iter(self.KINDS)

    def __len__(self) -> int:
        return len(self.KINDS)


def _link_shared(compiled, exports: list[str]) -> bytes:
    return link_shared(compiled.object, compiled.target)


def _link_wasm(compiled, exports: list[str]) -> bytes:
    # +atomics (a bundle's threads variant) links the wasm thread pool over a shared memory
    return link_wasm(compiled.object, exports, threads="atomics" in compiled.target.feature_set)


def _no_additions(library: bytes, manifest: dict) -> dict:
    return {}


def _wasm_memory(library: bytes, manifest: dict) -> dict:
    """The imported memory's limits, which only the linker knows and tessel.js needs before it instantiates."""
    return {"memory": {**manifest["memory"], "wasm_import": memory_import(library)}}


def _llvm_kernel(link, func: PrimFunc, target: Target) -> KernelCode:
    compiled = compile_funcs([func], target)
    return KernelCode(link(compiled, [func.name]), _LlvmSources(compiled), compiled)


def _llvm_model(link, additions, kernels: list[PrimFunc], run: PrimFunc, manifest: dict, target: Target) -> ModelCode:
    compiled = compile_funcs([*kernels, run], target, {BINDING_SYMBOL: binding_digest(manifest)})
    # Kernels are exported beside the entry so Module.profile can call them one at a time.
    library = link(compiled, [run.name, BINDING_SYMBOL, *(func.name for func in kernels)])
    return ModelCode(library, additions(library, manifest), _LlvmSources(compiled), compiled)


def _native_kernel_runtime(library: bytes, target: Target, num_threads: int | None):
    return NativeLibrary(library, num_threads) if target.can_run_here else None


def _native_model_runtime(image: ModelImage, target: Target, num_threads: int | None):
    if not target.can_run_here:
        return None
    arena, entry = image.manifest["memory"]["arena_bytes"], image.manifest["entry"]["name"]
    return NativeModel(image.code, image.params, arena, image.outputs, entry, num_threads, image.calls, image.binding)


def _wasm_model_runtime(image: ModelImage, target: Target, num_threads: int | None):
    memory, entry = image.manifest["memory"], image.manifest["entry"]["name"]
    return WasmModel(
        image.code,
        image.params,
        memory["arena_bytes"],
        image.inputs,
        image.outputs,
        entry,
        image.calls,
        image.binding,
        memory.get("wasm_import"),
        num_threads or 1,
        len(image.manifest.get("sizes", ())),
    )


register(
    Backend(
        kind="wasm",
        code_file="model.wasm",
        seal="wasm",
        build_kernel=partial(_llvm_kernel, _link_wasm),
        kernel_runtime=lambda library, target, num_threads: WasmInstance(library),
        build_model=partial(_llvm_model, _link_wasm, _wasm_memory),
        model_runtime=_wasm_model_runtime,
        label="WebAssembly + SIMD: runs in this browser",
        runs_in_browser=True,
        bind_arrays=_bind_wasm,
    )
)
register(
    Backend(
        kind="llvm",
        code_file="model.so",
        seal="elf",
        build_kernel=partial(_llvm_kernel, _link_shared),
        kernel_runtime=_native_kernel_runtime,
        build_model=partial(_llvm_model, _link_shared, _no_additions),
        model_runtime=_native_model_runtime,
        label="Native library (.so) for this server's CPU",
        bind_arrays=_bind_native,
    )
)


# ---- opencl and cuda: C-dialect kernels (codegen/c_source.py), one source per bundle, run from a dispatch list ---

# A GPU source names the binding digest of its manifest on its first line, as the CPU code embeds it in a symbol.
_DIGEST_LINE = "// " + BINDING_SYMBOL + " "


@dataclass(frozen=True)
class _CDialect:
    """What differs between the C-dialect GPU backends: the printer, the source kind and the runtime classes."""

    generate: Callable[[list[PrimFunc]], str]
    source_kind: str
    program: Callable[[str, dict, Target], object]
    model: Callable[[str, ModelImage, Target], object]


def _gpu_launches(func: PrimFunc, target: Target) -> list[PrimFunc]:
    """`func`'s launches (tir/gpu.py split_launches), each lowered for the device."""
    return [lower_gpu(part, target) for part in split_launches(func)]


def _gpu_kernel(dialect: _CDialect, func: PrimFunc, target: Target) -> KernelCode:
    """A lone kernel: its library is JSON of its source, its launches and their workspace, what the kernel runtime
    needs."""
    parts = [func] if "launch" in func.attrs else _gpu_launches(func, target)
    source = dialect.generate(parts)
    workspace = [buffer.size * np.dtype(buffer.dtype).itemsize for buffer in parts[0].params[len(func.params) :]]
    # the symbol the printer gave each part (a reserved word such as "kernel" is renamed)
    launches = [{"kernel": c_name(part.name), **part.attrs["launch"]} for part in parts]
    library = json.dumps({"source": source, "kernels": {func.name: {"parts": launches, "workspace": workspace}}})
    return KernelCode(library.encode(), {dialect.source_kind: source, "gpu": "\n".join(map(format_func, parts))}, parts)


def _gpu_kernel_runtime(dialect: _CDialect, library: bytes, target: Target, num_threads: int | None):
    code = json.loads(library)
    return dialect.program(code["source"], code["kernels"], target)


def _gpu_plan(kernels: list[PrimFunc], run: PrimFunc, manifest: dict, target: Target):
    """The functions the dispatches run (every kernel's launches lowered for the device, the same code once:
    tir/gpu.py share_launches), the manifest's dispatch list and its memory section: the workspace of kernels split
    into several launches goes after the memory plan's arena."""
    launches = {func.name: _gpu_launches(func, target) for func in kernels}
    memory = manifest["memory"]
    workspace_offset = align(memory["arena_bytes"], memory["alignment"])
    dispatches, workspace, functions = dispatch_list(run, launches, workspace_offset)
    if workspace:
        memory = {**memory, "arena_bytes": workspace_offset + workspace, "workspace_bytes": workspace}
    return functions, dispatches, memory


def _gpu_model(dialect: _CDialect, kernels: list[PrimFunc], run: PrimFunc, manifest: dict, target: Target) -> ModelCode:
    """Every kernel's launches in one source; the run entry becomes the manifest's dispatch list."""
    lowered, dispatches, memory = _gpu_plan(kernels, run, manifest, target)
    additions = {"dispatches": dispatches, "memory": memory}
    source = f"{_DIGEST_LINE}{binding_digest({**manifest, **additions})}\n" + dialect.generate(lowered)
    return ModelCode(source.encode(), additions, {dialect.source_kind: source}, lowered)


def _gpu_source(image: ModelImage) -> str:
    """The source of a bundle's code file, after checking that it was generated for this manifest."""
    source = unsealed("text", image.code).decode()
    first = source.split("\n", 1)[0]
    if image.binding is not None and first != _DIGEST_LINE + image.binding:
        raise BundleError(
            f"{image.manifest['code']} was not generated for this manifest.json (its binding digest differs: the "
            "manifest or the code was edited or swapped); export the model again"
        )
    return source


def _gpu_model_runtime(dialect: _CDialect, image: ModelImage, target: Target, num_threads: int | None):
    return dialect.model(_gpu_source(image), image, target)


def _register_c_gpu(kind: str, code_file: str, dialect: _CDialect, label: str) -> None:
    register(
        Backend(
            kind=kind,
            code_file=code_file,
            seal="text",
            build_kernel=partial(_gpu_kernel, dialect),
            kernel_runtime=partial(_gpu_kernel_runtime, dialect),
            build_model=partial(_gpu_model, dialect),
            model_runtime=partial(_gpu_model_runtime, dialect),
            label=label,
        )
    )


def _opencl_model(source: str, image: ModelImage, target: Target) -> OpenCLModel:
    arena = image.manifest["memory"]["arena_bytes"]
    return OpenCLModel(source, image.manifest["dispatches"], image.params, arena, image.inputs, image.outputs)


def _cuda_model(source: str, image: ModelImage, target: Target) -> CudaModel:
    arena = image.manifest["memory"]["arena_bytes"]
    dispatches = image.manifest["dispatches"]
    return CudaModel(source, dispatches, image.params, arena, image.inputs, image.outputs, target.cpu)


_register_c_gpu(
    "opencl",
    "kernels.cl",
    _CDialect(generate_opencl, "cl", lambda source, launches, target: OpenCLProgram(source, launches), _opencl_model),
    "OpenCL C 1.2 (kernels.cl) for this server's OpenCL device",
)
_register_c_gpu(
    "cuda",
    "kernels.cu",
    _CDialect(
        generate_cuda, "cu", lambda source, launches, target: CudaProgram(source, launches, target.cpu), _cuda_model
    ),
    "CUDA C++ (kernels.cu, compiled by NVRTC) for an NVIDIA GPU",
)


# ---- webgpu: one WGSL module, run through wgpu-py here and by tessel.js in browsers -----------------------------


def _webgpu_kernel(func: PrimFunc, target: Target) -> KernelCode:
    """A lone kernel: its library is JSON of the WGSL, an entry point per launch, and the launches' order and
    workspace (each buffer's element count and dtype), what WebGPUKernels needs."""
    parts = [func] if "launch" in func.attrs else _gpu_launches(func, target)
    module = generate_wgsl([(part, part.name, Layout.for_kernel(part, target.device.max_buffers)) for part in parts])
    workspace = [{"size": buffer.size, "dtype": buffer.dtype} for buffer in parts[0].params[len(func.params) :]]
    kernels = {func.name: {"parts": [part.name for part in parts], "workspace": workspace}}
    library = {"code": module.code, "entries": [entry.as_json() for entry in module.entries], "kernels": kernels}
    return KernelCode(
        json.dumps(library).encode(), {"wgsl": module.code, "gpu": "\n".join(map(format_func, parts))}, parts
    )


def _webgpu_kernel_runtime(library: bytes, target: Target, num_threads: int | None):
    compiled = json.loads(library)
    return WebGPUKernels(compiled["code"], compiled["entries"], compiled.get("kernels", {}))


def _webgpu_model(kernels: list[PrimFunc], run: PrimFunc, manifest: dict, target: Target) -> ModelCode:
    """kernels.wgsl, and the manifest's dispatch list completed for WebGPU with its `webgpu` section (entry points,
    buffers, uniform size, features, limits used: docs/gpu.md describes every field for tessel.js)."""
    lowered, planned, memory = _gpu_plan(kernels, run, manifest, target)
    planned, memory, slices = _io_in_arena(planned, manifest, memory)
    module, dispatches = model_shader(lowered, planned, target.device.offset_alignment)
    buffers = [
        {"region": "params", "index": 0, "bytes": manifest["params"]["bytes"]},
        {"region": "arena", "index": 0, "bytes": memory["arena_bytes"]},
        *slices,
    ]
    sizes = {entry.name: entry.offsets_bytes for entry in module.entries}
    uniform = max((dispatch["uniform_offset"] + sizes[dispatch["entry"]] for dispatch in dispatches), default=4)
    webgpu = {
        "entries": [entry.as_json() for entry in module.entries],
        "buffers": buffers,
        "uniform_bytes": uniform,
        "features": ["shader-f16"] if module.uses_f16 else [],
        "limits": limits_used(module, [buffer["bytes"] for buffer in buffers]),
    }
    additions = json.loads(json.dumps({"dispatches": dispatches, "webgpu": webgpu, "memory": memory}))
    source = f"{_DIGEST_LINE}{binding_digest({**manifest, **additions})}\n{module.code}"
    return ModelCode(source.encode(), additions, {"wgsl": source}, lowered)


def _io_in_arena(dispatches: list[dict], manifest: dict, memory: dict) -> tuple[list[dict], dict, list[dict]]:
    """The model's inputs and outputs placed in the arena, after what it holds: every dispatch then binds only params
    and the arena, so a kernel that one call runs on the model's input (or output) and another on the arena keeps one
    entry point, and one pipeline, where model_shader would make an entry per pattern of regions (odd_transformer's
    and bert_tiny's first layers, 88-112 ms of pipeline creation each on SwiftShader; docs/gpu.md). (dispatches with
    those bindings moved, the memory section with the larger arena, webgpu.buffers' entries of the inputs and outputs,
    each with its `arena_offset`, where a runtime writes the input or reads the output.)"""
    offset, slices, places = memory["arena_bytes"], [], {}
    for region, specs in (("input", manifest["inputs"]), ("output", manifest["outputs"])):
        for position, spec in enumerate(specs):
            offset = align(offset, memory["alignment"])
            size = tensor_bytes({**spec, "dtype": spec.get("device_dtype", spec["dtype"])})
            places[region, position] = offset
            slices.append({"region": region, "index": position, "bytes": size, "arena_offset": offset})
            offset += max(4, -(-size // 4) * 4)  # a write or copy is whole words, and never empty
    moved = []
    for dispatch in dispatches:
        bindings = [
            {**binding, "region": "arena", "index": 0, "offset": places[key] + binding["offset"]}
            if (key := (binding["region"], binding["index"])) in places
            else binding
            for binding in dispatch["bindings"]
        ]
        moved.append({**dispatch, "bindings": bindings})
    return moved, {**memory, "arena_bytes": align(offset, memory["alignment"])}, slices


def _webgpu_model_runtime(image: ModelImage, target: Target, num_threads: int | None):
    manifest = image.manifest
    return WebGPUModel(
        _gpu_source(image),
        manifest["webgpu"]["entries"],
        manifest["dispatches"],
        image.params,
        manifest["memory"]["arena_bytes"],
        image.inputs,
        image.outputs,
        image.calls,
        [item.get("device_dtype", item["dtype"]) for item in [*manifest["inputs"], *manifest["outputs"]]],
        manifest["webgpu"]["buffers"],
    )


register(
    Backend(
        kind="webgpu",
        code_file="kernels.wgsl",
        seal="text",
        build_kernel=_webgpu_kernel,
        kernel_runtime=_webgpu_kernel_runtime,
        build_model=_webgpu_model,
        model_runtime=_webgpu_model_runtime,
        label="WebGPU (WGSL): runs on this browser's GPU",
        runs_in_browser=True,
    )
)
