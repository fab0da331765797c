"""What `tessel tune` shows: a live display while a model tunes (the current task, trials, best GFLOP/s, the model's
estimated time, ETA), and the report of a finished log (each task's default against its best, and the search curves
as a PNG). It reads tune/records.py's logs and tune/tuners.py's Progress; cli.py drives it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from compiler.errors import TesselError
from compiler.tune.measure import flops
from compiler.tune.records import applies, read_records
from compiler.tune.task import canonical


def _milliseconds(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.4g} ms"


def _gflops(flops: int | None, seconds: float | None) -> str:
    return "-" if not flops or not seconds else f"{flops / seconds / 1e9:.2f}"


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}"


class Display:
    """Progress of a tuning run: a rich live panel on a terminal, one line per measured batch elsewhere (a log file,
    a test). `measured` is the Measurer callback (each result), `progress` the tuner's (each batch)."""

    def __init__(self, tasks, console=None):
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self.tasks = tasks
        self.started = time.monotonic()
        self.errors = 0
        self.measured_count = 0
        self.state = None
        self.live = None
        self.flops: dict[str, int] = {}

    def __enter__(self) -> Display:
        if self.console.is_terminal:
            from rich.live import Live

            self.live = Live(self._panel(), console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.update(self._panel())
            self.live.__exit__(*exc)

    def measured(self, task, result) -> None:
        self.measured_count += 1
        self.errors += result.error is not None
        if self.live is not None:
            self.live.update(self._panel())

    def progress(self, report) -> None:
        self.state = report
        if self.live is not None:
            self.live.update(self._panel())
        else:
            self.console.print(self._line(), highlight=False, soft_wrap=True)

    def _numbers(self) -> dict:
        report = self.state
        elapsed = time.monotonic() - self.started
        numbers = {"elapsed": _duration(elapsed), "task": "-", "trials": "-", "best": "-", "model": "-", "eta": "-"}
        if report is None:
            return numbers

        task = report.task
        if task.key not in self.flops:
            self.flops[task.key] = flops(task)
        numbers["task"] = f"{report.task_number}/{report.task_count} {task.template} ({'+'.join(task.ops)})"
        numbers["trials"] = f"{report.trials}/{report.budget} of this task"
        gflops = _gflops(self.flops[task.key], report.best_seconds)
        numbers["best"] = f"{gflops} GFLOP/s ({_milliseconds(report.best_seconds)})"
        if report.model_trials is not None:
            numbers["trials"] += f", {report.model_trials}/{report.model_budget} in all"
            numbers["model"] = _milliseconds(report.estimated_seconds)
            if report.model_trials:
                left = max(0, report.model_budget - report.model_trials)
                numbers["eta"] = _duration(elapsed / report.model_trials * left)
        return numbers

    def _line(self) -> str:
        numbers = self._numbers()
        return (
            f"[{numbers['elapsed']}] task {numbers['task']}: trials {numbers['trials']}, best {numbers['best']}, "
            f"model ~{numbers['model']}, {self.errors} failed, ETA {numbers['eta']}"
        )

    def _panel(self):
        from rich.table import Table

        numbers = self._numbers()
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        table.add_row("task", numbers["task"])
        table.add_row("trials", f"{numbers['trials']} ({self.errors} failed of {self.measured_count} measured)")
        table.add_row("best", numbers["best"])
        table.add_row("model, estimated", numbers["model"])
        table.add_row("elapsed / ETA", f"{numbers['elapsed']} / {numbers['eta']}")
        return table


# -- the report of a log ----------------------------------------------------------------------------------------------


@dataclass
class TaskSummary:
    """One task of a log: its template and ops, its fallback's seconds, its best (once confirmed: the config a
    compile gets, the fallback when nothing was confirmed faster), and the seconds of every trial in the order they
    were measured (None for failures)."""

    template: str
    ops: list[str]
    target: str
    flops: int | None
    default_seconds: float | None = None
    best_seconds: float | None = None
    best_config: dict | None = None
    curve: list[float | None] = field(default_factory=list)
    errors: int = 0
    confirmed: bool = False  # default and best are the medians of a confirmation's rounds (Measurer.confirm)

    @property
    def speedup(self) -> float | None:
        if self.default_seconds and self.best_seconds:
            return self.default_seconds / self.best_seconds
        return None


def summarize(path: str | Path) -> list[TaskSummary]:
    """The tasks of a log, in the order they were first measured (records that no longer apply left out)."""
    summaries: dict[str, TaskSummary] = {}
    for record in read_records(path):
        task = record["task"]
        if not applies(task):
            continue
        key = canonical(task)
        if key not in summaries:
            ops = [member["op"] for member in task["workload"].get("ops", [])]
            summaries[key] = TaskSummary(task["template"], ops, task["target"]["kind"], record.get("flops"))
        summary = summaries[key]
        seconds = record["seconds"]
        if "confirmation" in record:
            # a confirmation's medians replace the search's single times: its chosen config is what a compile gets
            summary.confirmed = True
            if record.get("fallback"):
                summary.default_seconds = seconds
            if record.get("chosen"):
                summary.best_seconds, summary.best_config = seconds, record["config"]
            continue
        summary.curve.append(seconds)
        summary.errors += seconds is None
        if summary.confirmed:
            continue
        if record.get("fallback") and seconds is not None:
            summary.default_seconds = seconds
        if seconds is not None and (summary.best_seconds is None or seconds < summary.best_seconds):
            summary.best_seconds, summary.best_config = seconds, record["config"]
    return list(summaries.values())


def report_lines(summaries: list[TaskSummary]) -> list[str]:
    rows = [("task", "ops", "trials", "failed", "default", "best", "speedup", "GFLOP/s", "best config")]
    for number, summary in enumerate(summaries, 1):
        speedup = summary.speedup
        rows.append(
            (
                f"{number} {summary.template}",
                "+".join(summary.ops),
                str(len(summary.curve)),
                str(summary.errors),
                _milliseconds(summary.default_seconds),
                _milliseconds(summary.best_seconds),
                "-" if speedup is None else f"{speedup:.2f}x",
                _gflops(summary.flops, summary.best_seconds),
                "-" if summary.best_config is None else str(summary.best_config),
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def plot_curves(summaries: list[TaskSummary], path: str | Path) -> Path:
    """Best seconds so far against trials, one line per task (relative to its default where it has one), to PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError:
        raise TesselError("plotting needs matplotlib: pip install 'tessel[tune]'") from None
    figure, axes = pyplot.subplots(figsize=(8, 5))
    for number, summary in enumerate(summaries, 1):
        best, points = math.inf, []
        for seconds in summary.curve:
            best = min(best, seconds if seconds is not None else math.inf)
            points.append(best / summary.default_seconds if summary.default_seconds else best)
        if any(math.isfinite(point) for point in points):
            axes.plot(range(1, len(points) + 1), points, label=f"{number} {summary.template}")
    axes.set_xlabel("trials")
    axes.set_ylabel("best time so far / default time")
    axes.set_title("tuning curves")
    axes.grid(True, alpha=0.3)
    if summaries:
        axes.legend(fontsize="small")
    path = Path(path)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    pyplot.close(figure)
    return path
