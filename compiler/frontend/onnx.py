"""ONNX → Graph: the first stage. Parses a model, checks that every op is supported, fixes every shape,
rewrites older-opset semantics into opset 21's, moves shape-deciding inputs into attributes and folds
whatever is constant at import, handing the passes a typed Graph with static shapes and params.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.inliner
from google.protobuf.message import DecodeError
from onnx import AttributeProto, TensorProto, numpy_helper

from compiler.errors import ModelError, ShapeError, TesselError, UnsupportedOpError
from compiler.frontend import checks, quantized
from compiler.frontend.checks import TENSOR_DTYPES, check_shape, dtype_name
from compiler.frontend.order import node_label, node_order
from compiler.graph.ir import DTYPES, Graph, GraphError, Node, TensorType, Value
from compiler.graph.ops.common import normalize_axis
from compiler.graph.ops.transform import shape_range
from compiler.graph.registry import decompresses, get_op, is_registered, worth_folding
from compiler.graph.sym import Sym, SymbolicSizeError, array_dtype, parse_size, size_array

__all__ = [
    "OPSET_RANGE",
    "TENSOR_DTYPES",
    "external_data_files",
    "load_onnx",
    "model_in_folder",
    "parse_input_shapes",
    "supported_op",
]

OPSET_RANGE = (11, 21)
_DEFAULT_DOMAINS = ("", "ai.onnx")

# What an op's shape rule or numpy reference raises on values the schema allows but the op cannot take (a
# kernel_shape that disagrees with the weight, a pads list of the wrong length...): the importer turns these,
# in one place, into a ModelError naming the node.
_DATA_ERRORS = (ValueError, TypeError, IndexError, KeyError, ArithmeticError, MemoryError)

# Attributes that hold a TensorProto.DataType enum rather than a number.
_DTYPE_ATTRIBUTES = {
    ("Cast", "to"),
    ("EyeLike", "dtype"),
    ("RandomNormal", "dtype"),
    ("RandomUniform", "dtype"),
    ("RandomNormalLike", "dtype"),
    ("RandomUniformLike", "dtype"),
    ("Multinomial", "dtype"),
    ("Bernoulli", "dtype"),
    ("QuantizeLinear", "output_dtype"),
    ("DequantizeLinear", "output_dtype"),
}

# Before opset 13 these ops coerced their input to 2-D around `axis` (default 1).
_COERCED_TO_2D = ("Softmax", "LogSoftmax", "Hardmax")

# GridSample before opset 20 named its interpolation modes differently.
_GRID_SAMPLE_MODES = {"bilinear": "linear", "bicubic": "cubic"}


def load_onnx(
    model: Any,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    dims: Mapping[str, tuple[int, int]] | None = None,
) -> Graph:
    """Import an ONNX model (a path, the serialized bytes, or a ModelProto) as a Graph.

    `input_shapes` gives or overrides the shape of named graph inputs, which is how a model with a
    symbolic batch dimension is compiled for one concrete size. `dims` keeps named symbolic dimensions (the inputs'
    `dim_param`s) symbolic instead, each within an inclusive range: {"seq": (1, 2048)} (compiler/graph/sym.py), or
    as an expression of the others: {"past": (0, 2047), "seq": (1, 2048), "total": "past+seq"}.
    """
    proto = _parse(model)
    _check_supported(proto.graph)
    opset = _default_opset(proto)
    return _Importer(proto.graph, opset, dict(input_shapes or {}), dict(dims or {})).run()


def model_in_folder(folder: str | os.PathLike) -> Path:
    """The one .onnx file in `folder` (say, an extracted upload of a model and its data files), to hand to
    load_onnx or compile_model as a path so that its external data loads from beside it; a ModelError when the
    folder holds none or several."""
    found = sorted(path for path in Path(folder).rglob("*.onnx") if path.is_file())
    if len(found) != 1:
        listed = ", ".join(str(path.relative_to(folder)) for path in found[:5]) or "none"
        raise ModelError(f"the upload must hold exactly one .onnx model beside its data files; it holds {listed}")
    return found[0]


def external_data_files(path: str | os.PathLike) -> list[Path]:
    """The data files the model file at `path` keeps weights in, each checked to exist inside the model's folder
    (compile_model hashes them into the bundle's identity)."""
    source = os.fspath(path)
    proto = _decode(_read(source), f"file {source!r}")
    base = Path(source).resolve().parent
    return sorted({_external_path(tensor, base, f"file {source!r}") for tensor in _external_tensors(proto)})


# -- reading the file -----------------------------------------------------------------------------


def _parse(model: Any) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        proto, source, base = model, "the model", None
    elif isinstance(model, bytes | bytearray | memoryview):
        proto, source, base = _decode(bytes(model), "the model data"), "the model data", None
    elif isinstance(model, str | os.PathLike):
        source = os.fspath(model)
        proto, base = _decode(_read(source), f"file {source!r}"), Path(source).resolve().parent
        source = f"file {source!r}"
    else:
        raise ModelError(f"cannot load a model from a {type(model).__name__}; pass a path, bytes or an onnx.ModelProto")
    if not proto.HasField("graph") or not proto.graph.output:
        raise ModelError(f"{source} is not an ONNX model: it has no graph with outputs; export the model again")
    checks.check_ir_version(proto, source)
    if base is not None:
        for tensor in _external_tensors(proto):
            _load_external(tensor, base, source)
    checks.check_names(proto.graph)
    if proto.functions:
        checks.check_function_imports(proto)
        for function in proto.functions:
            checks.check_function_names(function)
        try:
            proto = onnx.inliner.inline_local_functions(proto)
        except Exception as error:  # onnx's C++ inliner raises bare exceptions on malformed functions
            raise ModelError(f"{source}: its local functions cannot be inlined: {error}") from None
    return proto


def _read(source: str) -> bytes:
    try:
        with open(source, "rb") as file:
            return file.read()
    except FileNotFoundError:
        raise ModelError(f"model file {source!r} does not exist; check the path") from None
    except IsADirectoryError:
        raise ModelError(f"{source!r} is a directory, not an ONNX model file") from None
    except OSError as error:
        raise ModelError(f"cannot read model file {source!r}: {error.strerror}") from None


def _external_tensors(proto: onnx.ModelProto) -> list[TensorProto]:
    tensors = [t for t in proto.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    for node in proto.graph.node:
        tensors += [a.t for a in node.attribute if a.type == AttributeProto.TENSOR]
    return [t for t in tensors if t.data_location == TensorProto.EXTERNAL]


def _external_path(tensor: TensorProto, base: Path, source: str) -> Path:
    """Where an external tensor's data lives; refused unless it is a file inside the model's folder."""
    what = f"{source}: tensor {tensor.name!r}"
    location = next((entry.value for entry in tensor.external_data if entry.key == "location"), None)
    if not isinstance(location, str) or not location:
        raise ModelError(f"{what} is marked external but names no valid data file (location); export the model again")
    path = (base / location).resolve()
    if os.path.isabs(location) or not path.is_relative_to(base):
        raise ModelError(
            f"{what} keeps its data in {location!r}, outside the model's folder; Tessel reads data files only from "
            "beside the model"
        )
    if not path.is_file():
        raise ModelError(f"{what} keeps its data in {location!r}, which is missing; put it beside the model file")
    return path


def _load_external(tensor: TensorProto, base: Path, source: str) -> None:
    """Read an external tensor's bytes into raw_data, as if the model had been saved in one file."""
    path = _external_path(tensor, base, source)
    what = f"{source}: tensor {tensor.name!r} (data file {path.name!r})"
    entries = {entry.key: entry.value for entry in tensor.external_data}
    try:
        offset = int(entries.get("offset") or 0)
        length = int(entries["length"]) if entries.get("length") else None
    except ValueError:
        raise ModelError(f"{what} has an offset or length that is not a number; export the model again") from None
    size = path.stat().st_size
    length = size - offset if length is None else length
    if offset < 0 or length < 0 or offset + length > size:
        raise ModelError(f"{what} asks for {length} bytes at offset {offset}, but the file has {size}")
    with open(path, "rb") as file:
        file.seek(offset)
        tensor.raw_data = file.read(length)
    del tensor.external_data[:]
    tensor.data_location = TensorProto.DEFAULT


def _decode(data: bytes, source: str) -> onnx.ModelProto:
    if not data:
        raise ModelError(f"{source} is empty; give a complete .onnx model")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except DecodeError as error:
        raise ModelError(f"{source} is not an ONNX model or is truncated ({error}); export the model again") from None
    return proto


def supported_op(op_type: str, domain: str = "") -> bool:
    """Whether the importer takes a node of this op: a registered op of the default domain, or a quantized form it
    rewrites (compiler/frontend/quantized.py). Constant never becomes a node: the importer turns it into a param."""
    if domain in _DEFAULT_DOMAINS and (op_type == "Constant" or is_registered(op_type)):
        return True
    return quantized.rewrite_for(domain, op_type) is not None


def _check_supported(graph: onnx.GraphProto) -> None:
    """Raise one error naming every op type Tessel lacks, each with the nodes that use it."""
    missing: dict[str, list[str]] = {}
    for index, node in enumerate(graph.node):
        op_type = node.op_type if node.domain in _DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}"
        if not supported_op(node.op_type, node.domain):
            missing.setdefault(op_type, []).append(node_label(node, index))
    if missing:
        listed = "; ".join(f"{op} (nodes: {', '.join(names)})" for op, names in sorted(missing.items()))
        raise UnsupportedOpError(
            f"the model uses {len(missing)} op type(s) Tessel does not support: {listed}; "
            "replace them in the model before compiling",
            missing,
        )


def _default_opset(proto: onnx.ModelProto) -> int:
    versions = [o.version for o in proto.opset_import if o.domain in _DEFAULT_DOMAINS]
    if not versions:
        raise ModelError("the model imports no opset of the default ONNX domain; export it with an opset in 11-21")
    low, high = OPSET_RANGE
    if not low <= versions[0] <= high:
        raise ModelError(
            f"the model uses ONNX opset {versions[0]}; Tessel supports opsets {low} to {high}: re-export it with "
            f"one of those (torch.onnx.export(..., opset_version={high})) or convert it with onnx.version_converter"
        )
    return versions[0]


# -- tensors and attributes -----------------------------------------------------------------------


def _tensor_array(tensor: TensorProto, what: str) -> np.ndarray:
    checks.check_tensor(tensor, what)
    array = numpy_helper.to_array(tensor)
    widened = checks.PACKED_4BIT.get(tensor.data_type)
    return array.astype(widened) if widened else array


def _sparse_array(sparse: onnx.SparseTensorProto, what: str) -> np.ndarray:
    checks.check_sparse(sparse, what)
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices)
    try:
        dense = np.zeros(tuple(sparse.dims), dtype=values.dtype)
    except MemoryError:
        raise ModelError(
            f"{what} is a sparse tensor of dims {list(sparse.dims)}, which Tessel stores dense: its "
            f"{math.prod(sparse.dims) * values.itemsize:,} bytes are more memory than this process may take"
        ) from None
    if indices.ndim == 1:
        dense.reshape(-1)[indices] = values
    else:
        dense[tuple(indices.T)] = values
    return dense


