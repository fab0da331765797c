"""What benchmarks/cpu.py, ops.py, wasm.py and zoo.py share: the work a model does (multiply-add FLOPs counted by
compiler.zoo.model_flops, the least bytes it must move), this machine's measured FMA peak and copy bandwidth, the
onnxruntime session they are timed against, interleaved timing natively and in Node against onnxruntime-web, a
cross-origin isolated headless Chromium for the same in a page (wasm.py, generate_web.py), statistics and tables.
Nothing here is part of the compiler; the numbers go to docs/benchmarks.md."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import http.server
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from llvmlite import ir

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from compiler.codegen.llvm import compile_module  # noqa: E402
from compiler.link import link_shared  # noqa: E402
from compiler.target import Target  # noqa: E402

DEFAULT_MODELS = ("mobilenet_v2", "resnet18", "mlp", "dwconv_block")
WARMUP = 5  # untimed runs of each side before the timed ones
# Back to back, a block of timed runs follows at least SETTLE_RUNS untimed ones lasting at least SETTLE_S (settle):
# after an idle spell the first runs find the host asleep (mlp after a 250 ms pause: 0.31, 0.06, 0.05, 0.08 ms before
# its 0.03-0.04, both runtimes alike) and, for a model of many small jobs, Tessel's workers asleep too, woken only
# once the jobs within 2 ms add up (thread_pool.c); a caller running the model back to back sees neither
SETTLE_RUNS = 2
SETTLE_S = 0.005
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


def cpu_speeds(rounds: int = 200_000, repeat: int = 5) -> dict[int, float]:
    """GFLOPS of the generated FMA loop on each CPU of this process's affinity, the calling thread pinned to one CPU
    at a time (its affinity given back after): the best of `repeat` timings of ~0.2 ms. On this project's 2-core
    virtual machine one CPU ran the same loop at 0.5-0.6x the other's speed for seconds at a time, either CPU, at
    random (another tenant on the physical core, as far as a guest can see); a cell timed in such a spell measures
    the host, so the benchmarks print this probe beside their cells."""
    library, lanes = _fma_library()
    buffer = np.full(2 * lanes, 0.5, np.float32)
    saved = os.sched_getaffinity(0)
    speeds = {}
    try:
        for cpu in sorted(saved):
            os.sched_setaffinity(0, {cpu})
            best = float("inf")
            for _ in range(repeat):
                started = time.perf_counter()
                library.fma_loop(rounds, buffer.ctypes.data)
                best = min(best, time.perf_counter() - started)
            speeds[cpu] = rounds * FMA_CHAINS * lanes * 2 / best / 1e9
    finally:
        os.sched_setaffinity(0, saved)
    return speeds


def speed_spread(speeds: dict[int, float]) -> float:
    """The slowest CPU's speed over the fastest's (1.0: even)."""
    return min(speeds.values()) / max(speeds.values())


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


# Spins until its parent exits, so a benchmark killed mid-column (a timeout, Ctrl-C) leaves no core busy behind it.
_SPIN = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n"


def busy_core() -> subprocess.Popen:
    """Another process that keeps one core busy until it is terminated or this process exits, given time to start
    spinning."""
    child = subprocess.Popen([sys.executable, "-c", _SPIN])
    time.sleep(0.2)
    return child


def summary(times_ms: list[float]) -> dict[str, float]:
    return {"median": statistics.median(times_ms), "min": min(times_ms), "max": max(times_ms)}


def check_close(label: str, ours: list[np.ndarray], theirs: list[np.ndarray], range_tolerance: float = 1e-5) -> None:
    """Stop the benchmark when the outputs disagree: a fast wrong answer measures nothing. The absolute tolerance
    scales with the output's range (`range_tolerance` of it), as the zoo test's does: Winograd convs round differently
    from a direct sum (yolo_neck: 2.4e-5 of outputs up to 6.4)."""
    for position, (left, right) in enumerate(zip(ours, theirs)):
        scale = max(1.0, float(np.max(np.abs(right)))) if np.size(right) else 1.0
        if not np.allclose(left, right, rtol=1e-4, atol=range_tolerance * scale):
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
    """A session on `threads` threads for a ModelProto, or for an .onnx path (whose external data lies beside it)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if not spins:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    source = str(model) if isinstance(model, str | Path) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def interleaved(
    runs,
    repeat: int,
    block: int = 1,
    pause_s: float = 0.0,
    interval_s: float = 0.0,
    after_pause=None,
    settle: bool = False,
) -> list[list[float]]:
    """Milliseconds of `repeat` runs of each of `runs`, after WARMUP runs of each (each one's warm-up followed by
    `pause_s` idle): `block` runs of one, then `block` of the next (A B A B ... when block is 1), with `pause_s`
    seconds idle after each block and `interval_s` idle before each timed run (a caller that runs the model now and
    then, not back to back). With `settle`, each block starts with the untimed runs of `settle_runs` (back to back,
    the runs right after the harness's own pause are not what a caller running back to back sees). `after_pause`,
    when given, is called at the end of every pause (settled_cell probes the CPUs' speeds there, when neither side's
    threads are spinning)."""
    for run in runs:
        for _ in range(WARMUP):
            run()
        # the warm-up is a block too: one side's spinning threads must not run into the other's first timed block
        time.sleep(pause_s)
    times = [[] for _ in runs]
    while len(times[-1]) < repeat:
        count = min(block, repeat - len(times[-1]))
        for run, samples in zip(runs, times):
            if settle:
                settle_runs(run)
            for _ in range(count):
                if interval_s:
                    time.sleep(interval_s)
                started = time.perf_counter()
                run()
                samples.append((time.perf_counter() - started) * 1000)
            if pause_s:
                time.sleep(pause_s)
            if after_pause is not None:
                after_pause()
    return times


