"""What benchmarks/cpu.py, benchmarks/ops.py and benchmarks/wasm.py share: the work a model does (multiply-add
FLOPs counted by compiler.zoo.model_flops, the least bytes it must move), this machine's measured FMA peak and copy
bandwidth, the onnxruntime session they are timed against, interleaved timing, statistics and tables. Nothing
here is part of the compiler; the numbers go to docs/benchmarks.md."""

from __future__ import annotations

import ctypes
import functools
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from llvmlite import ir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compiler.codegen.llvm import compile_module  # noqa: E402
from compiler.link import link_shared  # noqa: E402
from compiler.target import Target  # noqa: E402

DEFAULT_MODELS = ("mobilenet_v2", "resnet18", "mlp", "dwconv_block")
WARMUP = 5  # untimed runs of each side before the timed ones
FMA_CHAINS = 12  # independent accumulators: enough to cover FMA latency × FMA ports on current x86 cores


def model_bytes(model: onnx.ModelProto) -> int:
    """The least traffic one inference needs: read every input and weight once, write every output once."""
    inferred = onnx.shape_inference.infer_shapes(model)
    total = sum(onnx.numpy_helper.to_array(tensor).nbytes for tensor in inferred.graph.initializer)
    for info in [*inferred.graph.input, *inferred.graph.output]:
        dims = [dim.dim_value for dim in info.type.tensor_type.shape.dim]
        total += int(np.prod(dims)) * onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type).itemsize
    return total


@functools.cache
def _fma_library() -> tuple[ctypes.CDLL, int]:
    """`void fma_loop(i64 count, float *out)`: FMA_CHAINS independent vector chains `acc = acc * a + b`, `count`
    rounds, generated as LLVM IR and compiled for the host like Tessel's kernels; the lanes are the widest
    float vector the host has (16 with AVX-512, else 8)."""
    target = Target.parse("llvm")
    lanes = 16 if "+avx512f" in target.features.split(",") else 8
    vector, i64 = ir.VectorType(ir.FloatType(), lanes), ir.IntType(64)
    module = ir.Module(name="fma_peak")
    module.triple = target.triple
    fma = ir.Function(module, ir.FunctionType(vector, [vector] * 3), f"llvm.fma.v{lanes}f32")
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [i64, ir.PointerType(vector)]), "fma_loop")
    count, out = function.args
    entry, loop, done = (function.append_basic_block(name) for name in ("entry", "loop", "done"))
    builder = ir.IRBuilder(entry)
    # Loaded from memory, so the optimiser cannot fold the chain into a closed form.
    scale, shift = builder.load(out, align=4), builder.load(builder.gep(out, [ir.Constant(i64, 1)]), align=4)
    builder.branch(loop)
    builder.position_at_end(loop)
    counter = builder.phi(i64)
    counter.add_incoming(ir.Constant(i64, 0), entry)
    chains = []
    for chain in range(FMA_CHAINS):
        value = builder.phi(vector)
        value.add_incoming(ir.Constant(vector, [float(chain)] * lanes), entry)
        chains.append(value)
    updated = [builder.call(fma, [value, scale, shift]) for value in chains]
    for value, new in zip(chains, updated):
        value.add_incoming(new, loop)
    following = builder.add(counter, ir.Constant(i64, 1))
    counter.add_incoming(following, loop)
    builder.cbranch(builder.icmp_signed("<", following, count), loop, done)
    builder.position_at_end(done)
    total = updated[0]
    for value in updated[1:]:
        total = builder.fadd(total, value)
    builder.store(total, out, align=4)
    builder.ret_void()
    compiled = compile_module(module, target)
    with tempfile.TemporaryDirectory(prefix="tessel-fma-") as folder:
        path = Path(folder, "fma_peak.so")
        path.write_bytes(link_shared(compiled.object, target))
        library = ctypes.CDLL(str(path))
    library.fma_loop.argtypes = [ctypes.c_int64, ctypes.c_void_p]
    library.fma_loop.restype = None
    return library, lanes


