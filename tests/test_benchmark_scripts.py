"""benchmarks/cpu.py and benchmarks/ops.py run end to end on their smallest cases: it checks Tessel's outputs against onnxruntime's
before it times anything, and prints its table, the reference timings and the slowest groups. Nothing here looks
at the times themselves (speed is measured by the scripts, never asserted by tests)."""

import subprocess
import sys
from pathlib import Path

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


def test_ops_benchmark_prints_its_table_for_one_case():
    case = "reduce_mean last axis 12x128x128"
    command = [sys.executable, "benchmarks/ops.py", "--cases", case, "--repeat", "30"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (row,) = [line for line in result.stdout.splitlines() if line.startswith(f"| {case} |")]
    assert row.rstrip(" |").endswith("×")