def settle_runs(run) -> None:
    """Run `run` untimed, at least SETTLE_RUNS times and for at least SETTLE_S seconds."""
    started, count = time.perf_counter(), 0
    while count < SETTLE_RUNS or time.perf_counter() - started < SETTLE_S:
        run()
        count += 1


EVEN_SPREAD = 0.9  # a cell timed while one CPU ran below this fraction of the other's speed is timed again
SETTLE_ATTEMPTS = 3


def settled_cell(time_cell) -> tuple[list[list[float]], float, int]:
    """`time_cell(after_pause)` (a call of interleaved passing its after_pause on), timed again while a CPU speed
    probe (cpu_speeds) taken before it or in any of its pauses shows the CPUs uneven (spread below EVEN_SPREAD), up to
    SETTLE_ATTEMPTS times. On this project's shared 2-core machines one CPU runs at half speed for seconds at a time;
    such a spell falls on one side's block and not the other's, so a cell timed through it compares the host, not the
    runtimes. Both sides are always timed again together, and the attempt kept is the one with the most even CPUs:
    (times, that attempt's lowest spread, attempts made)."""
    attempts = []
    for _ in range(SETTLE_ATTEMPTS):
        spreads = [speed_spread(cpu_speeds())]
        times = time_cell(functools.partial(_probe_into, spreads))
        attempts.append((min(spreads), times))
        if min(spreads) >= EVEN_SPREAD:
            break
    spread, times = max(attempts, key=lambda attempt: attempt[0])
    return times, spread, len(attempts)


def _probe_into(spreads: list[float]) -> None:
    spreads.append(speed_spread(cpu_speeds()))


def geometric_mean(values: list[float]) -> float:
    return float(np.exp(np.mean(np.log(values))))


def install_onnxruntime_web() -> None:
    """npm ci from the lockfile (npm install without one) into benchmarks/node_modules, once."""
    if (HERE / "node_modules" / "onnxruntime-web").is_dir():
        return
    if shutil.which("npm") is None:
        raise SystemExit("the wasm benchmarks need Node 20 and npm on the PATH to install onnxruntime-web")
    command = "ci" if (HERE / "package-lock.json").is_file() else "install"
    subprocess.run(["npm", command, "--prefix", str(HERE), "--no-audit", "--no-fund"], check=True)


class _IsolatedHandler(http.server.SimpleHTTPRequestHandler):
    """Static files, streamed from disk, with the headers that make a page cross-origin isolated (wasm threads need
    them)."""

    def end_headers(self):
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def guess_type(self, path):
        return "text/javascript" if str(path).endswith((".mjs", ".js")) else super().guess_type(path)

    def log_message(self, *arguments):
        return None


