"""The model fuzzer in the suite (issue 14): a fixed-seed run of damaged models (bit flips, truncations, edits of
dims, dtypes, attributes, raw_data, names, inputs and op types of small models and the zoo's small ones) must
end every case in one TesselError or a result matching onnxruntime. The cases run in one child process (the
long mode, `python -m tests.fuzz`), so that a signal or hang fails this test naming the case instead of
taking pytest down; inside it each case has an alarm."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = 1200


def test_damaged_models_end_in_a_clear_error_or_a_matching_result():
    command = [sys.executable, "-m", "tests.fuzz", "--cases", str(CASES), "--seed", "1"]
    command += ["--zoo", "mlp,digits,dwconv_block", "--compile-every", "10"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    last_case = (done.stderr.strip().splitlines() or ["no case"])[-1]
    assert done.returncode in (0, 1), (
        f"the fuzzer died (status {done.returncode}) in {last_case}:\n{done.stderr[-2000:]}"
    )
    report = json.loads(done.stdout)
    print(report["outcomes"])
    assert sum(report["outcomes"].values()) == CASES
    assert report["outcomes"].get("match", 0) > CASES // 20, "too few cases survive to be compared with onnxruntime"
    assert report["defects"] == []
