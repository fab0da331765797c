"""The `tessel` command: a driver that sees every stage, from the zoo and the ONNX frontend to the passes and
the reference executor. Each subcommand is one entry of COMMANDS; every user error ends as one line
`tessel: error: <message>` on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compiler import zoo
from compiler.backends import BACKENDS
from compiler.build import EVERY_WASM_VARIANT, WEIGHT_FORMATS, compile_model, load_module, stored_weights
from compiler.data.train_digits import held_out_split
from compiler.errors import ModelError, ShapeError, TesselError
from compiler.frontend.onnx import load_onnx, parse_dims
from compiler.frontend.onnx import parse_input_shapes as parse
from compiler.passes.fuse_ops import group_summary
from compiler.passes.pipeline import optimize
from compiler.quantize import ACCURACY_LEVELS, BLOCK_SIZES, INTEGER_TYPES, RANDOM_SAMPLES, quantize_model
from compiler.target import Target
from compiler.tune import report
from compiler.tune.session import tune_file

EXIT_USER_ERROR = 2


@dataclass(frozen=True)
class Command:
    """A subcommand: its one-line help, how it adds its arguments, and what it runs (returning an exit status)."""

    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _progress(message: str) -> None:
    print(message, flush=True)


# -- shared helpers --------------------------------------------------------------------------------------------


def parse_input_shapes(specs: list[str] | None) -> dict[str, tuple[int, ...]] | None:
    """--input-shape values as load_onnx's input_shapes (None when none were given)."""
    return parse(specs) if specs else None


def _load_model_file(path: Path, input_shapes: dict[str, tuple[int, ...]] | None):
    if not path.exists():
        raise ModelError(f"cannot read {path}: no such file")
    if not path.is_file():
        raise ModelError(f"cannot read {path}: it is not a file; give the path of an .onnx model")
    return load_onnx(str(path), input_shapes=input_shapes)


def _param_bytes(graph) -> int:
    """Bytes of every distinct parameter array, including those held inside fused group bodies."""
    seen: dict[int, int] = {}

    def visit(g) -> None:
        for array in g.params.values():
            seen[id(array)] = array.nbytes
        for node in g.nodes:
            if "body" in node.attrs:
                visit(node.attrs["body"])

    visit(graph)
    return sum(seen.values())


def _pattern_name(pattern) -> str:
    return getattr(pattern, "name", str(pattern))


def _table(rows: list[tuple], header: tuple) -> list[str]:
    cells = [tuple(str(cell) for cell in row) for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]


# -- zoo -------------------------------------------------------------------------------------------------------


def _configure_zoo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help=f"one of {', '.join(zoo.MODELS)}")
    parser.add_argument("-o", "--output", type=Path, help="where to write the model (default NAME.onnx)")
    parser.add_argument("--list", action="store_true", help="list the zoo's models and exit")


def _run_zoo(args: argparse.Namespace) -> int:
    if args.list:
        for name in zoo.MODELS:
            model = zoo.build_model(name)
            print(
                f"{name:<20} input {'x'.join(map(str, zoo.INPUT_SHAPES[name])):<14} "
                f"{zoo.model_parameters(model) / 1e6:7.3f} M params  {zoo.model_flops(model) / 1e9:6.3f} GFLOPs"
            )
        return 0
    if args.name is None:
        raise TesselError(f"name a zoo model to write ({', '.join(zoo.MODELS)}), or pass --list")
    output = args.output or Path(f"{args.name}.onnx")
    try:
        zoo.save_model(args.name, output)
    except OSError as error:
        raise TesselError(f"cannot write {output}: {error.strerror or error}") from None
    print(f"wrote {output} ({output.stat().st_size:,} bytes)")
    return 0


def _add_input_shape(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--input-shape",
        action="append",
        metavar="NAME=D1,D2,...",
        help="fix the shape of an input, e.g. input=1,3,224,224 (repeat for several inputs)",
    )


