"""Targets: what machine a kernel is generated for. Parsed from strings such as "llvm",
"llvm -mtriple=aarch64-linux-gnu", "wasm", "webgpu", "opencl" or "cuda -arch=sm_80"; codegen reads the
triple, CPU and features, link.py picks the linker from them, and GPU schedules and lowering read a GPU
target's `device` limits, so a kernel that would exceed them is refused at compile time."""

from __future__ import annotations

import platform
from dataclasses import dataclass, replace

import llvmlite.binding as llvm

from compiler.errors import TargetError

VALID_FORMS = (
    '"llvm" (this machine)',
    '"llvm -mtriple=aarch64-linux-gnu"',
    '"llvm -mtriple=armv7-linux-gnueabihf"',
    '"wasm" (wasm32 + SIMD128)',
    'each llvm form may add "-mcpu=NAME" and "-mattr=+feat,-feat"',
    '"webgpu" (WGSL)',
    '"opencl" (OpenCL C 1.2)',
    '"cuda" or "cuda -arch=sm_NN" (sm_80 unless given)',
)

# Cross targets get a CPU every chip of the family has and the SIMD unit the family is known for.
_CROSS_DEFAULTS = {
    "aarch64": ("aarch64-unknown-linux-gnu", "generic", "+neon"),
    "armv7": ("armv7-unknown-linux-gnueabihf", "generic", "+v7,+neon,+vfp4,+thumb2"),
}
_WASM = ("wasm32-unknown-unknown", "generic", "+simd128")


@dataclass(frozen=True)
class DeviceLimits:
    """What a GPU kernel may use: threads of one block (workgroup), its shared (workgroup) memory, the grid, the
    lanes that run in lockstep, the byte alignment a buffer binding's offset needs, how many buffers one kernel
    may bind, and the element types its buffers can hold."""

    max_threads: int
    max_block: tuple[int, int, int]
    max_grid: tuple[int, int, int]
    shared_bytes: int
    warp_size: int
    offset_alignment: int
    max_buffers: int | None
    max_buffer_bytes: int
    dtypes: frozenset[str]


_ALL_DTYPES = frozenset(
    ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool")
)
# WebGPU: the limits every adapter guarantees (the spec's defaults), which a bundle must fit to run anywhere;
# WGSL has no 64-bit types (f16 only behind the shader-f16 feature); bools and 8/16-bit integers, which it cannot
# store, codegen/wgsl.py keeps in the lanes of u32 words.
_WEBGPU = DeviceLimits(
    max_threads=256,
    max_block=(256, 256, 64),
    max_grid=(65535, 65535, 65535),
    shared_bytes=16384,
    warp_size=32,
    offset_alignment=256,
    max_buffers=8,
    max_buffer_bytes=134217728,
    dtypes=frozenset(("float32", "int32", "uint32", "bool", "int8", "uint8", "int16", "uint16")),
)
# OpenCL 1.2 full-profile minimums (32 KB local memory) with the work-group size of common GPUs; CL_DEVICE_MEM_BASE_ADDR
# _ALIGN is 1024 bits on the devices we know. The warp size is not exposed by OpenCL 1.2: 32 is a tiling hint only.
_OPENCL = DeviceLimits(
    max_threads=256,
    max_block=(256, 256, 256),
    max_grid=(2**31 - 1, 2**31 - 1, 2**31 - 1),
    shared_bytes=32768,
    warp_size=32,
    offset_alignment=128,
    max_buffers=None,
    max_buffer_bytes=2**31 - 1,
    dtypes=_ALL_DTYPES,
)
# CUDA compute capability 8.0 and later: 48 KB of static shared memory per block (more needs a dynamic opt-in).
_CUDA = DeviceLimits(
    max_threads=1024,
    max_block=(1024, 1024, 64),
    max_grid=(2**31 - 1, 65535, 65535),
    shared_bytes=49152,
    warp_size=32,
    offset_alignment=16,
    max_buffers=None,
    max_buffer_bytes=2**62,
    dtypes=_ALL_DTYPES,
)
GPU_KINDS = {"webgpu": ("webgpu", _WEBGPU), "opencl": ("spir64", _OPENCL), "cuda": ("nvptx64-nvidia-cuda", _CUDA)}
_CUDA_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")


# A kernel's local buffer up to this size lives on the stack; a larger one in a buffer kept between calls (the heap
# natively, a static array in wasm: codegen/llvm/memory.py). Schedules read it to keep a parallel task's buffers on
# the stack where a static one would serialize the loop.
STACK_BUFFER_BYTES = 64 * 1024

