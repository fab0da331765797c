"""`tessel tune` end to end on a small real model: the log it writes, the report and its PNG, `tessel compile
--tuning-records` applying it, Ctrl-C (a real SIGINT to a real process) leaving a log that resumes, and one-line
errors for a missing model or a corrupted log."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
import onnxruntime
import pytest

from compiler.build import load_module
from compiler.cli import main
from compiler.tune.records import read_records
from compiler.tune.session import pretrained_on
from compiler.tune.task import extract_tasks
from tests.tune.test_records import RNG, conv_model


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "conv.onnx"
    onnx.save(conv_model(), path)
    return path


def test_tune_report_and_compile_with_the_log(model_path, tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    assert main(["tune", str(model_path), "--trials", "6", "-o", str(log), "--tuner", "random", "--workers", "2"]) == 0
    captured = capsys.readouterr()
    assert "task 1/1 conv2d (Conv+Relu): trials" in captured.err and "compile with: tessel compile" in captured.out
    assert "confirmed against their defaults in interleaved rounds:" in captured.out
    records = read_records(log)
    searched = [record for record in records if "confirmation" not in record]
    assert len(searched) == 6 and sum(record["fallback"] for record in searched) == 1
    # the search's best configs and the fallback were measured again; one of them is chosen for compiles
    (chosen,) = [record for record in records if record.get("chosen")]
    assert 2 <= sum("confirmation" in record for record in records) <= 4
    png = tmp_path / "curves.png"
    assert main(["tune", "--report", str(log), "--plot", str(png)]) == 0
    report = capsys.readouterr().out.splitlines()
    assert report[0].split()[:6] == ["task", "ops", "trials", "failed", "default", "best"]
    assert report[1].split()[:4] == ["1", "conv2d", "Conv+Relu", "6"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bundle = tmp_path / "conv.bundle"
    assert main(["compile", str(model_path), "--target", "llvm", "--tuning-records", str(log), "-o", str(bundle)]) == 0
    module = load_module(bundle)
    assert module.manifest["kernels"][0]["config"] == chosen["config"]
    feeds = {"x": RNG.standard_normal((1, 8, 14, 14)).astype(np.float32)}
    expected = onnxruntime.InferenceSession(str(model_path)).run(None, feeds)[0]
    np.testing.assert_allclose(module.run(feeds)["y"], expected, rtol=1e-4, atol=1e-5)


def test_ctrl_c_leaves_a_log_that_resumes(model_path, tmp_path):
    log = tmp_path / "log.jsonl"
    # 40 repeats of at least 10 ms make each candidate take about half a second: the run is still going at the signal
    command = [sys.executable, "-m", "compiler", "tune", str(model_path), "--trials", "8", "-o", str(log)]
    command += ["--tuner", "random", "--repeat", "40", "--workers", "2"]
    # a shell's background job ignores SIGINT and its children inherit that: the tuner gets the default, as in a terminal
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 2):
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "run the same command to resume" in out and "Traceback" not in err
    done = read_records(log)
    assert 2 <= len(done) < 8 and log.read_text().endswith("\n")
    # the same command resumes: what the log holds is not measured again, --trials counts new measurements
    command[command.index("--repeat") + 1] = "1"
    command[command.index("--trials") + 1] = "2"
    finished = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert f"resuming: {len(done)} measurements" in finished.stdout
    again = read_records(log)
    assert again[: len(done)] == done
    assert sum("confirmation" not in record for record in again[len(done) :]) == 2


def test_tune_errors_are_one_line(model_path, tmp_path, capsys):
    assert main(["tune"]) == 2
    assert "name the .onnx model to tune" in capsys.readouterr().err
    assert main(["tune", str(tmp_path / "missing.onnx")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["tune", str(model_path), "--tuner", "annealing", "-o", str(tmp_path / "log.jsonl")]) == 2
    assert "unknown tuner 'annealing'" in capsys.readouterr().err
    corrupted = tmp_path / "log.jsonl"
    corrupted.write_text("{not json\n")
    assert main(["tune", "--report", str(corrupted)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "line 1 is not a record" in lines[0]


def test_transfer_warm_starts_from_other_logs(model_path, tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    assert main(["tune", str(model_path), "--trials", "6", "-o", str(log), "--tuner", "random", "--workers", "2"]) == 0
    # the same conv on a larger input: another task, which the first log's records pretrain a cost model for
    larger = conv_model()
    for value_info, shape in ((larger.graph.input[0], (1, 8, 20, 20)), (larger.graph.output[0], (1, 16, 10, 10))):
        for dimension, size in zip(value_info.type.tensor_type.shape.dim, shape):
            dimension.dim_value = size
    larger_path = tmp_path / "larger.onnx"
    onnx.save(larger, larger_path)
    (task,) = extract_tasks(str(larger_path), "llvm")
    assert pretrained_on([log], [task]) is not None
    # a log of the very task being tuned teaches nothing beyond its own search: it is left out
    (own,) = extract_tasks(str(model_path), "llvm")
    assert pretrained_on([log], [own]) is None
    capsys.readouterr()
    transferred = tmp_path / "larger.jsonl"
    command = ["tune", str(larger_path), "--trials", "4", "-o", str(transferred), "--workers", "2"]
    assert main([*command, "--transfer", str(log)]) == 0
    out = capsys.readouterr().out
    assert "tuning cold" not in out and "compile with: tessel compile" in out
    assert len(read_records(transferred)) >= 4
    assert main([*command, "--tuner", "random", "--transfer", str(log)]) == 2
    assert "--transfer warm-starts the xgb tuner" in capsys.readouterr().err
    assert main([*command, "--transfer", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
