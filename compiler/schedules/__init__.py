"""Schedule templates per target family: a fused group's tensor expressions in, a te.Schedule out, with named knobs
that the tuner (compiler/tune/) can set; compiler.build lowers the result. `family` picks the module for a target
kind: cpu.py for llvm and wasm, gpu.py for webgpu, opencl and cuda; each has schedule_group, DEFAULTS and
SPACE_VERSION."""

from types import ModuleType

from compiler.schedules import cpu, gpu
from compiler.schedules.cpu import DEFAULTS, schedule_group
from compiler.target import GPU_KINDS, Target

FAMILIES: dict[str, ModuleType] = {"cpu": cpu, "gpu": gpu}


def family(target: Target | str) -> ModuleType:
    """The schedule family of `target` (a Target, a target string or a bare kind)."""
    kind = target.kind if isinstance(target, Target) else str(target).split()[0]
    return FAMILIES["gpu" if kind in GPU_KINDS else "cpu"]


__all__ = ["DEFAULTS", "FAMILIES", "family", "schedule_group"]