@contextlib.contextmanager
def isolated_chromium(root: Path, args: tuple[str, ...] = ()):
    """Yields a headless Chromium (Debian's chromium through Playwright, with `args` added) and the URL of an empty
    page served with `root` from a local server, cross-origin isolated. `root` gets links to tessel.js's folder
    (/web_runtime/) and onnxruntime-web's builds (/ort/); what else it holds, or links to, is served as it lies."""
    from playwright.sync_api import sync_playwright

    install_onnxruntime_web()
    (root / "web_runtime").symlink_to(HERE.parent / "web_runtime")
    (root / "ort").symlink_to(HERE / "node_modules" / "onnxruntime-web" / "dist")
    (root / "index.html").write_text("<!doctype html><title>Tessel benchmark</title>")
    handler = functools.partial(_IsolatedHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=shutil.which("chromium"), headless=True, args=["--headless=new", "--no-sandbox", *args]
            )
            try:
                yield browser, f"http://127.0.0.1:{server.server_port}/index.html"
            finally:
                browser.close()
    finally:
        server.shutdown()


def run_in_node(
    entries,
    repeat: int,
    block: int = 1,
    pause_ms: float = 0.0,
    settle: bool = False,
    tessel_options: list[dict] | None = None,
    ort_threads: int = 1,
    node_flags: tuple[str, ...] = (),
    range_tolerance: float = 1e-5,
) -> dict:
    """Time wasm Modules in Node against onnxruntime-web (benchmarks/node_bench.mjs), `block` runs of each in turn
    with `pause_ms` idle after each block and, with `settle`, settling runs before it (as `interleaved`). `entries`
    are (name, ModelProto, wasm Module, feeds), the feeds in the Module's input dtypes; Tessel's outputs in Node are
    checked against onnxruntime's CPU provider here, and against onnxruntime-web's in Node, before timing, within
    `range_tolerance` of each output's range (check_close).
    Each bundle is loaded once per entry of `tessel_options` (tessel.load's options, e.g. {"threads": 2}), and
    onnxruntime-web runs on `ort_threads` threads; `node_flags` go to node (e.g. --experimental-wasm-relaxed-simd).
    Returns node_bench.mjs's report: {"versions": ..., "results":
    [{"name", "tessel" (the first options' times), "tessel_runs" (one list per options), "variants",
    "onnxruntime_web"}, ...]}."""
    install_onnxruntime_web()
    with tempfile.TemporaryDirectory(prefix="tessel-wasm-bench-") as folder:
        work = Path(folder)
        specs = []
        for name, model, module, feeds in entries:
            module.export(work / name)
            (work / f"{name}.onnx").write_bytes(model.SerializeToString())
            inputs = []
            for spec in module.inputs:
                path = work / f"{name}.{spec.name}.bin"
                path.write_bytes(np.ascontiguousarray(feeds[spec.name], spec.dtype).tobytes())
                inputs.append({"name": spec.name, "file": str(path), "shape": list(spec.shape), "dtype": spec.dtype})
            specs.append(
                {
                    "name": name,
                    "bundle": str(work / name),
                    "onnx": str(work / f"{name}.onnx"),
                    "inputs": inputs,
                    "outputs": [spec.name for spec in module.outputs],
                    "outputPrefix": str(work / f"{name}.output"),
                }
            )
        job = work / "job.json"
        job.write_text(
            json.dumps(
                {
                    "models": specs,
                    "repeat": repeat,
                    "warmup": WARMUP,
                    "block": block,
                    "pauseMs": pause_ms,
                    "settle": {"runs": SETTLE_RUNS, "ms": SETTLE_S * 1000} if settle else None,
                    "tesselOptions": tessel_options or [{}],
                    "ortThreads": ort_threads,
                    "rangeTolerance": range_tolerance,
                }
            )
        )
        node = subprocess.run(
            ["node", *node_flags, str(HERE / "node_bench.mjs"), str(job)], capture_output=True, text=True, cwd=HERE
        )
        if node.returncode != 0:
            raise SystemExit(f"node_bench.mjs failed:\n{node.stderr.strip()}")
        for name, model, module, feeds in entries:
            session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            in_node = [
                np.fromfile(work / f"{name}.output{position}.bin", spec.dtype).reshape(spec.shape)
                for position, spec in enumerate(module.outputs)
            ]
            check_close(f"{name} (Tessel in Node)", in_node, session.run(None, feeds), range_tolerance)
    return json.loads(node.stdout)
