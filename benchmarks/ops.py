"""Single ops and small blocks that transformer models are made of, Tessel against onnxruntime natively, side by side
in one process: each case is an ONNX model built here, compiled for the host, checked against onnxruntime's output,
then timed interleaved (A B A B ...) on the same input with the same thread count. The zoo models of cpu.py have no
softmax, layer norm or batched matmul; these cases keep those kernels measured.
Run: .venv/bin/python benchmarks/ops.py [--threads 1] [--cases ...] [--repeat 30]"""

from __future__ import annotations

import argparse
import datetime
from functools import partial

import numpy as np
import onnxruntime as ort
from common import check_close, interleaved, onnxruntime_session, print_table, ratio, spread, summary
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
        "matmul 128x768 @ 768x768": _model(
            [helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": HIDDEN}, {"y": HIDDEN}, {"w": _weight(WIDTH, WIDTH)}
        ),
        "matmul 128x768 @ 768x3072": _model(
            [helper.make_node("MatMul", ["x", "w"], ["y"])],
            {"x": HIDDEN},
            {"y": [1, TOKENS, 4 * WIDTH]},
            {"w": _weight(WIDTH, 4 * WIDTH)},
        ),
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
    arguments = parser.parse_args()
    threads, repeat = arguments.threads, max(30, arguments.repeat)
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
        rows.append(
            [
                name,
                spread(tessel, 3, ("median", "min")),
                spread(rival, 3, ("median", "min")),
                ratio(tessel["median"], rival["median"]),
            ]
        )
    print(f"{datetime.date.today()}, {machine()}, onnxruntime {ort.__version__}, {threads} thread(s)\n")
    print_table(["case", "Tessel ms (median / min)", "onnxruntime ms (median / min)", "Tessel / onnxruntime"], rows)


if __name__ == "__main__":
    main()
