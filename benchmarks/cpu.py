"""Tessel against onnxruntime natively, side by side in one process: each zoo model is compiled for the host,
its outputs checked against onnxruntime's, then the two are timed interleaved (A B A B ...) on the same input
with the same thread count. Prints a markdown table (docs/benchmarks.md keeps the latest) and the slowest
fused groups from Module.profile. Run: .venv/bin/python benchmarks/cpu.py [--threads 1] [--models ...]"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
from dataclasses import dataclass
from functools import partial

import onnxruntime as ort
from common import (
    DEFAULT_MODELS,
    check_close,
    copy_bandwidth,
    fma_peak_gflops,
    interleaved,
    model_bytes,
    onnxruntime_session,
    print_slowest,
    print_table,
    ratio,
    spread,
    summary,
)

import compiler
from compiler import zoo
from compiler.zoo import model_flops


@dataclass(frozen=True)
class IdlePolicy:
    onnxruntime_spins: bool
    # Tessel and onnxruntime with its default spinning workers, each timed alone after the interleaved runs (threads > 1)
    spinning_reference: bool
    describe: str


IDLE_POLICIES = {
    "default": IdlePolicy(
        False,
        True,
        "Tessel's pool (workers spin 300 us, then sleep), onnxruntime not spinning: its spinning workers do "
        "not go back to sleep between runs and would take the cores Tessel's runs need; onnxruntime with spinning "
        "and Tessel are then timed alone for reference",
    ),
    "spin": IdlePolicy(
        True, False, "Tessel's pool, onnxruntime spinning: interleaved, its workers hold the cores Tessel's need"
    ),
}


def machine() -> str:
    """lscpu's model name and the core count, for the tables' caption."""
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
        name = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        name = platform.processor() or platform.machine()
    return f"{name}, {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="threads for both Tessel and onnxruntime")
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=zoo.MODELS)
    parser.add_argument("--repeat", type=int, default=30, help="timed runs of each, after warm-up (at least 30)")
    parser.add_argument(
        "--idle",
        choices=tuple(IDLE_POLICIES),
        default="default",
        help="idle worker threads: "
        + "; ".join(f"{name}: {policy.describe}" for name, policy in IDLE_POLICIES.items()),
    )
    parser.add_argument("--slowest", type=int, default=5, help="slowest fused groups to list per model")
    arguments = parser.parse_args()
    threads, repeat = arguments.threads, max(30, arguments.repeat)
    policy = IDLE_POLICIES[arguments.idle]

    # Other processes may share the machine: the best of many short runs, before and after the models.
    peak, bandwidth = fma_peak_gflops(threads), copy_bandwidth(threads)

    measured, profiles, references = [], {}, []
    for name in arguments.models:
        model = zoo.build_model(name)
        module = compiler.compile_model(model, target="llvm", num_threads=threads)
        session = onnxruntime_session(model, threads, policy.onnxruntime_spins)
        feeds = zoo.sample_input(name)
        ours = module.run(feeds)
        check_close(name, [ours[spec.name] for spec in module.outputs], session.run(None, feeds))
        tessel_ms, onnxruntime_ms = interleaved([partial(module.run, feeds), partial(session.run, None, feeds)], repeat)
        tessel, rival = summary(tessel_ms), summary(onnxruntime_ms)
        measured.append((name, tessel, rival, model_flops(model), model_bytes(model)))
        profiles[name] = module.profile(repeat=10, feeds=feeds)
        if policy.spinning_reference and threads > 1:
            # Tessel first: the spinning session's workers spin from the moment it is created
            (alone,) = interleaved([partial(module.run, feeds)], repeat)
            spinning = onnxruntime_session(model, threads, spins=True)
            (rival_alone,) = interleaved([partial(spinning.run, None, feeds)], repeat)
            references.append((name, summary(alone), summary(rival_alone)))
            del spinning  # its workers would spin through the next model's runs

    peak, bandwidth = max(peak, fma_peak_gflops(threads)), max(bandwidth, copy_bandwidth(threads))
    print(
        f"{datetime.date.today()}, {machine()}, onnxruntime {ort.__version__}, {threads} thread(s), idle threads {arguments.idle}"
    )
    print(f"measured FMA peak {peak:.1f} GFLOP/s, copy bandwidth {bandwidth / 1e9:.1f} GB/s (read + written)\n")
    rows = []
    for name, tessel, rival, flops, traffic in measured:
        gflops = flops / (tessel["median"] / 1000) / 1e9
        floor = ""
        if name == "dwconv_block":
            floor_ms = traffic / bandwidth * 1000
            floor = f"{floor_ms:.2f} ms ({ratio(tessel['median'], floor_ms)})"
        rows.append(
            [
                name,
                spread(tessel),
                spread(rival),
                ratio(tessel["median"], rival["median"]),
                f"{gflops:.1f}",
                f"{100 * gflops / peak:.0f}%",
                floor,
            ]
        )
    print_table(
        [
            "model",
            "Tessel ms (median / min / max)",
            "onnxruntime ms (median / min / max)",
            "Tessel / onnxruntime",
            "Tessel GFLOP/s",
            "% of FMA peak",
            "bandwidth floor (Tessel ×)",
        ],
        rows,
    )
    if references:
        print("\nEach timed alone (not interleaved), onnxruntime with its spinning workers, for reference:")
        for name, tessel, rival in references:
            print(
                f"- {name}: Tessel {tessel['median']:.2f} ms, onnxruntime {rival['median']:.2f} ms (medians), "
                + ratio(tessel["median"], rival["median"])
            )
    for name, profile in profiles.items():
        print_slowest(name, profile, arguments.slowest)


if __name__ == "__main__":
    main()
