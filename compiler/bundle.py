"""Bundles: the directory a compiled model is exported to and loaded from (docs/modules.md, "Bundles"): manifest.json, the
code (its backend's code file: model.so, model.wasm..., and for wasm optional variants such as model.threads.wasm)
and params.bin. build.py writes the manifest; this module writes the files atomically and checks, on loading, the
format version, every file's sha256, the manifest's schema (check_manifest) and the sizes it gives against the files. The code carries `binding_digest` of the manifest
fields it was generated for, so an edited and rehashed manifest is refused before any kernel runs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

from compiler.errors import ShapeError, TesselError
from compiler.graph.ir import ITEMSIZE
from compiler.graph.sym import SIZE_LIMIT, Sym, evaluate, parse_size

FORMAT_VERSION = 2
# The version of the JS runtime (the npm package tessel-runtime, web_runtime/) that bundles are compiled for: written
# into every manifest as `runtime_version`, which tessel.js checks against its own. It must equal
# web_runtime/package.json's "version" and tessel.js's VERSION (tests/web/test_package.py checks the three agree).
RUNTIME_VERSION = "0.1.0"
MANIFEST_FILE = "manifest.json"
PARAMS_FILE = "params.bin"
# The engine features a wasm bundle may carry extra code for, beside its plain `code` (docs/web.md, "Threads and
# relaxed SIMD"): each variant is the same model built with some of them, in a file of its own, sealed and digested
# like `code`; the JS runtime runs the variant with the most features the engine has, every other runtime `code`.
WASM_FEATURES = ("threads", "relaxed-simd")


def variant_file(features: list[str]) -> str:
    """The code file of the wasm variant built with `features`: model.threads.wasm, model.threads.relaxed-simd.wasm."""
    return ".".join(["model", *features, "wasm"])


class BundleError(TesselError):
    """A bundle directory that is missing, incomplete, corrupted or of another format version."""


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# A large file's digest in a form a reader can compute as the file streams in (docs/web.md, "Where the wasm first
# result goes"): the sha256 of the concatenated sha256 digests (32 bytes each) of its CHUNK_BYTES-long pieces, the
# last one shorter. A browser hashes each piece as it arrives, so the check ends a piece after the download.
CHUNK_BYTES = 1 << 20
# the files given a chunked digest beside their plain one (code files are small enough to hash at once)
CHUNKED_FILES = ("params.bin",)


def chunked_digest(data: bytes, chunk_bytes: int = CHUNK_BYTES) -> str:
    pieces = (hashlib.sha256(data[start : start + chunk_bytes]).digest() for start in range(0, len(data), chunk_bytes))
    return hashlib.sha256(b"".join(pieces)).hexdigest()


BINDING_SYMBOL = "tessel_manifest_digest"


def binding_digest(manifest: dict) -> str:
    """The sha256 of the manifest fields the generated code relies on, as the code embeds it: everything is fixed
    before code generation except the files' digests (plain and chunked) and the wasm memory limits, which the linker
    decides."""
    bound = {key: value for key, value in manifest.items() if key not in ("files", "chunked_files")}
    if isinstance(bound.get("memory"), dict):
        bound["memory"] = {key: value for key, value in bound["memory"].items() if key != "wasm_import"}
    if isinstance(bound.get("variants"), list):
        bound["variants"] = [
            {key: value for key, value in variant.items() if key != "wasm_import"}
            if isinstance(variant, dict)
            else variant
            for variant in bound["variants"]
        ]
    return _digest(json.dumps(bound, sort_keys=True, separators=(",", ":")).encode())


# The code file ends with the sha256 of the rest of it: a wasm custom section (which engines skip) or bytes after
# everything an ELF header points at (which the dynamic loader never maps). The manifest's digest of the file can be
# recomputed by anyone editing the bundle; this one catches damage to the code itself before it is loaded.
_SEAL_NAME = b"tessel.sha256"


def _seal_bytes(style: str, digest: bytes) -> bytes:
    if style == "text":  # a comment line, so GPU source (kernels.cl, kernels.cu, kernels.wgsl) stays valid text
        return b"\n// " + _SEAL_NAME + b" " + digest.hex().encode() + b"\n"
    if style == "wasm":  # section id 0 (custom), then sizes that fit one LEB128 byte each
        payload = bytes([len(_SEAL_NAME)]) + _SEAL_NAME + digest
        return b"\x00" + bytes([len(payload)]) + payload
    return _SEAL_NAME + digest


def seal_code(style: str, code: bytes) -> bytes:
    """`code` (a linked model.so or model.wasm, or GPU source) with its seal appended; `style` is the backend's: "wasm"
    for a custom section, "text" for a last comment line, any other for bytes after the end."""
    return code + _seal_bytes(style, hashlib.sha256(code).digest())


def unsealed(style: str, code: bytes) -> bytes:
    """`code` without the seal `seal_code` appended (checked by check_seal before)."""
    return code[: len(code) - len(_seal_bytes(style, bytes(32)))]


def check_seal(style: str, code: bytes, name: str) -> None:
    """Refuse code whose seal is missing or does not match its bytes (truncated, damaged or not Tessel's)."""
    size = len(_seal_bytes(style, bytes(32)))
    body = code[:-size] if len(code) > size else b""
    if code[len(body) :] != _seal_bytes(style, hashlib.sha256(body).digest()):
        raise BundleError(
            f"{name} is truncated or damaged (its own sha256 seal does not match); export the model again"
        )


# No bundle this Tessel writes comes near these; they keep every size a manifest gives inside what a 64-bit
# offset holds, so a hostile one cannot make a reader allocate or multiply without bound.
MAX_BYTES = 1 << 40
MAX_ITEMS = 1 << 20


def _fail(where: str, wanted: str, value) -> None:
    shown = json.dumps(value)[:60] if isinstance(value, str | int | float | bool | type(None)) else type(value).__name__
    raise BundleError(
        f"{MANIFEST_FILE} is not a valid manifest: {where} must be {wanted}, got {shown}; export the model again"
    )


def _text(where, value):
    if not isinstance(value, str) or len(value) > 4096:
        _fail(where, "a string", value)


def _count(where, value, limit=MAX_BYTES):
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
        _fail(where, f"a whole number in [0, {limit}]", value)


def _list_of(item):
    def check(where, value):
        if not isinstance(value, list) or len(value) > MAX_ITEMS:
            _fail(where, "a list", value)
        for position, element in enumerate(value):
            _check(item, f"{where}[{position}]", element)

    return check


def _one_of(*choices):
    def check(where, value):
        if value not in choices:
            _fail(where, f"one of {', '.join(map(str, choices))}", value)

    return check


def _optional(schema):
    return lambda where, value: None if value is None else _check(schema, where, value)


def _any(where, value):
    return None


def _check(schema, where: str, value) -> None:
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            _fail(where, "an object", value)
        for key, item in schema.items():
            optional = key.endswith("?")
            name = key.rstrip("?")
            if name not in value:
                if optional:
                    continue
                raise BundleError(
                    f"{MANIFEST_FILE} is not a valid manifest: {where}.{name} is missing; export the model again"
                )
            _check(item, f"{where}.{name}", value[name])
    else:
        schema(where, value)


def _dict_of_text(where, value):
    if not isinstance(value, dict) or len(value) > MAX_ITEMS:
        _fail(where, "an object", value)
    for key, item in value.items():
        _text(f"{where}.{key}", item)


def _dim(where, value):
    """A dimension: a whole number, or a symbolic size's expression ("seq", "4*seq+past"; check_sizes parses it)."""
    if isinstance(value, str):
        if not re.fullmatch(r"[A-Za-z0-9_.*+-]{1,256}", value):
            _fail(where, "a size expression", value)
        return
    _count(where, value, MAX_BYTES)


_TENSOR = {
    "name": _text,
    "shape": _list_of(_dim),
    "dtype": _one_of(*ITEMSIZE),
    "device_dtype?": _one_of("int32"),
}
# the memory a wasm module imports: what a host creates before instantiating it (shared for threads)
_WASM_IMPORT = {
    "initial_pages": _count,
    "maximum_pages": _optional(_count),
    "shared?": _one_of(True, False),
}
MANIFEST_SCHEMA = {
    "format_version": _one_of(FORMAT_VERSION),
    "content_hash": _text,
    "compiler_version": _text,
    "runtime_version?": _text,
    "target": _text,
    "triple": _text,
    "code": _text,
    "entry": {"name": _text, "arguments": _list_of(_text)},
    # a model's symbolic sizes, in the order of the run entry's sizes argument
    "sizes?": _list_of({"name": _text, "min": _count, "max": _count}),
    # a symbolic dim is laid out for its largest value rounded up to a multiple of this
    "size_alignment?": lambda where, value: (
        _count(where, value, 1 << 16) if value != 0 else _fail(where, "1 or more", 0)
    ),
    "inputs": _list_of(_TENSOR),
    "outputs": _list_of({**_TENSOR, "source": _optional({"region": _one_of("input", "output", "params")})}),
    "kernels": _list_of({"name": _text, "ops": _list_of(_text), "groups": _list_of(_text), "config?": _any}),
    "calls": _list_of({"kernel": _text, "group": _text, "pattern": _text, "args": _list_of(_list_of(_any))}),
    "memory": {
        "arena_bytes": _count,
        "intermediate_bytes": _count,
        "alignment": _count,
        "wasm_import?": _WASM_IMPORT,
    },
    "variants?": _list_of(
        {
            "code": _text,
            "features": _list_of(_one_of(*WASM_FEATURES)),
            "wasm_import": _WASM_IMPORT,
            "stack_bytes?": _count,
        }
    ),
    "params": {
        "file": _one_of(PARAMS_FILE),
        "bytes": _count,
        "layout": _list_of({**_TENSOR, "offset": _count, "nbytes": _count}),
    },
    "options": _any,
    "files": _dict_of_text,
    # params.bin's digest as CHUNK_BYTES pieces (chunked_digest), for runtimes that hash it as it downloads
    "chunked_files?": {"chunk_bytes": _count, "sha256": _dict_of_text},
    # GPU bundles: the kernels in order, each parameter bound to a region (tir/gpu.py dispatch_list)
    "dispatches?": _list_of(
        {
            "kernel": _text,
            "call": _count,
            "bindings": _list_of(
                {
                    "region": _one_of("input", "output", "params", "arena"),
                    "index": _count,
                    "offset": _count,
                    "bytes": _count,
                    "dtype": _one_of(*ITEMSIZE),
                }
            ),
            "grid": _list_of(_count),
            "block": _list_of(_count),
            # webgpu's (codegen/wgsl.model_shader): the entry point, the regions it binds and its uniform words
            "entry?": _text,
            "regions?": _list_of({"region": _one_of("input", "output", "params", "arena"), "index": _count}),
            "uniform_offset?": _count,
            "element_offsets?": _list_of(_count),
        }
    ),
    "webgpu?": {
        "entries": _list_of(
            {
                "name": _text,
                "kernel": _text,
                "regions": _list_of(
                    {
                        "binding": _count,
                        "access": _one_of("read", "read_write"),
                        "type": _one_of("f32", "i32", "u32", "f16", "atomic<u32>"),
                    }
                ),
                "param_regions": _list_of(_count),
                "offsets_binding": _optional(_count),
                "offsets_bytes": _count,
                "grid": _list_of(_count),
                "block": _list_of(_count),
                "workgroup_bytes": _count,
                "status_binding?": _optional(_count),
            }
        ),
        "buffers": _list_of(
            {
                "region": _one_of("input", "output", "params", "arena"),
                "index": _count,
                "bytes": _count,
                # an input or output that lives in the arena from this byte on (backends.py, _io_in_arena)
                "arena_offset?": _count,
            }
        ),
        "uniform_bytes": _count,
        "features": _list_of(_one_of("shader-f16")),
        "limits": _any,
    },
}


def size_ranges(manifest: dict) -> dict[str, tuple[int, int]]:
    """The manifest's symbolic sizes by name, with their ranges; BundleError on a repeated name or an empty range."""
    ranges: dict[str, tuple[int, int]] = {}
    for item in manifest.get("sizes", ()):
        valid = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", item["name"]) and item["min"] <= item["max"] <= SIZE_LIMIT
        if item["name"] in ranges or not valid:
            raise BundleError(
                f"{MANIFEST_FILE}: the size {item['name']!r} is repeated, misnamed or has a range outside "
                f"0..{SIZE_LIMIT}; export the model again"
            )
        ranges[item["name"]] = (item["min"], item["max"])
    return ranges


def _aligned(largest: int, alignment: int) -> int:
    return -(-largest // alignment) * alignment


def _largest(dim, ranges: dict, alignment: int = 1) -> int:
    """A manifest dim's layout extent: itself, or a size expression's largest value over the sizes' ranges (at least 0),
    rounded up to the manifest's size_alignment, as every symbolic dim is laid out."""
    if isinstance(dim, int):
        return dim
    try:
        size = parse_size(dim, ranges)
    except ShapeError as error:
        raise BundleError(f"{MANIFEST_FILE}: {error}; export the model again") from None
    if not isinstance(size, Sym) or size.bounds()[0] < 0:
        raise BundleError(
            f"{MANIFEST_FILE}: the dim {dim!r} is not a size expression that stays at least 0; export the model again"
        )
    return _aligned(size.upper, alignment)


def _check_sizes_bound(manifest: dict, ranges: dict) -> None:
    """Every size is some input's dim alone, so that a run can tell its value from the inputs' shapes."""
    alone = {dim for spec in manifest["inputs"] for dim in spec["shape"] if isinstance(dim, str)}
    for name in ranges:
        if name not in alone:
            raise BundleError(
                f"{MANIFEST_FILE}: no input's shape has the size {name} as a dim of its own, so no run could tell its "
                "value; export the model again"
            )


def tensor_bytes(spec: dict, ranges: dict | None = None, alignment: int = 1) -> int:
    """Bytes of a manifest tensor (name, shape, dtype), a symbolic one as it is laid out (`ranges`: size_ranges,
    `alignment`: the manifest's size_alignment), refused above MAX_BYTES."""
    count = 1
    for dim in spec["shape"]:
        count *= _largest(dim, ranges or {}, alignment)
        if count > MAX_BYTES:
            break
    nbytes = count * ITEMSIZE[spec["dtype"]]
    if nbytes > MAX_BYTES:
        raise BundleError(
            f"{MANIFEST_FILE}: tensor {spec['name']!r} of shape {spec['shape']} is larger than {MAX_BYTES} bytes"
        )
    return nbytes


def check_manifest(manifest: dict, files: dict[str, bytes], code_files: dict[str, str]) -> None:
    """Check every key, type and size of a model bundle's manifest, and the sizes it gives against `files`,
    raising one BundleError that names the first thing wrong. `code_files` (target kind -> code file, the backends
    registry's) says which code file the manifest's target has."""
    _check(MANIFEST_SCHEMA, "manifest", manifest)
    kind = (manifest["target"].split() or [""])[0]
    if kind not in code_files:
        _fail("manifest.target", f"a target of kind {', '.join(code_files)}", manifest["target"])
    if manifest["code"] != code_files[kind]:
        _fail("manifest.code", f"{code_files[kind]!r} for target {kind}", manifest["code"])
    ranges = size_ranges(manifest)
    alignment = manifest.get("size_alignment", 1)
    for spec in [*manifest["inputs"], *manifest["outputs"]]:
        tensor_bytes(spec, ranges, alignment)
    _check_sizes_bound(manifest, ranges)
    for spec in manifest["params"]["layout"]:
        tensor_bytes(spec)
    code, params = manifest["code"], manifest["params"]
    if code not in files or PARAMS_FILE not in files:
        raise BundleError(f"the bundle is incomplete: its manifest lists no {code} or {PARAMS_FILE}; export it again")
    if len(files[PARAMS_FILE]) != params["bytes"]:
        raise BundleError(
            f"{PARAMS_FILE} has {len(files[PARAMS_FILE])} bytes, the manifest says {params['bytes']}; export the model again"
        )
    for entry in params["layout"]:
        if entry["nbytes"] != tensor_bytes(entry) or entry["offset"] + entry["nbytes"] > params["bytes"]:
            raise BundleError(
                f"{MANIFEST_FILE}: param {entry['name']!r} does not fit {PARAMS_FILE}; export the model again"
            )
    for position, variant in enumerate(manifest.get("variants", [])):
        if variant["code"] != variant_file(variant["features"]) or variant["code"] not in files:
            raise BundleError(
                f"{MANIFEST_FILE}: variant {position} names code {variant['code']!r}, which the bundle lacks or which "
                f"is not the file for features {variant['features']}; export the model again"
            )
    kernels = {kernel["name"] for kernel in manifest["kernels"]}
    for position, call in enumerate(manifest["calls"]):
        if call["kernel"] not in kernels:
            raise BundleError(
                f"{MANIFEST_FILE}: call {position} names unknown kernel {call['kernel']!r}; export the model again"
            )
    _check_dispatches(manifest)
    _check_webgpu(manifest)
    for position, spec in enumerate(manifest["outputs"]):
        source = spec["source"]
        if source is None:
            continue
        if source["region"] == "params":
            _count(f"manifest.outputs[{position}].source.offset", source.get("offset"))
            stored = {**spec, "dtype": spec.get("device_dtype", spec["dtype"])}
            if source["offset"] + tensor_bytes(stored, ranges, alignment) > params["bytes"]:
                raise BundleError(
                    f"{MANIFEST_FILE}: output {spec['name']!r} does not fit {PARAMS_FILE}; export the model again"
                )
        else:
            among = manifest["inputs"] if source["region"] == "input" else manifest["outputs"]
            index = source.get("index")
            _count(f"manifest.outputs[{position}].source.index", index, len(among) - 1)
            if among[index]["shape"] != spec["shape"] or among[index]["dtype"] != spec["dtype"]:
                raise BundleError(f"{MANIFEST_FILE}: output {spec['name']!r} is copied from a tensor of another shape")


def _check_dispatches(manifest: dict) -> None:
    """Every binding of a GPU dispatch lies inside its region, so no kernel can be pointed outside the memory the
    runtime made for it, and each dispatch launches a kernel of the model (or a part of one: tir/gpu.py
    split_launches; a call may run another call's launch where their code is the same, share_launches)."""
    sizes = {("params", 0): manifest["params"]["bytes"], ("arena", 0): manifest["memory"]["arena_bytes"]}
    for kind, specs in (("input", manifest["inputs"]), ("output", manifest["outputs"])):
        alignment = manifest.get("size_alignment", 1)
        ranges = size_ranges(manifest)
        sizes.update({(kind, index): tensor_bytes(spec, ranges, alignment) for index, spec in enumerate(specs)})
    calls = manifest["calls"]
    kernels = {call["kernel"] for call in calls}
    for position, dispatch in enumerate(manifest.get("dispatches", [])):
        where = f"{MANIFEST_FILE}: dispatch {position} ({dispatch['kernel']!r})"
        launched = re.fullmatch(r"(.*?)(_part\d+)?", dispatch["kernel"]).group(1)
        if dispatch["call"] >= len(calls) or launched not in kernels:
            raise BundleError(f"{where} is no launch of the model's kernels; export the model again")
        if len(dispatch["grid"]) != 3 or len(dispatch["block"]) != 3:
            raise BundleError(f"{where} needs three grid and three block sizes; export the model again")
        for binding in dispatch["bindings"]:
            region = (binding["region"], binding["index"])
            if region not in sizes or binding["offset"] + binding["bytes"] > sizes[region]:
                raise BundleError(
                    f"{where} binds {binding['bytes']} bytes at {binding['offset']} of {binding['region']} "
                    f"{binding['index']}, outside it; export the model again"
                )


def _check_webgpu(manifest: dict) -> None:
    """A webgpu dispatch names one of the bundle's entry points, binds as many regions as it declares, starts each
    parameter at the element its binding's byte offset is, and reads its words inside the uniform buffer, so the
    runtime (or tessel.js) never binds a buffer the manifest did not describe."""
    if "webgpu" not in manifest:
        return
    entries = {entry["name"]: entry for entry in manifest["webgpu"]["entries"]}
    arena = manifest["memory"]["arena_bytes"]
    placed = set()
    for buffer in manifest["webgpu"]["buffers"]:
        if "arena_offset" not in buffer:
            continue
        placed.add((buffer["region"], buffer["index"]))
        offset = buffer["arena_offset"]
        if buffer["region"] not in ("input", "output") or offset % 4 or offset + buffer["bytes"] > arena:
            raise BundleError(
                f"{MANIFEST_FILE}: webgpu.buffers places {buffer['region']} {buffer['index']} at byte {offset} of the "
                f"arena, which is not a whole word inside its {arena} bytes; export the model again"
            )
    for position, dispatch in enumerate(manifest.get("dispatches", [])):
        where = f"{MANIFEST_FILE}: dispatch {position} ({dispatch['kernel']!r})"
        entry = entries.get(dispatch.get("entry"))
        if entry is None or entry["kernel"] != dispatch["kernel"]:
            raise BundleError(f"{where} names no entry point of its kernel; export the model again")
        words, regions = dispatch.get("element_offsets", []), dispatch.get("regions", [])
        if any((region["region"], region["index"]) in placed for region in regions):
            raise BundleError(f"{where} binds a region that webgpu.buffers places in the arena; export the model again")
        places = entry["param_regions"]
        consistent = len(regions) == len(entry["regions"]) and len(words) == len(places) == len(dispatch["bindings"])
        consistent = consistent and all(0 <= place < len(regions) for place in places)
        consistent = consistent and all(
            (binding["region"], binding["index"]) == (regions[place]["region"], regions[place]["index"])
            and word * ITEMSIZE[binding["dtype"]] == binding["offset"]
            for binding, word, place in zip(dispatch["bindings"], words, places)
        )
        end = dispatch.get("uniform_offset", 0) + entry["offsets_bytes"]
        if not consistent or end > manifest["webgpu"]["uniform_bytes"]:
            raise BundleError(f"{where} does not match its entry point's bindings; export the model again")


def write_bundle(directory: str | Path, manifest: dict, files: dict[str, bytes]) -> Path:
    """Write `files` and a manifest listing their digests into `directory`, replacing what is there.

    Everything is written into a temporary directory beside the destination and renamed into place, so
    a reader sees the old bundle or the new one, never half of one."""
    directory = Path(directory).absolute()
    directory.parent.mkdir(parents=True, exist_ok=True)
    if directory.exists() and not (directory / MANIFEST_FILE).is_file() and any(directory.iterdir()):
        raise BundleError(f"{directory} exists and is not a bundle; choose an empty or new directory")
    manifest = {
        **manifest,
        "files": {name: _digest(data) for name, data in sorted(files.items())},
        "chunked_files": {
            "chunk_bytes": CHUNK_BYTES,
            "sha256": {name: chunked_digest(files[name]) for name in CHUNKED_FILES if name in files},
        },
    }
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        staging.chmod(0o755)
        for name, data in files.items():
            (staging / name).write_bytes(data)
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        if directory.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old.", dir=directory.parent))
            os.replace(directory, retired / "bundle")
            os.replace(staging, directory)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def read_bundle(directory: str | Path) -> tuple[dict, dict[str, bytes]]:
    """The manifest and the files of a bundle, after checking its format version and every file's digest."""
    directory = Path(directory)
    if not directory.is_dir():
        raise BundleError(f"{directory} is not a bundle directory: no such directory")
    manifest_path = directory / MANIFEST_FILE
    if not manifest_path.is_file():
        raise BundleError(f"{directory} is not a bundle: {MANIFEST_FILE} is missing; export the model again")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise BundleError(f"{manifest_path} is corrupted (not JSON: {error}); export the model again") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{manifest_path} is corrupted (not a JSON object); export the model again")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise BundleError(
            f"{directory} has bundle format version {version!r}; this Tessel reads version {FORMAT_VERSION}: "
            "compile the model again with this version"
        )
    listed = manifest.get("files")
    if not isinstance(listed, dict) or not listed:
        raise BundleError(f"{manifest_path} lists no files; export the model again")
    files = {}
    for name, digest in listed.items():
        path = directory / name
        if Path(name).name != name or not path.is_file():
            raise BundleError(f"{directory} is incomplete: {name} is missing; export the model again")
        data = path.read_bytes()
        if _digest(data) != digest:
            raise BundleError(f"{path} is corrupted: its sha256 does not match the manifest; export the model again")
        files[name] = data
    return manifest, files


class SymbolicSizes:
    """A manifest's symbolic sizes (`sizes`: name, min, max, in the order of the run entry's sizes argument) and its
    inputs' and outputs' dims as ints and Syms. A run binds each size's value from the inputs' shapes, lays every
    input out at its largest shape (what the kernels index) and cuts every output to the run's shape."""

    def __init__(self, manifest: dict):
        self.ranges = {item["name"]: (item["min"], item["max"]) for item in manifest.get("sizes", ())}
        self.alignment = manifest.get("size_alignment", 1)
        self.input_dims = [self._dims(item["shape"]) for item in manifest["inputs"]]
        self.output_dims = [self._dims(item["shape"]) for item in manifest["outputs"]]

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def layout(self, dims) -> tuple[int, ...]:
        """The shape a tensor of these dims is laid out for: each symbolic dim's largest value, rounded up to the
        manifest's size_alignment."""
        return tuple(dim if isinstance(dim, int) else _aligned(dim.upper, self.alignment) for dim in dims)

    def _dims(self, shape: list) -> tuple:
        return tuple(d if isinstance(d, int) else parse_size(d, self.ranges) for d in shape)

    def bind(self, names: list[str], arrays: list) -> dict[str, int]:
        """The value of each size in a run of inputs `arrays` (named `names`): every input dimension that is one size
        alone gives it; every other dimension must then agree, and every size lie in its range (ShapeError naming
        the input, the axis and the size otherwise)."""
        values: dict[str, int] = {}
        where: dict[str, str] = {}
        for name, dims, array in zip(names, self.input_dims, arrays):
            if len(array.shape) != len(dims):
                raise ShapeError(
                    f"input {name!r} has shape {tuple(array.shape)}, of rank {len(array.shape)}; the model takes rank "
                    f"{len(dims)} ({_dims_text(dims)})"
                )
            for axis, (dim, extent) in enumerate(zip(dims, array.shape)):
                if isinstance(dim, Sym) and dim.terms == {(dim.names[0],): 1}:
                    size = dim.names[0]
                    if size in values and values[size] != extent:
                        raise ShapeError(
                            f"input {name!r} has {extent} at axis {axis}, which is the size {size}, but {where[size]} "
                            f"gives {size} = {values[size]}; give inputs whose {size} agrees"
                        )
                    values.setdefault(size, extent)
                    where.setdefault(size, f"input {name!r} axis {axis}")
        for size, (low, high) in self.ranges.items():
            if size not in values:
                raise ShapeError(f"no input dimension is the size {size} alone, so a run cannot tell its value")
            if not low <= values[size] <= high:
                raise ShapeError(
                    f"{where[size]} gives the size {size} = {values[size]}, outside the range {low}..{high} the model "
                    f"was compiled for; compile it with a range that holds it (tessel compile --dim {size}=LOW..HIGH)"
                )
        for name, dims, array in zip(names, self.input_dims, arrays):
            expected = tuple(evaluate(dim, values) for dim in dims)
            if tuple(array.shape) != expected:
                at = ", ".join(f"{size} = {value}" for size, value in values.items())
                raise ShapeError(
                    f"input {name!r} has shape {tuple(array.shape)}, the model takes {expected} ({_dims_text(dims)}) "
                    f"at {at}"
                )
        return values

    def lay_out(self, specs, arrays: list) -> tuple[dict[str, int], list[np.ndarray], np.ndarray]:
        """A run's sizes (bind), its inputs each at its layout shape (`specs`: the inputs' names and layout shapes) and
        the run entry's sizes argument."""
        values = self.bind([spec.name for spec in specs], arrays)
        laid_out = [at_largest(array, spec.shape) for array, spec in zip(arrays, specs)]
        return values, laid_out, self.argument(values)

    def argument(self, values: dict[str, int]) -> np.ndarray:
        """The run entry's sizes argument: int32, one per size in manifest order."""
        return np.array([values[name] for name in self.ranges], np.int32)

    def cut_outputs(self, results: list[np.ndarray], values: dict[str, int]) -> list[np.ndarray]:
        """Each output (laid out at its largest shape) as an array of the run's shape."""
        shapes = [tuple(evaluate(dim, values) for dim in dims) for dims in self.output_dims]
        return [result[tuple(map(slice, shape))].copy() for result, shape in zip(results, shapes)]


def at_largest(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`array` in the first corner of a zeroed array of `shape` (a symbolic input's layout), or itself at that shape."""
    if array.shape == shape:
        return np.ascontiguousarray(array)
    laid_out = np.zeros(shape, array.dtype)
    laid_out[tuple(map(slice, array.shape))] = array
    return laid_out


def _dims_text(dims) -> str:
    return "[" + ", ".join(map(str, dims)) + "]"
