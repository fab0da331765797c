"""The frontend's one validation layer: every rule an ONNX model must keep before the importer reads it. Names
are text, tensors hold as much data as their dims say, sparse indices lie inside their dims, shapes fit in int64,
and each node matches its operator's schema in onnx.defs (input and output counts, attribute names, types and
values, dtype constraints). A broken rule raises one ModelError (ShapeError for sizes) naming what is wrong.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, defs

from compiler.errors import ModelError, ShapeError
from compiler.graph.sym import Sym, upper

INT64_MAX = (1 << 63) - 1
# The most elements a sparse tensor may have once made dense: the most a kernel's 32-bit index reaches (build.py's
# INDEX_LIMIT), past which compile_model would refuse it anyway. Checked before the dense array is allocated, as a
# few bytes of sparse tensor may declare any dims.
DENSE_LIMIT = (1 << 31) - 1

# ONNX tensor dtypes that Tessel reads, as numpy dtype names.
TENSOR_DTYPES = {
    TensorProto.FLOAT: "float32",
    TensorProto.FLOAT16: "float16",
    TensorProto.DOUBLE: "float64",
    TensorProto.INT8: "int8",
    TensorProto.UINT8: "uint8",
    TensorProto.INT16: "int16",
    TensorProto.INT32: "int32",
    TensorProto.INT64: "int64",
    TensorProto.BOOL: "bool",
}

# The schemas' spelling of each dtype, as in a type constraint's allowed_type_strs.
_SCHEMA_TYPES = {
    "float32": "tensor(float)",
    "float16": "tensor(float16)",
    "float64": "tensor(double)",
    "int8": "tensor(int8)",
    "uint8": "tensor(uint8)",
    "int16": "tensor(int16)",
    "int32": "tensor(int32)",
    "int64": "tensor(int64)",
    "bool": "tensor(bool)",
}

# 4-bit integer tensors, two values a byte in the file: read as the 8-bit type that holds their values (an initializer
# only: a DequantizeLinear's levels, which pack_dense stores two a byte again). No graph input or output has them.
PACKED_4BIT = {TensorProto.INT4: "int8", TensorProto.UINT4: "uint8"}

# The field a TensorProto keeps its values in when it has no raw_data, per dtype (onnx.proto's comments).
_VALUE_FIELDS = {
    TensorProto.INT4: "int32_data",
    TensorProto.UINT4: "int32_data",
    TensorProto.FLOAT: "float_data",
    TensorProto.FLOAT16: "int32_data",
    TensorProto.DOUBLE: "double_data",
    TensorProto.INT8: "int32_data",
    TensorProto.UINT8: "int32_data",
    TensorProto.INT16: "int32_data",
    TensorProto.INT32: "int32_data",
    TensorProto.INT64: "int64_data",
    TensorProto.BOOL: "int32_data",
}

# Integer attributes that are booleans wherever ONNX uses them; the schemas type them INT and say so only in prose.
FLAG_ATTRIBUTES = frozenset(
    {
        "allowzero",
        "align_corners",
        "ceil_mode",
        "center_point_box",
        "count_include_pad",
        "detect_negative",
        "detect_positive",
        "exclusive",
        "keepdims",
        "largest",
        "noop_with_empty_axes",
        "reverse",
        "select_last_index",
        "sorted",
        "transA",
        "transB",
        "upper",
    }
)


def _type_name(attribute_type: int) -> str:
    known = attribute_type in AttributeProto.AttributeType.values()
    return AttributeProto.AttributeType.Name(attribute_type) if known else f"type {attribute_type}"


# -- names ------------------------------------------------------------------------------------------------------


def _text(name: Any, what: str) -> str:
    # protobuf hands back bytes, not str, for a string field that is not valid UTF-8
    if not isinstance(name, str):
        raise ModelError(f"{what} is not valid UTF-8 text ({bytes(name)[:40]!r}); name it in UTF-8 and export again")
    return name


def check_names(graph: onnx.GraphProto) -> None:
    """Every name the importer reads, and every node's op type and domain, must be text."""
    _text(graph.name, "the graph's name")
    for kind, infos in (("input", graph.input), ("output", graph.output), ("value_info", graph.value_info)):
        for position, info in enumerate(infos):
            _text(info.name, f"graph {kind} {position}'s name")
    for position, tensor in enumerate(graph.initializer):
        _text(tensor.name, f"initializer {position}'s name")
    for position, sparse in enumerate(graph.sparse_initializer):
        _text(sparse.values.name, f"sparse initializer {position}'s name")
    for index, node in enumerate(graph.node):
        label = f"node {index}"
        for field in ("name", "op_type", "domain"):
            _text(getattr(node, field), f"{label}'s {field}")
        label = f"node {node.name or index} ({node.op_type})"
        for position, name in enumerate(node.input):
            _text(name, f"input {position} of {label}")
        for position, name in enumerate(node.output):
            _text(name, f"output {position} of {label}")
        for attribute in node.attribute:
            _text(attribute.name, f"an attribute name of {label}")


