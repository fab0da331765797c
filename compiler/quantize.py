"""`tessel quantize`: a float ONNX model in, an int8, 4-bit or float16 ONNX model out, written by onnxruntime's own
tools (quantize_static in the QDQ form, quantize_dynamic, the MatMulNBits quantizer, the float16 converter). It stands
beside the pipeline, not in it: it reads and writes .onnx files, and `tessel compile` takes what it writes like any
other model. onnxruntime is an optional extra (`pip install 'tessel[quantize]'`), imported only when a model is
quantized."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import warnings
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter

from compiler.errors import ModelError, ShapeError, TesselError
from compiler.frontend.onnx import external_data_files

MODES = ("static", "dynamic", "int4", "fp16")
# Each mode's output beside the model when no path is given: model.onnx -> model.int8.onnx, ...
SUFFIXES = {"static": ".int8.onnx", "dynamic": ".dynamic.onnx", "int4": ".q4.onnx", "fp16": ".fp16.onnx"}
# The ops each integer mode writes, which Quantized.summary counts.
WRITTEN_OPS = {
    "static": ("QuantizeLinear", "DequantizeLinear"),
    "dynamic": ("DynamicQuantizeLinear", "MatMulInteger", "ConvInteger"),
    "int4": ("MatMulNBits", "GatherBlockQuantized"),
}
INTEGER_TYPES = ("u8", "s8")
# The block sizes MLAS quantizes MatMulNBits weights in; any other fails deep inside onnxruntime's C++.
BLOCK_SIZES = (16, 32, 64, 128, 256)
# MatMulNBits' accuracy_level: 0 unset, then the smallest type its kernel may compute A in (1 fp32 ... 4 int8).
ACCURACY_LEVELS = (0, 1, 2, 3, 4)
RANDOM_SAMPLES = 8
# One protobuf message holds at most 2 GiB: past that, the weights go to a data file beside the model.
EXTERNAL_DATA_BYTES = 2**31
INSTALL_HINT = "tessel quantize wraps onnxruntime's quantizers: install them with `pip install 'tessel[quantize]'`"


class CalibrationWarning(UserWarning):
    """Static quantization calibrated on random inputs: the scales fit noise, not the data the model will see."""


@dataclass(frozen=True)
class Quantized:
    """What quantize_model wrote: the model file (and its data file, when the weights are external), their bytes and
    the float model's, and the op types and initializer dtypes it holds (counted in its main graph)."""

    path: Path
    mode: str
    files: tuple[Path, ...]
    bytes: int
    source_bytes: int
    ops: dict[str, int] = field(default_factory=dict)
    weights: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        """What the mode wrote, counted: "7 QuantizeLinear, 13 DequantizeLinear", "6 float16 initializers"."""
        if self.mode == "fp16":
            return f"{self.weights.get('float16', 0)} float16 initializers"
        return ", ".join(f"{self.ops.get(op, 0)} {op}" for op in WRITTEN_OPS[self.mode])


