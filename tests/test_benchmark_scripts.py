"""The benchmark scripts run end to end on their smallest cases: each checks Tessel's outputs against onnxruntime's
before it times anything, and prints its table, the reference timings and the slowest groups. Nothing here looks
at the times themselves (speed is measured by the scripts, never asserted by tests)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_cpu_benchmark_prints_its_table_for_mlp_at_two_threads():
    command = [sys.executable, "benchmarks/cpu.py", "--models", "mlp", "--threads", "2", "--repeat", "30"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "2 thread(s), idle threads default" in lines[0]
    (row,) = [line for line in lines if line.startswith("| mlp |")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[3].endswith("×") and float(cells[3][:-1]) > 0
    assert any(line.startswith("- mlp: Tessel ") for line in lines), "the spinning-onnxruntime reference is missing"
    assert any("Gemm+Relu" in line for line in lines), "the slowest groups are missing"


@pytest.mark.parametrize("wasm", [False, True])
def test_ops_benchmark_prints_its_table_and_a_matmuls_speed(wasm):
    cases = ["reduce_mean last axis 12x128x128", "matmul 128x768 @ 768x768"]
    command = [sys.executable, "benchmarks/ops.py", "--cases", *cases, "--repeat", "30", *(["--wasm"] if wasm else [])]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    for case in cases:
        (row,) = [line for line in result.stdout.splitlines() if line.startswith(f"| {case} |")]
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[3].endswith("×") and float(cells[3][:-1]) > 0
        assert bool(cells[4]) == case.startswith("matmul"), cells
    if not wasm:
        assert "FMA peak" in result.stdout.splitlines()[0]
        assert re.fullmatch(r"\d+ \(\d+%\)", cells[4]), cells


def test_zoo_benchmark_prints_its_columns_geometric_means_and_slowest_groups():
    columns = ["1-thread", "every-50ms", "busy-core"]
    command = [sys.executable, "benchmarks/zoo.py", "--models", "mlp", "digits", "--repeat", "2", "--columns", *columns]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("| model |"))
    assert header.count("|") == len(columns) + 2 and "one core busy" in header
    for name in ("mlp", "digits"):
        (row,) = [line for line in lines if line.startswith(f"| {name} |")]
        cells = [cell.strip() for cell in row.strip("|").split("|")][1:]
        assert len(cells) == len(columns)
        for cell in cells:
            tessel, rest = cell.split(" / ")
            rival, ratio = rest.split(" = ")
            assert float(tessel) > 0 and float(rival) > 0 and ratio.endswith("×")
    (means,) = [line for line in lines if line.startswith("| geometric mean |")]
    assert means.count("×") == len(columns)
    assert any("the worst geometric mean ratio" in line for line in lines)
    spread_line = next(line for line in lines if line.startswith("CPU speed spread (slowest CPU / fastest"))
    assert "cell(s) timed again" in spread_line
    assert any(line.startswith("| fused_") for line in lines), "the slowest groups are missing"


def test_real_benchmark_prints_ratios_to_both_rivals_and_their_geometric_means(tmp_path):
    """A text model (int64 token ids and mask) and a convnet at their small sizes, natively against onnxruntime and
    OpenVINO, then the text model in wasm in Node against onnxruntime-web."""
    command = [sys.executable, "benchmarks/real.py", "--models", "minilm", "squeezenet1_1", "--size", "small"]
    command += ["--repeat", "2", "--slowest", "2", "--cache", str(tmp_path)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("minilm: compiled for llvm in ") for line in lines)
    for name in ("minilm", "squeezenet1_1"):
        (row,) = [line for line in lines if line.startswith(f"| {name} |")]
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert float(cells[1]) > 0 and len(cells) == 8
        for times, versus_onnxruntime, versus_openvino in (cells[2:5], cells[5:8]):
            assert all(float(ms) > 0 for ms in times.split(" / "))
            assert versus_onnxruntime.endswith("×") and versus_openvino.endswith("×")
    (means,) = [line for line in lines if line.startswith("| geometric mean |")]
    assert means.count("×") == 4
    assert any(line.startswith("| fused_") for line in lines), "the slowest groups are missing"

    command = [sys.executable, "benchmarks/real.py", "--models", "minilm", "--size", "small", "--repeat", "2"]
    command += ["--wasm", "--cache", str(tmp_path)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (row,) = [line for line in result.stdout.splitlines() if line.startswith("| minilm |")]
    assert row.rstrip(" |").endswith("×")


def test_quantized_benchmark_reports_or_refuses_each_file(tmp_path):
    """MobileNetV3-Large at its small size (--quick, about 25 s): its int8 (static QDQ) and float16 files are each either
    compiled, checked against onnxruntime and timed (a table row) or refused with the reason (a line), whichever the
    quantized ops Tessel has at the time allow; a convnet has no MatMul for the 4-bit quantizer, which says so."""
    command = [sys.executable, "benchmarks/quantized.py", "--models", "mobilenet_v3_large", "--quick"]
    command += ["--cache", str(tmp_path)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("mobilenet_v3_large float32: compiled for llvm in ") for line in lines)
    assert any(line.startswith("mobilenet_v3_large 4-bit (MatMulNBits): no MatMul") for line in lines)
    timed = 0
    for label in ("int8 (static QDQ)", "float16"):
        rows = [line for line in lines if line.startswith(f"| mobilenet_v3_large | {label} |")]
        refused = [line for line in lines if line.startswith(f"mobilenet_v3_large {label}: Tessel refuses it: ")]
        assert len(rows) + len(refused) == 1, (label, result.stdout)
        for row in rows:
            cells = [cell.strip() for cell in row.strip("|").split("|")]
            assert len(cells) == 10 and float(cells[2]) > 0 and cells[3].endswith("×")
            for times, versus_onnxruntime, versus_float in (cells[4:7], cells[7:10]):
                assert all(float(ms) > 0 for ms in times.split(" / "))
                assert versus_onnxruntime.endswith("×") and versus_float.endswith("×")
        timed += len(rows)
    assert sum(line.startswith("| geometric mean |") for line in lines) == (timed > 0)


def test_threads_benchmark_prints_a_row_per_model_and_pattern():
    command = [sys.executable, "benchmarks/threads.py", "--models", "mlp", "small_convnet", "--rounds", "2"]
    command += ["--patterns", "back-to-back", "every 50 ms"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith(("| mlp |", "| small_convnet |"))]
    assert [row.split("|")[2].strip() for row in rows] == ["back-to-back", "every 50 ms"] * 2
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == 9 and all(float(cell) > 0 for cell in cells[-3:-1])
        # the slowest CPU's speed over the fastest's, before and after the row (common.cpu_speeds)
        assert all(0 < float(spread) <= 1 for spread in cells[-1].split(" / "))


def test_browser_benchmark_prints_a_row_per_call_pattern():
    """In headless Chromium against onnxruntime-web's wasm build: both first outputs are checked on a first and a
    second visit, then each pattern's runs are timed (the busy-core one with its loads again)."""
    command = [sys.executable, "benchmarks/browser.py", "--backend", "wasm", "--models", "mlp", "--loads", "1"]
    command += ["--repeat", "2"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| mlp |")]
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    assert [row[1] for row in cells] == ["back to back", "a run every 200 ms", "back to back, one core busy"]
    for row in cells:
        assert len(row) == 13 and row[4].endswith("×") and row[7].endswith("×") and row[10].endswith("×")
        assert float(row[5]) > 0 and float(row[6]) > 0 and float(row[8]) > 0 and float(row[9]) > 0
    assert "mlp: Tessel ran asked for wasm, model." in result.stderr, "Tessel's side did not say what it ran"


def test_kernels_benchmark_matches_each_group_to_onnxruntime_nodes():
    command = [sys.executable, "benchmarks/kernels.py", "digits", "--repeat", "2", "--rounds", "1"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].startswith("whole run: Tessel ")
    rows = [line for line in lines if line.startswith("| fused_")]
    assert rows and any("ConvNCHWc" in row and "| Conv" in row for row in rows), result.stdout


def run_in_benchmarks(code: str) -> None:
    """`code` run by a fresh Python in benchmarks/ (where `import common` finds the scripts' helpers); it must pass."""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "benchmarks", capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_cpu_speeds_times_every_cpu_of_the_affinity_and_gives_the_affinity_back():
    code = (
        "import os, common\n"
        "saved = os.sched_getaffinity(0)\n"
        "speeds = common.cpu_speeds(rounds=1000, repeat=2)\n"
        "assert sorted(speeds) == sorted(saved) and all(speed > 0 for speed in speeds.values()), speeds\n"
        "assert os.sched_getaffinity(0) == saved\n"
        "assert 0 < common.speed_spread(speeds) <= 1\n"
    )
    run_in_benchmarks(code)


def test_settled_cell_times_both_sides_again_while_a_probe_shows_uneven_cpus():
    # the speed probe is replaced by a script of spreads: the first attempt sees a slow CPU in one of its pauses,
    # the second sees even CPUs throughout and is kept; a cell that never settles keeps its most even attempt
    code = (
        "import common\n"
        "def run(spreads):\n"
        "    readings = iter(spreads)\n"
        "    common.cpu_speeds = lambda: {0: 1.0, 1: next(readings)}\n"
        "    calls = []\n"
        "    def time_cell(after_pause):\n"
        "        calls.append(len(calls))\n"
        "        after_pause(); after_pause()\n"
        "        return [[float(len(calls))], [float(len(calls))]]\n"
        "    return common.settled_cell(time_cell)\n"
        "assert run([1.0, 0.5, 1.0, 0.95, 0.97, 0.99]) == ([[2.0], [2.0]], 0.95, 2)\n"
        "assert run([0.6, 0.6, 0.6, 0.8, 0.7, 0.85, 0.5, 0.5, 0.5]) == ([[2.0], [2.0]], 0.7, 3)\n"
    )
    run_in_benchmarks(code)


def test_check_close_scales_its_absolute_tolerance_with_the_outputs_range():
    # a Winograd conv's rounding (2.4e-5 on outputs up to 6.4) passes; an error of 1e-3 on them stops the benchmark
    code = (
        "import numpy as np, common\n"
        "theirs = np.linspace(-6.4, 6.4, 101, dtype=np.float32)\n"
        "common.check_close('m', [theirs + np.float32(2.4e-5)], [theirs])\n"
        "try:\n"
        "    common.check_close('m', [theirs + np.float32(1e-3)], [theirs])\n"
        "    raise AssertionError('a wrong output was timed')\n"
        "except SystemExit as stop:\n"
        "    assert 'disagrees' in str(stop)\n"
    )
    run_in_benchmarks(code)
