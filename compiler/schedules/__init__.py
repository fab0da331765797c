"""Schedule templates per target family: a fused group's tensor expressions in, a te.Schedule out, with named knobs
that the tuner (compiler/tune/) can set; compiler.build lowers the result."""

from compiler.schedules.cpu import DEFAULTS, schedule_group

__all__ = ["DEFAULTS", "schedule_group"]
