"""The seeds' depthwise-convolution study (issue 12 §6) on a GPU target: filter 256x1x3x3, stride 1, pad same.

1. The (num_thread_y, num_thread_x) grid on 1x256x32x32 with 32x32 blocking, and the vthread choices on 1x256x96x96
   with 32x32 blocking, as tables of microseconds like the seeds' (their GTX 1080: (4, 32) best at 32x32, 8.8 µs;
   (8, 16) with vthread (1, 2) best at 96x96, 90.9 µs). The grid again as a tuning task (1b): its configs measured by
   the tuner's Measurer into a tuning log and the best confirmed against the template's fallback.
2. depthwise + scale_shift + relu fused into one kernel, against depthwise alone and against the three ops as separate
   kernels (the seeds: 91.5 against 90.9 µs fused / alone).

Each case is a model compiled by compile_model, its depthwise group built by schedules/gpu.py's template with the
row's knob values (given as a tuning record), checked against the reference executor, then timed kernel by kernel
on device-resident buffers (Module.replay: one dispatch at a time, waited for): interleaved rounds, medians. Nothing
here is part of the compiler; the tables go to docs/gpu.md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
from common import print_table

from compiler import compile_model
from compiler.errors import TuningError
from compiler.graph.ir import Graph, TensorType
from compiler.graph.reference import run_reference
from compiler.target import Target
from compiler.tune.task import extract_tasks

RNG = np.random.default_rng(0)
THREADS = (1, 2, 4, 8, 16, 32)
# the seeds' vthread table: thread shapes and (vthread_y, vthread_x) pairs
VTHREAD_ROWS = ((8, 8, 1, 1), (8, 8, 1, 2), (8, 16, 1, 1), (8, 16, 1, 2), (4, 32, 1, 1), (4, 32, 2, 1), (8, 8, 2, 2))


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("x"))


def _graph(shape, epilogue: str) -> tuple[Graph, dict]:
    """One model of the study: the depthwise conv (`epilogue` "none"), it with scale_shift and relu ("fused"), or one
    of the separate ops on the conv's output ("scale_shift", "relu")."""
    channels = shape[1]
    graph = Graph()
    x = graph.add_input("x", TensorType(shape, "float32"))
    if epilogue in ("none", "fused"):
        weight = graph.add_param("filter", RNG.standard_normal((channels, 1, 3, 3)).astype(np.float32))
        (y,) = graph.add_node("Conv", [x, weight], {"group": channels, "pads": [1, 1, 1, 1]})
    else:
        y = x
    if epilogue in ("fused", "scale_shift"):
        (y,) = graph.add_node("Mul", [y, graph.add_param("scale", RNG.random((channels, 1, 1)).astype(np.float32))])
        (y,) = graph.add_node("Add", [y, graph.add_param("shift", RNG.random((channels, 1, 1)).astype(np.float32))])
    if epilogue in ("fused", "relu"):
        (y,) = graph.add_node("Relu", [y])
    graph.outputs = [y]
    return graph, {"x": RNG.standard_normal(shape).astype(np.float32)}


class Case:
    """One model of the study compiled for the target (compile_model, its depthwise group built with `config`
    through a tuning record), checked against the reference executor; `seconds` times its kernels on the device."""

    def __init__(self, shape, epilogue: str, target: Target, config: dict | None, records: Path):
        graph, self.feeds = _graph(shape, epilogue)
        path = None
        if config:
            (task,) = extract_tasks(graph, target)
            try:
                valid = task.space.config(config).valid
            except TuningError as error:
                raise ValueError(str(error)) from None
            if not valid:
                raise ValueError(f"config {config} exceeds {target}'s threads per block or shared memory")
            path = records / f"{len(list(records.iterdir()))}.jsonl"
            path.write_text(json.dumps({"task": task.to_json(), "config": config, "seconds": 1.0}) + "\n")
        self.module = compile_model(graph, target, tuning_records=path)
        (actual,) = self.module.run(self.feeds).values()
        (expected,) = run_reference(graph, self.feeds).values()
        if not np.allclose(actual, expected, rtol=1e-4, atol=1e-4):
            error = float(np.max(np.abs(actual - expected)))
            raise SystemExit(
                f"{epilogue} {config}: the kernel disagrees with the reference ({error:.3g}); not timing it"
            )

    def seconds(self, repeat: int) -> float:
        """Seconds of the model's kernels, each the median of `repeat` dispatches on device-resident buffers, one at
        a time (Module.replay)."""
        _, times = self.module.replay(self.feeds, repeat)
        return sum(statistics.median(samples) for samples in times) / 1000


