"""The `tessel` command in-process: zoo, inspect and demo, and the one-line error (exit status 2) for every
mistake a user can make with a model file or an --input-shape."""

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler import zoo
from compiler.cli import COMMANDS, main, parse_input_shapes
from compiler.errors import ShapeError
from compiler.graph.registry import is_registered


def _error_line(capsys) -> str:
    """The single stderr line of a failed command (no traceback, no usage text)."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("tessel: error: ")
    return lines[0]


def _relu_model(dims) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["input"], ["output"])],
        "relu",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, dims)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_commands_are_a_table_later_issues_extend():
    assert {"zoo", "inspect", "demo"} <= set(COMMANDS)


def test_zoo_lists_every_model(capsys):
    assert main(["zoo", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(zoo.MODELS)
    (resnet,) = [line for line in lines if line.startswith("resnet18 ")]
    # torchvision's ResNet-18: 11.69 M parameters, 1.82 G multiply-adds at 224x224
    assert "1x3x224x224" in resnet and "11.699 M params" in resnet and "3.627 GFLOPs" in resnet


def test_zoo_writes_a_valid_model(tmp_path, capsys):
    path = tmp_path / "mlp.onnx"
    assert main(["zoo", "mlp", "-o", str(path)]) == 0
    assert str(path) in capsys.readouterr().out
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    (output,) = ort.InferenceSession(str(path)).run(None, zoo.sample_input("mlp"))
    assert output.shape == (1, 10)


def test_zoo_rejects_unknown_names_and_missing_arguments(tmp_path, capsys):
    assert main(["zoo", "alexnet"]) == 2
    line = _error_line(capsys)
    assert "unknown zoo model 'alexnet'" in line and "mobilenet_v2" in line
    assert main(["zoo", "mlp", "-o", str(tmp_path / "missing" / "mlp.onnx")]) == 2
    assert "cannot write" in _error_line(capsys)
    assert main(["zoo"]) == 2
    assert "--list" in _error_line(capsys)
    assert main([]) == 2
    assert "name a command" in _error_line(capsys)
    assert main(["compile-everything"]) == 2
    assert "invalid choice" in _error_line(capsys)


def test_inspect_prints_graphs_groups_counts_and_bytes(tmp_path, capsys):
    path = zoo.save_model("digits", tmp_path / "digits.onnx")
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    before, after = out.index("== graph before passes =="), out.index("== graph after passes ==")
    assert before < after < out.index("== fused groups") < out.index("== op counts ==")
    assert "= Conv(" in out[before:after] and "= Softmax(" in out[before:after]
    assert re.search(r"== fused groups \(\d+\) ==", out)
    assert "OUT_EWISE_FUSABLE" in out and "OPAQUE" in out
    assert re.search(r"\n\s+Conv\s+2\s+2\n", out)
    assert re.search(r"\n\s+Softmax\s+1\s+1\n", out)
    model = onnx.load(str(path))
    param_bytes = sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
    assert f"parameter bytes: {param_bytes:,} before passes, {param_bytes:,} after" in out


def test_inspect_fuses_the_seeds_block_into_one_group(tmp_path, capsys):
    path = zoo.save_model("dwconv_block", tmp_path / "block.onnx")
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "== fused groups (1) ==" in out
    section = out[out.index("== fused groups") : out.index("== op counts")]
    assert re.search(r"OUT_EWISE_FUSABLE\s+Conv -> Mul -> Add -> Relu\n", section)


def test_inspect_counts_show_batch_norm_folded_away(tmp_path, capsys):
    path = zoo.save_model("mobilenet_v2", tmp_path / "mobilenet_v2.onnx")
    assert main(["inspect", str(path), "--input-shape", "input=1,3,224,224"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\n\s+BatchNormalization\s+52\s+0\n", out)
    assert re.search(r"\n\s+Conv\s+52\s+52\n", out)


def test_inspect_missing_file(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nowhere.onnx")]) == 2
    line = _error_line(capsys)
    assert "nowhere.onnx" in line and "no such file" in line
    assert main(["inspect", str(tmp_path)]) == 2
    assert "not a file" in _error_line(capsys)


def test_inspect_not_onnx(tmp_path, capsys):
    path = tmp_path / "notes.onnx"
    path.write_text("these are not the weights you are looking for\n" * 20)
    assert main(["inspect", str(path)]) == 2
    assert "notes.onnx" in _error_line(capsys)


def test_inspect_truncated_model(tmp_path, capsys):
    whole = zoo.build_model("mlp").SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(whole[: len(whole) // 2])
    assert main(["inspect", str(path)]) == 2
    assert "cut.onnx" in _error_line(capsys)


def test_inspect_unsupported_op_names_it(tmp_path, capsys):
    assert not is_registered("Det"), "the test needs an op Tessel does not implement"
    graph = helper.make_graph(
        [helper.make_node("Relu", ["input"], ["positive"]), helper.make_node("Det", ["positive"], ["output"])],
        "determinant",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [2, 3, 3])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2])],
    )
    path = tmp_path / "det.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert main(["inspect", str(path)]) == 2
    assert "Det" in _error_line(capsys)


def test_inspect_symbolic_dimension_and_its_fix(tmp_path, capsys):
    path = tmp_path / "dynamic.onnx"
    onnx.save(_relu_model(["batch", 16]), str(path))
    assert main(["inspect", str(path)]) == 2
    line = _error_line(capsys)
    assert "batch" in line and "input" in line
    assert main(["inspect", str(path), "--input-shape", "input=4,16"]) == 0
    assert "float32[4,16]" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [("input", "NAME=D1,D2"), ("input=1,x", "NAME=D1,D2"), ("=1,2", "NAME=D1,D2"), ("input=1,0", "below 1")],
)
def test_bad_input_shape_spec(tmp_path, capsys, spec, complaint):
    path = tmp_path / "dynamic.onnx"
    onnx.save(_relu_model(["batch", 16]), str(path))
    assert main(["inspect", str(path), "--input-shape", spec]) == 2
    assert complaint in _error_line(capsys)


def test_parse_input_shapes():
    assert parse_input_shapes(None) is None
    assert parse_input_shapes(["input=1,3,224,224", " mask = 1,7"]) == {"input": (1, 3, 224, 224), "mask": (1, 7)}
    with pytest.raises(ShapeError, match="twice"):
        parse_input_shapes(["input=1", "input=2"])


def test_demo_prints_predictions_and_accuracy(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    predictions = re.findall(r"digit\s+\d+: predicted (\d), true (\d)", out)
    assert len(predictions) == 10
    accuracy = float(re.search(r"held-out accuracy: ([\d.]+) \((\d+)/450 digits\)", out).group(1))
    assert accuracy >= 0.95
    assert np.mean([p == t for p, t in predictions]) >= 0.7


# -- inspect: the dense weights' stored dtypes ----------------------------------------------------------------------


def _dense_weights_section(out: str) -> list[str]:
    return out[out.index("== dense weights") :].strip().splitlines()


def test_inspect_a_float_model_shows_float32_dense_weights_and_fp16_ones_on_request(tmp_path, capsys):
    path = zoo.save_model("bert_tiny", tmp_path / "bert_tiny.onnx")
    assert main(["inspect", str(path)]) == 0
    section = _dense_weights_section(capsys.readouterr().out)
    assert section[0] == "== dense weights (target wasm) =="
    assert re.match(r"\s+group\s+op\s+stored as\s+K x N\s+bytes$", section[1])
    assert re.match(r"\s+fused_\d+_matmulpacked_add\s+MatMulPacked\s+float32\s+128x128\s+65,536$", section[2])
    # the pooler reads one row (the first token): an unpacked Gemm
    assert re.match(r"\s+fused_\d+_gemm_tanh\s+Gemm\s+float32\s+128x128\s+65,536$", section[-2])
    assert section[-1] == "dense weights: 13 float32; params 1.65 MB"
    assert main(["inspect", str(path), "--weights", "fp16"]) == 0
    section = _dense_weights_section(capsys.readouterr().out)
    assert re.match(r"\s+fused_\d+_matmulpacked_add\s+MatMulPacked\s+float16\s+128x128\s+32,768$", section[2])
    assert section[-1] == "dense weights: 12 float16, 1 float32; params 0.87 MB"


def _quantized_bert_tiny(folder, mode: str):
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    source, output = folder / "bert_tiny.onnx", folder / f"bert_tiny.{mode}.onnx"
    zoo.save_model("bert_tiny", source)
    if mode == "dynamic":
        quantize_dynamic(str(source), str(output), weight_type=QuantType.QInt8)
    else:
        quantizer = MatMulNBitsQuantizer(onnx.load(str(source)), block_size=32, is_symmetric=False)
        quantizer.process()
        quantizer.model.save_model_to_file(str(output))
    return output


@pytest.mark.parametrize(
    "mode, op, stored, count, summary",
    [
        # int8 levels by uint8 activations are integer products (passes/integer_products.py), the single-row pooler's too
        (
            "dynamic",
            "MatMulIntegerPacked",
            r"int8 \(integer products\)",
            13,
            "dense weights: 13 int8 (integer products); params 0.44 MB",
        ),
        # MatMulNBits' 4-bit levels are packed two a uint8 byte; the quantizer leaves the pooler's Gemm float
        (
            "q4",
            "MatMulPacked",
            r"uint8 \(4-bit levels\)",
            12,
            "dense weights: 12 uint8 (4-bit levels), 1 float32; params 0.34 MB",
        ),
    ],
)
def test_inspect_a_quantized_model_shows_which_groups_read_narrow_weights(
    mode, op, stored, count, summary, tmp_path, capsys
):
    path = _quantized_bert_tiny(tmp_path, mode)
    assert main(["inspect", str(path), "--target", "llvm"]) == 0
    out = capsys.readouterr().out
    # with --target the graph itself is the target's: its dense kernels are the packed ones listed
    assert f"= {op}(" in out[out.index("== graph after passes ==") : out.index("== fused groups")]
    section = _dense_weights_section(out)
    assert section[0] == "== dense weights (target llvm) =="
    narrow = [line for line in section[2:-1] if re.search(rf"{op}\s+{stored}\s+\d+x\d+\s+[\d,]+$", line)]
    assert len(narrow) == count, section
    assert section[-1] == summary


def test_inspect_weights_fp16_on_a_gpu_target_or_a_bad_value_is_one_error(tmp_path, capsys):
    path = zoo.save_model("mlp", tmp_path / "mlp.onnx")
    assert main(["inspect", str(path), "--target", "webgpu", "--weights", "fp16"]) == 2
    assert "weights fp16 applies to the CPU targets (llvm, wasm)" in _error_line(capsys)
    assert main(["inspect", str(path), "--weights", "half"]) == 2
    assert "invalid choice: 'half'" in _error_line(capsys)
