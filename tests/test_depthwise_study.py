"""benchmarks/depthwise_study.py end to end on small shapes, its GPU schedules run serially on llvm (contract point
0): every kernel is checked against the reference executor before it is timed, and the three tables print. Nothing
here looks at the times."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_depthwise_study_prints_its_three_tables():
    command = [sys.executable, "benchmarks/depthwise_study.py", "--target", "llvm", "--limits", "webgpu"]
    command += ["--grid-shape", "1x2x32x32", "--vthread-shape", "1x2x64x64", "--threads", "8", "16", "32"]
    command += ["--rounds", "1", "--repeat", "1"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("depthwise study on llvm; schedules for webgpu")
    header = next(line for line in lines if line.startswith("| num_thread_y \\ x |"))
    assert header.count("|") == 5
    # 16 x 32 threads are 512, beyond WebGPU's 256 per workgroup: that cell is not built
    (row,) = [line for line in lines if line.startswith("| 16 |")]
    assert row.rstrip(" |").endswith("-")
    assert any(line.startswith("| 8 | 16 | 1 | 2 |") for line in lines)
    assert any(line.startswith("| three kernels (depthwise, scale_shift, relu) |") for line in lines)
    assert any(line.startswith("fused / alone = ") for line in lines)
