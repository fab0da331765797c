"""Tuning records: JSON lines, one measurement each ({"task", "config", "seconds", ...}, docs/modules.md). This reads
the best config per task key (tune/task.py) out of a file; compile_model builds each group with it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from compiler.errors import TuningError
from compiler.schedules import family
from compiler.schedules.cpu import SPACE_VERSION
from compiler.tune.space import TuningWarning
from compiler.tune.task import canonical

TASK_FIELDS = ("template", "workload", "target", "space_version")


def _space_version(task: dict) -> int | None:
    """The space version of the schedule family the task's target kind uses (None for a malformed target)."""
    target = task["target"]
    kind = target.get("kind") if isinstance(target, dict) else None
    return family(kind).SPACE_VERSION if isinstance(kind, str) else None


def load_records(path: str | Path) -> dict[str, dict]:
    """The fastest measured config per task key. Records of failed measurements (no seconds) are skipped; records
    whose task is of another space version or an older form (before tasks named their template) no longer apply,
    and one TuningWarning counts them."""
    path = Path(path)
    if not path.is_file():
        raise TuningError(f"cannot read tuning records {path}: no such file")
    best: dict[str, tuple[float, dict]] = {}
    stale = 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            task, config, seconds = dict(record["task"]), dict(record["config"]), record.get("seconds")
            seconds = None if seconds is None else float(seconds)
        except (ValueError, KeyError, TypeError) as error:
            raise TuningError(
                f'tuning records {path} line {number} is not a record ({{"task": {{{", ".join(TASK_FIELDS)}}}, '
                f'"config", "seconds", ...}}): {error}'
            ) from None
        if any(name not in task for name in TASK_FIELDS) or task["space_version"] != _space_version(task):
            stale += 1
            continue
        if seconds is None:
            continue
        key = canonical(task)
        if key not in best or seconds < best[key][0]:
            best[key] = (seconds, config)
    if stale:
        warnings.warn(
            f"{stale} tuning record(s) in {path} were written for another version of the schedule spaces (this "
            f"compiler's is {SPACE_VERSION}) and no longer apply; tune the model again to replace them",
            TuningWarning,
            stacklevel=2,
        )
    return {key: config for key, (_, config) in best.items()}
