"""The `tessel` command: a driver that sees every stage, from the zoo and the ONNX frontend to the passes and
the reference executor. Each subcommand is one entry of COMMANDS; every user error ends as one line
`tessel: error: <message>` on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from compiler.errors import ModelError, ShapeError, TesselError

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
    """`["name=1,3,224,224", ...]` as {name: shape}; ShapeError saying the expected form on anything else."""
    if not specs:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, equals, dims = spec.partition("=")
        name = name.strip()
        try:
            if not equals or not name:
                raise ValueError
            shape = tuple(int(dim) for dim in dims.split(","))
        except ValueError:
            raise ShapeError(
                f"--input-shape {spec!r} is not of the form NAME=D1,D2,...; for example input=1,3,224,224"
            ) from None
        if any(dim <= 0 for dim in shape):
            raise ShapeError(
                f"--input-shape {spec!r} has a dimension below 1; every dimension must be a positive integer"
            )
        if name in shapes:
            raise ShapeError(f"--input-shape gives input {name!r} twice; give each input once")
        shapes[name] = shape
    return shapes


def _load_model_file(path: Path, input_shapes: dict[str, tuple[int, ...]] | None):
    from compiler.frontend.onnx import load_onnx

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
    from compiler.zoo import MODELS

    parser.add_argument("name", nargs="?", help=f"one of {', '.join(MODELS)}")
    parser.add_argument("-o", "--output", type=Path, help="where to write the model (default NAME.onnx)")
    parser.add_argument("--list", action="store_true", help="list the zoo's models and exit")


def _run_zoo(args: argparse.Namespace) -> int:
    from compiler import zoo

    if args.list:
        for name in zoo.MODELS:
            print(f"{name}  input {'x'.join(map(str, zoo.INPUT_SHAPES[name]))}")
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


# -- inspect ---------------------------------------------------------------------------------------------------


def _configure_inspect(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="an .onnx file")
    parser.add_argument(
        "--input-shape",
        action="append",
        metavar="NAME=D1,D2,...",
        help="fix the shape of an input, e.g. input=1,3,224,224 (repeat for several inputs)",
    )


def _run_inspect(args: argparse.Namespace) -> int:
    from compiler.passes.fuse_ops import group_summary
    from compiler.passes.pipeline import optimize

    input_shapes = parse_input_shapes(args.input_shape)
    _progress(f"loading {args.model}")
    graph = _load_model_file(args.model, input_shapes)
    _progress(f"optimizing {len(graph.nodes)} nodes")
    started = time.perf_counter()
    fused = optimize(graph, fuse=True)
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
    return 0


# -- demo ------------------------------------------------------------------------------------------------------


def _configure_demo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--show", type=int, default=10, help="how many held-out digits to print (default 10)")


def _run_demo(args: argparse.Namespace) -> int:
    from compiler import zoo
    from compiler.data.train_digits import held_out_split
    from compiler.frontend.onnx import load_onnx
    from compiler.graph.reference import run_reference
    from compiler.passes.fuse_ops import group_summary
    from compiler.passes.pipeline import optimize

    _progress(f"building the digits model from {zoo.DIGITS_PATH}")
    graph = load_onnx(zoo.build_model("digits"))
    _progress(f"loaded through the ONNX frontend: {len(graph.nodes)} nodes")
    fused = optimize(graph, fuse=True)
    groups = group_summary(fused)
    _progress(f"optimized into {len(groups)} fused groups: " + ", ".join("+".join(ops) for _, _, ops in groups))
    images, labels = held_out_split()
    input_name = fused.inputs[0].name
    output_name = fused.outputs[0].name
    _progress(f"running {len(labels)} held-out digits on the reference executor")
    predictions = []
    for index, image in enumerate(images):
        probabilities = run_reference(fused, {input_name: image[None]})[output_name]
        predictions.append(int(probabilities.argmax()))
        if index < args.show:
            verdict = "ok" if predictions[-1] == labels[index] else "WRONG"
            print(f"  digit {index:3d}: predicted {predictions[-1]}, true {labels[index]}  {verdict}")
    correct = sum(int(p == t) for p, t in zip(predictions, labels))
    print(f"held-out accuracy: {correct / len(labels):.4f} ({correct}/{len(labels)} digits)")
    return 0


COMMANDS: dict[str, Command] = {
    "zoo": Command("write an example model as .onnx", _configure_zoo, _run_zoo),
    "inspect": Command(
        "show a model's graph before and after the passes, its fused groups and counts",
        _configure_inspect,
        _run_inspect,
    ),
    "demo": Command("run the trained digits model through the compiler's reference path", _configure_demo, _run_demo),
}


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors in the same one-line form as every other error."""

    def error(self, message: str):
        raise TesselError(f"{self.prog}: {message}" if self.prog != "tessel" else message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tessel", description="Tessel, a deep-learning compiler: ONNX in, fast kernels out.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, command in COMMANDS.items():
        command.configure(subparsers.add_parser(name, help=command.help, description=command.help))
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command is None:
            raise TesselError(f"name a command: {', '.join(COMMANDS)} (tessel COMMAND --help says more)")
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
