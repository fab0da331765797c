"""The model fuzzer in the suite (issue 14): a fixed-seed run of damaged models (bit flips, truncations, edits of
dims, dtypes, attributes, raw_data, names, inputs and op types of small models and the zoo's small ones) must
end every case in one TesselError or a result matching onnxruntime; so must a run over quantized seeds with their
integer mutations (issue 41, fuzz_quantized.py). The cases run in one child process (the long mode,
`python -m tests.fuzz`), so that a signal or hang fails this test naming the case instead of taking pytest down;
inside it each case has an alarm."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = 1200
# The quantized seeds are small, and most cases end in a check: a thousand take a few seconds.
QUANTIZED_CASES = 1000


def _fuzz(*arguments: str) -> dict:
    command = [sys.executable, "-m", "tests.fuzz", *arguments]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    last_case = (done.stderr.strip().splitlines() or ["no case"])[-1]
    assert done.returncode in (0, 1), (
        f"the fuzzer died (status {done.returncode}) in {last_case}:\n{done.stderr[-2000:]}"
    )
    report = json.loads(done.stdout)
    print(report["outcomes"])
    return report


def test_damaged_models_end_in_a_clear_error_or_a_matching_result():
    report = _fuzz("--cases", str(CASES), "--seed", "1", "--zoo", "mlp,digits,dwconv_block", "--compile-every", "10")
    assert sum(report["outcomes"].values()) == CASES
    assert report["outcomes"].get("match", 0) > CASES // 20, "too few cases survive to be compared with onnxruntime"
    assert report["defects"] == []


def test_damaged_quantized_models_end_in_a_clear_error_or_a_matching_result():
    report = _fuzz("--quantized", "--cases", str(QUANTIZED_CASES), "--seed", "1", "--compile-every", "5")
    assert sum(report["outcomes"].values()) == QUANTIZED_CASES
    # a malformed scale or zero point that Tessel accepts must compute what onnxruntime does (a nan or zero scale
    # is valid ONNX): enough cases get that far to be compared
    assert report["outcomes"].get("match", 0) > QUANTIZED_CASES // 10, "too few cases are compared with onnxruntime"
    assert report["defects"] == []