def check_ir_version(model: onnx.ModelProto, source: str) -> None:
    """The IR version is one this onnx knows, from 3 (the first with opset imports) on, as onnxruntime requires."""
    if not 3 <= model.ir_version <= onnx.IR_VERSION:
        raise ModelError(
            f"{source} has ONNX IR version {model.ir_version}; Tessel reads IR versions 3 to {onnx.IR_VERSION}: "
            "export the model again"
        )


def check_function_imports(model: onnx.ModelProto) -> None:
    """A call of a local function is in a domain the model imports an opset of (onnxruntime refuses the model
    otherwise; a node of any other domain but the default is an unsupported op, named as such later)."""
    imported = {entry.domain for entry in model.opset_import}
    functions = {function.domain for function in model.functions}
    for index, node in enumerate(model.graph.node):
        if node.domain in functions and node.domain not in imported:
            raise ModelError(
                f"node {node.name or index} ({node.op_type}) is in domain {node.domain!r}, of which the model imports "
                "no opset; export the model again"
            )


def check_function_names(function: onnx.FunctionProto) -> None:
    """A local function's names must be text before onnx's inliner copies them into the graph."""
    _text(function.name, "a local function's name")
    for index, node in enumerate(function.node):
        for field in ("name", "op_type", "domain"):
            _text(getattr(node, field), f"node {index} of function {function.name!r}'s {field}")
        for name in [*node.input, *node.output, *function.input, *function.output]:
            _text(name, f"a value name in function {function.name!r}")


def decode_text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ModelError(
            f"{what} is not valid UTF-8 text ({data[:40]!r}); write it in UTF-8 and export again"
        ) from None


# -- shapes and tensors -----------------------------------------------------------------------------------------


def check_shape(shape: Iterable[int], dtype: str, what: str) -> tuple[int, ...]:
    """The shape as ints, refused when a dim is negative or its element count or byte size overflows int64."""
    shape = tuple(d if isinstance(d, Sym) else int(d) for d in shape)
    if any(upper(d) < 0 for d in shape):
        raise ShapeError(f"{what} has the shape {list(shape)}; dimensions must be >= 0")
    count = 1
    for d in shape:
        count *= upper(d)
    if count * np.dtype(dtype).itemsize > INT64_MAX:
        raise ShapeError(
            f"{what} has the shape {list(shape)}: {count:,} elements of {dtype}, more bytes than a 64-bit size can "
            "count; give it a smaller shape"
        )
    return shape


def dtype_name(elem_type: int, what: str) -> str:
    if elem_type not in TENSOR_DTYPES:
        name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else elem_type
        supported = ", ".join(TENSOR_DTYPES.values())
        raise ModelError(f"{what} has dtype {name}, which Tessel does not support; use one of {supported}")
    return TENSOR_DTYPES[elem_type]


