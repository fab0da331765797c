"""Schedule spaces, in AutoTVM's design: a schedule template declares its knobs on a `cfg` (define_split, define_knob,
define_reorder, add_filter) and reads their values back, so one piece of code both describes the space a tuner
searches and builds any point of it. It lives with the templates that declare spaces; compiler/tune/ searches them
(a driver of the schedules, never their dependency)."""

from __future__ import annotations

import itertools
import json
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from compiler.errors import TuningError

POLICIES = ("factors", "power2")


class TuningWarning(UserWarning):
    """A tuning config that does not fit its template (a knob it no longer has, a value outside its space): the
    default schedule is built instead."""


# -- the value a template reads back: one per knob ------------------------------------------------------------------


@dataclass(frozen=True)
class SplitEntity:
    """One way to split a loop: `size` gives each part's extent, outermost first (the outermost covers the rest)."""

    size: tuple[int, ...]

    def apply(self, schedule, stage, axis) -> list:
        """Split `axis` of `stage` (a Stage, or a tensor or op of `schedule`) by the inner sizes, innermost first;
        the new axes, outermost first."""
        stage = stage if hasattr(stage, "split") else schedule[stage]
        inner_axes = []
        for factor in reversed(self.size[1:]):
            axis, inner = stage.split(axis, factor)
            inner_axes.insert(0, inner)
        return [axis, *inner_axes]

    def to_json(self) -> list[int]:
        return list(self.size)


@dataclass(frozen=True)
class OptionEntity:
    """One option of a define_knob: `val`."""

    val: object

    def to_json(self):
        return self.val


@dataclass(frozen=True)
class ReorderEntity:
    """One loop order: position k of the result takes axis perm[k] of the declared axes."""

    perm: tuple[int, ...]

    def permute(self, axes: Sequence) -> list:
        return [axes[position] for position in self.perm]

    def apply(self, schedule, stage, axes: Sequence) -> list:
        """Reorder `axes` of `stage` (in the positions they occupy now); the axes in their new order."""
        stage = stage if hasattr(stage, "reorder") else schedule[stage]
        ordered = self.permute(axes)
        stage.reorder(*ordered)
        return ordered

    def to_json(self) -> list[int]:
        return list(self.perm)


# -- the spaces of single knobs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitSpace:
    """Every split of a loop of `extent` into `num_outputs` parts that `policy` allows: "factors" (each inner size
    divides what is left, no loop has a tail), "power2" (inner sizes are powers of two, the outermost loop may have
    a guarded tail) or "candidates" (the sizes a template lists)."""

    extent: int
    num_outputs: int
    policy: str
    choices: tuple[tuple[int, ...], ...]

    def entity(self, index: int) -> SplitEntity:
        return SplitEntity(self.choices[index])

    def decode(self, value) -> int | None:
        """The choice a record's value names: the sizes (outermost first; the outermost may be -1), the inner sizes
        alone, or, for a split in two, the inner size as an int."""
        parsed = _split_value(value, self.num_outputs)
        if parsed is None:
            return None
        outer, inner = parsed
        for index, choice in enumerate(self.choices):
            if choice[1:] == inner and outer in (None, -1, choice[0]):
                return index
        return None

    def nearest(self, wanted) -> int:
        """The choice whose inner sizes are each at most `wanted`'s, the innermost as large as it can be, then the
        next: a template's fallback "a tile of at most 8" (divisor_at_most, for the factors policy)."""
        parsed = _split_value(wanted, self.num_outputs)
        if parsed is None or parsed[0] is not None:
            raise ValueError(
                f"a split default gives {self.num_outputs - 1} inner sizes (an int for two), not {wanted!r}"
            )
        limits = parsed[1]
        fitting = [
            index
            for index, choice in enumerate(self.choices)
            if all(size <= limit for size, limit in zip(choice[1:], limits))
        ]
        if not fitting:
            raise ValueError(f"no {self.policy} split of {self.extent} has inner sizes at most {list(limits)}")
        return max(fitting, key=lambda index: self.choices[index][:0:-1])

    def describe(self) -> str:
        return f"{len(self.choices)} {self.policy} splits of {self.extent} into {self.num_outputs}"


