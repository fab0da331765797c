"""tessel.js reads and writes every dtype a bundle's inputs and outputs may have, in Node 20 (which has no
Float16Array, so float16 travels as a Uint16Array of its bits), against onnxruntime; and its float16 conversions
against numpy's float16, over all 65536 float16 bit patterns and float32 values of every kind. tests/web/dtypes.test.mjs
holds the checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from node_helpers import run_node_tests
from onnx import TensorProto, helper

from compiler import compile_model

NODE_TEST = Path(__file__).with_name("dtypes.test.mjs")
SHAPE = (2, 3, 4)
DTYPES = ("float16", "int8", "uint8", "int16", "int32", "int64", "float64", "bool")


def dtype_model(dtype: str) -> onnx.ModelProto:
    """x of `dtype` in, and out: doubled (x + x; not x for bool), as_float (x cast to float32), from_float (the float32
    input f cast to `dtype`), same (Identity) and x itself (an output no kernel writes: copied from the input)."""
    proto = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    doubled = (
        helper.make_node("Not", ["x"], ["doubled"])
        if dtype == "bool"
        else helper.make_node("Add", ["x", "x"], ["doubled"])
    )
    nodes = [
        doubled,
        helper.make_node("Cast", ["x"], ["as_float"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["f"], ["from_float"], to=proto),
        helper.make_node("Identity", ["x"], ["same"]),
    ]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        f"{dtype}_io",
        [value("x", proto, SHAPE), value("f", TensorProto.FLOAT, SHAPE)],
        [
            value(name, TensorProto.FLOAT if name == "as_float" else proto, SHAPE)
            for name in ("doubled", "as_float", "from_float", "same", "x")
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def dtype_feeds(dtype: str, rng: np.random.Generator, int64_as_int32: bool = False) -> dict[str, np.ndarray]:
    """Values that stay in range when doubled, and floats whose cast to `dtype` truncates (or rounds, for floats);
    int64 ones inside int32's range where the device holds int64 as int32 (WebGPU)."""
    if dtype == "bool":
        x = rng.integers(0, 2, SHAPE).astype(bool)
        f = rng.choice(np.array([0.0, -0.0, 0.5, -3.0, 1e-30, 7.0], np.float32), SHAPE)
    elif dtype in ("float16", "float64"):
        x = (rng.standard_normal(SHAPE) * 100).astype(dtype)
        x.flat[:4] = [np.inf, -0.0, 6e-8, -np.inf]  # 6e-8 is a float16 subnormal
        f = (rng.standard_normal(SHAPE) * 3000).astype(np.float32)
        f.flat[:3] = [70000.0, 1e-7, -65519.0]  # beyond float16's range, a subnormal, the largest finite below
    else:
        info = np.iinfo("int32" if int64_as_int32 else dtype)
        x = rng.integers(info.min // 2, info.max // 2, SHAPE, endpoint=True).astype(dtype)
        low, high = (
            max(-1e12, 0.9 * float(limit)) if limit < 0 else min(1e12, 0.9 * float(limit))
            for limit in (info.min, info.max)
        )
        f = rng.uniform(low, high, SHAPE).astype(np.float32)
    return {"x": x, "f": f}


def _write(path: Path, array: np.ndarray) -> dict:
    path.write_bytes(np.ascontiguousarray(array).tobytes())
    return {"file": str(path), "shape": list(array.shape), "dtype": str(array.dtype)}


def _conversion_cases(root: Path) -> dict:
    """numpy's float16 both ways: every float16 bit pattern as float32 bits, and float32 values (random bit patterns,
    magnitudes across float16's range and beyond, the exact midpoints between neighbouring float16 values, specials)
    as float16 bits."""
    every_half = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    as_float = every_half.view(np.float16).astype(np.float32)
    rng = np.random.default_rng(16)
    patterns = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    magnitudes = (2.0 ** rng.uniform(-28, 18, 200_000) * rng.choice([-1, 1], 200_000)).astype(np.float32)
    finite = np.sort(every_half.view(np.float16)[np.isfinite(every_half.view(np.float16))].astype(np.float32))
    finite = np.unique(finite)
    midpoints = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)  # exact: 12 significant bits
    specials = np.array(
        [
            0.0,
            -0.0,
            np.inf,
            -np.inf,
            65504.0,
            65519.996,
            65520.0,
            2.0**-24,
            2.0**-25,
            2.0**-25 * 1.0000001,
            2.0**-14,
            2.0**-14 - 2.0**-25,
            1e-45,
            -1e-45,
            3.4e38,
            1.0 + 2.0**-11,
            1.0 + 3 * 2.0**-11,
        ],
        np.float32,
    )
    floats = np.concatenate([patterns, magnitudes, midpoints, specials])
    with np.errstate(over="ignore", invalid="ignore"):
        halves = floats.astype(np.float16)
    return {
        "halves": _write(root / "halves.u16", every_half),
        "halves_as_float": _write(root / "halves_as_float.f32", as_float),
        "floats": _write(root / "floats.f32", floats),
        "floats_as_half": _write(root / "floats_as_half.u16", halves.view(np.uint16)),
    }


def test_every_dtype_in_and_out_and_the_float16_conversions(tmp_path):
    rng = np.random.default_rng(7)
    models = []
    for dtype in DTYPES:
        model = dtype_model(dtype)
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        feeds = dtype_feeds(dtype, rng)
        runs = [feeds]
        if dtype == "float16":
            # float32 values that are not float16 values: tessel.js rounds a Float32Array input as numpy does
            unrounded = (rng.standard_normal(SHAPE) * 100).astype(np.float32)
            runs.append({"x": unrounded.astype(np.float16), "f": feeds["f"], "x_float32": unrounded})
        cases = []
        for number, run in enumerate(runs):
            inputs = {name: array for name, array in run.items() if name in ("x", "f")}
            expected = dict(zip([output.name for output in session.get_outputs()], session.run(None, inputs)))
            cases.append(
                {
                    "inputs": {name: _write(tmp_path / f"{dtype}.{number}.in.{name}", a) for name, a in run.items()},
                    "expected": {
                        name: _write(tmp_path / f"{dtype}.{number}.out.{name}", a) for name, a in expected.items()
                    },
                }
            )
        bundle = compile_model(model, "wasm").export(tmp_path / dtype)
        models.append({"dtype": dtype, "bundle": str(bundle), "runs": cases})
    cases = {"models": models, "conversions": _conversion_cases(tmp_path)}
    run_node_tests(NODE_TEST, "TESSEL_DTYPE_CASES", cases, tmp_path, timeout=300)
