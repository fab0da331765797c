"""int64 legalization for devices without it (webgpu): a layout-stage pass of the GPU family (passes/pipeline.py)
that stores int64 tensors as int32, so kernels never hold an int64 buffer.

Params are narrowed here, checked; model inputs and outputs keep their int64 dtype for the caller and the runtime
converts them (the manifest's `device_dtype`, docs/gpu.md); every node's outputs are inferred again from the narrowed
inputs, and a Cast to int64 casts to int32.
"""

from __future__ import annotations

import numpy as np

from compiler.errors import ModelError, TesselError
from compiler.graph.ir import Graph, GraphError, TensorType, Value
from compiler.graph.registry import get_op
from compiler.target import Target

INT32_RANGE = (np.iinfo(np.int32).min, np.iinfo(np.int32).max)


def fits_int32(array: np.ndarray) -> bool:
    return array.size == 0 or (INT32_RANGE[0] <= int(array.min()) and int(array.max()) <= INT32_RANGE[1])


def narrow_int64(graph: Graph, target: Target) -> Graph:
    """`graph` with its int64 values in int32 when `target`'s device has no int64 (else `graph` itself); raises
    ModelError naming a param whose values do not fit in int32."""
    if "int64" in target.device.dtypes or "int32" not in target.device.dtypes:
        return graph
    result = graph.copy()
    renamed: dict[Value, Value] = {}

    def narrowed(value: Value | None, dtype: str | None = None) -> Value | None:
        if value is None:
            return None
        if value in renamed:
            return renamed[value]
        dtype = dtype or ("int32" if value.type.dtype == "int64" else value.type.dtype)
        if dtype != value.type.dtype:
            renamed[value] = Value(value.name, TensorType(value.type.shape, dtype))
            return renamed[value]
        return value

    params = {}
    for value, array in result.params.items():
        if array.dtype == np.int64:
            if not fits_int32(array):
                raise ModelError(
                    f"constant {value.name!r} holds int64 values outside int32's range, which {target.kind} cannot "
                    "store (it has no int64); compile the model for a target with int64 (llvm, wasm, opencl, cuda)"
                )
            array = array.astype(np.int32)
        params[narrowed(value)] = array
    result.params = params
    result.inputs = [narrowed(value) for value in result.inputs]
    for node in result.nodes:
        node.inputs = [narrowed(value) for value in node.inputs]
        if node.op == "Cast" and node.attrs.get("to") == "int64":
            node.attrs = {**node.attrs, "to": "int32"}
        try:
            types = get_op(node.op).infer([v.type if v is not None else None for v in node.inputs], node.attrs)
        except (GraphError, TesselError) as error:
            raise ModelError(
                f"node {node.name} ({node.op}) computes in int64 ({error}), which {target.kind} has not; compile the "
                "model for a target with int64 (llvm, wasm, opencl, cuda)"
            ) from error
        node.outputs = [narrowed(value, type.dtype) for value, type in zip(node.outputs, types)]
    result.outputs = [renamed.get(value, value) for value in result.outputs]
    return result
