"""ONNX's backend node tests compiled ahead of time: each case becomes a whole Module (compile_model) for
the host, for wasm and for opencl (run on PoCL), and must match ONNX's expected outputs wherever the reference
executor does. A case whose op has no kernel yet is skipped with UnsupportedOpError's reason, counted in the table.
OpenCL C has every dtype the compiler has, so no case is refused there; webgpu, which refuses some dtypes, has its
own test (test_node_tests_webgpu.py).

The `_expanded` cases (347 of the 1001 that run: an op written as its ONNX function body, a graph of other ops each
with cases of its own) run on llvm only. wasm and opencl share llvm's graph passes and fusion, and their kernels for
each of those ops are tested by the op's own cases; the expanded ones cost about a third of each target's time, and
the suite must fit its budget on a cold 2-core machine.

Each case is compiled and linked on its own (about 0.1-0.2 s on the CPU targets; on opencl PoCL's clang build of
each kernels.cl dominates, and PoCL caches the builds, so a second run is several times faster), so the cases are
split between two worker processes: the machines this runs on have two cores."""

import sys
from pathlib import Path

import pytest

# the node-test loop lives beside the reference executor's test; run alone, this file must still find it
sys.path.insert(0, str(Path(__file__).parent / "frontend"))
from node_cases import run_compiled_node_tests  # noqa: E402

# close below today's count of cases compiled and passed on each target (1021 on llvm, 674 on wasm and opencl
# without the expanded cases: the quantized ops' 20 joined them), so that a change turning passing cases into skips
# fails here
MINIMUM_PASSING = {"llvm": 1015, "wasm": 668, "opencl": 668}


@pytest.mark.slow
@pytest.mark.parametrize("target", ["llvm", "wasm", "opencl"])
def test_node_tests_pass_compiled(target, capsys, tmp_path):
    report, seconds = run_compiled_node_tests(target, expanded=target == "llvm")
    table = report.table()
    (tmp_path / f"node_tests_{target}.txt").write_text(table + "\n")
    with capsys.disabled():
        print(f"\nONNX node tests compiled for {target} ({seconds:.0f} s):\n{table}")
    failures = report.failures()
    assert not failures, f"{len(failures)} node-test case(s) fail compiled for {target}:\n" + "\n".join(
        f"  {result.name} [{result.op}]: {result.reason}" for result in failures
    )
    assert report.count("passed") >= MINIMUM_PASSING[target]
