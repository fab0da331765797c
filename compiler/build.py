"""The driver: schedule → lower (tir) → the target's backend (backends.py: codegen, packaging, runtime). `build`
gives one callable Kernel; `compile_model` gives a whole-model Module: every fused group's kernel plus a `run` entry
that calls them over a static memory plan, exported as a bundle (bundle.py) and read back by `load_module`.
docs/modules.md describes the run entry's ABI and the bundle."""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from compiler.backends import KernelCode, ModelCode, ModelImage, backend_for, code_files
from compiler.bundle import (
    FORMAT_VERSION,
    PARAMS_FILE,
    RUNTIME_VERSION,
    WASM_FEATURES,
    BundleError,
    SymbolicSizes,
    binding_digest,
    check_manifest,
    check_seal,
    read_bundle,
    seal_code,
    variant_file,
    write_bundle,
)
from compiler.errors import ModelError, ShapeError, TargetError, TesselError
from compiler.frontend.onnx import external_data_files, load_onnx
from compiler.generate import generate as generate_tokens
from compiler.generate import stepper_for
from compiler.graph.ir import Graph, Node
from compiler.graph.sym import symbols_of
from compiler.link import WASM_STACK_BYTES
from compiler.memory_plan import ALIGNMENT, Lifetime, align, plan_memory
from compiler.passes.half_weights import half_weights
from compiler.passes.pipeline import optimize
from compiler.runtime import ArgSpec
from compiler.target import SIZE_LAYOUT_MULTIPLE, Target
from compiler.tir.lower import SIZES_ARGUMENT, lower
from compiler.tir.nodes import Buffer, KernelCall, PrimFunc, Seq
from compiler.tir.printer import format_func
from compiler.tune.records import load_records
from compiler.tune.task import canonical, lower_node, workload
from compiler.version import COMPILER_VERSION


class Kernel:
    """A compiled kernel: call it on numpy arrays (outputs written in place), read its code with
    source(), write the library with export_library()."""

    def __init__(self, func: PrimFunc, target: Target, code: KernelCode, runtime):
        self.func = func
        self.target = target
        self.compiled = code.compiled
        self.library = code.library
        self.sources = code.sources
        self.runtime = runtime
        self.specs = [ArgSpec(buffer.name, tuple(buffer.shape), buffer.dtype) for buffer in func.params]
        self.entry = runtime.function(func.name, self.specs) if runtime is not None else None

    @property
    def name(self) -> str:
        return self.func.name

    def __call__(self, *arrays) -> None:
        if self.entry is None:
            raise TargetError(
                f"kernel {self.name!r} was cross-compiled for {self.target.triple} and cannot run on this machine; "
                "use export_library(path) and run it on such a device (or under qemu-user)"
            )
        self.entry(*arrays)

    @property
    def num_threads(self) -> int:
        """Threads for parallel loops (0: every usable core, 1: no thread pool); native host kernels only."""
        return getattr(self.runtime, "num_threads", 1)

    @num_threads.setter
    def num_threads(self, count: int) -> None:
        if hasattr(self.runtime, "num_threads"):
            self.runtime.num_threads = count

    def source(self, kind: str = "ll") -> str:
        if kind == "tir":
            return format_func(self.func)
        return _source(self.sources, kind, self.target)

    def export_library(self, path: str | Path) -> Path:
        """Write the loadable code (.so for llvm targets, .wasm for wasm) to `path`."""
        path = Path(path)
        path.write_bytes(self.library)
        return path


def build_func(func: PrimFunc, target: Target | str = "llvm", num_threads: int | None = None) -> Kernel:
    """Compile one PrimFunc (from lower() or built by hand) into a Kernel."""
    target = Target.parse(target)
    backend = backend_for(target)
    code = backend.build_kernel(func, target)
    return Kernel(func, target, code, backend.kernel_runtime(code.library, target, num_threads))


def _source(sources, kind: str, target: Target) -> str:
    """The generated text of `kind` from a backend's sources, or one error naming the kinds there are."""
    if kind not in sources:
        *others, last = ["tir", *sources]
        kinds = f"{', '.join(others)} or {last}"
        raise TargetError(f"unknown source kind {kind!r} for target {target}; choose {kinds}")
    return sources[kind]


def build(
    schedule, args, target: Target | str = "llvm", name: str = "kernel", num_threads: int | None = None
) -> Kernel:
    """Lower a TE schedule over `args` (the kernel's arrays, in call order) and compile it."""
    return build_func(lower(schedule, list(args), name), target, num_threads)


# ---- whole models ------------------------------------------------------------------------------------------

ENTRY = "run"
Progress = Callable[[str, float], None]


