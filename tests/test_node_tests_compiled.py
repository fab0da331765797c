"""ONNX's backend node tests compiled ahead of time: each case becomes a whole Module (compile_model) for
the host and for wasm, and must match ONNX's expected outputs wherever the reference executor does. A
case whose op has no kernel yet is skipped with UnsupportedOpError's reason, counted in the table.

Each case is compiled and linked on its own (about 0.1-0.2 s), so the cases are split between two
worker processes: the machines this runs on have two cores."""

import functools
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from compiler.build import compile_model

# the node-test loop lives beside the reference executor's test; run alone, this file must still find it
sys.path.insert(0, str(Path(__file__).parent / "frontend"))
from node_cases import NodeTestReport, _node_cases, run_node_tests  # noqa: E402

# close below today's count of cases compiled and passed on each target, so that a change turning
# passing cases into skips fails here
MINIMUM_PASSING = 995
WORKERS = 2


def _compiled(target: str, graph, feeds):
    return compile_model(graph, target=target).run(feeds)


def _run_share(target: str, names: list[str]) -> NodeTestReport:
    return run_node_tests(functools.partial(_compiled, target), set(names))


@pytest.mark.slow
@pytest.mark.parametrize("target", ["llvm", "wasm"])
def test_node_tests_pass_compiled(target, capsys, tmp_path):
    started = time.perf_counter()
    names = [case.name for case in _node_cases()]
    shares = [names[worker::WORKERS] for worker in range(WORKERS)]
    with ProcessPoolExecutor(WORKERS, mp_context=multiprocessing.get_context("spawn")) as pool:
        reports = list(pool.map(_run_share, [target] * WORKERS, shares))
    report = NodeTestReport(tuple(result for part in reports for result in part.results))
    seconds = time.perf_counter() - started
    table = report.table()
    (tmp_path / f"node_tests_{target}.txt").write_text(table + "\n")
    with capsys.disabled():
        print(f"\nONNX node tests compiled for {target} ({seconds:.0f} s, {WORKERS} processes):\n{table}")
    failures = report.failures()
    assert not failures, f"{len(failures)} node-test case(s) fail compiled for {target}:\n" + "\n".join(
        f"  {result.name} [{result.op}]: {result.reason}" for result in failures
    )
    assert report.count("passed") >= MINIMUM_PASSING
