"""ONNX's backend node tests compiled for opencl and run on PoCL: every case the CPU targets pass must match ONNX's
expected outputs here too (OpenCL C has every dtype the compiler has, so none is refused). The counts are in
docs/gpu.md. Each case builds its own kernels.cl with PoCL's clang, which dominates the time (PoCL caches the builds
under ~/.cache/pocl, so a second run is several times faster)."""

import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from compiler.build import compile_model

sys.path.insert(0, str(Path(__file__).parent / "frontend"))
from node_cases import NodeTestReport, _node_cases, run_node_tests  # noqa: E402

WORKERS = 2
# close below today's count (docs/gpu.md), so a change turning passing cases into failures fails here
MINIMUM_PASSING = 995


def _compiled(graph, feeds):
    return compile_model(graph, target="opencl").run(feeds)


def _run_share(names: list[str]) -> NodeTestReport:
    return run_node_tests(_compiled, set(names))


@pytest.mark.slow
def test_node_tests_on_opencl(capsys, tmp_path):
    started = time.perf_counter()
    names = [case.name for case in _node_cases()]
    shares = [names[worker::WORKERS] for worker in range(WORKERS)]
    with ProcessPoolExecutor(WORKERS, mp_context=multiprocessing.get_context("spawn")) as pool:
        reports = list(pool.map(_run_share, shares))
    report = NodeTestReport(tuple(result for part in reports for result in part.results))
    table = report.table()
    (tmp_path / "node_tests_opencl.txt").write_text(table + "\n")
    with capsys.disabled():
        print(f"\nONNX node tests on opencl ({time.perf_counter() - started:.0f} s, {WORKERS} processes):\n{table}")
    failures = report.failures()
    assert not failures, f"{len(failures)} node-test case(s) fail on opencl:\n" + "\n".join(
        f"  {result.name} [{result.op}]: {result.reason}" for result in failures
    )
    assert report.count("passed") >= MINIMUM_PASSING