def _add_dims(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dim",
        action="append",
        metavar="NAME=LOW..HIGH",
        help="keep an input's symbolic dimension NAME symbolic, every size in LOW..HIGH run by one bundle, "
        "e.g. seq=1..2048 (repeat for several; CPU targets)",
    )


def _add_weights(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--weights",
        choices=WEIGHT_FORMATS,
        default="fp32",
        help="fp32 (default): the model's weights as they are; fp16: each float32 weight of a packed dense "
        "(MatMul/Gemm) kernel stored as float16, half the bytes, computed in float32 (CPU targets: llvm, wasm)",
    )


def _add_threads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, help="threads for parallel loops when a bundle runs natively")


# -- inspect ---------------------------------------------------------------------------------------------------


# The target whose dense kernels `tessel inspect` reports without --target: tessel compile's default.
INSPECT_WEIGHTS_TARGET = "wasm"


def _configure_inspect(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="an .onnx file")
    _add_input_shape(parser)
    parser.add_argument(
        "--target",
        help="run the passes of this target too (layouts, packed weights), as tessel compile does; without it the "
        f"graph sections show the target-independent passes, the dense weights section {INSPECT_WEIGHTS_TARGET}'s",
    )
    _add_weights(parser)


# the dense ops whose weight pack_dense (and integer_products) packed, with its scales and sums beside it
PACKED_DENSE = ("MatMulPacked", "MatMulIntegerPacked")


def _dense_weights(fused) -> list[tuple[str, str, str, str, int]]:
    """(group, op, stored dtype, K x N, bytes of the weight with its scales and zero points) for each dense kernel of
    a fused graph whose weight is a param: a MatMulPacked's in the dtype the kernel reads it in, a
    MatMulIntegerPacked's as int8 levels, a MatMul's or Gemm's float32 (kernels that read their weight unpacked read
    float32)."""
    rows = []
    for group in fused.nodes:
        body = group.attrs.get("body")
        if body is None:
            continue
        outer = dict(zip(body.inputs, group.inputs, strict=True))
        for member in body.nodes:
            if member.op not in (*PACKED_DENSE, "MatMul", "Gemm") or len(member.inputs) < 2:
                continue
            arrays = [fused.params.get(outer.get(value)) for value in member.inputs[1:]]
            if arrays[0] is None:  # a product of two activations (attention's), not a weight
                continue
            weight = arrays[0]
            if member.op in PACKED_DENSE:
                size = f"{member.inputs[0].type.shape[-1]}x{member.attrs['columns']}"
            elif member.op == "Gemm" and member.attrs.get("transB", 0):
                size = "x".join(map(str, weight.shape[::-1]))
            else:
                size = "x".join(map(str, weight.shape))
            dtype = str(weight.dtype)
            if member.attrs.get("bits") == 4:  # pack_dense stores levels that fit 4 bits two a byte
                dtype += " (4-bit levels)"
            if member.op == "MatMulIntegerPacked":  # int8 levels four to a word, uint8 activations
                dtype = "int8 (integer products)"
            stored = sum(
                array.nbytes for array in arrays[: None if member.op in PACKED_DENSE else 1] if array is not None
            )
            rows.append((group.name, member.op, dtype, size, stored))
    return rows


def _print_dense_weights(fused, target: str) -> None:
    rows = _dense_weights(fused)
    print(f"\n== dense weights (target {target}) ==")
    if rows:
        print(
            "\n".join(
                _table([(*row[:4], f"{row[4]:,}") for row in rows], ("group", "op", "stored as", "K x N", "bytes"))
            )
        )
    counts = Counter(row[2] for row in rows)
    kinds = ", ".join(f"{count} {dtype}" for dtype, count in counts.most_common()) or "none"
    print(f"dense weights: {kinds}; params {_param_bytes(fused) / 1e6:.2f} MB")