# What each wasm variant's feature adds to the target (bundle.WASM_FEATURES).
WASM_FEATURE_ATTRIBUTES = {"threads": "+atomics,+bulk-memory", "relaxed-simd": "+relaxed-simd"}
# Every wasm variant beside the plain code: what the server ships, so tessel.js can run the fastest one an engine has.
EVERY_WASM_VARIANT = ("threads", "relaxed-simd", "threads+relaxed-simd")


def _wasm_variants(target: Target, variants) -> list[dict]:
    """The manifest's `variants` for the requested ones, each a feature or features joined by "+" ("threads",
    "relaxed-simd", "threads+relaxed-simd"); each entry gets its memory import once linked. A threaded variant says
    how large a stack each worker needs (the linker gives the calling thread the same)."""
    if variants and target.kind != "wasm":
        raise TargetError(f"wasm_variants apply to the wasm target, not {target}; drop them or compile for wasm")
    entries = []
    for variant in variants:
        features = variant.split("+")
        if not set(features) <= set(WASM_FEATURES):
            raise TargetError(
                f"unknown wasm variant {variant!r}; use {' or '.join(WASM_FEATURES)}, or both joined by '+'"
            )
        features = [feature for feature in WASM_FEATURES if feature in features]
        entry = {"code": variant_file(features), "features": features}
        if "threads" in features:
            entry["stack_bytes"] = WASM_STACK_BYTES
        if entry not in entries:
            entries.append(entry)
    return entries


# How compile_model(weights=...) stores dense weights: "fp32" keeps the model's params as they are; "fp16" stores each
# float32 weight of a packed dense kernel as float16, widened as the kernel reads it (passes/half_weights.py).
WEIGHT_FORMATS = ("fp32", "fp16")


def check_weights(weights: str, target: Target) -> None:
    """One error for a `weights` that WEIGHT_FORMATS lacks, or that `target` cannot store: float16 is read narrow only
    by the CPU family's packed dense kernels; a GPU target's kernels read float32 weights."""
    if weights not in WEIGHT_FORMATS:
        raise TesselError(f"unknown weights format {weights!r}; use {' or '.join(WEIGHT_FORMATS)}")
    if weights != "fp32" and target.family != "cpu":
        raise TargetError(
            f"weights {weights} applies to the CPU targets (llvm, wasm), whose dense kernels read float16 weights; "
            f"{target.kind} kernels read float32 weights: drop it or compile for llvm or wasm"
        )


def stored_weights(graph: Graph, target: Target, weights: str) -> Graph:
    """`graph` with its dense weights stored as `weights` asks (WEIGHT_FORMATS) for `target` (check_weights)."""
    check_weights(weights, target)
    return half_weights(graph) if weights == "fp16" else graph


def _silent(step: str, fraction: float) -> None:
    return None


def _model_source(model, input_shapes, dims=None) -> tuple[Graph, bytes]:
    """The model as a Graph, and the bytes that identify it in the bundle's content hash."""
    if isinstance(model, Graph):
        if input_shapes or dims:
            raise ShapeError("input_shapes and dims apply to ONNX models; an imported Graph already has its shapes")
        params = b"".join(array.tobytes() for array in model.params.values())
        return model, str(model).encode() + hashlib.sha256(params).digest()
    if isinstance(model, onnx.ModelProto):
        data = model.SerializeToString()
    elif isinstance(model, bytes):
        data = model
    elif isinstance(model, str | Path):
        path = Path(model)
        if not path.is_file():
            raise ModelError(f"cannot read model {path}: no such file; give the path of an .onnx model")
        # from the path, so that weights kept in data files beside the model load (and count in the identity)
        data = path.read_bytes()
        for data_file in external_data_files(path):
            with open(data_file, "rb") as file:
                data += hashlib.file_digest(file, "sha256").digest()
        return load_onnx(path, input_shapes=input_shapes, dims=dims), data
    else:
        raise ModelError(f"compile_model takes a path, ONNX bytes, a ModelProto or a Graph, not {type(model).__name__}")
    return load_onnx(data, input_shapes=input_shapes, dims=dims), data


