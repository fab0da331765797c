"""The kernel driver: schedule → lower (tir) → codegen (LLVM) → link → runtime, giving a callable
Kernel. The stages stay separate functions so a whole-model build can put many PrimFuncs in one
module (codegen.generate_module takes a list) and reuse the linking and loading steps."""

from __future__ import annotations

from pathlib import Path

from compiler.codegen.llvm import CompiledModule, compile_funcs
from compiler.errors import TargetError
from compiler.link import link_shared, link_wasm
from compiler.runtime import ArgSpec
from compiler.runtime.native import NativeLibrary
from compiler.runtime.wasm import WasmInstance
from compiler.target import Target
from compiler.tir.lower import lower
from compiler.tir.nodes import PrimFunc
from compiler.tir.printer import format_func


def link(compiled: CompiledModule, exports: list[str]) -> bytes:
    """The loadable library for `compiled`: a .so for llvm targets, a .wasm for wasm."""
    if compiled.target.kind == "wasm":
        return link_wasm(compiled.object, exports)
    return link_shared(compiled.object, compiled.target)


def load(library: bytes, target: Target, num_threads: int | None = None):
    """The runtime for a linked library, or None when the target cannot run on this machine."""
    if target.kind == "wasm":
        return WasmInstance(library)
    if not target.can_run_here:
        return None
    return NativeLibrary(library, num_threads)


class Kernel:
    """A compiled kernel: call it on numpy arrays (outputs written in place), read its code with
    source(), write the library with export_library()."""

    def __init__(self, func: PrimFunc, target: Target, compiled: CompiledModule, library: bytes, runtime):
        self.func = func
        self.target = target
        self.compiled = compiled
        self.library = library
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
        """Threads for parallel loops (0: libgomp's default); native host kernels only."""
        return getattr(self.runtime, "num_threads", 1)

    @num_threads.setter
    def num_threads(self, count: int) -> None:
        if hasattr(self.runtime, "num_threads"):
            self.runtime.num_threads = count

    def source(self, kind: str = "ll") -> str:
        if kind == "tir":
            return format_func(self.func)
        if kind == "ll":
            return self.compiled.ll
        if kind == "asm":
            return self.compiled.asm
        raise TargetError(f"unknown source kind {kind!r} for target {self.target}; choose tir, ll or asm")

    def export_library(self, path: str | Path) -> Path:
        """Write the linked library (.so for llvm targets, .wasm for wasm) to `path`."""
        path = Path(path)
        path.write_bytes(self.library)
        return path


def build_func(func: PrimFunc, target: Target | str = "llvm", num_threads: int | None = None) -> Kernel:
    """Compile one PrimFunc (from lower() or built by hand) into a Kernel."""
    target = Target.parse(target)
    compiled = compile_funcs([func], target)
    library = link(compiled, [func.name])
    return Kernel(func, target, compiled, library, load(library, target, num_threads))


def build(
    schedule, args, target: Target | str = "llvm", name: str = "kernel", num_threads: int | None = None
) -> Kernel:
    """Lower a TE schedule over `args` (the kernel's arrays, in call order) and compile it."""
    return build_func(lower(schedule, list(args), name), target, num_threads)