def _run_inspect(args: argparse.Namespace) -> int:
    input_shapes = parse_input_shapes(args.input_shape)
    target = Target.parse(args.target) if args.target else None
    weights_target = target or Target.parse(INSPECT_WEIGHTS_TARGET)
    _progress(f"loading {args.model}")
    graph = _load_model_file(args.model, input_shapes)
    stored = stored_weights(graph, weights_target, args.weights)
    _progress(f"optimizing {len(graph.nodes)} nodes")
    started = time.perf_counter()
    fused = optimize(stored, fuse=True, target=target)
    # without --target the graph sections keep the target-independent passes, whose float kernels read every weight
    # widened: the dense weights are what the default compile target's packed kernels read
    packed = fused if target is not None else optimize(stored, fuse=True, target=weights_target)
    groups = group_summary(fused)
    _progress(f"optimized in {time.perf_counter() - started:.2f} s")

    print("\n== graph before passes ==")
    print(graph)
    print("\n== graph after passes ==")
    print(fused)
    print(f"\n== fused groups ({len(groups)}) ==")
    print(
        "\n".join(
            _table([(name, _pattern_name(p), " -> ".join(ops)) for name, p, ops in groups], ("group", "pattern", "ops"))
        )
    )

    before = Counter(node.op for node in graph.nodes)
    after = Counter(op for _, _, ops in groups for op in ops)
    print("\n== op counts ==")
    rows = [(op, before.get(op, 0), after.get(op, 0)) for op in sorted(before.keys() | after.keys())]
    rows.append(("total", sum(before.values()), sum(after.values())))
    print("\n".join(_table(rows, ("op", "before", "after"))))

    print("\n== groups by pattern ==")
    by_pattern = Counter(_pattern_name(pattern) for _, pattern, _ in groups)
    print("\n".join(_table(sorted(by_pattern.items()) + [("total", len(groups))], ("pattern", "groups"))))

    print(f"\nparameter bytes: {_param_bytes(graph):,} before passes, {_param_bytes(fused):,} after")
    _print_dense_weights(packed, str(weights_target))
    return 0


# -- demo ------------------------------------------------------------------------------------------------------


def _configure_demo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--show", type=int, default=10, help="how many held-out digits to print (default 10)")


