"""ONNX's backend node tests through the importer and the reference executor: every case whose ops and
dtypes Tessel supports, at an opset it reads (directly or through onnx.version_converter), must match
ONNX's expected outputs."""

import numpy as np
import pytest
from node_cases import run_node_tests

from compiler.graph.reference import run_reference

# close below today's count (about 990), so that a change turning passing cases into skips fails here
MINIMUM_PASSING = 900


@pytest.mark.slow
def test_onnx_node_tests_match_expected_outputs(capsys, tmp_path):
    report = run_node_tests(run_reference)
    table = report.table()
    (tmp_path / "node_tests.txt").write_text(table + "\n")
    with capsys.disabled():
        print(f"\nONNX node tests through the reference executor (also in {tmp_path / 'node_tests.txt'}):\n{table}")
    failures = report.failures()
    assert not failures, f"{len(failures)} supported node-test case(s) fail:\n" + "\n".join(
        f"  {result.name} [{result.op}]: {result.reason}" for result in failures
    )
    assert report.count("passed") >= MINIMUM_PASSING


def test_a_wrong_or_crashing_runner_fails_its_cases():
    names = {"test_relu", "test_add", "test_matmul_2d"}

    def off_by_one(graph, inputs):
        return {name: array + np.ones((), array.dtype) for name, array in run_reference(graph, inputs).items()}

    def crashing(graph, inputs):
        raise RuntimeError("kernel exploded")

    wrong = run_node_tests(off_by_one, names)
    assert sorted(result.name for result in wrong.failures()) == sorted(names)
    assert all("differs" in result.reason for result in wrong.failures())
    crashed = run_node_tests(crashing, names)
    assert {result.reason for result in crashed.failures()} == {"RuntimeError: kernel exploded"}