def interleaved_seconds(cases: list[Case], rounds: int, repeat: int) -> list[float]:
    """Median seconds of each case over `rounds` rounds of A, B, C..., each the median of `repeat` dispatches (one
    warm-up round first)."""
    for case in cases:
        case.seconds(1)
    samples = [[] for _ in cases]
    for _ in range(rounds):
        for case, values in zip(cases, samples):
            values.append(case.seconds(repeat))
    return [statistics.median(values) for values in samples]


def _device(target: Target) -> str:
    """The device the kernels run on, as its runtime names it (OpenCL's device, WebGPU's adapter)."""
    runtime = importlib.import_module(f"compiler.runtime.{target.kind}")
    if hasattr(runtime, "device_name"):
        return runtime.device_name()
    if hasattr(runtime, "device"):
        info = runtime.device().adapter.info
        return ", ".join(str(info[key]) for key in ("device", "description", "backend_type") if info.get(key))
    return str(target)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}"


def thread_grid(args, target: Target, records: Path) -> None:
    shape = _shape(args.grid_shape)
    threads = [count for count in args.threads if count <= 32]
    configs = {}
    for threads_y in threads:
        for threads_x in threads:
            config = {"blocking_h": 32, "blocking_w": 32, "num_thread_y": threads_y, "num_thread_x": threads_x}
            try:
                configs[threads_y, threads_x] = Case(shape, "none", target, config, records)
            except ValueError:
                continue  # over the device's threads per block, or not dividing the blocking
    times = dict(zip(configs, interleaved_seconds(list(configs.values()), args.rounds, args.repeat)))
    best = min(times, key=times.get)
    print(f"\n1. (num_thread_y, num_thread_x) on {args.grid_shape}, blocking 32x32, µs per launch (best {best}):\n")
    rows = []
    for threads_y in threads:
        cells = [_us(times[threads_y, x]) if (threads_y, x) in times else "-" for x in threads]
        rows.append([str(threads_y), *cells])
    print_table(["num_thread_y \\ x", *map(str, threads)], rows)


def thread_task(args, target: Target, records: Path) -> None:
    """The same grid as a tuning task: the grid shape's depthwise task (tune/task.py), each (num_thread_y,
    num_thread_x) at blocking 32x32 a config of its space, measured by tune/measure.py's Measurer (a worker process,
    outputs checked against the fallback's) into a tuning log, the three fastest then confirmed against the template's
    fallback (Measurer.confirm, interleaved rounds). The log is what `tessel tune --target opencl --tuner grid` writes
    and `tessel compile --records` applies."""
    from compiler.tune.measure import Measurer
    from compiler.tune.records import RecordLog, load_records

    graph, _ = _graph(_shape(args.grid_shape), "none")
    (task,) = extract_tasks(graph, target)
    threads = [count for count in args.threads if count <= 32]
    configs = {}
    for threads_y in threads:
        for threads_x in threads:
            config = task.space.config(
                {"blocking_h": 32, "blocking_w": 32, "num_thread_y": threads_y, "num_thread_x": threads_x}
            )
            if config.valid:
                configs[threads_y, threads_x] = config
    log_path = args.log or records / "grid-task.jsonl"
    with RecordLog(log_path) as log, Measurer(task, target, records=log, timeout=args.timeout) as measurer:
        results = dict(zip(configs, measurer.measure(list(configs.values()))))
        fastest = sorted((result.seconds, pair) for pair, result in results.items() if result.seconds is not None)
        confirmation = measurer.confirm([configs[pair] for _, pair in fastest[:3]])
    print(f"\n1b. the grid as a tuning task ({task.template}, {len(task.space)} configs in its space): µs per call")
    print("    through the tuning Measurer (transfers included, min of its repeats), log " + str(log_path) + ":\n")
    rows = []
    for threads_y in threads:
        cells = []
        for threads_x in threads:
            result = results.get((threads_y, threads_x))
            cells.append("-" if result is None else _us(result.seconds) if result.seconds else "failed")
        rows.append([str(threads_y), *cells])
    print_table(["num_thread_y \\ x", *map(str, threads)], rows)
    fallback = task.space.fallback.to_json()
    if confirmation is not None:
        chosen = confirmation.chosen.to_json()
        print(
            f"fallback {fallback}: {_us(confirmation.fallback_seconds or 0)} µs; confirmed choice {chosen}: "
            f"{_us(confirmation.chosen_seconds or 0)} µs (medians of the confirmation's rounds); a compile with the "
            f"log gets {load_records(log_path)[task.key]}"
        )