def attribute_value(attribute: AttributeProto, op_type: str, what: str) -> Any:
    kind = attribute.type
    if (op_type, attribute.name) in _DTYPE_ATTRIBUTES and kind == AttributeProto.INT:
        return dtype_name(attribute.i, what)
    if kind == AttributeProto.INT:
        return int(attribute.i)
    if kind == AttributeProto.FLOAT:
        return float(attribute.f)
    if kind == AttributeProto.STRING:
        return checks.decode_text(attribute.s, what)
    if kind == AttributeProto.TENSOR:
        return _tensor_array(attribute.t, what)
    if kind == AttributeProto.SPARSE_TENSOR:
        return _sparse_array(attribute.sparse_tensor, what)
    if kind == AttributeProto.INTS:
        return tuple(int(i) for i in attribute.ints)
    if kind == AttributeProto.FLOATS:
        return tuple(float(f) for f in attribute.floats)
    if kind == AttributeProto.STRINGS:
        return tuple(checks.decode_text(s, what) for s in attribute.strings)
    # graphs and type protos belong to control-flow and sequence ops, which are rejected before this
    return onnx.helper.get_attribute_value(attribute)


def as_attribute(array: np.ndarray, op: str) -> Any:
    """A constant input as the contract hands it to ops: 0-d → scalar, 1-d → tuple, else the array."""
    if array.ndim == 0:
        # Range's output dtype is that of its bounds, which a Python scalar would lose
        return array[()] if op == "Range" else array.item()
    if array.ndim == 1:
        return tuple(array.tolist())
    return array