def _concurrently(work, threads: int) -> float:
    """Seconds for `threads` Python threads each running `work(index)` at once (ctypes calls drop the GIL)."""
    workers = [threading.Thread(target=work, args=(index,)) for index in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return time.perf_counter() - started


def fma_peak_gflops(threads: int, rounds: int = 5_000_000, repeat: int = 20) -> float:
    """The best of `repeat` timings of the generated FMA loop, run on `threads` threads at once."""
    library, lanes = _fma_library()
    buffers = [np.full(2 * lanes, 0.5, np.float32) for _ in range(threads)]
    best = min(
        _concurrently(lambda index: library.fma_loop(rounds, buffers[index].ctypes.data), threads)
        for _ in range(repeat)
    )
    return threads * rounds * FMA_CHAINS * lanes * 2 / best / 1e9


def copy_bandwidth(threads: int, megabytes: int = 512, repeat: int = 10) -> float:
    """Bytes per second (read + written) of memmove over a buffer far larger than the caches, split across
    `threads` threads; the best of `repeat`."""
    size = megabytes << 20
    source, destination = np.ones(size, np.uint8), np.zeros(size, np.uint8)
    part = size // threads

    def copy(index: int) -> None:
        ctypes.memmove(destination.ctypes.data + index * part, source.ctypes.data + index * part, part)

    best = min(_concurrently(copy, threads) for _ in range(repeat))
    return 2 * part * threads / best


def summary(times_ms: list[float]) -> dict[str, float]:
    return {"median": statistics.median(times_ms), "min": min(times_ms), "max": max(times_ms)}


def check_close(label: str, ours: list[np.ndarray], theirs: list[np.ndarray]) -> None:
    """Stop the benchmark when the outputs disagree: a fast wrong answer measures nothing."""
    for position, (left, right) in enumerate(zip(ours, theirs)):
        if not np.allclose(left, right, rtol=1e-4, atol=1e-5):
            error = float(np.max(np.abs(left.astype(np.float64) - right)))
            raise SystemExit(f"{label}: output {position} disagrees (max abs error {error:.3g}); not timing it")


def spread(stats: dict[str, float], digits: int = 2, keys=("median", "min", "max")) -> str:
    """A table cell of summary() statistics: "median / min / max" milliseconds."""
    return " / ".join(f"{stats[key]:.{digits}f}" for key in keys)


def ratio(ours_ms: float, theirs_ms: float) -> str:
    """A table cell: Tessel's time over the rival's (lower is better)."""
    return f"{ours_ms / theirs_ms:.2f}×"


def print_table(header: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def print_slowest(title: str, profile: list[dict], count: int) -> None:
    """The `count` slowest groups of a Module.profile, each with its share of all the groups' time."""
    total = sum(entry["median_ms"] for entry in profile)
    print(f"\n{title}: slowest of {len(profile)} fused groups (Module.profile, median of 10), {total:.2f} ms in all")
    print_table(
        ["group", "kernel", "ops", "ms", "share"],
        [
            [
                entry["group"],
                entry["kernel"],
                "+".join(entry["ops"]),
                f"{entry['median_ms']:.3f}",
                f"{100 * entry['median_ms'] / total:.0f}%",
            ]
            for entry in sorted(profile, key=lambda entry: -entry["median_ms"])[:count]
        ],
    )


def onnxruntime_session(model, threads: int, spins: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if not spins:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def interleaved(runs, repeat: int) -> list[list[float]]:
    """Milliseconds of `repeat` runs of each of `runs`, alternating (A B A B ...), after WARMUP runs of each."""
    for _ in range(WARMUP):
        for run in runs:
            run()
    times = [[] for _ in runs]
    for _ in range(repeat):
        for run, samples in zip(runs, times):
            started = time.perf_counter()
            run()
            samples.append((time.perf_counter() - started) * 1000)
    return times
