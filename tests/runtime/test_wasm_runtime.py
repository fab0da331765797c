"""The wasmtime runtime: host-owned memory that grows for large arrays, outputs copied back in place."""

from __future__ import annotations

import numpy as np
import wasmtime

from compiler.build import build_func
from compiler.te.expr import Const, Var
from compiler.tir.nodes import Buffer, For, ForKind, Load, PrimFunc, Store


def axpy_func(size: int) -> PrimFunc:
    x, y = Buffer("x", (size,), "float32"), Buffer("y", (size,), "float32")
    i = Var("i")
    body = Store(y, i, Load(x, i) * Const(3.0, "float32") + Load(y, i))
    return PrimFunc("axpy", [x, y], For(i, Const(0, "int32"), Const(size, "int32"), ForKind.SERIAL, body))


def test_memory_grows_for_large_arrays_and_outputs_update_in_place():
    size = 3_000_000  # 24 MB of arguments: far beyond the module's initial memory
    kernel = build_func(axpy_func(size), "wasm")
    x = np.random.default_rng(1).standard_normal(size).astype("float32")
    y = np.ones(size, "float32")
    before = kernel.runtime.memory.data_len(kernel.runtime.store)
    kernel(x, y)
    np.testing.assert_array_equal(y, x * 3 + 1)
    assert kernel.runtime.memory.data_len(kernel.runtime.store) > before
    kernel(x, y)  # the second call reuses the grown memory
    np.testing.assert_array_equal(y, x * 3 + (x * 3 + 1))


def test_exported_module_imports_memory_and_exports_the_kernel(tmp_path):
    kernel = build_func(axpy_func(16), "wasm")
    data = kernel.export_library(tmp_path / "axpy.wasm").read_bytes()
    assert data[:4] == b"\0asm"
    module = wasmtime.Module(wasmtime.Engine(), data)
    assert [(item.module, item.name) for item in module.imports] == [("env", "memory")]
    assert {"axpy", "__heap_base"} <= {item.name for item in module.exports}
    assert "tessel_parallel" not in kernel.source("ll")
