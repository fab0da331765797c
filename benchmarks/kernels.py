"""Per kernel, Tessel against onnxruntime on one model: each Tessel fused group's milliseconds (Module.profile) beside
the onnxruntime nodes that compute the same part of the graph (onnxruntime's own per-node profile, enable_profiling),
at the same thread count, in interleaved rounds. Prints the groups that lose the most first, with their shapes and
windows, so a slow template shows as one row. Run: .venv/bin/python benchmarks/kernels.py MODEL [--threads 1]
(MODEL: a zoo model's name or an .onnx file's path).

onnxruntime's profiler slows each node it times (shufflenet_v2, 1 thread: 172 nodes, 1.12 ms of node time in a
profiled run against 0.79 ms for a whole run unprofiled), so each node's time is also given less the mean overhead
per node (its profiled node total less an unprofiled run, over its node count): a lower bound of the node's time."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from common import onnxruntime_session, print_table
from cpu import machine

import compiler
from compiler import zoo
from compiler.frontend.onnx import load_onnx
from compiler.passes.pipeline import optimize
from compiler.target import Target

WARMUP = 3  # untimed runs of the profiled session


def load(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A zoo model and its sample input, or an .onnx file and random float inputs of its static shapes."""
    if name in zoo.MODELS:
        return zoo.build_model(name), zoo.sample_input(name)
    model = onnx.load(name)
    initializers = {tensor.name for tensor in model.graph.initializer}
    rng = np.random.default_rng(0)
    feeds = {}
    for value in model.graph.input:
        if value.name not in initializers:
            shape = [dim.dim_value for dim in value.type.tensor_type.shape.dim]
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    return model, feeds


def tessel_groups(model: onnx.ModelProto, target: str) -> tuple[dict[str, str], dict[str, str]]:
    """Each ONNX node's name -> the Tessel fused group that computes it, and each group's description. Fusion keeps
    the member nodes' names; a node the passes removed (a batch norm folded into its conv, an Identity) goes with
    the group of its first input's producer."""
    fused = optimize(load_onnx(model), target=Target.parse(target))
    group = {member.name: node.name for node in fused.nodes for member in node.attrs["body"].nodes}
    producer = {output: node for node in model.graph.node for output in node.output}
    found: dict[str, str] = {}
    for node in model.graph.node:
        seen = node
        while seen is not None and seen.name not in group:
            seen = next((producer[i] for i in seen.input if i in producer), None)
        found[node.name] = group[seen.name] if seen is not None else "(none)"
    return found, {node.name: describe(node) for node in fused.nodes}


def describe(node) -> str:
    """A fused group's first input and output shapes, and its anchor's window (kernel, stride, groups)."""

    def shape(value) -> str:
        return "x".join(str(d) for d in value.type.shape)

    text = f"{shape(node.inputs[0])} -> {shape(node.outputs[0])}"
    for member in node.attrs["body"].nodes:
        attrs = member.attrs
        if "kernel_shape" in attrs:
            kernel = "x".join(str(k) for k in attrs["kernel_shape"])
            text += f" k{kernel} s{attrs.get('strides', [1])[0]}"
            text += f" g{attrs['group']}" if attrs.get("group", 1) != 1 else ""
    return text


class ProfiledSession:
    """onnxruntime with per-node profiling, its nodes matched to Tessel's groups: by name (a fused node keeps its
    last member's name, an NCHWc one adds "_nchwc"), or, for a node onnxruntime made itself (a layout reorder), as
    the group of its input's producer."""

    def __init__(self, model: onnx.ModelProto, threads: int, feeds, groups: dict[str, str]):
        directory = Path(tempfile.mkdtemp(prefix="kernels_"))
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(directory / "optimized.onnx")
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(options.optimized_model_filepath)
        producer = {output: node for node in optimized.graph.node for output in node.output}

        def owner(node) -> str:
            while node is not None:
                for name in (node.name, node.name.removesuffix("_nchwc")):
                    if name in groups:
                        return groups[name]
                node = next((producer[i] for i in node.input if i in producer), None)
            return "(unmatched)"

        self.owners = {node.name: owner(node) for node in optimized.graph.node}
        self.covered: dict[str, list[str]] = defaultdict(list)
        for node in optimized.graph.node:
            self.covered[self.owners[node.name]].append(node.op_type)
        options.enable_profiling = True
        options.profile_file_prefix = str(directory / "profile")
        options.optimized_model_filepath = ""
        self.session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        self.feeds = feeds
        for _ in range(WARMUP):
            self.session.run(None, feeds)

    def run(self, count: int) -> None:
        for _ in range(count):
            self.session.run(None, self.feeds)

    def medians(self) -> tuple[dict[str, float], int]:
        """Each group's median onnxruntime ms per run, and the nodes timed per run."""
        events = json.loads(Path(self.session.end_profiling()).read_text())
        per_run: dict[tuple[int, str], float] = defaultdict(float)
        runs: dict[str, int] = defaultdict(int)
        for event in events:
            if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
                continue
            node = event["name"].removesuffix("_kernel_time")
            per_run[runs[node], self.owners.get(node, "(unmatched)")] += event["dur"] / 1000
            runs[node] += 1
        samples: dict[str, list[float]] = defaultdict(list)
        for (index, group), ms in per_run.items():
            if index >= WARMUP:
                samples[group].append(ms)
        return {group: statistics.median(values) for group, values in samples.items()}, len(runs)