# -- building the graph ---------------------------------------------------------------------------


class _Importer:
    def __init__(
        self,
        onnx_graph: onnx.GraphProto,
        opset: int,
        input_shapes: dict[str, tuple[int, ...]],
        dims: dict[str, tuple[int, int]],
    ):
        self.onnx_graph = onnx_graph
        self.opset = opset
        self.input_shapes = input_shapes
        ranges = {name: bounds for name, bounds in dims.items() if not isinstance(bounds, str)}
        # a dim may be an expression of the others ("total": "past+seq", an attention mask's length)
        self.dims = {
            name: parse_size(bounds, ranges) if isinstance(bounds, str) else Sym.symbol(name, *bounds)
            for name, bounds in dims.items()
        }
        self.graph = Graph(name=onnx_graph.name or "graph")
        self.values: dict[str, Value] = {}
        # every name the ONNX graph uses, so that names made up here never collide with a later one
        self.taken = {name for node in onnx_graph.node for name in [*node.input, *node.output]}
        self.taken.update(v.name for v in [*onnx_graph.input, *onnx_graph.output])
        self.taken.update(t.name for t in onnx_graph.initializer)

    def run(self) -> Graph:
        order = node_order(self.onnx_graph)
        for tensor in self.onnx_graph.initializer:
            self._add_param(tensor.name, _tensor_array(tensor, f"initializer {tensor.name!r}"))
        for tensor in self.onnx_graph.sparse_initializer:
            self._add_param(tensor.values.name, _sparse_array(tensor, f"initializer {tensor.values.name!r}"))
        self._add_inputs()
        for index in order:
            node = self.onnx_graph.node[index]
            label = node_label(node, index)
            what = f"node {label} ({node.op_type})"
            # the one place where a node's failure becomes the user's error, named after the node
            try:
                self._convert(node, label)
            except UnsupportedOpError as error:
                raise UnsupportedOpError(f"{what}: {error}", error.ops or {node.op_type: [label]}) from error
            except TesselError as error:
                raise type(error)(f"{what}: {error}") from error
            except _DATA_ERRORS as error:
                raise ModelError(
                    f"{what} cannot be imported ({type(error).__name__}: {error}); check its inputs and attributes "
                    f"against the ONNX definition of {node.op_type}"
                ) from error
        for output in self.onnx_graph.output:
            if output.name not in self.values:
                raise ModelError(f"graph output {output.name!r} is produced by no node; export the model again")
            checks.check_declared_output(output, self.values[output.name].type.dtype)
            self.graph.outputs.append(self.values[output.name])
        self._materialize_sizes()
        self._drop_unused_params()
        try:
            self.graph.verify()
        except GraphError as error:
            raise ModelError(f"the imported model is inconsistent: {error}; export the model again") from error
        return self.graph

    # -- values

    def _fresh(self, hint: str) -> str:
        name, counter = hint, 0
        while name in self.taken:
            counter += 1
            name = f"{hint}_{counter}"
        self.taken.add(name)
        return name

    def _define(self, name: str, value: Value) -> None:
        if name in self.values:
            raise ModelError(f"value {name!r} is defined twice in the model; export the model again")
        self.values[name] = value

    def _add_param(self, name: str, array: np.ndarray) -> Value:
        value = Value(name, TensorType(array.shape, array_dtype(array)))
        self.graph.params[value] = array
        self._define(name, value)
        return value

    def _add_constant(self, array: np.ndarray, hint: str) -> Value:
        return self._add_param(self._fresh(hint), array)

    def _add_inputs(self) -> None:
        initialized = {t.name for t in self.onnx_graph.initializer}
        initialized.update(t.values.name for t in self.onnx_graph.sparse_initializer)
        inputs = [i for i in self.onnx_graph.input if i.name not in initialized]
        names = [i.name for i in inputs]
        unknown = sorted(set(self.input_shapes) - set(names))
        if unknown:
            raise ShapeError(
                f"input_shapes names {', '.join(map(repr, unknown))}, which the model does not take as input; "
                f"its inputs are {', '.join(map(repr, names)) or 'none'}"
            )
        declared = {
            d.dim_param
            for info in inputs
            if info.type.HasField("tensor_type") and info.name not in self.input_shapes
            for d in info.type.tensor_type.shape.dim
            if d.HasField("dim_param")
        }
        unused = sorted(set(self.dims) - declared)
        if unused:
            raise ShapeError(
                f"dims names {', '.join(map(repr, unused))}, which no input's shape uses; the symbolic dimensions of "
                f"the inputs are {', '.join(map(repr, sorted(declared))) or 'none'}"
            )
        for info in inputs:
            dtype, shape = self._input_type(info)
            value = Value(info.name, TensorType(shape, dtype))
            self.graph.inputs.append(value)
            self._define(info.name, value)

    def _input_type(self, info: onnx.ValueInfoProto) -> tuple[str, tuple[int, ...]]:
        name = info.name
        if not info.type.HasField("tensor_type"):
            kind = info.type.WhichOneof("value") or "untyped"
            raise TesselError(
                f"input {name!r} is a {kind.replace('_type', '')}, not a tensor; Tessel takes tensors only"
            )
        tensor_type = info.type.tensor_type
        dtype = dtype_name(tensor_type.elem_type, f"input {name!r}")
        dims = list(tensor_type.shape.dim) if tensor_type.HasField("shape") else None
        if name in self.input_shapes:
            shape = check_shape(self.input_shapes[name], dtype, f"input_shapes's input {name!r}")
            if dims is not None and len(shape) != len(dims):
                raise ShapeError(
                    f"input_shapes gives input {name!r} the shape {shape} of rank {len(shape)}, "
                    f"but the model declares rank {len(dims)}; give {len(dims)} dimensions"
                )
            return dtype, shape
        if dims is not None and all(d.HasField("dim_value") or d.dim_param in self.dims for d in dims):
            shape = tuple(d.dim_value if d.HasField("dim_value") else self.dims[d.dim_param] for d in dims)
            return dtype, check_shape(shape, dtype, f"input {name!r}")
        if dims is None or any(not d.HasField("dim_value") for d in dims):
            if dims is None:
                described, example = "has no declared shape", (1, 3, 224, 224)
            else:
                unknown = [
                    f"{d.dim_param or '?'} (axis {axis})" for axis, d in enumerate(dims) if not d.HasField("dim_value")
                ]
                described = f"has symbolic or unknown dimension(s) {', '.join(unknown)}"
                example = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in dims)
            named = [d.dim_param for d in dims or () if d.dim_param]
            keep = (
                f"; or keep {named[0]!r} symbolic within a range: dims={{{named[0]!r}: (1, 2048)}} (CLI: --dim "
                f"{named[0]}=1..2048)"
                if named
                else ""
            )
            raise ShapeError(
                f"input {name!r} {described}; give it a fixed shape: input_shapes={{{name!r}: {example}}} "
                f"(CLI: --input-shape {name}={','.join(map(str, example))}){keep}"
            )
        return dtype, check_shape((d.dim_value for d in dims), dtype, f"input {name!r}")

    # -- nodes

    def _convert(self, node: onnx.NodeProto, label: str) -> None:
        rewrite = quantized.rewrite_for(node.domain, node.op_type)
        if node.domain == quantized.CONTRIB_DOMAIN:
            schema = None
            quantized.check_contrib(rewrite, node.op_type, node.input, node.attribute)
        else:
            schema = checks.node_schema(node, self.opset)
            checks.check_node(node, schema)
        attrs = {a.name: attribute_value(a, node.op_type, f"attribute {a.name!r}") for a in node.attribute}
        if node.op_type == "Constant":
            (array,) = get_op("Constant").run_reference([], attrs)
            if str(array.dtype) not in DTYPES:
                raise ModelError(f"it holds {array.dtype} data, which Tessel does not support")
            self._add_param(node.output[0], array)
            return
        inputs: list[Value | None] = []
        for name in node.input:
            if name and name not in self.values:
                raise ModelError(
                    f"it uses {name!r}, which no node, input or initializer of the model defines; the model is "
                    "incomplete: export it again"
                )
            inputs.append(self.values[name] if name else None)
        if schema is not None:
            checks.check_dtypes(node, schema, [v.type.dtype if v is not None else None for v in inputs])
        outputs = list(node.output)
        if (
            rewrite is not None
        ):  # a quantized form that the graph holds as QuantizeLinear, DequantizeLinear and float ops
            builder = quantized.Builder(self._emit, self._add_constant, self.graph.params, label)
            quantized.apply(rewrite, builder, inputs, attrs, outputs)
            return
        inputs = self._take_const_inputs(node.op_type, inputs, attrs, node.input)
        while outputs and not outputs[-1]:  # trailing empty names are optional outputs nobody asked for
            outputs.pop()
        if len(outputs) > 1:
            attrs["_outputs"] = len(outputs)
        if node.op_type in _COERCED_TO_2D and self.opset < 13:
            self._coerced_to_2d(node.op_type, inputs[0], attrs, label, outputs[0])
            return
        if node.op_type == "GridSample" and self.opset < 20 and "mode" in attrs:
            attrs["mode"] = _GRID_SAMPLE_MODES.get(attrs["mode"], attrs["mode"])
        self._emit(node.op_type, inputs, attrs, label, outputs)

    def _take_const_inputs(
        self, op: str, inputs: list[Value | None], attrs: dict[str, Any], names
    ) -> list[Value | None]:
        """Move the op's shape-deciding inputs into attrs; they must be constant at import."""
        const_inputs = get_op(op).const_inputs
        for index, attr in const_inputs:
            if index >= len(inputs) or inputs[index] is None:
                continue
            value = inputs[index]
            if value not in self.graph.params:
                raise ShapeError(
                    f"input {index} ({attr!r}, value {names[index]!r}) decides the output shape and must be "
                    "a constant, but it is computed at run time; export the model with static shapes "
                    "(fixed sizes, no dynamic axes) so that it folds to a constant"
                )
            array = self.graph.params[value]
            # Resize before opset 13 required roi and scales, passing empty tensors to mean 'absent'
            if op == "Resize" and array.size == 0:
                continue
            attrs[attr] = as_attribute(array, op)
        taken = {index for index, _ in const_inputs}
        remaining = [v for index, v in enumerate(inputs) if index not in taken]
        while remaining and remaining[-1] is None:
            remaining.pop()
        return remaining

    def _coerced_to_2d(self, op: str, x: Value, attrs: dict[str, Any], label: str, output: str) -> None:
        """Opset < 13 Softmax-like ops: flatten at `axis`, apply along the last axis, restore the shape."""
        shape = x.type.shape
        axis = normalize_axis(attrs.pop("axis", 1), len(shape), f"node {label} ({op}) axis")
        if axis == len(shape) - 1:
            self._emit(op, [x], {**attrs, "axis": -1}, label, [output])
            return
        (flat,) = self._emit("Flatten", [x], {"axis": axis}, f"{label}_flatten", [self._fresh(f"{output}_2d")])
        (result,) = self._emit(op, [flat], {**attrs, "axis": -1}, label, [self._fresh(f"{output}_{op.lower()}_2d")])
        self._emit("Reshape", [result], {"shape": shape}, f"{label}_reshape", [output])

    def _emit(
        self, op: str, inputs: list[Value | None], attrs: dict[str, Any], label: str, output_names: list[str]
    ) -> list[Value]:
        """Add one node, or fold it to params when its result is known at import."""
        op_def = get_op(op)
        if op in ("QuantizeLinear", "DequantizeLinear") and len(inputs) > 1 and inputs[1] in self.graph.params:
            scale = self.graph.params[inputs[1]]
            quantized.check_scale(scale, f"the scale {inputs[1].name!r}", dequantize=op == "DequantizeLinear")
        types = op_def.infer([v.type if v is not None else None for v in inputs], attrs)
        if len(types) < len(output_names):
            raise UnsupportedOpError(
                f"it asks for {len(output_names)} outputs; Tessel computes only {len(types)} for {op}", {op: [label]}
            )
        folded = self._fold(op, op_def, inputs, attrs, types)
        names = [name or self._fresh(f"{label}_out{position}") for position, name in enumerate(output_names)]
        names += [self._fresh(f"{label}_out{position}") for position in range(len(names), len(types))]
        if folded is not None:
            for name, expected, array in zip(names, types, folded, strict=True):
                if expected != TensorType(array.shape, array_dtype(array)):
                    raise AssertionError(
                        f"node {label} ({op}) folds to {array.dtype}{list(array.shape)}, typed {expected}"
                    )
                self._add_param(name, array)
            return [self.values[name] for name in names]
        outputs = [Value(name, expected) for name, expected in zip(names, types, strict=True)]
        for name, value in zip(names, outputs, strict=True):
            self._define(name, value)
        self.graph.nodes.append(Node(op, list(inputs), outputs, attrs, label))
        return outputs

    def _fold(
        self, op: str, op_def, inputs: list[Value | None], attrs: dict[str, Any], types: list[TensorType]
    ) -> list[np.ndarray] | None:
        if op in ("Shape", "Size"):
            # constants whatever their input holds: arrays of Syms where the shape is symbolic (size_array)
            shape = inputs[0].type.shape
            if op == "Size":
                return [size_array(math.prod(shape))]
            return [size_array(shape[shape_range(len(shape), **attrs)])]
        if any(v is not None and v not in self.graph.params for v in inputs):
            return None
        if not all(t.static for t in types):
            return None
        input_types = [v.type for v in inputs if v is not None]
        if not worth_folding(input_types, types) or decompresses(op, input_types, types):
            return None
        arrays = [self.graph.params[v] if v is not None else None for v in inputs]
        if any(array is not None and array.dtype == object for array in arrays):
            # shape arithmetic over symbolic sizes: numpy evaluates it on the Syms; an op that needs the sizes'
            # values (a Range over them) stays a node, and its size inputs become SizeValues (_materialize_sizes)
            try:
                results = [np.asarray(result) for result in op_def.run_reference(arrays, attrs)]
            except (SymbolicSizeError, TypeError, ValueError):
                return None
            return [size_array(result) if result.dtype == object else result for result in results]
        return [np.asarray(result) for result in op_def.run_reference(arrays, attrs)]

    def _materialize_sizes(self) -> None:
        """Arrays of symbolic sizes that a node reads at run time (not as a shape-deciding attribute) become
        SizeValues nodes, which compute them from the sizes a run is given."""
        read = {value for node in self.graph.nodes for value in node.inputs if value is not None}
        read.update(self.graph.outputs)
        made = []
        for value, array in list(self.graph.params.items()):
            if array.dtype == object and value in read:
                del self.graph.params[value]
                made.append(
                    Node(
                        "SizeValues",
                        [],
                        [value],
                        {"values": tuple(array.reshape(-1).tolist()), "shape": array.shape},
                        f"{value.name}_sizes",
                    )
                )
        self.graph.nodes[:0] = made

    def _drop_unused_params(self) -> None:
        used = {v for node in self.graph.nodes for v in node.inputs if v is not None}
        used.update(self.graph.outputs)
        self.graph.params = {value: array for value, array in self.graph.params.items() if value in used}


