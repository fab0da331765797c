"""`tessel tune`'s run: a model's tasks (task.py) searched by tune_model (tuners.py) through Measurers (measure.py,
or Ray's in ray_runner.py) that append every measurement to a log (records.py) and report to the live display
(report.py). A stopped run (Ctrl-C) leaves a valid log; the same command resumes it."""

from __future__ import annotations

import warnings
from pathlib import Path

from compiler.errors import TuningError
from compiler.schedules.space import TuningWarning
from compiler.target import Target
from compiler.tune import report
from compiler.tune.cost_model import pretrain_records
from compiler.tune.measure import LocalBuilder, LocalRunner, Measurer, MeasureResult
from compiler.tune.ray_runner import ray_measuring
from compiler.tune.records import RecordLog, read_records
from compiler.tune.task import Task, extract_tasks
from compiler.tune.tuners import tune_model

INTERRUPTED = 130


def history(tasks: list[Task], log: RecordLog) -> dict[str, list[MeasureResult]]:
    """The measurements a resumed log holds for each task, as results of its space (a tuner's `history`)."""
    known: dict[str, list[MeasureResult]] = {}
    misfits = 0
    for task in tasks:
        for record in log.done.get(task.key, {}).values():
            try:
                config = task.space.config(record["config"])
            except TuningError:
                misfits += 1
                continue
            result = MeasureResult(config, record["seconds"], record.get("error"), record.get("build_seconds", 0.0))
            known.setdefault(task.key, []).append(result)
    if misfits:
        warnings.warn(
            f"{misfits} record(s) in {log.path} do not fit their template any more and are measured afresh",
            TuningWarning,
            stacklevel=2,
        )
    return known


def pretrained_on(logs: list[Path], tasks: list[Task]):
    """A cost model pretrained on the records of other tuning logs (cost_model.pretrain_records), leaving out the
    tasks being tuned so that their own old measurements do not stand in for the search; None when the logs hold no
    task with two measurements."""
    records = [record for log in logs for record in read_records(log)]
    model = pretrain_records(records, exclude=[task.key for task in tasks])
    if model is None:
        print(f"--transfer: {', '.join(map(str, logs))} hold no other task with two measurements; tuning cold")
    return model


def _tune(tasks, target, log, model, trials, tuner, early_stopping, ray, workers, timeout, repeat, threads, transfer):
    known = history(tasks, log)
    resumed = sum(len(results) for results in known.values())
    print(f"tuning {model} for {target}: {len(tasks)} tasks, {trials} trials, tuner {tuner}, log {log.path}")
    if resumed:
        print(f"resuming: {resumed} measurements already in the log are not repeated")
    if ray is not None:
        builder, runner = ray_measuring(ray)
    else:
        builder, runner = LocalBuilder(workers), LocalRunner()
    options = {"pretrained": pretrained_on(transfer, tasks)} if transfer else {}
    display = report.Display(tasks)

    def measurer(task: Task) -> Measurer:
        return Measurer(
            task, target, runner, repeat, timeout=timeout, builder=builder, records=log, callbacks=[display.measured],
            num_threads=threads,
        )  # fmt: skip

    try:
        with display:
            return tune_model(
                tasks, measurer, trials, tuner=tuner, early_stopping=early_stopping, callbacks=[display.progress],
                history=known, **options,
            )  # fmt: skip
    finally:
        builder.close()
        runner.close()


def tune_file(
    model: Path,
    target: str,
    output: Path,
    trials: int,
    tuner: str = "xgb",
    input_shapes: dict | None = None,
    early_stopping: int | None = None,
    ray: str | None = None,
    workers: int | None = None,
    timeout: float = 10.0,
    repeat: int = 3,
    threads: int | None = None,
    transfer: list[Path] | None = None,
) -> int:
    target = Target.parse(target)
    if trials < 1:
        raise TuningError(f"--trials must be at least 1, not {trials}")
    if transfer and tuner != "xgb":
        raise TuningError(f"--transfer warm-starts the xgb tuner's cost model; tuner {tuner!r} has none")
    tasks = extract_tasks(str(model), target, input_shapes)
    try:
        with RecordLog(output) as log:
            results = _tune(
                tasks, target, log, model, trials, tuner, early_stopping, ray, workers, timeout, repeat, threads,
                transfer,
            )  # fmt: skip
    except KeyboardInterrupt:
        print(f"\ninterrupted: {output} holds every finished measurement; run the same command to resume")
        return INTERRUPTED
    default = sum(r.task.weight * (r.default_seconds or 0.0) for r in results)
    tuned = sum(r.task.weight * (r.chosen_seconds or r.default_seconds or 0.0) for r in results)
    print("\n".join(report.report_lines(report.summarize(output))))
    confirmed = [r for r in results if r.confirmation is not None]
    if confirmed:
        changed = sum(r.chosen_config != r.task.space.fallback for r in confirmed)
        print(
            f"confirmed against their defaults in interleaved rounds: {changed} of {len(confirmed)} tasks get a tuned "
            "config, the others keep their defaults (nothing was confirmed faster)"
        )
    if tuned:
        print(
            f"tuned kernels, weighted by their groups: {default * 1e3:.4g} ms by default, {tuned * 1e3:.4g} ms tuned "
            f"({default / tuned:.2f}x); compile with: tessel compile {model} --target '{target}' --records {output}"
        )
    return 0
