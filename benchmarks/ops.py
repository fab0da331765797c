"""Single ops and small blocks that transformer models are made of, Tessel against onnxruntime natively, side by side
in one process: each case is an ONNX model built here, compiled for the host, checked against onnxruntime's output,
then timed interleaved (A B A B ...) on the same input with the same thread count. The zoo models of cpu.py have no
softmax, layer norm or batched matmul; these cases keep those kernels measured. A MatMul case also prints its
GFLOP/s and their share of the FMA peak that common.fma_peak_gflops measures on as many threads, in the same run
(the dense target: 85% of it at one thread for 128, 197 and 1500 rows by 768 x 768 and 768 x 3072). With --wasm the
cases run in Node instead, Tessel's plain-SIMD bundle on one thread against onnxruntime-web's (benchmarks/wasm.py's
harness).
Run: .venv/bin/python benchmarks/ops.py [--threads 1] [--cases ...] [--repeat 30] [--wasm]"""

from __future__ import annotations

import argparse
import datetime
from functools import partial

import numpy as np
import onnxruntime as ort
from common import (
    check_close,
    fma_peak_gflops,
    interleaved,
    onnxruntime_session,
    print_table,
    ratio,
    run_in_node,
    spread,
    summary,
)
from cpu import machine
from onnx import TensorProto, helper, numpy_helper

import compiler

TOKENS, WIDTH, HEADS = 128, 768, 12
HIDDEN = [1, TOKENS, WIDTH]
ATTENTION = [1, HEADS, TOKENS, TOKENS]
RNG = np.random.default_rng(0)