def timed_ms(run, count: int) -> float:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a zoo model's name or an .onnx file's path")
    parser.add_argument("--threads", type=int, default=1, help="threads for both Tessel and onnxruntime")
    parser.add_argument("--repeat", type=int, default=10, help="timed calls of each kernel (and runs) per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of Tessel and onnxruntime")
    parser.add_argument("--top", type=int, default=0, help="groups to print, the worst first (0: every group)")
    arguments = parser.parse_args()
    model, feeds = load(arguments.model)
    module = compiler.compile_model(model, target="llvm")
    module.num_threads = arguments.threads
    groups, described = tessel_groups(model, "llvm")
    profiled = ProfiledSession(model, arguments.threads, feeds, groups)
    plain = onnxruntime_session(model, arguments.threads, spins=True)
    ours: dict[str, list[float]] = defaultdict(list)
    ops: dict[str, str] = {}
    whole, rival_whole = [], []
    for _ in range(arguments.rounds):
        for entry in module.profile(repeat=arguments.repeat, feeds=feeds):
            ours[entry["group"]].append(entry["median_ms"])
            ops[entry["group"]] = "+".join(entry["ops"])
        profiled.run(arguments.repeat)
        whole.append(timed_ms(lambda: module.run(feeds), arguments.repeat))
        rival_whole.append(timed_ms(lambda: plain.run(None, feeds), arguments.repeat))
    theirs, nodes = profiled.medians()
    tessel = {group: statistics.median(values) for group, values in ours.items()}
    whole_ms, rival_ms = statistics.median(whole), statistics.median(rival_whole)
    overhead = max(0.0, (sum(theirs.values()) - rival_ms) / max(nodes, 1))

    def corrected(group: str) -> float:
        return max(0.0, theirs.get(group, 0.0) - overhead * len(profiled.covered.get(group, [])))

    rows = []
    for group in sorted(set(tessel) | set(theirs), key=lambda group: corrected(group) - tessel.get(group, 0.0)):
        if arguments.top and len(rows) >= arguments.top:
            break
        mine, rival = tessel.get(group, 0.0), corrected(group)
        rows.append(
            [
                group,
                ops.get(group, ""),
                described.get(group, ""),
                "+".join(sorted(set(profiled.covered.get(group, [])))),
                f"{mine:.3f}",
                f"{theirs.get(group, 0.0):.3f}",
                f"{rival:.3f}",
                f"{mine / rival:.2f}×" if rival > 0 else "-",
                f"{mine - rival:+.3f}",
            ]
        )
    print(f"{arguments.model}: {machine()}, onnxruntime {ort.__version__}, {arguments.threads} thread(s)")
    print(
        f"whole run: Tessel {whole_ms:.3f} ms, onnxruntime {rival_ms:.3f} ms ({whole_ms / rival_ms:.2f}×). "
        f"Sums: Tessel's groups {sum(tessel.values()):.3f} ms, onnxruntime's {nodes} profiled nodes "
        f"{sum(theirs.values()):.3f} ms, {overhead * 1000:.1f} us per node over its unprofiled run "
        f"(medians of {arguments.rounds} interleaved rounds of {arguments.repeat})\n"
    )
    header = ["group", "Tessel ops", "shapes", "onnxruntime ops", "Tessel ms", "ort ms", "ort less overhead"]
    print_table([*header, "ratio", "loss ms"], rows)


if __name__ == "__main__":
    main()
