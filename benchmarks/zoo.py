"""Every zoo model, Tessel against onnxruntime, in one process: each model compiled for the host (and for wasm), its
outputs checked against onnxruntime's, then timed in blocks (a block of Tessel runs, a block of onnxruntime runs, a
pause, and again) in up to six columns: one thread; both runtimes' default thread counts back to back, with one run
every 50 ms, one every 200 ms, and back to back while a child process keeps one core busy; and wasm in Node against
onnxruntime-web. Prints the table (median ms Tessel / onnxruntime = ratio), each column's geometric mean and the
slowest fused groups of the worst model. Run: .venv/bin/python benchmarks/zoo.py [--models ...] [--columns ...]"""

from __future__ import annotations

import argparse
import datetime
from dataclasses import dataclass
from functools import partial

import onnxruntime as ort
from common import (
    EVEN_SPREAD,
    SETTLE_ATTEMPTS,
    SETTLE_RUNS,
    SETTLE_S,
    busy_core,
    check_close,
    geometric_mean,
    interleaved,
    onnxruntime_session,
    print_slowest,
    print_table,
    run_in_node,
    settled_cell,
    summary,
)
from cpu import machine

import compiler
from compiler import zoo

# runs of one side before the other's block. This host's speed drifts for a second or two at a time, for both sides
# alike; blocks of 10 let such a spell fall on one side's few blocks (bert_tiny and squeezenet at 2 threads, 8 cells
# each: ratio standard deviation 0.083 and 0.118 with 20 runs in blocks of 10, 0.027 and 0.041 with 30 in blocks of
# 5). Blocks of 2 time too many first runs after a pause, which onnxruntime pays more for (bert_tiny 0.68x against 0.77x)
BLOCK = 5
PAUSE_S = 0.25  # idle after each block, so neither side's spinning or warm caches carry into the other's block


@dataclass(frozen=True)
class Column:
    title: str
    one_thread: bool = False
    interval_s: float = 0.0  # idle before each timed run
    busy_core: bool = False
    wasm: bool = False


COLUMNS = {
    "1-thread": Column("1 thread", one_thread=True),
    "default": Column("default threads, back to back"),
    "every-50ms": Column("default, a run every 50 ms", interval_s=0.05),
    "every-200ms": Column("default, a run every 200 ms", interval_s=0.2),
    "busy-core": Column("default, one core busy", busy_core=True),
    "wasm": Column("wasm in Node vs onnxruntime-web", wasm=True),
}


