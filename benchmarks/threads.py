"""Threads against one thread, in the call patterns a user has: every zoo model (whatever compiler.zoo.MODELS
holds), plus a transformer encoder block and a small conv net built here, timed natively at one thread and at the
default thread count, against onnxruntime at the same two counts, interleaved (A B C D A B C D ...):
- back to back: blocks of runs one after the other (each sample is a block's median, after settling runs:
  common.settle_runs);
- every 50 ms and every 200 ms: one run after a pause (the workers have gone to sleep);
- busy: back to back while another process keeps one core busy.
Prints a markdown table of medians and spreads, and for each row the slowest CPU's speed over the fastest's before
and after it (common.cpu_speeds: on a shared virtual machine one CPU can run at half speed for seconds, and a row
timed then measures the host); nothing here is asserted (docs/codegen.md keeps the numbers).
Run: .venv/bin/python benchmarks/threads.py [--models ...] [--rounds 15] [--patterns ...]"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from common import busy_core, cpu_speeds, settle_runs, speed_spread
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import compiler  # noqa: E402
from compiler import te, zoo  # noqa: E402
from compiler.tir.lower import lower  # noqa: E402
from compiler.tir.nodes import For, ForKind, walk_stmts  # noqa: E402

PATTERNS = {"back-to-back": None, "every 50 ms": 0.05, "every 200 ms": 0.2, "busy core": None}
BLOCK = 10  # runs per back-to-back sample
VARIANTS = ("tessel 1", "tessel default", "onnxruntime 1", "onnxruntime default")


def _weight(rng, name: str, shape, scale: float = 0.05) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def transformer_block(sequence: int = 128, width: int = 256, heads: int = 4) -> onnx.ModelProto:
    """One pre-norm encoder block: LayerNorm, multi-head attention (MatMul, Softmax, MatMul), residual, LayerNorm,
    a GELU feed-forward of 4x width, residual."""
    rng = np.random.default_rng(1)
    head = width // heads
    weights = [
        _weight(rng, "ln1_scale", (width,), 1.0),
        _weight(rng, "ln1_bias", (width,)),
        _weight(rng, "ln2_scale", (width,), 1.0),
        _weight(rng, "ln2_bias", (width,)),
        *(_weight(rng, name, (width, width)) for name in ("wq", "wk", "wv", "wo")),
        _weight(rng, "w1", (width, 4 * width)),
        _weight(rng, "b1", (4 * width,)),
        _weight(rng, "w2", (4 * width, width)),
        numpy_helper.from_array(np.array([1, sequence, heads, head], np.int64), "split_heads"),
        numpy_helper.from_array(np.array([1, sequence, width], np.int64), "merge_heads"),
        numpy_helper.from_array(np.array(head**-0.5, np.float32), "scale"),
        numpy_helper.from_array(np.array(2**-0.5, np.float32), "inv_sqrt2"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    node = helper.make_node
    nodes = [node("LayerNormalization", ["x", "ln1_scale", "ln1_bias"], ["n1"], axis=-1, epsilon=1e-5)]
    for name in ("q", "k", "v"):
        nodes += [
            node("MatMul", ["n1", f"w{name}"], [f"{name}_flat"]),
            node("Reshape", [f"{name}_flat", "split_heads"], [f"{name}_split"]),
        ]
    nodes += [
        node("Transpose", ["q_split"], ["q_heads"], perm=[0, 2, 1, 3]),
        node("Transpose", ["k_split"], ["k_heads"], perm=[0, 2, 3, 1]),
        node("Transpose", ["v_split"], ["v_heads"], perm=[0, 2, 1, 3]),
        node("MatMul", ["q_heads", "k_heads"], ["scores_raw"]),
        node("Mul", ["scores_raw", "scale"], ["scores"]),
        node("Softmax", ["scores"], ["attention"], axis=-1),
        node("MatMul", ["attention", "v_heads"], ["context_heads"]),
        node("Transpose", ["context_heads"], ["context_split"], perm=[0, 2, 1, 3]),
        node("Reshape", ["context_split", "merge_heads"], ["context"]),
        node("MatMul", ["context", "wo"], ["attended"]),
        node("Add", ["x", "attended"], ["r1"]),
        node("LayerNormalization", ["r1", "ln2_scale", "ln2_bias"], ["n2"], axis=-1, epsilon=1e-5),
        node("MatMul", ["n2", "w1"], ["h_raw"]),
        node("Add", ["h_raw", "b1"], ["h"]),
        node("Mul", ["h", "inv_sqrt2"], ["h_scaled"]),
        node("Erf", ["h_scaled"], ["h_erf"]),
        node("Add", ["h_erf", "one"], ["h_erf1"]),
        node("Mul", ["h", "h_erf1"], ["h_gelu2"]),
        node("Mul", ["h_gelu2", "half"], ["gelu"]),
        node("MatMul", ["gelu", "w2"], ["ffn"]),
        node("Add", ["r1", "ffn"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "transformer_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, sequence, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, sequence, width])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def small_convnet(size: int = 64) -> onnx.ModelProto:
    """Dilated, grouped and strided convs, an average pool, HardSwish and a sigmoid gate."""
    rng = np.random.default_rng(2)
    weights = [
        _weight(rng, "c1", (16, 3, 3, 3), 0.2),
        _weight(rng, "c2", (32, 4, 3, 3), 0.2),
        _weight(rng, "c3", (32, 32, 3, 3), 0.1),
        _weight(rng, "gate", (32, 32, 1, 1), 0.1),
        _weight(rng, "c4", (64, 32, 3, 3), 0.1),
    ]
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "c1"], ["a"], pads=[1, 1, 1, 1], strides=[2, 2]),
        node("HardSwish", ["a"], ["a_act"]),
        node("Conv", ["a_act", "c2"], ["b"], pads=[1, 1, 1, 1], group=4),
        node("Relu", ["b"], ["b_act"]),
        node("Conv", ["b_act", "c3"], ["c"], pads=[2, 2, 2, 2], dilations=[2, 2]),
        node("Conv", ["c", "gate"], ["g"]),
        node("Sigmoid", ["g"], ["g_act"]),
        node("Mul", ["c", "g_act"], ["gated"]),
        node("AveragePool", ["gated"], ["pooled"], kernel_shape=[2, 2], strides=[2, 2]),
        node("Conv", ["pooled", "c4"], ["d"], pads=[1, 1, 1, 1], strides=[2, 2]),
        node("HardSwish", ["d"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "small_convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, size // 8, size // 8])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


EXTRA_MODELS = {"transformer_block": transformer_block, "small_convnet": small_convnet}


def model_and_feeds(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    if name in EXTRA_MODELS:
        model = EXTRA_MODELS[name]()
        shape = [dim.dim_value for dim in model.graph.input[0].type.tensor_type.shape.dim]
        return model, {model.graph.input[0].name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    return zoo.build_model(name), zoo.sample_input(name)


def onnxruntime_session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    """threads 0 is onnxruntime's own default; its workers do not spin, as Tessel's sleep between runs."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def runners(name: str) -> dict[str, tuple]:
    """The four variants of one model, each (prepare, run): functions of no arguments, prepare untimed before each
    sample. Tessel's two are one module whose thread count prepare sets, so both run the same code on the same
    memory (two loads of one bundle differed by up to 10% in their one-thread times)."""
    model, feeds = model_and_feeds(name)
    module = compiler.compile_model(model, target="llvm")
    default_threads = module.num_threads
    sessions = {1: onnxruntime_session(model, 1), 0: onnxruntime_session(model, 0)}
    expected = sessions[1].run(None, feeds)
    for threads in (1, default_threads):
        module.num_threads = threads
        outputs = module.run(feeds)
        for spec, reference in zip(module.outputs, expected):
            np.testing.assert_allclose(outputs[spec.name], reference, rtol=1e-3, atol=1e-4, err_msg=name)

    def threads(count: int):
        return lambda: setattr(module, "num_threads", count)

    def nothing():
        return None

    return {
        "tessel 1": (threads(1), partial(module.run, feeds)),
        "tessel default": (threads(default_threads), partial(module.run, feeds)),
        "onnxruntime 1": (nothing, partial(sessions[1].run, None, feeds)),
        "onnxruntime default": (nothing, partial(sessions[0].run, None, feeds)),
    }