def group_key(node: Node) -> str:
    """What decides a fused group's kernel: its workload (members' ops, attrs and wiring and every type); groups with
    equal keys (repeated blocks) share one kernel."""
    return hashlib.sha256(canonical(workload(node)).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class _Place:
    """Where a value lives at run time: `region` is input, output, params or arena."""

    region: str
    index: int
    offset: int = 0


def _spec(value) -> ArgSpec:
    return ArgSpec(value.name, tuple(value.type.shape), value.type.dtype)


def _spec_json(spec: ArgSpec) -> dict:
    """A tensor's manifest entry; a symbolic dimension is its expression's text ("seq", "4*seq+past")."""
    return {"name": spec.name, "shape": [d if isinstance(d, int) else str(d) for d in spec.shape], "dtype": spec.dtype}


def model_sizes(graph: Graph) -> dict[str, tuple[int, int]]:
    """The model's symbolic sizes (its inputs' kept dim_params) with their ranges, in the order of the kernels' and
    the run entry's sizes argument: sorted by name."""
    found: dict[str, tuple[int, int]] = {}
    for value in graph.inputs:
        found.update(symbols_of(value.type.shape))
    return dict(sorted(found.items()))


def _host_json(spec: ArgSpec, model_value) -> dict:
    """A model input's or output's manifest entry: the model's dtype, and `device_dtype` where the pipeline stores it
    narrower on the device (passes/narrow_int64.py), for the runtime to convert."""
    if model_value.type.dtype == spec.dtype:
        return _spec_json(spec)
    return {**_spec_json(spec), "dtype": model_value.type.dtype, "device_dtype": spec.dtype}


def compile_model(
    model,
    target: Target | str = "wasm",
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    tuning_records: str | Path | None = None,
    num_threads: int | None = None,
    progress: Progress | None = None,
    wasm_variants: tuple[str, ...] = (),
    weights: str = "fp32",
    dims: dict[str, tuple[int, int]] | None = None,
) -> Module:
    """Compile a whole model (a path, ONNX bytes, a ModelProto or a Graph) ahead of time into a Module:
    one kernel per distinct fused group, a static memory plan and one `run` entry calling them in order.
    `wasm_variants` adds code built with more engine features beside the plain wasm (_wasm_variants); `weights`
    "fp16" stores the dense weights as float16 (stored_weights). `dims` keeps named symbolic dimensions of the inputs
    symbolic, each in an inclusive range ({"seq": (1, 2048)}): one bundle then runs every size in the range, its
    tensors laid out for the largest (docs/architecture.md, "Symbolic sizes")."""
    progress = progress or _silent
    target = Target.parse(target)
    backend = backend_for(target)
    variants = _wasm_variants(target, wasm_variants)
    check_weights(weights, target)
    progress("loading the model", 0.0)
    graph, model_bytes = _model_source(model, input_shapes, dims)
    sizes = model_sizes(graph)
    if sizes and target.family != "cpu":
        raise TargetError(
            f"the model keeps the symbolic sizes {', '.join(sizes)}, which compile for CPU targets (llvm, wasm) so far; "
            f"fix them for {target.kind} with input_shapes (--input-shape)"
        )
    progress("optimizing the graph", 0.05)
    fused = optimize(stored_weights(graph, target, weights), fuse=True, target=target)
    _check_indexable(fused)
    records = load_records(tuning_records) if tuning_records is not None else {}

    parts = _concatenated_in_place(fused)
    kept = [node for node in fused.nodes if node.outputs[0] not in parts.values()]
    fused = Graph(fused.inputs, fused.outputs, kept, fused.params, fused.name)
    kernels: dict[str, PrimFunc] = {}
    kernel_entries: dict[str, dict] = {}
    kernel_of: list[str] = []
    for step, node in enumerate(fused.nodes):
        key = group_key(node)
        if key not in kernels:
            progress(f"lowering {node.name}", 0.1 + 0.5 * step / max(1, len(fused.nodes)))
            name = f"kernel_{len(kernels)}"
            kernels[key], cfg = lower_node(node, target, records, name, list(sizes))
            ops = [member.op for member in node.attrs["body"].nodes]
            kernel_entries[key] = {"name": name, "ops": ops, "groups": [], "config": cfg.values or None}
        kernel_of.append(kernels[key].name)
        kernel_entries[key]["groups"].append(node.name)

    places, params, params_layout, plan, output_sources = _lay_out(fused, parts)
    _check_addressable(fused, target, plan.arena_bytes, len(params))
    sized = {func.name for func in kernels.values() if func.params and func.params[-1].name == SIZES_ARGUMENT}
    run = _run_func(fused, kernel_of, places, bool(sizes), sized)
    options = {
        "input_shapes": {name: list(shape) for name, shape in sorted((input_shapes or {}).items())},
        "tuning_records": _records_digest(kernel_entries),
    }
    if sizes:  # absent for static models, so their bundles (and ids) stay as they were
        options["dims"] = {name: list(bounds) for name, bounds in sizes.items()}
    if variants:
        options["wasm_variants"] = [variant["code"] for variant in variants]
    if weights != "fp32":  # absent by default, so the bundles (and ids) of float32 compiles stay as they were
        options["weights"] = weights
    identity = hashlib.sha256()
    for part in (
        model_bytes,
        str(target).encode(),
        json.dumps(options, sort_keys=True).encode(),
        COMPILER_VERSION.encode(),
        RUNTIME_VERSION.encode(),
    ):
        identity.update(hashlib.sha256(part).digest())
    inputs, outputs = [_spec(value) for value in fused.inputs], [_spec(value) for value in fused.outputs]
    manifest = {
        "format_version": FORMAT_VERSION,
        "content_hash": identity.hexdigest(),
        "compiler_version": COMPILER_VERSION,
        "runtime_version": RUNTIME_VERSION,
        "target": str(target),
        "triple": target.triple,
        "code": backend.code_file,
        "entry": {
            "name": ENTRY,
            "arguments": ["inputs...", "outputs...", "params", "arena", *([SIZES_ARGUMENT] if sizes else [])],
        },
        **(
            {
                "sizes": [{"name": name, "min": low, "max": high} for name, (low, high) in sizes.items()],
                # a symbolic dim is laid out for its largest value rounded up to this (target.size_capacity)
                "size_alignment": SIZE_LAYOUT_MULTIPLE,
            }
            if sizes
            else {}
        ),
        "inputs": [_host_json(spec, value) for spec, value in zip(inputs, graph.inputs)],
        "outputs": [
            {**_host_json(spec, value), "source": source}
            for spec, value, source in zip(outputs, graph.outputs, output_sources)
        ],
        "kernels": list(kernel_entries.values()),
        "calls": [
            {
                "kernel": name,
                "group": node.name,
                "pattern": node.attrs.get("pattern", ""),
                "args": [[buffer.name, offset] for buffer, offset in call.args],
            }
            for name, node, call in zip(kernel_of, fused.nodes, run.body.stmts)
        ],
        "memory": {"arena_bytes": plan.arena_bytes, "intermediate_bytes": plan.total_bytes, "alignment": ALIGNMENT},
        "params": {"file": PARAMS_FILE, "bytes": len(params), "layout": params_layout},
        "options": options,
        **({"variants": variants} if variants else {}),
    }
    # JSON round trip first: the digest is of the manifest as a loader will read it back
    manifest = json.loads(json.dumps(manifest))
    progress(f"generating code for {len(kernels)} kernels and linking it ({backend.code_file})", 0.6)
    code = backend.build_model(list(kernels.values()), run, manifest, target)
    # each variant is built from the same manifest (its binding digest leaves the variants' memory out) and adds only
    # its own memory import; each takes about as long as the plain code, so each gets an equal share of the progress
    variant_code = {}
    share = 0.4 / (1 + len(variants))
    for position, variant in enumerate(variants, 1):
        progress(f"generating the {'+'.join(variant['features'])} variant", 0.6 + share * position)
        attributes = ",".join(WASM_FEATURE_ATTRIBUTES[feature] for feature in variant["features"])
        built = backend.build_model(list(kernels.values()), run, manifest, target.with_features(attributes))
        variant_code[variant["code"]] = seal_code(backend.seal, built.code)
        variant["wasm_import"] = built.manifest["memory"]["wasm_import"]
    manifest = json.loads(json.dumps({**manifest, **code.manifest, **({"variants": variants} if variants else {})}))
    progress("done", 1.0)
    library = seal_code(backend.seal, code.code)
    funcs = [*kernels.values(), run]
    return Module(manifest, library, params, num_threads, code, funcs, target=target, variants=variant_code)


def _records_digest(kernel_entries: dict[str, dict]) -> str | None:
    """What the bundle's identity takes of the tuning records: the configs they gave its kernels (group key -> knob
    values), so records of other models or other configs of a task do not change it; None when none applied."""
    applied = {key: entry["config"] for key, entry in kernel_entries.items() if entry["config"] is not None}
    return hashlib.sha256(json.dumps(applied, sort_keys=True).encode()).hexdigest() if applied else None


# Loop variables and buffer offsets in generated kernels are 32-bit integers on every target.
INDEX_LIMIT = (1 << 31) - 1


def _check_indexable(graph: Graph) -> None:
    """Refuse a tensor with more elements than a kernel's 32-bit index reaches, before lowering anything."""
    values = list(graph.values())
    for node in graph.nodes:
        if "body" in node.attrs:
            values += node.attrs["body"].values()
    for value in values:
        elements = math.prod(value.type.max_shape)  # a symbolic tensor's as it is laid out, at its largest
        if elements > INDEX_LIMIT:
            raise ShapeError(
                f"tensor {value.name!r} ({value.type}) has {elements:,} elements; Tessel's kernels index "
                f"with 32-bit integers, so a tensor holds at most {INDEX_LIMIT:,}: compile with smaller input shapes "
                "(or narrower --dim ranges)"
            )


def _check_addressable(graph: Graph, target: Target, arena_bytes: int, params_bytes: int) -> None:
    """Refuse a model whose memory (arena, params, inputs and outputs) exceeds what the target's pointers address."""
    limit = 1 << (8 * target.pointer_bytes)
    io_bytes = sum(value.type.nbytes for value in dict.fromkeys([*graph.inputs, *graph.outputs]))
    total = arena_bytes + params_bytes + io_bytes
    if total >= limit:
        raise ShapeError(
            f"the model needs {total:,} bytes of memory ({arena_bytes:,} arena, {params_bytes:,} params, "
            f"{io_bytes:,} inputs and outputs), but {target.arch} addresses {limit:,}: compile it with smaller "
            "input shapes, or for a 64-bit target"
        )


def _concatenated_in_place(graph: Graph) -> dict:
    """The Concats that need no kernel: value -> the Concat output it is a slab of. A group that is one Concat
    along an axis with only size-1 axes before it (channels of a batch of 1, NCHW or blocked) lays its parts end
    to end, so the kernels that make the parts can write them straight into its buffer. Each part must be an
    intermediate made by a kernel and a part of one such Concat only; the Concat's output an intermediate too."""
    made = {value for node in graph.nodes for value in node.outputs}
    outputs = set(graph.outputs)
    parts: dict = {}
    for node in graph.nodes:
        body = node.attrs.get("body")
        if body is None or [member.op for member in body.nodes] != ["Concat"] or len(node.outputs) != 1:
            continue
        (concat,) = body.nodes
        (output,) = node.outputs
        axis = int(concat.attrs["axis"]) % len(output.type.shape)
        sources = [node.inputs[body.inputs.index(value)] for value in concat.inputs]
        unique = len(set(sources)) == len(sources)
        if not unique or math.prod(output.type.shape[:axis]) != 1 or output in outputs or output in parts:
            continue
        if not output.type.static:
            continue  # parts of symbolic sizes lie at their largest shapes' offsets, not end to end
        if all(value in made and value not in outputs and value not in parts for value in sources):
            parts.update(dict.fromkeys(sources, output))
    # a Concat whose output is a part of another keeps its kernel (it writes into the outer one's buffer)
    return {value: whole for value, whole in parts.items() if whole not in parts}


def _lay_out(graph: Graph, parts: dict | None = None):
    """Places for every value the kernels touch: graph inputs and outputs are the caller's arrays, params
    sit at 64-byte-aligned offsets of params.bin, intermediates in the arena of a static memory plan. A part of
    a Concat done in place (`parts`: value -> the Concat output) lives inside the output's buffer, which is alive
    from its first part's kernel to its last reader.

    An output that no kernel writes (it is an input, a param, or a repeat of another output) is copied on
    the host; `output_sources` says from where."""
    places: dict = {value: _Place("input", position) for position, value in enumerate(graph.inputs)}
    output_sources: list[dict | None] = []
    for position, value in enumerate(graph.outputs):
        if value in places:
            source = places[value]
            output_sources.append({"region": source.region, "index": source.index})
        elif value in graph.params:
            output_sources.append({"region": "params", "name": value.name})
        else:
            places[value] = _Place("output", position)
            output_sources.append(None)
    used = [value for node in graph.nodes for value in node.inputs if value in graph.params]
    used += [value for value in graph.outputs if value in graph.params]
    chunks, layout, offset = [], [], 0
    for value in dict.fromkeys(used):
        array = np.ascontiguousarray(graph.params[value])
        places[value] = _Place("params", 0, offset)
        layout.append({**_spec_json(_spec(value)), "offset": offset, "nbytes": array.nbytes})
        padded = align(array.nbytes)
        chunks.append(array.tobytes() + bytes(padded - array.nbytes))
        offset += padded
    parts = parts or {}
    lifetimes: dict = {}
    for step, node in enumerate(graph.nodes):
        for value in node.inputs:
            value = parts.get(value, value)
            if value in lifetimes:
                lifetimes[value] = (lifetimes[value][0], step)
        for value in node.outputs:
            value = parts.get(value, value)
            if value not in places:
                lifetimes[value] = (lifetimes.get(value, (step,))[0], step)
    names = {value: f"{value.name}#{position}" for position, value in enumerate(lifetimes)}
    plan = plan_memory(
        [Lifetime(names[value], value.type.nbytes, first, last) for value, (first, last) in lifetimes.items()]
    )
    for value in lifetimes:
        places[value] = _Place("arena", 0, plan.offsets[names[value]])
    offsets: dict = {}
    for value, whole in parts.items():
        # parts in the Concat's order, each after the bytes of those before it
        places[value] = _Place("arena", 0, places[whole].offset + offsets.get(whole, 0))
        offsets[whole] = offsets.get(whole, 0) + value.type.nbytes
    for position, source in enumerate(output_sources):
        if source is not None and source["region"] == "params":
            source["offset"] = places[graph.outputs[position]].offset
    return places, b"".join(chunks), layout, plan, output_sources


def _run_func(graph: Graph, kernel_of: list[str], places: dict, symbolic: bool = False, sized=()) -> PrimFunc:
    """The `run` entry: one KernelCall per fused group, in order, over pointers into the regions. A model with
    symbolic sizes takes their values as one more argument (int32, one per size), handed on to the `sized` kernels."""
    inputs = [Buffer(f"input_{position}", (value.type.nbytes,), "uint8") for position, value in enumerate(graph.inputs)]
    outputs = [
        Buffer(f"output_{position}", (value.type.nbytes,), "uint8") for position, value in enumerate(graph.outputs)
    ]
    regions = {"params": Buffer("params", (0,), "uint8"), "arena": Buffer("arena", (0,), "uint8")}
    size_values = [Buffer(SIZES_ARGUMENT, (0,), "int32")] if symbolic else []

    def argument(value) -> tuple[Buffer, int]:
        place = places[value]
        if place.region == "input":
            return inputs[place.index], 0
        if place.region == "output":
            return outputs[place.index], 0
        return regions[place.region], place.offset

    calls = tuple(
        KernelCall(
            name,
            tuple(argument(value) for value in [*node.inputs, *node.outputs] if value is not None)
            + (((size_values[0], 0),) if name in sized else ()),
        )
        for name, node in zip(kernel_of, graph.nodes)
    )
    return PrimFunc(ENTRY, [*inputs, *outputs, regions["params"], regions["arena"], *size_values], Seq(calls))


def _describe_call(call: dict, kernels: list[dict]) -> str:
    """One kernel call of the run entry in words: the ops of its kernel and the group it computes."""
    ops = next((kernel["ops"] for kernel in kernels if kernel["name"] == call["kernel"]), [])
    return f"{'/'.join(dict.fromkeys(ops)) or call['kernel']} (group {call['group']!r})"


class Module:
    """A compiled model: run it on named numpy arrays, time it, export it as a bundle. A cross-compiled
    module (another architecture) exports but does not run here."""

    def __init__(
        self,
        manifest: dict,
        library: bytes,
        params: bytes,
        num_threads: int | None = None,
        code: ModelCode | None = None,
        funcs: list[PrimFunc] | None = None,
        *,
        target: Target,
        binding: str | None = None,
        variants: dict[str, bytes] | None = None,
    ):
        self.manifest = manifest
        self.library = library
        # the wasm variants' code by file name (bundle.WASM_FEATURES): exported with the bundle, run by tessel.js
        self.variants = variants or {}
        self.params = params
        self.compiled = code.compiled if code is not None else None
        self.sources = code.sources if code is not None else None
        self.funcs = funcs or []
        self.target = target
        # a symbolic model's sizes by name, with their ranges; its inputs' and outputs' dims as ints and Syms, and the
        # specs the runtimes see: every tensor at its largest shape (the layout its kernels index)
        self.sizes = SymbolicSizes(manifest)
        self.inputs = [
            ArgSpec(item["name"], self.sizes.layout(dims), item["dtype"])
            for item, dims in zip(manifest["inputs"], self.sizes.input_dims)
        ]
        self.outputs = [
            ArgSpec(item["name"], self.sizes.layout(dims), item["dtype"])
            for item, dims in zip(manifest["outputs"], self.sizes.output_dims)
        ]
        # what a run checks and fills in, made once: each input's name and dtype, the outputs no kernel writes
        self.input_checks = [(spec, np.dtype(spec.dtype)) for spec in self.inputs]
        self.input_names = {spec.name for spec in self.inputs}
        self.host_outputs = [(p, item["source"]) for p, item in enumerate(manifest["outputs"]) if item["source"]]
        self.output_names = [spec.name for spec in self.outputs]
        calls = [_describe_call(call, manifest["kernels"]) for call in manifest.get("calls", [])]
        image = ModelImage(manifest, library, params, self.inputs, self.outputs, calls, binding)
        self.runtime = backend_for(self.target).model_runtime(image, self.target, num_threads)

    @property
    def num_threads(self) -> int:
        """Threads for parallel loops (0: every usable core, 1: no thread pool); native modules only."""
        return getattr(self.runtime, "num_threads", 1)

    @num_threads.setter
    def num_threads(self, count: int) -> None:
        if count < 0:
            raise TesselError(f"num_threads must be 0 (every core) or a positive count, got {count}")
        if hasattr(self.runtime, "num_threads"):
            self.runtime.num_threads = count

    def __repr__(self) -> str:
        kernels = len(self.manifest["kernels"])
        return f"<Module {self.manifest['content_hash'][:12]} target={self.target} kernels={kernels}>"

    def _check(self, feeds: dict) -> list[np.ndarray]:
        if not isinstance(feeds, dict):
            raise ShapeError(f"run takes a dict of input name -> numpy array, not {type(feeds).__name__}")
        if len(feeds) != len(self.input_names) or not self.input_names.issuperset(feeds):
            expected = [spec.name for spec in self.inputs]
            unknown = [name for name in feeds if name not in expected]
            if unknown:
                raise ShapeError(f"unknown input {unknown[0]!r}; the model's inputs are {', '.join(expected)}")
            missing = [name for name in expected if name not in feeds]
            raise ShapeError(f"missing input {missing[0]!r}; the model's inputs are {', '.join(expected)}")
        arrays = []
        for spec, dtype in self.input_checks:
            array = feeds[spec.name]
            if not isinstance(array, np.ndarray):
                raise ShapeError(f"input {spec.name!r} must be a numpy array, not {type(array).__name__}")
            if array.dtype != dtype:
                raise ShapeError(
                    f"input {spec.name!r} has dtype {array.dtype}, the model takes {spec.dtype}; "
                    f"convert it with array.astype({spec.dtype!r})"
                )
            if self.sizes:
                arrays.append(array)
                continue
            if array.shape != spec.shape:
                raise ShapeError(
                    f"input {spec.name!r} has shape {tuple(array.shape)}, the model takes {spec.shape}; "
                    "compile with input_shapes (tessel compile --input-shape) for another shape"
                )
            arrays.append(array if array.flags.c_contiguous else np.ascontiguousarray(array))
        return arrays

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the whole model once through its `run` entry; inputs are checked before any code sees them. A model
        with symbolic sizes takes every size in its ranges: each input goes into a buffer of its largest shape, and
        each output comes back cut to the run's shape."""
        arrays = self._check(feeds)
        if self.runtime is None:
            raise TargetError(
                f"this module was cross-compiled for {self.target.triple} and cannot run on this machine; "
                "export it and run it on such a device (or under qemu-user)"
            )
        if not self.sizes:
            return self._named_outputs(arrays, self.runtime.run(arrays))
        values, laid_out, sizes = self.sizes.lay_out(self.inputs, arrays)
        results = self.runtime.run(laid_out, sizes)
        return self._named_outputs(arrays, self.sizes.cut_outputs(results, values))

    def _named_outputs(self, arrays: list[np.ndarray], results: list[np.ndarray]) -> dict[str, np.ndarray]:
        """Fill in the outputs no kernel writes (copied on the host) and name every output."""
        for position, source in self.host_outputs:
            spec = self.outputs[position]
            if source["region"] == "input":
                results[position] = arrays[source["index"]].copy()
            elif source["region"] == "output":
                results[position] = results[source["index"]].copy()
            else:
                data = self.params[source["offset"] :]
                stored = self.manifest["outputs"][position].get("device_dtype", spec.dtype)
                array = np.frombuffer(data, stored, int(np.prod(spec.shape))).reshape(spec.shape)
                results[position] = array.astype(spec.dtype)
        return dict(zip(self.output_names, results))

    def generate(self, input_ids, max_new_tokens: int, **options) -> np.ndarray:
        """The tokens a decoder with a KV cache generates after `input_ids`, at most `max_new_tokens`; `options`:
        temperature (0, greedy, by default), top_k, top_p, stop_token, seed, on_token (compiler/generate.py)."""
        return generate_tokens(stepper_for(self), input_ids, max_new_tokens, **options)

    def random_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Inputs of the right names, shapes and dtypes: standard normal floats, small integers, random bools."""
        rng = np.random.default_rng(seed)
        feeds = {}
        for spec in self.inputs:
            dtype = np.dtype(spec.dtype)
            if dtype.kind == "f":
                feeds[spec.name] = rng.standard_normal(spec.shape).astype(dtype)
            elif dtype.kind == "b":
                feeds[spec.name] = rng.random(spec.shape) < 0.5
            else:
                feeds[spec.name] = rng.integers(0, 10, spec.shape).astype(dtype)
        return feeds

    def benchmark(self, repeat: int = 30, feeds: dict[str, np.ndarray] | None = None) -> dict[str, float]:
        """Median, min and max milliseconds of `repeat` runs after one warm-up run."""
        if repeat < 1:
            raise TesselError(f"benchmark repeat must be at least 1, got {repeat}")
        feeds = feeds if feeds is not None else self.random_inputs()
        self.run(feeds)
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            self.run(feeds)
            times.append((time.perf_counter() - started) * 1000)
        return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times)}

    def replay(self, feeds: dict[str, np.ndarray], repeat: int = 1) -> tuple[dict[str, np.ndarray], list[list[float]]]:
        """Run the model as `run` does, but call each group's kernel from the host, one call at a time,
        `repeat` times in a row (a kernel never writes what it reads, so repeats are idempotent). Gives the
        outputs and, per call in graph order, the milliseconds of each repeat."""
        if repeat < 1:
            raise TesselError(f"profile repeat must be at least 1, got {repeat}")
        arrays = self._check(feeds)
        if self.runtime is None:
            raise TargetError(
                f"this module was cross-compiled for {self.target.triple} and cannot be profiled on this machine"
            )
        calls = self.manifest["calls"]
        if any("args" not in call for call in calls):
            raise BundleError("this bundle's manifest has no kernel call arguments; export it again to profile it")
        values = None
        if self.sizes:
            values, laid_out, sizes = self.sizes.lay_out(self.inputs, arrays)
            replayer = self.runtime.replay(laid_out, sizes)
        else:
            replayer = self.runtime.replay(arrays)
        times = []
        for call in calls:
            kernel = replayer.kernel(call["kernel"], call["args"])
            samples = []
            for _ in range(repeat):
                started = time.perf_counter()
                kernel()
                samples.append((time.perf_counter() - started) * 1000)
            times.append(samples)
        results = replayer.outputs()
        if values is not None:
            results = self.sizes.cut_outputs(results, values)
        return self._named_outputs(arrays, results), times

    def profile(self, repeat: int = 10, feeds: dict[str, np.ndarray] | None = None) -> list[dict]:
        """Milliseconds per fused group, in graph order: each group's kernel called on its own, from the
        host, with the arguments the run entry passes it (one untimed call, then `repeat` timed ones).
        Each entry: group, kernel, pattern, ops (member ops), median_ms and min_ms."""
        feeds = feeds if feeds is not None else self.random_inputs()
        _, times = self.replay(feeds, repeat + 1)
        ops = {kernel["name"]: kernel["ops"] for kernel in self.manifest["kernels"]}
        return [
            {
                "group": call["group"],
                "kernel": call["kernel"],
                "pattern": call.get("pattern", ""),
                "ops": ops.get(call["kernel"], []),
                "median_ms": statistics.median(samples[1:]),
                "min_ms": min(samples[1:]),
            }
            for call, samples in zip(self.manifest["calls"], times)
        ]

    def export(self, directory: str | Path) -> Path:
        """Write the bundle (manifest.json, the code, params.bin) into `directory`, atomically."""
        files = {self.manifest["code"]: self.library, **self.variants, PARAMS_FILE: self.params}
        path = write_bundle(directory, self.manifest, files)
        written = json.loads((path / "manifest.json").read_text())
        self.manifest = {**self.manifest, "files": written["files"], "chunked_files": written["chunked_files"]}
        return path

    def source(self, kind: str = "ll") -> str:
        """The generated code: "tir" (every kernel and the run entry's calls), "ll" or "asm"."""
        if kind == "tir":
            return "\n\n".join(format_func(func) for func in self.funcs)
        if self.sources is None:
            raise TargetError("a module loaded from a bundle keeps only its linked code; compile it to see its source")
        return _source(self.sources, kind, self.target)


def load_module(directory: str | Path, num_threads: int | None = None) -> Module:
    """A Module from a bundle directory, after checking its format version, every file's digest, the manifest's
    schema and sizes, and that the code was generated for this manifest (bundle.py), before any kernel runs."""
    manifest, files = read_bundle(directory)
    check_manifest(manifest, files, code_files())
    code = files[manifest["code"]]
    target = Target.parse(manifest["target"])
    seal = backend_for(target).seal
    check_seal(seal, code, manifest["code"])
    variants = {variant["code"]: files[variant["code"]] for variant in manifest.get("variants", [])}
    for name, variant_code in variants.items():
        check_seal(seal, variant_code, name)
    binding = binding_digest(manifest)
    return Module(manifest, code, files[PARAMS_FILE], num_threads, target=target, binding=binding, variants=variants)