def parse_input_shapes(specs) -> dict[str, tuple[int, ...]]:
    """`["name=1,3,224,224", ...]` as {name: shape} for `load_onnx(input_shapes=...)`; a ShapeError saying the
    expected form on anything else. The CLI's --input-shape and the server's form field both use it."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, equals, dims = spec.partition("=")
        name = name.strip()
        try:
            if not equals or not name:
                raise ValueError
            shape = tuple(int(dim) for dim in dims.split(","))
            if math.prod(shape) > checks.INT64_MAX:
                raise ShapeError(
                    f"input shape {spec!r} has {math.prod(shape):,} elements, more than a 64-bit size can count; "
                    "give smaller dimensions"
                )
        except ValueError:
            raise ShapeError(
                f"input shape {spec!r} is not of the form NAME=D1,D2,...; for example input=1,3,224,224"
            ) from None
        if any(dim < 1 for dim in shape):
            raise ShapeError(
                f"input shape {spec!r} has a dimension below 1; every dimension must be a positive integer"
            )
        if name in shapes:
            raise ShapeError(f"input shapes give input {name!r} twice; give each input once")
        shapes[name] = shape
    return shapes


def parse_dims(specs) -> dict[str, tuple[int, int] | str]:
    """`["seq=1..2048", "total=past+seq", ...]` as {name: (low, high) or expression} for `load_onnx(dims=...)`: symbolic
    dimensions kept symbolic within an inclusive range, or as an expression of the others; a ShapeError saying the
    expected form on anything else (the CLI's --dim)."""
    dims: dict[str, tuple[int, int] | str] = {}
    for spec in specs:
        name, equals, bounds = spec.partition("=")
        low, dots, high = bounds.partition("..")
        name = name.strip()
        if equals and name and not dots and bounds.strip():
            dims[name] = bounds.strip()  # an expression of the other dims, checked at import: total=past+seq
            continue
        try:
            if not equals or not name or not dots:
                raise ValueError
            low, high = int(low), int(high)
        except ValueError:
            raise ShapeError(
                f"dim {spec!r} is not of the form NAME=LOW..HIGH or NAME=EXPRESSION; for example seq=1..2048 or "
                "total=past+seq"
            ) from None
        if not 0 <= low <= high or high > checks.INT64_MAX:
            raise ShapeError(f"dim {spec!r} has an empty or negative range; give 0 <= LOW <= HIGH")
        if name in dims:
            raise ShapeError(f"dims give {name!r} twice; give each name once")
        Sym.symbol(name, low, high)  # the name's own check
        dims[name] = (low, high)
    return dims