def _run_demo(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    _progress(f"compiling the digits model ({zoo.DIGITS_PATH.name}) for wasm")
    module = compile_model(zoo.build_model("digits"), target="wasm")
    kernels = ", ".join("+".join(kernel["ops"]) for kernel in module.manifest["kernels"])
    _progress(
        f"compiled in {time.perf_counter() - started:.2f} s into {len(module.manifest['kernels'])} kernels: {kernels}"
    )
    images, labels = held_out_split()
    input_name, output_name = module.inputs[0].name, module.outputs[0].name
    _progress(f"classifying {len(labels)} held-out digits in wasmtime, one call of the module's run entry each")
    predictions = []
    for index, image in enumerate(images):
        probabilities = module.run({input_name: np.ascontiguousarray(image[None], dtype=np.float32)})[output_name]
        predictions.append(int(probabilities.argmax()))
        if index < args.show:
            verdict = "ok" if predictions[-1] == labels[index] else "WRONG"
            print(f"  digit {index:3d}: predicted {predictions[-1]}, true {labels[index]}  {verdict}")
    correct = sum(int(p == t) for p, t in zip(predictions, labels))
    print(f"held-out accuracy: {correct / len(labels):.4f} ({correct}/{len(labels)} digits)")
    return 0


# -- compile, run, bench ---------------------------------------------------------------------------------------


def _configure_compile(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="an .onnx file")
    kinds = ", ".join(kind for kind in BACKENDS if kind != "wasm")
    parser.add_argument(
        "--target", default="wasm", help=f'"wasm" (default), {kinds}, or e.g. "llvm -mtriple=aarch64-linux-gnu"'
    )
    parser.add_argument("-o", "--output", type=Path, help="the bundle directory to write (default MODEL.bundle)")
    _add_input_shape(parser)
    _add_dims(parser)
    parser.add_argument(
        "--records", "--tuning-records", type=Path, help="a tuning log (tessel tune) whose best configs to apply"
    )
    _add_threads(parser)
    parser.add_argument(
        "--wasm-variants",
        choices=WASM_VARIANT_CHOICES,
        help="wasm code beside the plain model.wasm, for tessel.js to pick the best an engine and page allow: "
        "all (default for wasm: threads, relaxed-simd and both), threads, relaxed-simd or none",
    )
    _add_weights(parser)
    parser.add_argument("--verbose", action="store_true", help="print the kernels and the memory plan")


# --wasm-variants: each choice names the variants (build.py _wasm_variants) it writes beside the plain code
WASM_VARIANT_CHOICES = ("all", "threads", "relaxed-simd", "none")


def _wasm_variants(args: argparse.Namespace, target: Target) -> tuple[str, ...]:
    """What --wasm-variants asks for: every variant by default on wasm, as the service compiles; none elsewhere."""
    wasm = target.kind == "wasm"
    choice = args.wasm_variants or ("all" if wasm else "none")
    if not wasm and choice != "none":
        raise TesselError(
            f"--wasm-variants {choice} applies to --target wasm, not {args.target}; drop it or compile for wasm"
        )
    return {"all": EVERY_WASM_VARIANT, "none": ()}.get(choice, (choice,))


def _run_compile(args: argparse.Namespace) -> int:
    started = time.perf_counter()

    def progress(step: str, fraction: float) -> None:
        if args.verbose or not step.startswith("lowering "):
            _progress(f"[{fraction * 100:3.0f}%] {step} ({time.perf_counter() - started:.1f} s)")

    if not args.model.is_file():
        raise ModelError(f"cannot read {args.model}: no such file; give the path of an .onnx model")
    target = Target.parse(args.target)
    module = compile_model(
        args.model,
        target=target,
        input_shapes=parse_input_shapes(args.input_shape),
        tuning_records=args.records,
        num_threads=args.threads,
        progress=progress,
        wasm_variants=_wasm_variants(args, target),
        weights=args.weights,
        dims=parse_dims(args.dim or ()),
    )
    output = args.output or args.model.with_suffix(".bundle")
    path = module.export(output)
    manifest = module.manifest
    memory = manifest["memory"]
    if args.verbose:
        rows = [(k["name"], len(k["groups"]), "+".join(k["ops"])) for k in manifest["kernels"]]
        print("\n".join(_table(rows, ("kernel", "groups", "ops"))))
        print(
            f"arena: {memory['arena_bytes']:,} bytes peak for {memory['intermediate_bytes']:,} bytes of "
            f"intermediates ({len(manifest['calls'])} kernel calls, {len(manifest['kernels'])} distinct kernels)"
        )
        print(f"params: {manifest['params']['bytes']:,} bytes in {len(manifest['params']['layout'])} arrays")
    if args.weights != "fp32":
        layout = manifest["params"]["layout"]
        narrow = sum(entry["dtype"] == "float16" for entry in layout)
        total = manifest["params"]["bytes"]
        print(f"weights {args.weights}: {narrow} of {len(layout)} param arrays float16, params {total:,} bytes")
    variants = ", ".join(variant["code"] for variant in manifest.get("variants", []))
    beside = f"; variants {variants}" if variants else ""
    print(f"wrote {path} (target {manifest['target']}{beside}) in {time.perf_counter() - started:.1f} s")
    return 0


def _configure_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", type=Path, help="a bundle directory from tessel compile")
    parser.add_argument(
        "--input",
        action="append",
        metavar="[NAME=]FILE.npy",
        help="an input array (.npy); NAME= picks the input (default: the inputs in order); random when omitted",
    )
    parser.add_argument("--output", type=Path, help="write the first output here (.npy); .npz for all outputs")
    _add_threads(parser)


def _read_inputs(module, specs: list[str] | None) -> dict:
    if not specs:
        return module.random_inputs()
    names = [spec.name for spec in module.inputs]
    feeds = {}
    for position, spec in enumerate(specs):
        name, equals, file = spec.partition("=")
        if not equals:
            if position >= len(names):
                raise ShapeError(f"--input {spec!r}: the model takes {len(names)} inputs ({', '.join(names)})")
            name, file = names[position], spec
        try:
            feeds[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise TesselError(f"cannot read --input {file}: {error}") from None
    return feeds


def _run_run(args: argparse.Namespace) -> int:
    module = load_module(args.bundle, num_threads=args.threads)
    results = module.run(_read_inputs(module, args.input))
    for name, array in results.items():
        flat = array.reshape(-1)
        preview = ", ".join(f"{value:.6g}" for value in flat[:8].tolist()) + (", ..." if flat.size > 8 else "")
        print(f"{name}: {array.dtype}{list(array.shape)} [{preview}]")
    if args.output is not None:
        if args.output.suffix == ".npz":
            np.savez(args.output, **results)
        else:
            np.save(args.output, next(iter(results.values())))
        print(f"wrote {args.output}")
    return 0


def _configure_bench(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", type=Path, help="a bundle directory from tessel compile")
    parser.add_argument("--repeat", type=int, default=30, help="timed runs (default 30)")
    _add_threads(parser)


def _run_bench(args: argparse.Namespace) -> int:
    module = load_module(args.bundle, num_threads=args.threads)
    timing = module.benchmark(repeat=args.repeat)
    print(
        f"{args.bundle} ({module.target}): median {timing['median_ms']:.3f} ms, "
        f"min {timing['min_ms']:.3f} ms, max {timing['max_ms']:.3f} ms over {args.repeat} runs"
    )
    return 0


def _configure_tune(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, nargs="?", help="an .onnx file (not with --report)")
    parser.add_argument(
        "--target",
        default="llvm",
        help='"llvm" (default, this machine), "wasm", "opencl" or "webgpu" (this machine\'s)',
    )
    parser.add_argument("--trials", type=int, default=200, help="measurements for the whole model (default 200)")
    parser.add_argument("-o", "--output", type=Path, help="the tuning log to write or resume (default MODEL.jsonl)")
    parser.add_argument("--tuner", default="xgb", help="xgb (default), ga, random or grid (tune/tuners.py)")
    parser.add_argument("--early-stopping", type=int, help="stop a task after this many trials without progress")
    parser.add_argument("--ray", metavar="auto|ADDRESS", help="build and measure on a Ray cluster (pip tessel[ray])")
    parser.add_argument("--workers", type=int, help="builder processes (default: one per core)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds one candidate may run, its first call (a GPU driver's compile) included; default 10",
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed repeats per candidate, the fastest counts")
    parser.add_argument(
        "--transfer",
        type=Path,
        nargs="+",
        metavar="LOG",
        help="warm-start the xgb tuner with a cost model pretrained on these logs' other tasks",
    )
    parser.add_argument("--report", type=Path, metavar="LOG", help="print each task's default and best in LOG")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="with --report: plot the search curves")
    _add_input_shape(parser)
    _add_threads(parser)


def _run_tune(args: argparse.Namespace) -> int:
    if args.report is not None:
        summaries = report.summarize(args.report)
        print("\n".join(report.report_lines(summaries)))
        if args.plot is not None:
            print(f"wrote {report.plot_curves(summaries, args.plot)}")
        return 0
    if args.model is None:
        raise TesselError("name the .onnx model to tune (or --report LOG to read a finished log)")
    if not args.model.is_file():
        raise ModelError(f"cannot read {args.model}: no such file; give the path of an .onnx model")

    return tune_file(
        args.model,
        args.target,
        args.output or args.model.with_suffix(".jsonl"),
        trials=args.trials,
        tuner=args.tuner,
        input_shapes=parse_input_shapes(args.input_shape),
        early_stopping=args.early_stopping,
        ray=args.ray,
        workers=args.workers,
        timeout=args.timeout,
        repeat=args.repeat,
        threads=args.threads,
        transfer=args.transfer,
    )


# -- quantize --------------------------------------------------------------------------------------------------


def _configure_quantize(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="a float .onnx file (its .data file beside it, if any)")
    parser.add_argument(
        "-o", "--output", type=Path, help="the .onnx file to write (default MODEL.int8/.dynamic/.q4/.fp16.onnx)"
    )
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--dynamic", action="store_true", help="dynamic int8 (DynamicQuantizeLinear + MatMulInteger)")
    modes.add_argument("--int4", action="store_true", help="4-bit MatMul weights (com.microsoft.MatMulNBits)")
    modes.add_argument("--fp16", action="store_true", help="float16 weights and compute (float32 inputs and outputs)")
    static = parser.add_argument_group("static QDQ quantization (the default mode)")
    static.add_argument(
        "--calibrate", type=Path, metavar="INPUTS.npz", help="calibration inputs by input name, first axis the samples"
    )
    static.add_argument(
        "--samples",
        type=int,
        help=f"random calibration samples when --calibrate is not given (default {RANDOM_SAMPLES})",
    )
    static.add_argument("--activation-type", choices=INTEGER_TYPES, help="activations' type (default u8)")
    _add_input_shape(static)
    both = parser.add_argument_group("static and --dynamic")
    both.add_argument("--weight-type", choices=INTEGER_TYPES, help="weights' type (default s8)")
    both.add_argument(
        "--per-channel",
        action=argparse.BooleanOptionalAction,
        help="a scale per output channel (default: per channel for static, per tensor for --dynamic)",
    )
    both.add_argument("--no-preprocess", action="store_true", help="skip onnxruntime's quant_pre_process")
    int4 = parser.add_argument_group("--int4")
    int4.add_argument("--block-size", type=int, choices=BLOCK_SIZES, help="weights per scale along K (default 32)")
    int4.add_argument("--asymmetric", action="store_true", help="zero points per block (default symmetric)")
    int4.add_argument("--accuracy-level", type=int, choices=ACCURACY_LEVELS, help="MatMulNBits' accuracy_level")
    fp16 = parser.add_argument_group("--fp16")
    fp16.add_argument("--fp16-io", action="store_true", help="float16 inputs and outputs too")
    parser.add_argument(
        "--external-data", action="store_true", help="write the weights to OUTPUT.data (automatic past 2 GB)"
    )


# Options that only one mode reads, by their argparse destination: (flag, the modes that take it)
_QUANTIZE_OPTIONS = {
    "calibrate": ("--calibrate", ("static",)),
    "samples": ("--samples", ("static",)),
    "activation_type": ("--activation-type", ("static",)),
    "input_shape": ("--input-shape", ("static",)),
    "weight_type": ("--weight-type", ("static", "dynamic")),
    "per_channel": ("--per-channel", ("static", "dynamic")),
    "no_preprocess": ("--no-preprocess", ("static", "dynamic")),
    "block_size": ("--block-size", ("int4",)),
    "asymmetric": ("--asymmetric", ("int4",)),
    "accuracy_level": ("--accuracy-level", ("int4",)),
    "fp16_io": ("--fp16-io", ("fp16",)),
}
_MODE_FLAGS = {
    "static": "static quantization (no mode flag)",
    "dynamic": "--dynamic",
    "int4": "--int4",
    "fp16": "--fp16",
}


def _run_quantize(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    mode = "dynamic" if args.dynamic else "int4" if args.int4 else "fp16" if args.fp16 else "static"
    for name, (flag, modes) in _QUANTIZE_OPTIONS.items():
        if getattr(args, name) not in (None, False) and mode not in modes:
            takes = " and ".join(_MODE_FLAGS[other] for other in modes)
            raise TesselError(f"{flag} applies to {takes}, not {_MODE_FLAGS[mode]}; drop it or change the mode")
    result = quantize_model(
        args.model,
        args.output,
        mode,
        calibration=args.calibrate,
        input_shapes=parse_input_shapes(args.input_shape),
        samples=args.samples if args.samples is not None else RANDOM_SAMPLES,
        activation_type=args.activation_type or "u8",
        weight_type=args.weight_type or "s8",
        per_channel=args.per_channel,
        block_size=args.block_size or 32,
        symmetric=not args.asymmetric,
        accuracy_level=args.accuracy_level,
        keep_io_types=not args.fp16_io,
        preprocess=not args.no_preprocess,
        external_data=True if args.external_data else None,
        progress=lambda step: _progress(f"{step} ({time.perf_counter() - started:.1f} s)"),
    )
    files = " and ".join(str(path) for path in result.files)
    print(
        f"wrote {files}: {result.bytes:,} bytes, {result.bytes / result.source_bytes:.2f}x the float model's "
        f"{result.source_bytes:,}; {result.summary()} (in {time.perf_counter() - started:.1f} s)"
    )
    return 0


def _configure_serve(parser: argparse.ArgumentParser) -> None:
    # The service is a driver of its own; the CLI only hands it the command line.
    from server.app import add_arguments

    add_arguments(parser)


def _run_serve(args: argparse.Namespace) -> int:
    from server.app import run_from_args

    return run_from_args(args)


COMMANDS: dict[str, Command] = {
    "zoo": Command("write an example model as .onnx", _configure_zoo, _run_zoo),
    "inspect": Command(
        "show a model's graph before and after the passes, its fused groups and counts",
        _configure_inspect,
        _run_inspect,
    ),
    "demo": Command(
        "compile the trained digits model for wasm and classify the held-out digits with it",
        _configure_demo,
        _run_demo,
    ),
    "compile": Command("compile an .onnx model ahead of time into a bundle", _configure_compile, _run_compile),
    "run": Command("run a bundle on .npy inputs (random when none are given)", _configure_run, _run_run),
    "bench": Command("time a bundle's run: median, min and max milliseconds", _configure_bench, _run_bench),
    "tune": Command(
        "search each kernel's schedule space by measuring it, into a log that compile --records applies",
        _configure_tune,
        _run_tune,
    ),
    "quantize": Command(
        "write an int8 (static QDQ or dynamic), 4-bit or float16 copy of a float .onnx model with onnxruntime's tools",
        _configure_quantize,
        _run_quantize,
    ),
    "serve": Command("serve the upload-and-compile page, the compile API and the demos", _configure_serve, _run_serve),
}


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors in the same one-line form as every other error."""

    def error(self, message: str):
        raise TesselError(f"{self.prog}: {message}" if self.prog != "tessel" else message)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, with the arguments of `command` only: a configure function may import its
    stage (serve's imports the server and Starlette), which a command that does not use it must not pay for."""
    parser = _Parser(prog="tessel", description="Tessel, a deep-learning compiler: ONNX in, fast kernels out.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, entry in COMMANDS.items():
        subparser = subparsers.add_parser(name, help=entry.help, description=entry.help)
        if name == command:
            entry.configure(subparser)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning the user can act on (a tuning record that no longer fits its template) as one line, like errors."""
    print(f"tessel: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser(next((word for word in argv if not word.startswith("-")), None)).parse_args(argv)
        if args.command is None:
            raise TesselError(f"name a command: {', '.join(COMMANDS)} (tessel COMMAND --help says more)")
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return COMMANDS[args.command].run(args)
    except TesselError as error:
        print(f"tessel: error: {error}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""
        print(f"tessel: error: {where}{error.strerror or error}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