@dataclass(frozen=True)
class OptionSpace:
    """The options of a define_knob, in the template's order."""

    choices: tuple

    def entity(self, index: int) -> OptionEntity:
        return OptionEntity(self.choices[index])

    def decode(self, value) -> int | None:
        for index, option in enumerate(self.choices):
            if type(option) is type(value) and option == value:
                return index
        return None

    def describe(self) -> str:
        return f"one of {list(self.choices)}"


@dataclass(frozen=True)
class ReorderSpace:
    """Orders of `count` loops: every permutation ("all") or the ones a template lists."""

    count: int
    choices: tuple[tuple[int, ...], ...]

    def entity(self, index: int) -> ReorderEntity:
        return ReorderEntity(self.choices[index])

    def decode(self, value) -> int | None:
        if not isinstance(value, list | tuple):
            return None
        value = tuple(value)
        return self.choices.index(value) if value in self.choices else None

    def describe(self) -> str:
        return f"{len(self.choices)} orders of {self.count} loops"


Knob = SplitSpace | OptionSpace | ReorderSpace


def _split_value(value, num_outputs: int) -> tuple[int | None, tuple[int, ...]] | None:
    """(the outermost size or None, the inner sizes) that a split value gives: an int (the inner size of a split in
    two), the inner sizes, or every size; None when it is none of these."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    if len(value) == num_outputs:
        return value[0], tuple(value[1:])
    if len(value) == num_outputs - 1:
        return None, tuple(value)
    return None


def divisors(extent: int) -> list[int]:
    """Every divisor of `extent`, ascending (the "factors" policy's inner sizes)."""
    return [d for d in range(1, extent + 1) if extent % d == 0]


def _splits(extent: int, num_outputs: int, sizes_of: Callable[[int], list[int]]) -> list[tuple[int, ...]]:
    """Every split, innermost size chosen first among sizes_of(what is left), each part after it among
    sizes_of(ceil(left / size)); the outermost part takes the rest."""
    if num_outputs == 1:
        return [(extent,)]
    return [
        (*outer, size) for size in sizes_of(extent) for outer in _splits(-(-extent // size), num_outputs - 1, sizes_of)
    ]


def _split_choices(extent: int, num_outputs: int, policy) -> tuple[str, tuple[tuple[int, ...], ...]]:
    if isinstance(policy, str):
        if policy == "factors":
            return policy, tuple(_splits(extent, num_outputs, divisors))
        if policy == "power2":
            powers = lambda left: [1 << k for k in range(left.bit_length()) if 1 << k <= left]  # noqa: E731
            return policy, tuple(_splits(extent, num_outputs, powers))
        raise ValueError(f"unknown split policy {policy!r}; use one of {POLICIES} or a list of candidate sizes")
    choices = []
    for candidate in policy:
        parsed = _split_value(candidate, num_outputs)
        if parsed is None or min(parsed[1], default=1) < 1:
            raise ValueError(f"split candidate {candidate!r} does not split a loop into {num_outputs}")
        choices.append((-(-extent // math.prod(parsed[1])), *parsed[1]))
    return "candidates", tuple(dict.fromkeys(choices))


def _extent(axis_or_extent) -> int:
    extent = axis_or_extent if isinstance(axis_or_extent, int) else getattr(axis_or_extent, "extent", None)
    if hasattr(extent, "__tensor_expr__"):
        extent = int(extent)  # a symbolic size: its planned int while a template plans (planning_sizes)
    if not isinstance(extent, int) or extent < 1:
        raise ValueError(f"a split needs a loop of constant positive extent, not {axis_or_extent!r}")
    return extent


# -- a template's cfg, and the space it collects ---------------------------------------------------------------------


class ConfigSpace:
    """The `cfg` a template is handed. Each define_* declares a knob (declaring the same one again is a no-op) and
    `cfg[name]` gives its value: the one `values` (a record's config: knob name -> JSON value, or a Config) sets,
    else the template's default. After the template ran, the cfg is its space: size, index <-> config, filters.

    A template declares the same knobs whatever their values, so every point of the space builds from one run."""

    def __init__(self, values: Mapping | Config | None = None):
        self.knobs: dict[str, Knob] = {}
        self.defaults: dict[str, int] = {}
        self.filters: list[Callable[[Config], bool]] = []
        self.template = ""
        self.values = dict(values.to_json() if isinstance(values, Config) else values or {})
        self._chosen: dict[str, int] = {}
        self._outside: list[str] = []

    def _define(self, name: str, knob: Knob, default: int) -> None:
        known = self.knobs.get(name)
        if known is not None:
            if known != knob:
                raise ValueError(f"knob {name!r} is declared twice, as {known.describe()} and as {knob.describe()}")
            return
        self.knobs[name] = knob
        self.defaults[name] = self._chosen[name] = default
        if name in self.values:
            index = knob.decode(self.values[name])
            if index is None:
                self._outside.append(f"{name}={self.values[name]!r} is outside its space ({knob.describe()})")
            else:
                self._chosen[name] = index

    def define_split(self, name: str, axis_or_extent, num_outputs: int = 2, policy="factors", default=None) -> None:
        """A split of a loop (an axis or its extent) into `num_outputs` parts. `policy`: "factors", "power2" or a
        list of candidates (inner sizes, or every size with -1 for the outermost). `default`: the inner sizes the
        fallback is at most (an int for a split in two); without one the fallback does not tile."""
        if num_outputs not in (2, 3, 4):
            raise ValueError(f"split {name!r}: num_outputs is 2, 3 or 4, not {num_outputs}")
        extent = _extent(axis_or_extent)
        label, choices = _split_choices(extent, num_outputs, policy)
        knob = SplitSpace(extent, num_outputs, label, choices)
        if hasattr(default, "__tensor_expr__"):
            default = int(default)  # a symbolic size: its planned int while a template plans (planning_sizes)
        self._define(name, knob, 0 if default is None else knob.nearest(default))

    def define_knob(self, name: str, options: Sequence, default=None) -> None:
        """A choice among `options` (JSON values); `default` (one of them) is the fallback, else the first."""
        knob = OptionSpace(tuple(options))
        if not knob.choices:
            raise ValueError(f"knob {name!r} has no options")
        index = 0 if default is None else knob.decode(default)
        if index is None:
            raise ValueError(f"knob {name!r}: default {default!r} is not {knob.describe()}")
        self._define(name, knob, index)

    def define_reorder(self, name: str, axes_or_count, policy="all", default=None) -> None:
        """An order of some loops (the axes, or how many): every permutation ("all") or a list of candidate
        permutations. `default` (a permutation) is the fallback, else the order they are given in."""
        count = axes_or_count if isinstance(axes_or_count, int) else len(axes_or_count)
        if policy == "all":
            choices = tuple(itertools.permutations(range(count)))
        elif isinstance(policy, str):
            raise ValueError(f"unknown reorder policy {policy!r}; use 'all' or a list of permutations")
        else:
            choices = tuple(dict.fromkeys(tuple(perm) for perm in policy))
            if any(sorted(perm) != list(range(count)) for perm in choices):
                raise ValueError(f"reorder {name!r}: every candidate must be a permutation of range({count})")
        knob = ReorderSpace(count, choices)
        index = knob.decode(default if default is not None else tuple(range(count)))
        if index is None:
            raise ValueError(f"reorder {name!r}: default {default!r} is not {knob.describe()}")
        self._define(name, knob, index)

    def add_filter(self, valid: Callable[[Config], bool]) -> None:
        """A test of whole configs: one it rejects (a register tile larger than the register file) is never
        measured. The fallback is what the template built before it had a space, and is not filtered."""
        self.filters.append(valid)

    def __getitem__(self, name: str):
        if name not in self.knobs:
            raise TuningError(f"{self._where()} has no knob {name!r}; its knobs are {', '.join(self.knobs) or 'none'}")
        return self.knobs[name].entity(self._chosen[name])

    def _where(self) -> str:
        return f"template {self.template!r}" if self.template else "this template"

    def misfits(self) -> list[str]:
        """Why `values` do not fit the space the template declared: knobs it lacks, values outside a knob's space."""
        unknown = [f"it has no knob {name!r}" for name in self.values if name not in self.knobs]
        return unknown + self._outside

    # -- the space, once the template has run --

    @property
    def size(self) -> int:
        return math.prod(len(knob.choices) for knob in self.knobs.values())

    def __len__(self) -> int:
        return self.size

    def get(self, index: int) -> Config:
        """The config at `index` (0 <= index < size); the first knob varies fastest."""
        if not 0 <= index < self.size:
            raise TuningError(f"config index {index} is outside the space of {self._where()} (size {self.size})")
        choices = {}
        for name, knob in self.knobs.items():
            index, choices[name] = divmod(index, len(knob.choices))
        return Config(self, choices)

    def config(self, values: Mapping) -> Config:
        """The config `values` (knob name -> JSON value) name, knobs they leave out at their defaults; a knob the
        template lacks or a value outside its space raises TuningError."""
        choices = dict(self.defaults)
        for name, value in values.items():
            if name not in self.knobs:
                raise TuningError(f"{self._where()} has no knob {name!r}; its knobs are {', '.join(self.knobs)}")
            index = self.knobs[name].decode(value)
            if index is None:
                raise TuningError(
                    f"{name}={value!r} is outside the space of {self._where()}: {self.knobs[name].describe()}"
                )
            choices[name] = index
        return Config(self, choices)

    @property
    def fallback(self) -> Config:
        return Config(self, dict(self.defaults))

    @property
    def current(self) -> Config:
        """The config the template was built with."""
        return Config(self, dict(self._chosen))

    def valid_configs(self) -> Iterator[Config]:
        """Every config the filters accept, in index order."""
        return (config for config in map(self.get, range(self.size)) if config.valid)


class Config(Mapping):
    """One point of a space: knob name -> entity, with its index and its JSON form (what records store)."""

    def __init__(self, space: ConfigSpace, choices: dict[str, int]):
        self.space = space
        self.choices = choices

    def __getitem__(self, name: str):
        if name not in self.choices:
            raise TuningError(f"{self.space._where()} has no knob {name!r}; its knobs are {', '.join(self.choices)}")
        return self.space.knobs[name].entity(self.choices[name])

    def __iter__(self):
        return iter(self.choices)

    def __len__(self) -> int:
        return len(self.choices)

    def __eq__(self, other) -> bool:
        return isinstance(other, Config) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_json(), sort_keys=True))

    def __repr__(self) -> str:
        return f"Config({self.index}: {self.to_json()})"

    @property
    def index(self) -> int:
        index, stride = 0, 1
        for name, knob in self.space.knobs.items():
            index += self.choices[name] * stride
            stride *= len(knob.choices)
        return index

    @property
    def valid(self) -> bool:
        return all(valid(self) for valid in self.space.filters)

    def to_json(self) -> dict:
        return {name: self[name].to_json() for name in self.choices}


def run_template(template: Callable[[ConfigSpace], object], values: Mapping | Config | None = None):
    """`template(cfg)` built with `values` (a record's config), and its cfg. Values that do not fit what the template
    declares (a knob it no longer has, a value outside its space) give a TuningWarning and the fallback schedule."""
    cfg = ConfigSpace(values)
    result = template(cfg)
    problems = cfg.misfits()
    if problems:
        warnings.warn(
            f"tuning config {cfg.values} does not fit {cfg._where()} ({'; '.join(problems)}); "
            "building its default schedule instead (tune this model again to replace the record)",
            TuningWarning,
            stacklevel=2,
        )
        cfg = ConfigSpace()
        result = template(cfg)
    return result, cfg