def check_tensor(tensor: TensorProto, what: str) -> None:
    """A dense tensor that numpy_helper.to_array reads exactly: known dtype, dims >= 0, data as long as its dims."""
    packed = tensor.data_type in PACKED_4BIT
    dtype = PACKED_4BIT[tensor.data_type] if packed else dtype_name(tensor.data_type, what)
    shape = check_shape(tensor.dims, dtype, what)
    if tensor.data_location == TensorProto.EXTERNAL:
        raise ModelError(
            f"{what} keeps its data in an external file; compile the model from its path, with its data files beside it"
        )
    if tensor.HasField("segment"):
        raise ModelError(f"{what} is a segment of a larger tensor, which Tessel does not read; export it whole")
    count = int(np.prod(shape, dtype=object))
    if packed:  # two values a byte (raw_data) or a value of int32_data
        count = (count + 1) // 2
    if tensor.HasField("raw_data"):
        expected, got, unit = count * np.dtype(dtype).itemsize, len(tensor.raw_data), "bytes of raw_data"
    else:
        expected, got, unit = count, len(getattr(tensor, _VALUE_FIELDS[tensor.data_type])), "values"
    if got != expected:
        raise ModelError(
            f"{what} has dims {list(shape)}, which need {expected:,} {unit}, but it holds {got:,}; export the model again"
        )


def check_sparse(sparse: onnx.SparseTensorProto, what: str) -> None:
    """Values of shape [NNZ] and int64 indices of shape [NNZ] (into the flattened tensor) or [NNZ, rank], in range."""
    check_tensor(sparse.values, f"{what}'s values")
    dense = check_shape(sparse.dims, TENSOR_DTYPES[sparse.values.data_type], what)
    size = int(np.prod(dense, dtype=object))
    if size > DENSE_LIMIT:
        raise ModelError(
            f"{what} is a sparse tensor of dims {list(dense)}: {size:,} elements once dense, and Tessel stores every "
            f"weight dense, in tensors its kernels index with 32-bit integers (at most {DENSE_LIMIT:,} elements); "
            "give it smaller dims"
        )
    if len(sparse.values.dims) != 1:
        raise ModelError(f"{what}'s values have dims {list(sparse.values.dims)}; a sparse tensor's values are 1-D")
    count = sparse.values.dims[0]
    if sparse.indices.data_type != TensorProto.INT64:
        raise ModelError(f"{what}'s indices must be int64")
    check_tensor(sparse.indices, f"{what}'s indices")
    indices = onnx.numpy_helper.to_array(sparse.indices)
    if indices.shape not in ((count,), (count, len(dense))):
        raise ModelError(
            f"{what}'s indices have shape {list(indices.shape)}; for {count} values in a tensor of rank {len(dense)} "
            f"they must be [{count}] or [{count}, {len(dense)}]"
        )
    bounds = np.array([size] if indices.ndim == 1 else dense, dtype=np.int64)
    outside = (indices < 0) | (indices >= bounds)
    if outside.any():
        position = int(np.argwhere(outside)[0][0])
        raise ModelError(
            f"{what}'s index {indices[position].tolist()} lies outside its dims {list(dense)}; export the model again"
        )


def check_declared_output(info: onnx.ValueInfoProto, dtype: str) -> None:
    """A graph output's declared dtype, when it declares one, must be the one its node computes (onnxruntime
    refuses the model otherwise). Its declared shape may differ: input_shapes can change it."""
    kind = info.type.WhichOneof("value")
    if kind not in (None, "tensor_type"):
        raise ModelError(f"graph output {info.name!r} is declared a {kind.replace('_type', '')}, not a tensor")
    declared = info.type.tensor_type.elem_type
    if kind == "tensor_type" and not declared:
        raise ModelError(f"graph output {info.name!r} is declared a tensor of no dtype (UNDEFINED); export it again")
    if declared and TENSOR_DTYPES.get(declared) != dtype:
        name = TensorProto.DataType.Name(declared) if declared in TensorProto.DataType.values() else declared
        raise ModelError(
            f"graph output {info.name!r} is declared {name}, but the node that makes it computes {dtype}; "
            "export the model again"
        )


# -- nodes against their schemas --------------------------------------------------------------------------------
# The messages below name no node: the importer prefixes each with the node it was checking.


def node_schema(node: onnx.NodeProto, opset: int) -> defs.OpSchema:
    try:
        # "ai.onnx" is the default domain's long name, under which onnx.defs registers nothing
        return defs.get_schema(node.op_type, opset, "" if node.domain == "ai.onnx" else node.domain)
    except defs.SchemaError:
        raise ModelError(f"opset {opset} of ONNX has no operator {node.op_type!r}; export the model again") from None