def quantize_model(
    source: str | os.PathLike,
    output: str | os.PathLike | None = None,
    mode: str = "static",
    *,
    calibration: str | os.PathLike | Mapping[str, np.ndarray] | None = None,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    samples: int = RANDOM_SAMPLES,
    activation_type: str = "u8",
    weight_type: str = "s8",
    per_channel: bool | None = None,
    block_size: int = 32,
    symmetric: bool = True,
    accuracy_level: int | None = None,
    keep_io_types: bool = True,
    preprocess: bool = True,
    external_data: bool | None = None,
    progress: Callable[[str], None] | None = None,
) -> Quantized:
    """Write a quantized or float16 copy of the float ONNX model at `source` to `output` (default: beside it, named by
    SUFFIXES), by onnxruntime's tools. `mode`:

    - "static": quantize_static in the QDQ form, per-channel `weight_type` weights and per-tensor `activation_type`
      activations ("u8" or "s8"), calibrated on `calibration` (an .npz path or arrays by input name, the first axis
      the samples) or, without it, on `samples` random inputs (a CalibrationWarning: poor accuracy);
      `input_shapes` fixes symbolic input dimensions for those samples.
    - "dynamic": quantize_dynamic, `weight_type` weights (per tensor unless `per_channel`): DynamicQuantizeLinear and
      MatMulInteger, the transformers' form.
    - "int4": MatMulNBitsQuantizer, 4-bit com.microsoft.MatMulNBits for MatMuls by constant weights, in blocks of
      `block_size` along K, `symmetric` or with zero points, at `accuracy_level`; and GatherBlockQuantized for
      Gathers of constant tables (embeddings), in blocks along their rows.
    - "fp16": convert_float_to_float16; float32 inputs and outputs stay so unless `keep_io_types` is False.

    The static and dynamic modes run onnxruntime's pre-processing first (symbolic shape inference; static adds its
    basic graph optimizations, which fold batch norms into convs) unless `preprocess` is False. A model over 2 GB is
    written with its weights in `output` + ".data" (`external_data` True or False forces either). Every failure is a
    TesselError with one message."""
    if mode not in MODES:
        raise TesselError(f"unknown quantization mode {mode!r}; choose one of {', '.join(MODES)}")
    source = Path(source)
    output = (
        Path(output) if output is not None else source.with_name(source.name.removesuffix(".onnx") + SUFFIXES[mode])
    )
    say = progress or (lambda message: None)
    model, data_files = _read_header(source)
    _check_output(source, output)
    source_bytes = sum(path.stat().st_size for path in [source, *data_files])
    feeds = []
    if mode == "static":
        inputs = _graph_inputs(model)
        shapes = _fixed_shapes(inputs, input_shapes or {})
        feeds = _calibration_samples(calibration, inputs, shapes, samples)
    if per_channel is None:
        per_channel = mode == "static"
    big = source_bytes > EXTERNAL_DATA_BYTES if external_data is None else external_data
    say(f"read {source} ({source_bytes:,} bytes{' with its data files' if data_files else ''})")
    with _onnxruntime_tools(), tempfile.TemporaryDirectory(prefix=".tessel-quantize-", dir=output.parent) as folder:
        staged = Path(folder, output.name)
        if mode == "static":
            model_path = _preprocess(source, Path(folder), optimize=True, big=big, say=say) if preprocess else source
            say(f"calibrating on {len(feeds)} sample(s) and quantizing (quantize_static, QDQ)")
            _static(model_path, staged, feeds, activation_type, weight_type, per_channel, big)
        elif mode == "dynamic":
            model_path = _preprocess(source, Path(folder), optimize=False, big=big, say=say) if preprocess else source
            say("quantizing (quantize_dynamic)")
            _dynamic(model_path, staged, weight_type, per_channel, big)
        elif mode == "int4":
            say(f"quantizing MatMul weights to 4 bits in blocks of {block_size} (MatMulNBitsQuantizer)")
            _save(_int4(source, block_size, symmetric, accuracy_level), staged, external_data)
        else:
            say("converting to float16 (convert_float_to_float16)")
            _save(_float16(source, keep_io_types, big), staged, external_data)
        files = _move_into_place(staged, output)
    written = onnx.load(str(output), load_external_data=False)
    ops = Counter(node.op_type for node in written.graph.node)
    if mode == "int4" and not ops["MatMulNBits"]:
        warnings.warn(
            f"{source} has no MatMul by a constant 2-D weight, the only op MatMulNBits replaces: {output} computes "
            "as the float model does",
            stacklevel=2,
        )
    weights = Counter(onnx.TensorProto.DataType.Name(tensor.data_type).lower() for tensor in written.graph.initializer)
    return Quantized(
        output, mode, files, sum(path.stat().st_size for path in files), source_bytes, dict(ops), dict(weights)
    )


# -- the float model ----------------------------------------------------------------------------------------------------


def _read_header(source: Path) -> tuple[onnx.ModelProto, list[Path]]:
    """The model's graph without its external weights, and the data files they lie in (each checked to exist)."""
    if not source.exists():
        raise ModelError(f"model file {str(source)!r} does not exist; check the path")
    data_files = external_data_files(source)  # a ModelError for a file that is not protobuf or misses a data file
    model = onnx.load(str(source), load_external_data=False)
    if not model.HasField("graph") or not model.graph.output:
        raise ModelError(f"{source} is not an ONNX model: it has no graph with outputs; give a float .onnx model")
    return model, data_files


def _check_output(source: Path, output: Path) -> None:
    if output.suffix != ".onnx":
        raise TesselError(f"the output {output} must be an .onnx file; name it, e.g., {output.stem}.onnx")
    if output.resolve() == source.resolve():
        raise TesselError(f"the output {output} is the input model; write the quantized model to another file")
    if output.is_dir():
        raise TesselError(f"the output {output} is a directory; give the path of the .onnx file to write")
    if not output.parent.is_dir():
        raise TesselError(f"cannot write {output}: its folder {output.parent} does not exist; create it first")


@dataclass(frozen=True)
class _Input:
    name: str
    dims: tuple[int | str, ...]  # a symbolic or unknown dimension by its name ("?" when it has none)
    dtype: np.dtype