def calibration_kernels():
    """Parallel loops of three kinds of body at sizes around the work threshold, each built with the threshold off
    so that it always reaches the pool: (label, work estimate, kernel, arrays)."""
    from compiler.tir import work

    def elementwise(size: int, heavy: bool):
        x = te.placeholder((size,), name="x")
        if heavy:
            y = te.compute((size,), lambda i: te.tanh(x[i]) * te.sigmoid(x[i]), name="y")
        else:
            y = te.compute((size,), lambda i: x[i] * 3.0 + 1.0, name="y")
        schedule = te.create_schedule(y.op)
        outer, inner = schedule[y].split(y.op.axis[0], factor=16)
        schedule[y].parallel(outer)
        schedule[y].vectorize(inner)
        return schedule, [x, y], [(size,), (size,)]

    def row_sums(size: int, _heavy: bool):
        x = te.placeholder((size // 64, 64), name="x")
        k = te.reduce_axis((0, 64), name="k")
        y = te.compute((size // 64,), lambda i: te.sum(x[i, k], axis=k), name="y")
        schedule = te.create_schedule(y.op)
        schedule[y].parallel(y.op.axis[0])
        return schedule, [x, y], [(size // 64, 64), (size // 64,)]

    saved, work.PARALLEL_MIN_WORK = work.PARALLEL_MIN_WORK, 0
    try:
        for label, make, heavy in (
            ("affine", elementwise, False),
            ("tanh*sigmoid", elementwise, True),
            ("row sums", row_sums, False),
        ):
            for size in (1 << 12, 1 << 13, 1 << 14, 1 << 15, 1 << 16, 1 << 17, 1 << 18, 1 << 20):
                schedule, tensors, shapes = make(size, heavy)
                func = lower(schedule, tensors, "calibrate")
                kernel = compiler.build(schedule, tensors, target="llvm", name="calibrate")
                arrays = [np.random.default_rng(0).standard_normal(shape).astype(np.float32) for shape in shapes]
                (loop,) = [
                    stmt for stmt in walk_stmts(func.body) if isinstance(stmt, For) and stmt.kind == ForKind.PARALLEL
                ]
                yield f"{label} {size}", work.stmt_work(loop), kernel, arrays
    finally:
        work.PARALLEL_MIN_WORK = saved


def calibrate(rounds: int) -> None:
    """One thread against the default for each calibration kernel, back to back, interleaved."""
    print("| loop | work estimate | 1 thread us | default us | ns per operation (1 thread) | default / 1 |")
    print("|---|---|---|---|---|---|")
    for label, estimate, kernel, arrays in calibration_kernels():
        samples = {1: [], 0: []}
        for _ in range(rounds):
            for threads, times in samples.items():
                kernel.num_threads = threads
                kernel(*arrays)
                times.append(statistics.median(timed(partial(kernel, *arrays)) for _ in range(BLOCK)) * 1000)
        one, default = statistics.median(samples[1]), statistics.median(samples[0])
        print(
            f"| {label} | {estimate} | {one:.1f} | {default:.1f} | {one * 1000 / estimate:.2f} | {default / one:.2f} |"
        )


def timed(run) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) * 1000


def measure(variants: dict, pattern: str, rounds: int) -> dict[str, list[float]]:
    """Milliseconds per variant: `rounds` samples each, the variants interleaved within every round."""
    samples = {label: [] for label in variants}
    pause = PATTERNS[pattern]
    for prepare, run in variants.values():
        prepare()
        for _ in range(3):
            run()
    for _ in range(rounds):
        for label, (prepare, run) in variants.items():
            prepare()
            if pause is None:
                settle_runs(run)
                samples[label].append(statistics.median(timed(run) for _ in range(BLOCK)))
            else:
                time.sleep(pause)
                samples[label].append(timed(run))
    return samples


def cell(times: list[float]) -> str:
    return f"{statistics.median(times):.3f} ({min(times):.3f}–{max(times):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    every = [*zoo.MODELS, *EXTRA_MODELS]
    parser.add_argument("--models", nargs="+", default=every, choices=every)
    parser.add_argument("--patterns", nargs="+", default=list(PATTERNS), choices=list(PATTERNS))
    parser.add_argument("--rounds", type=int, default=15, help="samples of each variant per pattern")
    parser.add_argument(
        "--calibrate", action="store_true", help="time single parallel loops around the work threshold instead"
    )
    arguments = parser.parse_args()
    if arguments.calibrate:
        calibrate(arguments.rounds)
        return
    print(f"compiler: {Path(compiler.__file__).parent}, ms per run, median (min–max) of {arguments.rounds} samples\n")
    header = ["model", "pattern", *VARIANTS, "default / 1", "Tessel / onnxruntime (default)", "CPU speed spread"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for name in arguments.models:
        variants = runners(name)
        for pattern in arguments.patterns:
            before = speed_spread(cpu_speeds())
            hog = busy_core() if pattern == "busy core" else None
            try:
                samples = measure(variants, pattern, arguments.rounds)
            finally:
                if hog is not None:
                    hog.kill()
                    hog.wait()
            after = speed_spread(cpu_speeds())
            medians = {label: statistics.median(times) for label, times in samples.items()}
            row = [
                name,
                pattern,
                *(cell(samples[label]) for label in VARIANTS),
                f"{medians['tessel default'] / medians['tessel 1']:.2f}",
                f"{medians['tessel default'] / medians['onnxruntime default']:.2f}",
                f"{before:.2f} / {after:.2f}",
            ]
            print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
