"""`tessel compile`, `tessel run` and `tessel bench` in-process: a bundle compiled from an .onnx file runs
and matches onnxruntime; every user mistake ends as one `tessel: error:` line and exit status 2."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler import zoo
from compiler.build import load_module
from compiler.cli import COMMANDS, main


@pytest.fixture(scope="module")
def mlp_bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    model = zoo.save_model("mlp", folder / "mlp.onnx")
    assert main(["compile", str(model), "--target", "wasm", "-o", str(folder / "mlp"), "--verbose"]) == 0
    return folder / "mlp"


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tessel: error: "), captured.err
    return lines[0]


def test_the_commands_are_registered():
    assert {"compile", "run", "bench", "zoo", "inspect", "demo"} <= set(COMMANDS)


def test_compile_verbose_reports_kernels_memory_and_progress(tmp_path, capsys):
    model = zoo.save_model("digits", tmp_path / "digits.onnx")
    assert main(["compile", str(model), "--target", "llvm", "-o", str(tmp_path / "out"), "--verbose"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"arena: [\d,]+ bytes peak for [\d,]+ bytes of intermediates", out)
    assert "[100%] done" in out and "linking" in out and "kernel_0" in out
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["target"] == "llvm"


def test_stale_tuning_records_are_one_warning_line(tmp_path, capsys):
    model = zoo.save_model("mlp", tmp_path / "mlp.onnx")
    records = tmp_path / "records.jsonl"
    old_form = {"op": "Gemm", "shapes": [[1, 784], [512, 784], [512]], "dtype": "float32", "target": "wasm"}
    records.write_text(json.dumps({"task": old_form, "config": {"tile_n": 4}, "seconds": 0.001}) + "\n")
    assert (
        main(["compile", str(model), "--target", "wasm", "-o", str(tmp_path / "out"), "--records", str(records)]) == 0
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tessel: warning: 1 tuning record(s)"), lines


def test_run_with_an_input_file_matches_onnxruntime(mlp_bundle, tmp_path, capsys):
    feeds = zoo.sample_input("mlp", seed=4)
    np.save(tmp_path / "x.npy", feeds["input"])
    assert (
        main(["run", str(mlp_bundle), "--input", f"input={tmp_path / 'x.npy'}", "--output", str(tmp_path / "y.npy")])
        == 0
    )
    assert "output: float32[1, 10]" in capsys.readouterr().out
    (expected,) = ort.InferenceSession(zoo.build_model("mlp").SerializeToString()).run(None, feeds)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-4, atol=1e-5)


def test_run_without_inputs_uses_random_ones_and_bench_times(mlp_bundle, capsys):
    assert main(["run", str(mlp_bundle)]) == 0
    assert "output: float32[1, 10]" in capsys.readouterr().out
    assert main(["bench", str(mlp_bundle), "--repeat", "3"]) == 0
    assert re.search(r"median [\d.]+ ms, min [\d.]+ ms, max [\d.]+ ms over 3 runs", capsys.readouterr().out)


def test_user_mistakes_exit_2_with_one_message(mlp_bundle, tmp_path, capsys):
    model = zoo.save_model("mlp", tmp_path / "mlp.onnx")
    assert "unknown target 'tpu'" in _error(
        capsys, ["compile", str(model), "--target", "tpu", "-o", str(tmp_path / "o")]
    )
    assert "no such file" in _error(capsys, ["compile", str(tmp_path / "absent.onnx")])
    np.save(tmp_path / "wrong.npy", np.zeros((1, 5), np.float32))
    assert "shape (1, 5), the model takes (1, 784)" in _error(
        capsys, ["run", str(mlp_bundle), "--input", str(tmp_path / "wrong.npy")]
    )
    np.save(tmp_path / "ints.npy", np.zeros((1, 784), np.int32))
    assert "dtype int32" in _error(capsys, ["run", str(mlp_bundle), "--input", str(tmp_path / "ints.npy")])
    assert "unknown input 'image'" in _error(
        capsys, ["run", str(mlp_bundle), "--input", f"image={tmp_path / 'ints.npy'}"]
    )
    assert "no such directory" in _error(capsys, ["bench", str(tmp_path / "nothing")])


def test_a_corrupted_bundle_exits_2(tmp_path, capsys):
    model = zoo.save_model("mlp", tmp_path / "mlp.onnx")
    bundle = tmp_path / "b"
    assert main(["compile", str(model), "-o", str(bundle)]) == 0
    data = bytearray((bundle / "params.bin").read_bytes())
    data[0] ^= 1
    (bundle / "params.bin").write_bytes(bytes(data))
    assert "params.bin is corrupted" in _error(capsys, ["run", str(bundle)])


def test_a_model_with_external_data_compiles_from_its_path_and_matches_onnxruntime(tmp_path, capsys):
    import onnx

    model = zoo.build_model("mlp")
    path = tmp_path / "mlp.onnx"
    onnx.save(model, path, save_as_external_data=True, location="mlp.onnx.data", size_threshold=1024)
    assert (tmp_path / "mlp.onnx.data").stat().st_size > path.stat().st_size
    assert main(["compile", str(path), "--target", "wasm", "-o", str(tmp_path / "bundle")]) == 0
    x = np.random.default_rng(0).standard_normal((1, 784)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert (
        main(["run", str(tmp_path / "bundle"), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")])
        == 0
    )
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-4, atol=1e-5)
    (tmp_path / "mlp.onnx.data").unlink()
    assert "keeps its data in 'mlp.onnx.data', which is missing" in _error(capsys, ["compile", str(path)])


@pytest.mark.parametrize(
    "shape, message",
    [
        ("input=99999999999999999999,8", "more than a 64-bit size can count"),
        ("input=3000000,784", "Tessel's kernels index with 32-bit integers"),
        ("input=1000000,784", "but wasm32 addresses 4,294,967,296"),
    ],
)
def test_shapes_too_large_for_the_target_are_refused_before_code_generation(tmp_path, capsys, shape, message):
    model = zoo.save_model("mlp", tmp_path / "mlp.onnx")
    assert message in _error(capsys, ["compile", str(model), "--target", "wasm", "--input-shape", shape])


WASM_FILES = {"model.wasm", "model.threads.wasm", "model.relaxed-simd.wasm", "model.threads.relaxed-simd.wasm"}

# Loads a bundle in Node through web_runtime/tessel.js at two threads and prints the variant it ran and its output.
NODE_RUN = """
import { readFileSync } from "node:fs";
import * as tessel from "./web_runtime/tessel.js";
const [bundle, input] = process.argv.slice(1);
const bytes = readFileSync(input);
const model = await tessel.load(bundle, { threads: 2 });
const outputs = await model.run({ [model.inputNames[0]]: new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4) });
console.log(JSON.stringify({ variant: model.variant, output: Array.from(outputs[model.outputNames[0]].data) }));
model.dispose();
"""


def test_compile_for_wasm_writes_every_variant_and_tessel_js_runs_the_threaded_one(mlp_bundle, tmp_path):
    """`tessel compile --target wasm` writes the threads and relaxed-SIMD variants beside the plain code, as the
    service does; tessel.js in Node 20 (threads, no relaxed SIMD without a flag) picks model.threads.wasm at two
    threads and gives the Python runtime's outputs."""
    manifest = json.loads((mlp_bundle / "manifest.json").read_text())
    assert {variant["code"] for variant in manifest["variants"]} == WASM_FILES - {"model.wasm"}
    assert WASM_FILES <= {path.name for path in mlp_bundle.iterdir()}
    module = load_module(mlp_bundle)
    feeds = module.random_inputs(seed=4)
    (expected,) = module.run(feeds).values()
    (tmp_path / "input.bin").write_bytes(next(iter(feeds.values())).astype(np.float32).tobytes())
    node = shutil.which("node")
    if node is None:
        pytest.fail("node (Node.js 20) is not installed; run `make test`, which installs it")
    completed = subprocess.run(
        [node, "--input-type=module", "-e", NODE_RUN, str(mlp_bundle), str(tmp_path / "input.bin")],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    ran = json.loads(completed.stdout)
    assert ran["variant"] == {"code": "model.threads.wasm", "features": ["threads"], "threads": 2}
    np.testing.assert_allclose(np.array(ran["output"], np.float32), expected.ravel(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "choice, variants",
    [("none", set()), ("threads", {"model.threads.wasm"}), ("relaxed-simd", {"model.relaxed-simd.wasm"})],
)
def test_wasm_variants_chooses_the_code_written(choice, variants, tmp_path, capsys):
    model = zoo.save_model("digits", tmp_path / "digits.onnx")
    assert main(["compile", str(model), "--wasm-variants", choice, "-o", str(tmp_path / "out")]) == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert {variant["code"] for variant in manifest.get("variants", [])} == variants
    assert {path.name for path in (tmp_path / "out").glob("*.wasm")} == {"model.wasm", *variants}
    out = capsys.readouterr().out
    assert all(name in out for name in variants) and ("; variants " in out) == bool(variants), out


def test_wasm_variants_on_another_target_is_one_error(tmp_path, capsys):
    model = zoo.save_model("digits", tmp_path / "digits.onnx")
    message = _error(capsys, ["compile", str(model), "--target", "llvm", "--wasm-variants", "threads"])
    assert "--wasm-variants threads applies to --target wasm, not llvm" in message
    assert "invalid choice: 'fast'" in _error(capsys, ["compile", str(model), "--wasm-variants", "fast"])


def _dense_model(weight: np.ndarray, rows: int = 8) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "w"], ["output"])],
        "dense",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [rows, weight.shape[0]])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [rows, weight.shape[1]])],
        [numpy_helper.from_array(weight, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_compile_weights_fp16_stores_the_dense_weights_as_float16(tmp_path, capsys):
    model = zoo.save_model("bert_tiny", tmp_path / "bert_tiny.onnx")
    assert main(["compile", str(model), "--target", "llvm", "--weights", "fp16", "-o", str(tmp_path / "b16")]) == 0
    out = capsys.readouterr().out
    manifest = json.loads((tmp_path / "b16" / "manifest.json").read_text())
    assert manifest["options"]["weights"] == "fp16"
    layout = manifest["params"]["layout"]
    assert sum(entry["dtype"] == "float16" for entry in layout) == 12
    assert (
        f"weights fp16: 12 of {len(layout)} param arrays float16, params {manifest['params']['bytes']:,} bytes" in out
    )
    feeds = zoo.sample_input("bert_tiny", seed=5)
    np.save(tmp_path / "x.npy", feeds["input"])
    assert (
        main(["run", str(tmp_path / "b16"), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")])
        == 0
    )
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, feeds)
    # float16 weights: within 2e-3 of the output's largest magnitude (tests/passes/test_half_weights.py)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=0, atol=2e-3)


def test_compile_weights_fp32_is_the_default_and_writes_no_option(tmp_path, capsys):
    model = tmp_path / "dense.onnx"
    onnx.save(_dense_model(np.ones((64, 96), np.float32)), model)
    assert main(["compile", str(model), "--target", "llvm", "--weights", "fp32", "-o", str(tmp_path / "a")]) == 0
    assert main(["compile", str(model), "--target", "llvm", "-o", str(tmp_path / "b")]) == 0
    assert "weights " not in capsys.readouterr().out
    manifests = [json.loads((tmp_path / name / "manifest.json").read_text()) for name in ("a", "b")]
    assert manifests[0] == manifests[1] and "weights" not in manifests[0]["options"]
    assert {entry["dtype"] for entry in manifests[0]["params"]["layout"]} == {"float32"}


def test_compile_weights_bad_value_or_target_is_one_error(tmp_path, capsys):
    model = zoo.save_model("digits", tmp_path / "digits.onnx")
    message = _error(capsys, ["compile", str(model), "--weights", "int8"])
    assert "argument --weights: invalid choice: 'int8' (choose from 'fp32', 'fp16')" in message
    message = _error(capsys, ["compile", str(model), "--target", "webgpu", "--weights", "fp16"])
    assert "weights fp16 applies to the CPU targets (llvm, wasm)" in message and "webgpu" in message


def test_compile_weights_fp16_keeps_a_weight_beyond_float16_as_float32_with_a_warning(tmp_path, capsys):
    weight = np.ones((64, 96), np.float32)
    weight[1, 2] = 1e6
    model = tmp_path / "dense.onnx"
    onnx.save(_dense_model(weight), model)
    assert main(["compile", str(model), "--target", "llvm", "--weights", "fp16", "-o", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert captured.err.strip() == (
        "tessel: warning: weight 'w' holds values up to 1e+06 in magnitude, beyond float16's 65504: it stays float32"
    )
    assert "weights fp16: 0 of 1 param arrays float16" in captured.out
