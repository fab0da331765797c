"""Schedule templates per target family: a fused group's tensor expressions in, a te.Schedule out, with named knobs
that the tuner (compiler/tune/) can set; compiler.build lowers the result. FAMILIES names each family's module (it is
imported on first use); each has `schedule_group(group, target, config)`, `schedule_small_sizes(group, target, cfg)` (a
symbolic group's variant for its smallest sizes, or None) and its `SPACE_VERSION`."""

from __future__ import annotations

import importlib
from types import ModuleType

from compiler.errors import TargetError
from compiler.target import Target, family_of

FAMILIES = {"cpu": "compiler.schedules.cpu", "gpu": "compiler.schedules.gpu"}


def templates(target: Target) -> ModuleType:
    """The template module of `target`'s family."""
    if target.family not in FAMILIES:
        families = ", ".join(FAMILIES)
        raise TargetError(
            f"target {target} needs {target.family} schedule templates, which this Tessel does not have yet (it has "
            f"{families}); compile for a target of those"
        )
    return importlib.import_module(FAMILIES[target.family])


def schedule_group(group, target: Target, config=None):
    """A schedule of `group` (a GroupTE) by its target's family's templates (see schedules/cpu/'s schedule_group)."""
    return templates(target).schedule_group(group, target, config)


def schedule_small_sizes(group, target: Target, general):
    """(schedule, cfg) of a symbolic group's variant for its smallest sizes beside the one `general` configured, or
    None (see schedules/cpu/'s schedule_small_sizes)."""
    return templates(target).schedule_small_sizes(group, target, general)


def space_version(kind: str) -> int | None:
    """The schedule-space version of the family of target kind `kind` (part of every tuning task's key), or None
    where that family has no templates."""
    family = family_of(kind)
    return importlib.import_module(FAMILIES[family]).SPACE_VERSION if family in FAMILIES else None


__all__ = ["FAMILIES", "schedule_group", "space_version", "templates"]
