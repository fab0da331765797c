"""benchmarks/depthwise_study.py end to end on small shapes on PoCL (OpenCL): every case is compiled with its knob
values as a tuning record and checked against the reference executor before it is timed, and its tables print.
Nothing here looks at the times."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_depthwise_study_prints_its_tables_on_opencl():
    command = [sys.executable, "benchmarks/depthwise_study.py", "--target", "opencl", "--skip", "vthread"]
    command += ["--grid-shape", "1x2x32x32", "--vthread-shape", "1x2x32x64", "--threads", "16", "32"]
    command += ["--rounds", "1", "--repeat", "1"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("depthwise study on ") and "(opencl)" in lines[0]
    header = next(line for line in lines if line.startswith("| num_thread_y \\ x |"))
    assert header.count("|") == 4
    # 16 x 32 threads are 512, beyond the OpenCL target's 256 per work-group: those cells are not built
    row = next(line for line in lines if line.startswith("| 16 |"))  # the grid's; table 1b repeats it as measured
    cells = [cell.strip() for cell in row.strip(" |").split("|")]
    assert float(cells[1]) > 0 and cells[2] == "-"
    assert any(line.startswith("| three kernels (depthwise, scale_shift, relu) |") for line in lines)
    assert any(line.startswith("fused / alone = ") for line in lines)