def _model(nodes, inputs: dict, outputs: dict, weights: dict | None = None):
    graph = helper.make_graph(
        nodes,
        "case",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs.items()],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in outputs.items()],
        [numpy_helper.from_array(value, name) for name, value in (weights or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _matmul(rows: int, inner: int, columns: int):
    """x (1, rows, inner) @ a weight (inner, columns), as a transformer's projection."""
    return _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        {"x": [1, rows, inner]},
        {"y": [1, rows, columns]},
        {"w": _weight(inner, columns)},
    )


def _attention(heads: int, tokens: int, depth: int):
    """softmax(Q K^T / sqrt(depth)) V over `heads` heads, as torch's scaled_dot_product_attention exports it."""
    shape = [1, heads, tokens, depth]
    return _model(
        [
            helper.make_node("MatMul", ["q", "kt"], ["scores"]),
            helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
            helper.make_node("Softmax", ["scaled"], ["weights"], axis=-1),
            helper.make_node("MatMul", ["weights", "v"], ["y"]),
        ],
        {"q": shape, "kt": [1, heads, depth, tokens], "v": shape},
        {"y": shape},
        {"scale": np.array(depth**-0.5, np.float32)},
    )


def flops(model) -> int:
    """Multiply-add flops of a case's MatMuls (0 when it has none): 2 x M x K x N each."""
    shapes = {value.name: [dim.dim_value for dim in value.type.tensor_type.shape.dim] for value in model.graph.input}
    shapes.update({init.name: list(init.dims) for init in model.graph.initializer})
    total = 0
    for node in model.graph.node:
        if node.op_type == "MatMul" and all(name in shapes for name in node.input):
            a, b = (shapes[name] for name in node.input)
            total += 2 * int(np.prod(a[:-1])) * a[-1] * b[-1]
    return total


def _weight(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)


def _unary(op: str, shape: list[int], **attrs):
    return _model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": shape}, {"y": shape})


def cases() -> dict:
    """name -> ONNX model; every input is float32 and drawn from a standard normal."""
    gelu = [
        helper.make_node("Div", ["x", "root2"], ["scaled"]),
        helper.make_node("Erf", ["scaled"], ["erf"]),
        helper.make_node("Add", ["erf", "one"], ["shifted"]),
        helper.make_node("Mul", ["x", "shifted"], ["doubled"]),
        helper.make_node("Mul", ["doubled", "half"], ["y"]),
    ]
    constants = {"root2": np.float32(np.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5)}
    return {
        "softmax 12x128x128": _unary("Softmax", ATTENTION, axis=-1),
        "layer_norm 128x768": _model(
            [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], axis=-1)],
            {"x": HIDDEN},
            {"y": HIDDEN},
            {"scale": np.ones(WIDTH, np.float32), "bias": np.zeros(WIDTH, np.float32)},
        ),
        "gelu (erf) 128x3072": _model(
            gelu,
            {"x": [1, TOKENS, 4 * WIDTH]},
            {"y": [1, TOKENS, 4 * WIDTH]},
            {name: np.array(value) for name, value in constants.items()},
        ),
        "exp 12x128x128": _unary("Exp", ATTENTION),
        "matmul 128x768 @ 768x768": _matmul(128, 768, 768),
        "matmul 128x768 @ 768x3072": _matmul(128, 768, 3072),
        "matmul 197x768 @ 768x768": _matmul(197, 768, 768),
        "matmul 197x768 @ 768x3072": _matmul(197, 768, 3072),
        "matmul 1500x768 @ 768x768": _matmul(1500, 768, 768),
        "matmul 1500x768 @ 768x3072": _matmul(1500, 768, 3072),
        "attention 12 heads x 197 tokens x 64": _attention(12, 197, 64),
        "attention 6 heads x 1500 tokens x 64": _attention(6, 1500, 64),
        "attention scores 12x128x64 @ 12x64x128": _model(
            [helper.make_node("MatMul", ["q", "k"], ["y"])],
            {"q": [1, HEADS, TOKENS, 64], "k": [1, HEADS, 64, TOKENS]},
            {"y": ATTENTION},
        ),
        # the zoo's ragged and strided kernels: audio_conv1d's first conv, unet_small's upsampling, vit_tiny's scores
        "conv1d 1->48 k79 s4 16000": _model(
            [helper.make_node("Conv", ["x", "w"], ["y"], strides=[4], pads=[39, 39])],
            {"x": [1, 1, 16000]},
            {"y": [1, 48, 4000]},
            {"w": _weight(48, 1, 79)},
        ),
        "conv_transpose 64->32 2x2 s2 24x24": _model(
            [helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
            {"x": [1, 64, 24, 24]},
            {"y": [1, 32, 48, 48]},
            {"w": _weight(64, 32, 2, 2)},
        ),
        "resize linear 2x 32x48x48": _model(
            [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")],
            {"x": [1, 32, 48, 48]},
            {"y": [1, 32, 96, 96]},
            {"scales": np.array([1, 1, 2, 2], np.float32)},
        ),
        "attention scores 3x77x64 @ 3x64x77": _model(
            [helper.make_node("MatMul", ["q", "k"], ["y"])],
            {"q": [1, 3, 77, 64], "k": [1, 3, 64, 77]},
            {"y": [1, 3, 77, 77]},
        ),
        "reduce_mean last axis 12x128x128": _model(
            [helper.make_node("ReduceMean", ["x"], ["y"], axes=[-1])], {"x": ATTENTION}, {"y": [*ATTENTION[:-1], 1]}
        ),
    }


def main() -> None:
    every = cases()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="threads for both Tessel and onnxruntime")
    parser.add_argument("--cases", nargs="+", default=list(every), choices=list(every), metavar="CASE")
    parser.add_argument("--repeat", type=int, default=30, help="timed runs of each, after warm-up (at least 30)")
    parser.add_argument("--wasm", action="store_true", help="Tessel's wasm bundle against onnxruntime-web in Node")
    arguments = parser.parse_args()
    threads, repeat = arguments.threads, max(30, arguments.repeat)
    if arguments.wasm:
        return wasm_main(every, arguments.cases, repeat)
    peak = fma_peak_gflops(threads)
    rows = []
    for name in arguments.cases:
        model = every[name]
        module = compiler.compile_model(model, target="llvm", num_threads=threads)
        session = onnxruntime_session(model, threads, spins=False)
        feeds = {spec.name: RNG.standard_normal(spec.shape).astype(np.float32) for spec in module.inputs}
        ours = module.run(feeds)
        check_close(name, [ours[spec.name] for spec in module.outputs], session.run(None, feeds))
        tessel, rival = map(
            summary, interleaved([partial(module.run, feeds), partial(session.run, None, feeds)], repeat)
        )
        work = flops(model)
        speed = f"{work / tessel['median'] / 1e6:.0f} ({work / tessel['median'] / 1e6 / peak:.0%})" if work else ""
        rows.append(
            [
                name,
                spread(tessel, 3, ("median", "min")),
                spread(rival, 3, ("median", "min")),
                ratio(tessel["median"], rival["median"]),
                speed,
            ]
        )
    print(
        f"{datetime.date.today()}, {machine()}, onnxruntime {ort.__version__}, {threads} thread(s), "
        f"FMA peak {peak:.0f} GFLOP/s\n"
    )
    header = ["case", "Tessel ms (median / min)", "onnxruntime ms (median / min)", "Tessel / onnxruntime"]
    print_table([*header, "Tessel GFLOP/s (share of peak)"], rows)


def wasm_main(every: dict, names: list[str], repeat: int) -> None:
    """Each case's plain-SIMD wasm bundle on one thread against onnxruntime-web on one thread, in one Node process."""
    entries = []
    for name in names:
        model = every[name]
        model.ir_version = 8  # onnxruntime-web 1.23 takes no later IR version
        module = compiler.compile_model(model, target="wasm")
        feeds = {spec.name: RNG.standard_normal(spec.shape).astype(np.float32) for spec in module.inputs}
        entries.append((name, model, module, feeds))
    report = run_in_node(entries, repeat=repeat)
    rows = []
    for (name, model, _, _), result in zip(entries, report["results"]):
        tessel, rival = summary(result["tessel"]), summary(result["onnxruntime_web"])
        work = flops(model)
        rows.append(
            [
                name,
                spread(tessel, 3, ("median", "min")),
                spread(rival, 3, ("median", "min")),
                ratio(tessel["median"], rival["median"]),
                f"{work / tessel['median'] / 1e6:.1f}" if work else "",
            ]
        )
    versions = report["versions"]
    print(
        f"{datetime.date.today()}, {machine()}, Node {versions.get('node')}, onnxruntime-web {versions.get('onnxruntime_web')}\n"
    )
    header = ["case", "Tessel wasm ms (median / min)", "onnxruntime-web ms (median / min)", "Tessel / onnxruntime-web"]
    print_table([*header, "Tessel GFLOP/s"], rows)


if __name__ == "__main__":
    main()