def time_native(module, session, feeds, column: Column, repeat: int) -> tuple[float, float, float | None, int]:
    """Median milliseconds of Tessel and of onnxruntime in `column`'s call pattern, the lowest CPU speed spread seen
    while timing them and the attempts made (common.settled_cell). The busy-core column is uneven on purpose: its
    child spins on one CPU, so it is timed once and its spread is not probed (None)."""

    def time_cell(after_pause=None):
        return interleaved(
            [partial(module.run, feeds), partial(session.run, None, feeds)],
            repeat,
            block=BLOCK,
            pause_s=PAUSE_S,
            interval_s=column.interval_s,
            after_pause=after_pause,
            settle=not column.interval_s,
        )

    if column.busy_core:
        child = busy_core()
        try:
            tessel, rival = time_cell()
        finally:
            child.terminate()
            child.wait()
        spread, attempts = None, 1
    else:
        (tessel, rival), spread, attempts = settled_cell(time_cell)
    return summary(tessel)["median"], summary(rival)["median"], spread, attempts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(zoo.MODELS), choices=zoo.MODELS)
    parser.add_argument("--columns", nargs="+", default=list(COLUMNS), choices=tuple(COLUMNS))
    parser.add_argument("--repeat", type=int, default=30, help="timed runs of each side per column, after warm-up")
    parser.add_argument("--slowest", type=int, default=8, help="slowest fused groups of the worst model to list")
    arguments = parser.parse_args()
    if arguments.repeat < 1:
        parser.error("--repeat needs at least 1 timed run")
    columns = [COLUMNS[key] for key in arguments.columns]
    native = [column for column in columns if not column.wasm]

    medians: dict[tuple[str, str], tuple[float, float]] = {}
    spreads: list[float] = []  # per settled native cell: the slowest CPU's speed over the fastest's, at its lowest
    retimed = 0  # native cells timed more than once because the CPUs ran unevenly
    modules, wasm_entries, default_threads = {}, [], None
    for name in arguments.models:
        model, feeds = zoo.build_model(name), zoo.sample_input(name)
        if native:
            module = compiler.compile_model(model, target="llvm")
            default_threads = module.num_threads
            one_thread = onnxruntime_session(model, 1, spins=True)
            # onnxruntime's own defaults: a thread per core, spinning workers
            default = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            ours = module.run(feeds)
            check_close(name, [ours[spec.name] for spec in module.outputs], default.run(None, feeds))
            for column in native:
                module.num_threads = 1 if column.one_thread else default_threads
                session = one_thread if column.one_thread else default
                ours, theirs, spread, attempts = time_native(module, session, feeds, column, arguments.repeat)
                medians[name, column.title] = ours, theirs
                if spread is not None:
                    spreads.append(spread)
                retimed += attempts > 1
            module.num_threads = default_threads
            modules[name] = module
            del one_thread, default, session  # spinning workers would run through the next model's timings
        if any(column.wasm for column in columns):
            wasm_module = compiler.compile_model(model, target="wasm")
            wasm_entries.append((name, model, wasm_module, feeds))
            modules.setdefault(name, wasm_module)
    if wasm_entries:
        report = run_in_node(wasm_entries, arguments.repeat, block=BLOCK, pause_ms=PAUSE_S * 1000, settle=True)
        title = COLUMNS["wasm"].title
        for result in report["results"]:
            medians[result["name"], title] = (
                summary(result["tessel"])["median"],
                summary(result["onnxruntime_web"])["median"],
            )
        versions = report["versions"]
        wasm_caption = f", Node {versions['node']}, onnxruntime-web {versions['onnxruntime_web']} (1 thread, SIMD)"
    else:
        wasm_caption = ""

    threads = "" if default_threads is None else f", Tessel's default num_threads={default_threads} (0: every core)"
    print(f"{datetime.date.today()}, {machine()}, onnxruntime {ort.__version__}{threads}{wasm_caption}")
    print(
        f"median ms of {arguments.repeat} runs, Tessel / onnxruntime = ratio (lower is better); "
        f"blocks of {BLOCK} runs, {PAUSE_S * 1000:.0f} ms pauses, back to back after {SETTLE_RUNS} untimed runs "
        f"and {SETTLE_S * 1000:.0f} ms\n"
    )
    rows, ratios = [], {name: [] for name in arguments.models}
    for name in arguments.models:
        row = [name]
        for column in columns:
            ours, theirs = medians[name, column.title]
            ratios[name].append(ours / theirs)
            row.append(f"{ours:.2f} / {theirs:.2f} = {ours / theirs:.2f}×")
        rows.append(row)
    means = [geometric_mean([ratios[name][index] for name in arguments.models]) for index in range(len(columns))]
    rows.append(["geometric mean", *(f"{mean:.2f}×" for mean in means)])
    print_table(["model", *(column.title for column in columns)], rows)
    if spreads:
        # common.settled_cell: on a shared VM one CPU may run at half speed for seconds; such cells are timed again
        print(
            f"\nCPU speed spread (slowest CPU / fastest, probed before each native cell and in its pauses; busy-core "
            f"cells not probed): lowest per cell min {min(spreads):.2f}, median {sorted(spreads)[len(spreads) // 2]:.2f}; "
            f"{retimed} cell(s) timed again (up to {SETTLE_ATTEMPTS} attempts) because a spread fell below "
            f"{EVEN_SPREAD}, keeping the most even attempt"
        )

    worst = max(arguments.models, key=lambda name: geometric_mean(ratios[name]))
    module = modules[worst]
    where = "natively" if module.target.kind != "wasm" else "in wasmtime"
    profile = module.profile(repeat=10, feeds=zoo.sample_input(worst))
    print_slowest(f"{worst} (the worst geometric mean ratio), {where}", profile, arguments.slowest)


if __name__ == "__main__":
    main()
