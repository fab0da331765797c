"""Targets: what machine a kernel is generated for. Parsed from strings such as "llvm",
"llvm -mtriple=aarch64-linux-gnu" or "wasm"; codegen reads the triple, CPU and features, link.py
picks the linker from them and build.py decides whether the result can run on this host."""

from __future__ import annotations

import platform
from dataclasses import dataclass

from compiler.errors import TargetError

VALID_FORMS = (
    '"llvm" (this machine)',
    '"llvm -mtriple=aarch64-linux-gnu"',
    '"llvm -mtriple=armv7-linux-gnueabihf"',
    '"wasm" (wasm32 + SIMD128)',
    'each llvm form may add "-mcpu=NAME" and "-mattr=+feat,-feat"',
)

# Cross targets get a CPU every chip of the family has and the SIMD unit the family is known for.
_CROSS_DEFAULTS = {
    "aarch64": ("aarch64-unknown-linux-gnu", "generic", "+neon"),
    "armv7": ("armv7-unknown-linux-gnueabihf", "generic", "+v7,+neon,+vfp4,+thumb2"),
}
_WASM = ("wasm32-unknown-unknown", "generic", "+simd128")


def _host_cpu() -> tuple[str, str, str]:
    import llvmlite.binding as llvm

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

    kind: str  # "llvm" or "wasm"
    triple: str
    cpu: str
    features: str
    is_host: bool
    options: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def parse(text: str | Target) -> Target:
        if isinstance(text, Target):
            return text
        words = str(text).split()
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
        features = self.feature_set
        if "avx512f" in features:
            return 64
        if "avx2" in features or "avx" in features:
            return 32
        return 16

    @property
    def pointer_bytes(self) -> int:
        return 4 if self.arch in ("wasm32", "armv7", "arm") else 8

    @property
    def can_run_here(self) -> bool:
        """wasm runs in wasmtime anywhere; llvm output only on a machine of its own architecture."""
        return self.kind == "wasm" or (self.is_host and platform.system() == "Linux")