def _graph_inputs(model: onnx.ModelProto) -> list[_Input]:
    """The inputs a caller feeds: graph inputs that no initializer defaults."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    inputs = []
    for info in model.graph.input:
        if info.name in initializers:
            continue
        if not info.type.HasField("tensor_type") or not info.type.tensor_type.HasField("shape"):
            raise ShapeError(f"input {info.name!r} is not a tensor of declared rank; static quantization needs one")
        tensor_type = info.type.tensor_type
        dims = tuple(
            dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or "?") for dim in tensor_type.shape.dim
        )
        inputs.append(_Input(info.name, dims, onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)))
    return inputs


def _fixed_shapes(inputs: list[_Input], input_shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple]:
    """Each input's dimensions with `input_shapes` filling its symbolic ones (a symbolic one left unfilled stays a
    name); a shape that names no input, has another rank or changes a fixed dimension is an error."""
    by_name = {entry.name: entry for entry in inputs}
    for name, shape in input_shapes.items():
        if name not in by_name:
            raise ShapeError(f"input shapes name {name!r}, which is not an input; the inputs are {_names(by_name)}")
        dims = by_name[name].dims
        if len(shape) != len(dims) or any(isinstance(dim, int) and dim != size for dim, size in zip(dims, shape)):
            raise ShapeError(
                f"input shape {name}={','.join(map(str, shape))} does not fit input {name!r} of shape {_shape(dims)}; "
                "give its rank and change only its symbolic dimensions"
            )
    return {entry.name: tuple(input_shapes.get(entry.name, entry.dims)) for entry in inputs}


def _names(names) -> str:
    return ", ".join(repr(name) for name in names) or "none"


def _shape(dims) -> str:
    return "(" + ", ".join(str(dim) for dim in dims) + ")"


# -- calibration data ---------------------------------------------------------------------------------------------------


def _calibration_samples(
    calibration: str | os.PathLike | Mapping[str, np.ndarray] | None,
    inputs: list[_Input],
    shapes: Mapping[str, tuple],
    samples: int = RANDOM_SAMPLES,
) -> list[dict[str, np.ndarray]]:
    """The feeds static quantization calibrates on, one dict per sample: from `calibration` (arrays keyed by input
    name, the first axis the samples, checked against `shapes` and cast to the inputs' dtypes) or, when None, `samples`
    random ones (standard normal floats, integer inputs all ones: a valid token id, mask and type in any vocabulary)."""
    if calibration is None:
        return _random_samples(inputs, shapes, samples)
    if isinstance(calibration, Mapping):
        arrays, where = dict(calibration), "the calibration data"
    else:
        arrays, where = _read_npz(Path(calibration)), f"calibration file {os.fspath(calibration)}"
    missing = [entry.name for entry in inputs if entry.name not in arrays]
    if missing:
        raise ShapeError(
            f"{where} has no array for input(s) {_names(missing)} (it holds {_names(arrays)}); give one array per "
            "input, keyed by its name, its first axis the samples"
        )
    counts = set()
    for entry in inputs:
        array = np.asarray(arrays[entry.name])
        shape = shapes[entry.name]
        if array.ndim != len(shape) + 1 or any(
            isinstance(dim, int) and dim != size for dim, size in zip(shape, array.shape[1:])
        ):
            raise ShapeError(
                f"{where}: array {entry.name!r} has shape {_shape(array.shape)}, but input {entry.name!r} takes "
                f"{_shape(shape)} per sample; give (samples, {_shape(shape)[1:]}"
            )
        if array.dtype.kind != entry.dtype.kind and {array.dtype.kind, entry.dtype.kind} != {"i", "u"}:
            raise ShapeError(
                f"{where}: array {entry.name!r} holds {array.dtype}, but input {entry.name!r} takes {entry.dtype}; "
                "save it in that dtype"
            )
        counts.add(array.shape[0])
        arrays[entry.name] = array.astype(entry.dtype, copy=False)
    if len(counts) > 1 or 0 in counts:
        raise ShapeError(
            f"{where} must hold the same number of samples, at least one, for every input; it holds {sorted(counts)}"
        )
    count = counts.pop() if counts else 1  # a model without inputs runs once
    return [{entry.name: arrays[entry.name][index] for entry in inputs} for index in range(count)]


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise TesselError(f"calibration file {path} does not exist; give an .npz of inputs (numpy.savez)")
    reason = None
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as file:
            reason = "it holds a single array" if file.read(6) == b"\x93NUMPY" else "it is not a zip archive"
    else:
        try:
            with np.load(path, allow_pickle=False) as archive:
                return {name: archive[name] for name in archive.files}
        except (OSError, ValueError, zipfile.BadZipFile) as error:
            reason = _first_line(error)
    raise TesselError(
        f"calibration file {path} is not an .npz of arrays keyed by input name ({reason}); write one with "
        "numpy.savez(path, input_name=samples, ...)"
    )


def _random_samples(inputs: list[_Input], shapes: Mapping[str, tuple], samples: int) -> list[dict[str, np.ndarray]]:
    for entry in inputs:
        unknown = [f"{dim} (axis {axis})" for axis, dim in enumerate(shapes[entry.name]) if not isinstance(dim, int)]
        if unknown:
            example = ",".join(str(dim) if isinstance(dim, int) else "1" for dim in shapes[entry.name])
            raise ShapeError(
                f"input {entry.name!r} has symbolic dimension(s) {', '.join(unknown)}: random calibration needs their "
                f"sizes: pass input_shapes (CLI: --input-shape {entry.name}={example}), or calibration data"
            )
    if samples < 1:
        raise TesselError(f"random calibration needs at least one sample, not {samples}")
    warnings.warn(
        f"no calibration data: calibrating on {samples} random sample(s) of the inputs' shapes, which gives poor "
        "accuracy; pass real inputs (CLI: --calibrate inputs.npz, arrays keyed by input name, first axis the samples)",
        CalibrationWarning,
        stacklevel=3,
    )
    rng = np.random.default_rng(0)
    feeds = []
    for _ in range(samples):
        feed = {}
        for entry in inputs:
            shape = shapes[entry.name]
            if entry.dtype.kind == "f":
                feed[entry.name] = rng.standard_normal(shape).astype(entry.dtype)
            else:
                feed[entry.name] = np.ones(shape, entry.dtype)
        feeds.append(feed)
    return feeds


class _Samples:
    """onnxruntime's CalibrationDataReader protocol (it recognises any class with get_next) over a list of feeds."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self._feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


# -- onnxruntime's tools ------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _onnxruntime_tools() -> Iterator[None]:
    """onnxruntime's quantizers imported, and quiet while they run: they log every node they pass at INFO, and one
    of them (matmul_nbits_quantizer) sets the root logger to INFO when imported. Only their warnings pass, so the
    caller's progress lines stay readable, and the root logger's level is given back as it was before the import."""
    root = logging.getLogger()
    saved = root.level
    try:
        import onnxruntime.quantization.matmul_nbits_quantizer  # noqa: F401
    except ImportError:
        raise TesselError(INSTALL_HINT) from None
    root.setLevel(max(saved, logging.WARNING))
    try:
        yield
    finally:
        root.setLevel(saved)


@contextlib.contextmanager
def _library(what: str) -> Iterator[None]:
    """A failure inside onnxruntime's tool as one TesselError naming the tool, with its own message's first line."""
    try:
        yield
    except TesselError:
        raise
    except Exception as error:
        raise TesselError(
            f"{what} failed: {_first_line(error)}; the float model must load and run in onnxruntime"
        ) from None


def _first_line(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    # a C++ check's message follows its source location and condition: "q4_dq.cpp:1922 ... false was false. Only..."
    return lines[0].rpartition(" was false. ")[2]


def _preprocess(source: Path, folder: Path, optimize: bool, big: bool, say: Callable[[str], None]) -> Path:
    """quant_pre_process into `folder`; its failure (symbolic shape inference meets an op it does not know) is a
    warning, and the model is quantized as it is."""
    from onnxruntime.quantization import quant_pre_process

    steps = "shape inference and basic optimizations" if optimize else "shape inference"
    say(f"pre-processing: {steps} (quant_pre_process)")
    path = (folder / "preprocessed.onnx").resolve()
    try:
        # run in `folder`: a symbolic shape inference that fails leaves sym_shape_infer_temp.onnx in the working folder
        with contextlib.chdir(folder):
            quant_pre_process(
                str(source.resolve()),
                str(path),
                skip_optimization=not optimize,
                save_as_external_data=big,
                all_tensors_to_one_file=True,
                external_data_location=path.name + ".data",
            )
    except Exception as error:
        warnings.warn(
            f"onnxruntime's pre-processing failed ({_first_line(error)}); quantizing the model without it",
            stacklevel=3,
        )
        return source
    return path


def _quant_type(name: str):
    from onnxruntime.quantization import QuantType

    if name not in INTEGER_TYPES:
        raise TesselError(f"unknown integer type {name!r}; choose one of {', '.join(INTEGER_TYPES)}")
    return QuantType.QUInt8 if name == "u8" else QuantType.QInt8


def _static(source, staged, feeds, activation_type, weight_type, per_channel, big) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, quantize_static

    activations, weights = _quant_type(activation_type), _quant_type(weight_type)
    with _library("onnxruntime's static quantizer (quantize_static)"):
        quantize_static(
            str(source),
            str(staged),
            _Samples(feeds),
            quant_format=QuantFormat.QDQ,
            per_channel=per_channel,
            activation_type=activations,
            weight_type=weights,
            calibrate_method=CalibrationMethod.MinMax,
            use_external_data_format=big,
        )


def _dynamic(source, staged, weight_type, per_channel, big) -> None:
    from onnxruntime.quantization import quantize_dynamic

    weights = _quant_type(weight_type)
    with _library("onnxruntime's dynamic quantizer (quantize_dynamic)"):
        quantize_dynamic(
            str(source), str(staged), weight_type=weights, per_channel=per_channel, use_external_data_format=big
        )


def _int4(source: Path, block_size: int, symmetric: bool, accuracy_level: int | None) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    if block_size not in BLOCK_SIZES:
        raise TesselError(f"block size {block_size} is not one MatMulNBits quantizes in; choose one of {BLOCK_SIZES}")
    if accuracy_level is not None and accuracy_level not in ACCURACY_LEVELS:
        raise TesselError(f"accuracy level {accuracy_level} is not one of MatMulNBits' {ACCURACY_LEVELS}")
    model = onnx.load(str(source))
    # MatMul weights to MatMulNBits and Gather tables (embeddings) to GatherBlockQuantized, in blocks along their rows.
    # Quantizing a Gather sets the model's opset to 21 (int4 tables) without converting its ops: the model is brought
    # to opset 21 first, or, where onnx's converter cannot, its Gathers stay float.
    constants = {tensor.name for tensor in model.graph.initializer}
    tables = any(node.op_type == "Gather" and node.input[0] in constants for node in model.graph.node)
    op_types = ("MatMul", "Gather") if tables else ("MatMul",)
    opset = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 21)
    if tables and opset < 21:
        try:
            model = onnx.version_converter.convert_version(model, 21)
        except Exception as error:  # noqa: BLE001 - onnx raises several kinds; any means "not convertible"
            warnings.warn(
                f"{source}: onnx cannot convert opset {opset} to 21 ({str(error).splitlines()[0]}); its Gather tables "
                "stay float32",
                stacklevel=3,
            )
            op_types = ("MatMul",)
    with _library("onnxruntime's 4-bit quantizer (MatMulNBitsQuantizer)"):
        quantizer = MatMulNBitsQuantizer(
            model,
            block_size=block_size,
            is_symmetric=symmetric,
            accuracy_level=accuracy_level,
            op_types_to_quantize=op_types,
        )
        # an all-zero block (an embedding's padding row) gets scale 0 and numpy warns of 0 / 0 in its levels, which
        # the zero scale then erases: nothing for the user to act on
        with np.errstate(invalid="ignore", divide="ignore"):
            quantizer.process()
        quantizer.model.topological_sort()
    return quantizer.model.model


def _float16(source: Path, keep_io_types: bool, big: bool) -> onnx.ModelProto:
    from onnxruntime.quantization.onnx_model import ONNXModel
    from onnxruntime.transformers.float16 import convert_float_to_float16

    with _library("onnxruntime's float16 converter (convert_float_to_float16)"):
        # shape inference serializes the model, which protobuf cannot past 2 GB
        model = convert_float_to_float16(onnx.load(str(source)), keep_io_types=keep_io_types, disable_shape_infer=big)
        # the converter appends the Casts of kept float32 inputs after their readers; onnx's checker (and any
        # importer that reads nodes in order) wants them first
        ONNXModel(model).topological_sort()
    return model


def _save(model: onnx.ModelProto, path: Path, external_data: bool | None) -> None:
    big = model.ByteSize() > EXTERNAL_DATA_BYTES if external_data is None else external_data
    if big:
        onnx.save(
            model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=path.name + ".data"
        )
    else:
        onnx.save(model, str(path))


def _move_into_place(staged: Path, output: Path) -> tuple[Path, ...]:
    """The staged model (and its data file) renamed to `output`, so a failed run leaves no half file there; a data
    file left from an earlier output of that name is removed when the new one has none."""
    files = []
    for name in (output.name, output.name + ".data"):
        if (staged.parent / name).is_file():
            os.replace(staged.parent / name, output.parent / name)
            files.append(output.parent / name)
        elif (output.parent / name).is_file():
            (output.parent / name).unlink()
    return tuple(files)
