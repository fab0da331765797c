"""Tuning records: JSON lines, one measurement each ({"task", "config", "seconds", "error", ...}, docs/modules.md).
This reads the best config per task key (tune/task.py) out of a file, which compile_model builds each group with, and
writes the log a tuning run appends to (and resumes from)."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

from compiler.errors import TuningError
from compiler.schedules import space_version
from compiler.schedules.space import TuningWarning
from compiler.tune.task import canonical
from compiler.version import COMPILER_VERSION

TASK_FIELDS = ("template", "workload", "target", "space_version")


def _space_version(target) -> int | None:
    """The current space version of a record's target (its JSON: Target.to_json)."""
    return space_version(target.get("kind", "")) if isinstance(target, dict) else None


def read_records(path: str | Path, truncated_tail: bool = False) -> list[dict]:
    """Every record of a file, each {"task", "config", "seconds" (None for a failed measurement), ...}, in order; a
    line that is not a record is a TuningError naming the file and line.
    With `truncated_tail`, a last line without its newline that does not parse (a run killed while writing it) is
    left out instead."""
    path = Path(path)
    if not path.is_file():
        raise TuningError(f"cannot read tuning records {path}: no such file")
    text = path.read_text()
    lines = text.splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            record["task"], record["config"] = dict(record["task"]), dict(record["config"])
            seconds = record.get("seconds")
            record["seconds"] = None if seconds is None else float(seconds)
        except (ValueError, KeyError, TypeError) as error:
            if truncated_tail and number == len(lines) and not text.endswith("\n"):
                break
            raise TuningError(
                f'tuning records {path} line {number} is not a record ({{"task": {{{", ".join(TASK_FIELDS)}}}, '
                f'"config", "seconds", ...}}): {error}'
            ) from None
        records.append(record)
    return records


def applies(task: dict) -> bool:
    """Whether a record's task is of this compiler's form and space version."""
    return all(name in task for name in TASK_FIELDS) and task["space_version"] == _space_version(task["target"])


def best_records(records: list[dict]) -> dict[str, dict]:
    """The record a compile uses per task key, among those that apply: the latest one a confirmation chose
    ("chosen", Measurer.confirm: the fallback unless a config was confirmed faster over interleaved rounds); for a
    task never confirmed (a log from before confirmations, or a run stopped before its end), the fastest successful
    one."""
    best: dict[str, dict] = {}
    chosen: dict[str, dict] = {}
    for record in records:
        if record["seconds"] is None or not applies(record["task"]):
            continue
        key = canonical(record["task"])
        if record.get("chosen"):
            chosen[key] = record
        elif "confirmation" not in record and (key not in best or record["seconds"] < best[key]["seconds"]):
            best[key] = record
    return {**best, **chosen}


def load_records(path: str | Path) -> dict[str, dict]:
    """The config per task key that best_records picks. Records of failed measurements (no seconds) are skipped; records
    whose task is of another space version or an older form (before tasks named their template) no longer apply,
    and one TuningWarning counts them."""
    records = read_records(path)
    stale = sum(not applies(record["task"]) for record in records)
    if stale:
        warnings.warn(
            f"{stale} tuning record(s) in {path} were written for another version of the schedule spaces than this "
            "compiler's and no longer apply; tune the model again to replace them",
            TuningWarning,
            stacklevel=2,
        )
    return {key: record["config"] for key, record in best_records(records).items()}


def config_key(config: dict) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


class RecordLog:
    """A tuning log being written: one JSON line per measurement, appended and flushed as it is known, so a run
    stopped at any point (Ctrl-C) leaves whole lines. Opening an existing log resumes it: `done[task key][config
    key]` holds its records, which a Measurer returns instead of measuring again."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.version = COMPILER_VERSION
        self.done: dict[str, dict[str, dict]] = {}
        if self.path.is_file():
            records = read_records(self.path, truncated_tail=True)
            text = self.path.read_text()
            if text and not text.endswith("\n"):
                # drop a truncated last line, so appended lines start on a line of their own
                self.path.write_text(text[: text.rfind("\n") + 1])
            for record in records:
                if applies(record["task"]):
                    self.done.setdefault(canonical(record["task"]), {})[config_key(record["config"])] = record
        try:
            self.file = open(self.path, "a")
        except OSError as error:
            raise TuningError(f"cannot write tuning log {self.path}: {error.strerror or error}") from None

    def write(self, task: dict, config: dict, seconds: float | None, error: str | None, **extra) -> dict:
        record = {
            "task": task,
            "config": config,
            "seconds": seconds,
            "error": error,
            **extra,
            "version": self.version,
            "timestamp": time.time(),
        }
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        self.done.setdefault(canonical(task), {})[config_key(config)] = record
        return record

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> RecordLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