def check_node(node: onnx.NodeProto, schema: defs.OpSchema) -> None:
    """Input and output counts, required inputs present, and every attribute known, of its schema's type and, for
    flags, 0 or 1."""
    for kind, names, low, high in (
        ("inputs", node.input, schema.min_input, schema.max_input),
        ("outputs", node.output, schema.min_output, schema.max_output),
    ):
        if not low <= len(names) <= high:
            expected = f"{low}" if low == high else f"{low} to {high}" if high < 1 << 30 else f"at least {low}"
            raise ModelError(
                f"it has {len(names)} {kind}, but {node.op_type} (opset {schema.since_version}) takes {expected}"
            )
    for position, (formal, name) in enumerate(zip(_formal_params(schema.inputs, len(node.input)), node.input)):
        if not name and formal.option != defs.OpSchema.FormalParameterOption.Optional:
            raise ModelError(f"its input {position} ({formal.name!r}) is left empty, but only optional inputs may be")
    seen = set()
    for attribute in node.attribute:
        if attribute.name in seen:
            raise ModelError(f"it gives the attribute {attribute.name!r} twice")
        seen.add(attribute.name)
        declared = schema.attributes.get(attribute.name)
        if declared is None:
            known = ", ".join(sorted(schema.attributes)) or "none"
            raise ModelError(
                f"it has the attribute {attribute.name!r}, which {node.op_type} does not take (it takes: {known})"
            )
        kind = attribute.type
        if kind == AttributeProto.UNDEFINED:
            raise ModelError(f"attribute {attribute.name!r} has no type; export the model again")
        if kind != int(declared.type):
            raise ModelError(
                f"attribute {attribute.name!r} is of type {_type_name(kind)}, but {node.op_type} takes "
                f"{_type_name(int(declared.type))} there"
            )
        if attribute.name in FLAG_ATTRIBUTES and kind == AttributeProto.INT and attribute.i not in (0, 1):
            raise ModelError(f"attribute {attribute.name!r} is {attribute.i}; it is a flag, 0 or 1")
    missing = [name for name, declared in schema.attributes.items() if declared.required and name not in seen]
    if missing:
        raise ModelError(f"it lacks the required attribute(s) {', '.join(map(repr, missing))}")


def _formal_params(formals, count: int) -> list:
    """The formal parameter each of `count` actual arguments binds to: a variadic last one takes the rest."""
    formals = list(formals)
    if not formals:
        return []
    return [formals[min(position, len(formals) - 1)] for position in range(count)]


def check_dtypes(node: onnx.NodeProto, schema: defs.OpSchema, inputs: list[str | None]) -> None:
    """Each input's dtype (None for an absent one) must be allowed by its formal parameter's type constraint, and
    the inputs bound to one type parameter must share a dtype, as onnxruntime requires."""
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    bound: dict[str, tuple[str, str]] = {}
    for position, (formal, dtype) in enumerate(zip(_formal_params(schema.inputs, len(inputs)), inputs)):
        if dtype is None:
            continue
        schema_type = _SCHEMA_TYPES[dtype]
        param = formal.type_str
        permitted = allowed.get(param, {param})
        if schema_type not in permitted:
            names = sorted(name[7:-1] for name in permitted if name.startswith("tensor("))
            raise ModelError(
                f"input {position} ({formal.name!r}) is {dtype}, which {node.op_type} does not take there "
                f"(it takes {', '.join(names)}); cast it in the model"
            )
        variadic_mixed = formal.option == defs.OpSchema.FormalParameterOption.Variadic and not formal.is_homogeneous
        if param in allowed and not variadic_mixed:
            first = bound.setdefault(param, (dtype, f"input {position} ({formal.name!r})"))
            if first[0] != dtype:
                raise ModelError(
                    f"input {position} ({formal.name!r}) is {dtype} but {first[1]} is {first[0]}; "
                    f"{node.op_type} needs them to share one dtype ({param}): cast one of them in the model"
                )
