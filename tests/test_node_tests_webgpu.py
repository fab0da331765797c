"""ONNX's backend node tests compiled for webgpu and run on lavapipe: every case must match ONNX's expected outputs, or
be refused at compile time by an error naming the dtype WebGPU lacks (int64, float64, float16 without shader-f16)
and the target. The counts are in docs/gpu.md. The `_expanded` cases are left out, as they are for wasm and opencl
(tests/test_node_tests_compiled.py says why)."""

import re
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "frontend"))
from node_cases import run_compiled_node_tests  # noqa: E402

# "kernel kernel_0 for target webgpu: buffer X holds int64, which webgpu has not (...)" and the codegen's own form
REFUSAL = re.compile(
    r"(holds|computes in|has dtype) (int64|float64|bool|int8|uint8|int16|uint16|uint64|float16).*webgpu"
)
# close below today's count (582, docs/gpu.md), so a change turning passing cases into failures or refusals fails here
MINIMUM_PASSING = 575
# No case fails today (docs/gpu.md); each must pass or be refused for a dtype.
MAXIMUM_FAILING = 0


@pytest.mark.slow
def test_node_tests_on_webgpu(capsys, tmp_path):
    report, seconds = run_compiled_node_tests("webgpu", expanded=False)
    failed = report.failures()
    refused = [result for result in failed if REFUSAL.search(result.reason)]
    failures = [result for result in failed if result not in refused]
    table = report.table()
    (tmp_path / "node_tests_webgpu.txt").write_text(table + "\n")
    with capsys.disabled():
        print(f"\nONNX node tests on webgpu ({seconds:.0f} s):\n{table}")
        dtypes = Counter(REFUSAL.search(result.reason).group(2) for result in refused)
        print(f"passed {report.count('passed')}, refused for a dtype {len(refused)} {dict(dtypes)}, failed:")
        print("\n".join(f"  {result.name} [{result.op}]: {result.reason}" for result in failures))
    assert len(failures) <= MAXIMUM_FAILING, f"{len(failures)} node-test cases fail on webgpu (see the list above)"
    assert report.count("passed") >= MINIMUM_PASSING
