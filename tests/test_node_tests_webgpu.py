"""ONNX's backend node tests compiled for webgpu and run on lavapipe: every case must match ONNX's expected outputs, or
be refused at compile time by an error naming the dtype WebGPU lacks (int64, float64, float16 without shader-f16)
and the target. The counts are in docs/gpu.md."""

import multiprocessing
import re
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from compiler.build import compile_model

sys.path.insert(0, str(Path(__file__).parent / "frontend"))
from node_cases import NodeTestReport, _node_cases, run_node_tests  # noqa: E402

WORKERS = 2
# "kernel kernel_0 for target webgpu: buffer X holds int64, which webgpu has not (...)" and the codegen's own form
REFUSAL = re.compile(
    r"(holds|computes in|has dtype) (int64|float64|bool|int8|uint8|int16|uint16|uint64|float16).*webgpu"
)
# close below today's count (docs/gpu.md), so a change turning passing cases into failures or refusals fails here
MINIMUM_PASSING = 895
# No case fails today (docs/gpu.md); each must pass or be refused for a dtype.
MAXIMUM_FAILING = 0


def _compiled(graph, feeds):
    return compile_model(graph, target="webgpu").run(feeds)


def _run_share(names: list[str]) -> NodeTestReport:
    return run_node_tests(_compiled, set(names))


@pytest.mark.slow
def test_node_tests_on_webgpu(capsys, tmp_path):
    started = time.perf_counter()
    names = [case.name for case in _node_cases()]
    shares = [names[worker::WORKERS] for worker in range(WORKERS)]
    with ProcessPoolExecutor(WORKERS, mp_context=multiprocessing.get_context("spawn")) as pool:
        reports = list(pool.map(_run_share, shares))
    report = NodeTestReport(tuple(result for part in reports for result in part.results))
    failed = report.failures()
    refused = [result for result in failed if REFUSAL.search(result.reason)]
    failures = [result for result in failed if result not in refused]
    table = report.table()
    (tmp_path / "node_tests_webgpu.txt").write_text(table + "\n")
    with capsys.disabled():
        print(f"\nONNX node tests on webgpu ({time.perf_counter() - started:.0f} s, {WORKERS} processes):\n{table}")
        dtypes = Counter(REFUSAL.search(result.reason).group(2) for result in refused)
        print(f"passed {report.count('passed')}, refused for a dtype {len(refused)} {dict(dtypes)}, failed:")
        print("\n".join(f"  {result.name} [{result.op}]: {result.reason}" for result in failures))
    assert len(failures) <= MAXIMUM_FAILING, f"{len(failures)} node-test cases fail on webgpu (see the list above)"
    assert report.count("passed") >= MINIMUM_PASSING