def vthread_table(args, target: Target, records: Path) -> dict:
    shape = _shape(args.vthread_shape)
    cases, names = [], []
    for threads_y, threads_x, vthread_y, vthread_x in VTHREAD_ROWS:
        config = {"blocking_h": 32, "blocking_w": 32, "num_thread_y": threads_y, "num_thread_x": threads_x}
        config |= {"vthread_y": vthread_y, "vthread_x": vthread_x}
        try:
            cases.append(Case(shape, "none", target, config, records))
        except ValueError:
            continue
        names.append(config)
    times = interleaved_seconds(cases, args.rounds, args.repeat)
    print(f"\n2. vthreads on {args.vthread_shape}, blocking 32x32, µs per launch:\n")
    rows = [
        [str(c["num_thread_y"]), str(c["num_thread_x"]), str(c["vthread_y"]), str(c["vthread_x"]), _us(seconds)]
        for c, seconds in zip(names, times)
    ]
    print_table(["num_thread_y", "num_thread_x", "vthread_y", "vthread_x", "µs"], rows)
    return names[times.index(min(times))]


def fusion_table(args, target: Target, records: Path, config: dict) -> None:
    shape = _shape(args.vthread_shape)
    fused = Case(shape, "fused", target, config, records)
    alone = Case(shape, "none", target, config, records)
    scale_shift = Case(shape, "scale_shift", target, None, records)
    relu = Case(shape, "relu", target, None, records)
    fused_s, alone_s, scale_shift_s, relu_s = interleaved_seconds(
        [fused, alone, scale_shift, relu], args.rounds, args.repeat
    )
    separate_s = alone_s + scale_shift_s + relu_s
    print(f"\n3. fusion on {args.vthread_shape} with {config}, µs per launch:\n")
    rows = [
        ["depthwise + scale_shift + relu, one kernel", _us(fused_s), "1.00×"],
        ["depthwise alone", _us(alone_s), f"{alone_s / fused_s:.2f}×"],
        ["three kernels (depthwise, scale_shift, relu)", _us(separate_s), f"{separate_s / fused_s:.2f}×"],
    ]
    print_table(["kernels", "µs", "over fused"], rows)
    print(f"fused / alone = {fused_s / alone_s:.2f} (the seeds: 1.01); separate / fused = {separate_s / fused_s:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="opencl", help="opencl, webgpu or cuda")
    parser.add_argument("--grid-shape", default="1x256x32x32")
    parser.add_argument("--vthread-shape", default="1x256x96x96")
    parser.add_argument("--threads", type=int, nargs="+", default=list(THREADS), help="num_thread values to try")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians over them")
    parser.add_argument("--repeat", type=int, default=10, help="dispatches timed per kernel and round")
    parser.add_argument("--skip", nargs="*", default=[], choices=["grid", "task", "vthread", "fusion"])
    parser.add_argument("--log", type=Path, help="the grid task's tuning log (default: a temporary file)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a candidate may take (its compile too)")
    args = parser.parse_args()
    target = Target.parse(args.target)
    if not target.is_gpu:
        raise SystemExit(f"--target must be a GPU target (webgpu, opencl, cuda), not {target}")
    print(f"depthwise study on {_device(target)} ({target}); µs per kernel dispatch, medians of {args.rounds} rounds")
    best = {"blocking_h": 32, "blocking_w": 32, "num_thread_y": 8, "num_thread_x": 16, "vthread_y": 1, "vthread_x": 2}
    with tempfile.TemporaryDirectory() as folder:
        records = Path(folder)
        if "grid" not in args.skip:
            thread_grid(args, target, records)
        if "task" not in args.skip:
            thread_task(args, target, records)
        if "vthread" not in args.skip:
            best = vthread_table(args, target, records)
        if "fusion" not in args.skip:
            fusion_table(args, target, records, best)


if __name__ == "__main__":
    main()