# A symbolic dimension is laid out for its largest value rounded up to this many elements (docs/symbolic.md): a tile
# of a few vectors then divides the layout, so a tile past the run's size needs no test in its vector loop (a cache of
# past + seq rows, at most 63 + 64 = 127, is laid out for 128). The graph's shapes, the kernels' buffers and every
# runtime's input and output slots use it.
SIZE_LAYOUT_MULTIPLE = 16


def size_capacity(largest: int) -> int:
    """The layout extent of a symbolic dimension whose largest value is `largest`."""
    return -(-largest // SIZE_LAYOUT_MULTIPLE) * SIZE_LAYOUT_MULTIPLE


@dataclass(frozen=True)
class Machine:
    """What code for a CPU target may assume beyond its triple and features; codegen/llvm/ and the linker read these
    instead of testing the target's kind.

    - `libm`: a C library's math to call (float64 exp, log, ...); else every function is expanded in IR.
    - `half_conversions`: float16 <-> float32 instructions; else float16 is i16 bits converted by integer arithmetic.
    - `gathers`: masked gathers of 4- and 8-byte elements; else a scalar load per lane.
    - `prefetch`: a prefetch instruction.
    - `scratch`: where a buffer too large for the stack lives: "heap" (allocated once and kept between calls) or
      "static" (one array per buffer, so a parallel loop that holds one stays serial).
    - `threads`: "pool" (parallel loops always go to the thread pool) or "atomics" (only with the +atomics feature:
      threaded wasm; plain wasm runs them serially).
    - `relocation`: the relocation model: "pic" for a shared library, "static" for a wasm module."""

    libm: bool
    half_conversions: bool
    gathers: bool
    prefetch: bool
    scratch: str
    threads: str
    relocation: str


MACHINES = {
    "llvm": Machine(
        libm=True, half_conversions=True, gathers=True, prefetch=True, scratch="heap", threads="pool", relocation="pic"
    ),
    "wasm": Machine(
        libm=False,
        half_conversions=False,
        gathers=False,
        prefetch=False,
        scratch="static",
        threads="atomics",
        relocation="static",
    ),
}


def _host_cpu() -> tuple[str, str, str]:
    triple = llvm.get_process_triple()
    cpu = llvm.get_host_cpu_name()
    # Every feature the host reports present (avx2, fma, avx512*...), as `clang -march=native` does.
    features = [item for item in llvm.get_host_cpu_features().flatten().split(",") if item.startswith("+")]
    return triple, cpu, ",".join(features)


def _arch(triple: str) -> str:
    return triple.split("-", 1)[0]


@dataclass(frozen=True)
class Target:
    """`options` keeps the user's -mtriple/-mcpu/-mattr as given, so str() prints what was parsed."""

    kind: str  # "llvm", "wasm", "webgpu", "opencl" or "cuda"
    triple: str
    cpu: str  # for cuda, the compute capability (sm_80)
    features: str
    is_host: bool
    options: tuple[tuple[str, str], ...] = ()
    device: DeviceLimits | None = None  # GPU targets only

    @staticmethod
    def parse(text: str | Target) -> Target:
        if isinstance(text, Target):
            return text
        words = str(text).split()
        if words and words[0] in GPU_KINDS:
            return _gpu_target(text, words)
        if not words or words[0] not in ("llvm", "wasm"):
            raise TargetError(f"unknown target {text!r}; valid forms: {'; '.join(VALID_FORMS)}")
        options = []
        for word in words[1:]:
            key, equals, value = word.partition("=")
            if key not in ("-mtriple", "-mcpu", "-mattr") or not equals or not value:
                raise TargetError(f"unknown target option {word!r} in {text!r}; valid forms: {'; '.join(VALID_FORMS)}")
            options.append((key[1:], value))
        given = dict(options)
        if words[0] == "wasm":
            if "mtriple" in given:
                raise TargetError(f"target {text!r}: wasm is always wasm32-unknown-unknown; drop -mtriple")
            triple, cpu, features = _WASM
            is_host = False
        elif "mtriple" in given:
            requested = given["mtriple"]
            arch = _arch(requested)
            host_arch = _arch(_host_cpu()[0])
            if arch == host_arch:
                triple, cpu, features = _host_cpu()
                is_host = True
            elif arch in ("aarch64", "arm64"):
                triple, cpu, features = _CROSS_DEFAULTS["aarch64"]
                is_host = False
            elif arch in ("armv7", "armv7a", "arm"):
                triple, cpu, features = _CROSS_DEFAULTS["armv7"]
                is_host = False
            else:
                raise TargetError(f"unsupported -mtriple={requested!r}; valid forms: {'; '.join(VALID_FORMS)}")
        else:
            triple, cpu, features = _host_cpu()
            is_host = True
        cpu = given.get("mcpu", cpu)
        if "mattr" in given:
            features = ",".join(item for item in (features, given["mattr"]) if item)
        return Target(words[0], triple, cpu, features, is_host, tuple(options))

    def __str__(self) -> str:
        return " ".join([self.kind, *(f"-{key}={value}" for key, value in self.options)])

    @property
    def is_gpu(self) -> bool:
        return self.device is not None

    @property
    def family(self) -> str:
        """The schedule family ("cpu" or "gpu") that schedules/ and passes/pipeline.py pick templates and passes by."""
        return family_of(self.kind)

    @property
    def arch(self) -> str:
        return _arch(self.triple)

    @property
    def feature_set(self) -> frozenset[str]:
        """Features switched on by the end of the list (a later -feat cancels an earlier +feat)."""
        enabled: dict[str, bool] = {}
        for item in self.features.split(","):
            if item:
                enabled[item[1:]] = item[0] == "+"
        return frozenset(name for name, on in enabled.items() if on)

    @property
    def vector_bytes(self) -> int:
        if self.is_gpu:
            return 16  # float4 / vec4<f32>
        features = self.feature_set
        if "avx512f" in features:
            return 64
        if "avx2" in features or "avx" in features:
            return 32
        return 16

    @property
    def pointer_bytes(self) -> int:
        return 4 if self.arch in ("wasm32", "armv7", "arm", "webgpu") else 8

    @property
    def machine(self) -> Machine:
        """What code for this CPU target may assume (MACHINES); a GPU target has none."""
        if self.kind not in MACHINES:
            raise TargetError(f"target {self} is a GPU target; its kernels are not compiled by the CPU code generator")
        return MACHINES[self.kind]

    @property
    def parallel(self) -> bool:
        """Whether parallel loops run on threads: natively always, in wasm only with +atomics (threaded wasm)."""
        return self.machine.threads == "pool" or "atomics" in self.feature_set

    def with_features(self, attributes: str) -> Target:
        """This target with `attributes` ("+atomics,+bulk-memory") added after its features, and to its options as
        an -mattr, so str() names the variant."""
        features = ",".join(item for item in (self.features, attributes) if item)
        return replace(self, features=features, options=(*self.options, ("mattr", attributes)))

    def to_json(self) -> dict:
        """The machine a tuning record was measured for: the same features under another spelling are the same."""
        return {"kind": self.kind, "triple": self.triple, "cpu": self.cpu, "features": sorted(self.feature_set)}

    @staticmethod
    def from_json(machine: dict) -> Target:
        """The CPU target a record's `to_json` describes (never this host: its features are the record's)."""
        if machine["kind"] not in MACHINES:
            raise TargetError(f"a tuning record's target kind {machine['kind']!r} is not a CPU target")
        features = ",".join(f"+{feature}" for feature in machine["features"])
        return Target(machine["kind"], machine["triple"], machine["cpu"], features, is_host=False)

    @property
    def can_run_here(self) -> bool:
        """wasm runs in wasmtime anywhere; llvm output only on a machine of its own architecture. GPU code may run
        wherever its runtime finds a device: the runtime says which platform is missing when it loads."""
        return self.kind == "wasm" or self.is_gpu or (self.is_host and platform.system() == "Linux")


def family_of(kind: str) -> str:
    """A target kind's schedule family: GPU kinds schedule for threads and blocks, every other kind for CPU cores."""
    return "gpu" if kind in GPU_KINDS else "cpu"


def _gpu_target(text, words: list[str]) -> Target:
    kind = words[0]
    triple, limits = GPU_KINDS[kind]
    options = []
    for word in words[1:]:
        key, equals, value = word.partition("=")
        if kind != "cuda" or key != "-arch" or not equals or value not in _CUDA_ARCHS:
            allowed = f"-arch=one of {', '.join(_CUDA_ARCHS)}" if kind == "cuda" else "no options"
            raise TargetError(f"unknown target option {word!r} in {text!r}; {kind} takes {allowed}")
        options.append(("arch", value))
    cpu = dict(options).get("arch", "sm_80") if kind == "cuda" else kind
    return Target(kind, triple, cpu, "", False, tuple(options), limits)
