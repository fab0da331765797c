"""ONNX's own node tests run through any `runner(graph, inputs) -> {output name: array}` (the reference
executor, or a compiled module in the codegen tests), tallied per op type. The onnx wheel ships the case
generators but not data/node, so the cases come from `collect_testcases()`, in memory."""

from __future__ import annotations

import functools
import multiprocessing
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper, version_converter

from compiler.errors import UnsupportedOpError
from compiler.frontend.onnx import OPSET_RANGE, TENSOR_DTYPES, load_onnx, supported_op
from compiler.graph.ir import Graph
from compiler.graph.registry import get_op, is_registered

Runner = Callable[[Graph, dict[str, np.ndarray]], Mapping[str, np.ndarray]]

# Cases whose expected data in ONNX itself is wrong: name -> why. Everything else must pass or be skipped
# for a stated reason.
KNOWN_BAD: dict[str, str] = {
    "test_averagepool_2d_ceil_last_window_starts_on_pad": (
        "expected output hard-coded to 4 decimals (0.1511 for 0.15105554, which onnxruntime also computes)"
    ),
}

# Case-name prefixes that abbreviate the op they test.
_CASE_ABBREVIATIONS = {
    "sce": "SoftmaxCrossEntropyLoss",
    "nllloss": "NegativeLogLikelihoodLoss",
    "mvn": "MeanVarianceNormalization",
    "flexattention": "FlexAttention",
}


@dataclass(frozen=True)
class CaseResult:
    name: str
    op: str
    status: str  # "passed", "failed" or "skipped"
    reason: str = ""
    converted_from: int | None = None  # the case's own opset, when onnx.version_converter moved it into range


@dataclass(frozen=True)
class NodeTestReport:
    results: tuple[CaseResult, ...]

    @staticmethod
    def _row(results: list[CaseResult], reasons: bool = True) -> str:
        passed, failed, skipped = (sum(r.status == s for r in results) for s in ("passed", "failed", "skipped"))
        converted = sum(r.converted_from is not None and r.status != "skipped" for r in results)
        row = f"{passed + failed:>4} {passed:>4} {failed:>4} {skipped:>4} {converted:>4}"
        if reasons:
            why = Counter(r.reason for r in results if r.status == "skipped")
            row += "  " + "; ".join(f"{reason} x{n}" for reason, n in why.most_common())
        return row.rstrip()

    def count(self, status: str) -> int:
        return sum(1 for result in self.results if result.status == status)

    def failures(self) -> list[CaseResult]:
        return [result for result in self.results if result.status == "failed"]

    def table(self) -> str:
        """One row per op type: cases run, passed, failed, skipped, and why they were skipped."""
        rows: dict[str, list[CaseResult]] = defaultdict(list)
        for result in self.results:
            rows[result.op].append(result)
        width = max(len(op) for op in rows) if rows else 2
        lines = [f"{'op':<{width}}  {'run':>4} {'pass':>4} {'fail':>4} {'skip':>4} {'conv':>4}  skipped because"]
        for op, results in sorted(rows.items()):
            lines.append(f"{op:<{width}}  {self._row(results)}")
        lines.append(f"{'TOTAL':<{width}}  {self._row(list(self.results), reasons=False)}")
        lines.append(
            f"conv: cases run after onnx.version_converter moved them from their own opset into "
            f"{OPSET_RANGE[0]}-{OPSET_RANGE[1]}; the expected outputs are still those of their own opset"
        )
        return "\n".join(lines)


def run_node_tests(runner: Runner, names: Collection[str] | None = None) -> NodeTestReport:
    """Run every generated ONNX node test case (or those named) through `runner`; a case that raises is
    reported as failed, never raised."""
    cases = [case for case in _node_cases() if names is None or case.name in names]
    return NodeTestReport(tuple(_run_case(case, runner) for case in cases))


def _compile_and_run(target: str, graph, feeds):
    from compiler.build import compile_model

    return compile_model(graph, target=target).run(feeds)


def _run_compiled_share(target: str, names: list[str]) -> NodeTestReport:
    return run_node_tests(functools.partial(_compile_and_run, target), set(names))


def run_compiled_node_tests(target: str, workers: int = 2, expanded: bool = True) -> tuple[NodeTestReport, float]:
    """Every case compiled for `target` (compile_model) and run, and the seconds it took; without the `_expanded`
    cases (an op written as its ONNX function body of other ops) unless `expanded`. Each case is compiled on its
    own, so the cases are split between `workers` spawned processes: the machines this runs on have two cores."""
    started = time.perf_counter()
    names = [case.name for case in _node_cases() if expanded or "_expanded" not in case.name]
    shares = [names[worker::workers] for worker in range(workers)]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        reports = list(pool.map(_run_compiled_share, [target] * workers, shares))
    return NodeTestReport(tuple(result for part in reports for result in part.results)), time.perf_counter() - started


@functools.cache
def _node_cases() -> tuple:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(collect_testcases())


@functools.cache
def _schema_names() -> tuple[str, ...]:
    return tuple(sorted({schema.name for schema in onnx.defs.get_all_schemas() if schema.domain == ""}))


def _case_op(name: str, model: onnx.ModelProto) -> str:
    """The op a case tests: its only op type, or the op its name starts with (for expanded functions)."""
    op_types = {node.op_type for node in model.graph.node}
    expanded = "_expanded" in name
    if len(op_types) == 1 and not expanded:
        return op_types.pop()
    words = name.removeprefix("test_")
    key = words.replace("_", "").lower()
    matches = [op for op in _schema_names() if key.startswith(op.lower())]
    first_word = words.split("_")[0]
    op = max(matches, key=len) if matches else _CASE_ABBREVIATIONS.get(first_word, first_word)
    return f"{op} (expanded)" if expanded else op


def _skip_reason(model: onnx.ModelProto) -> str | None:
    domains = sorted({node.domain for node in model.graph.node} - {"", "ai.onnx"})
    if domains:
        return f"domain {domains[0]}"
    for info in [*model.graph.input, *model.graph.output]:
        kind = info.type.WhichOneof("value")
        if kind != "tensor_type":
            return f"{(kind or 'untyped').removesuffix('_type')} values"
        elem_type = info.type.tensor_type.elem_type
        if elem_type not in TENSOR_DTYPES:
            return f"dtype {TensorProto.DataType.Name(elem_type).lower()}"
    # load_onnx reports these too; asking first saves converting the opset of a case that cannot run
    missing = sorted({n.op_type for n in model.graph.node if not supported_op(n.op_type, n.domain)})
    if missing:
        return f"unsupported op {', '.join(missing)}"
    return None


def _within_opsets(model: onnx.ModelProto) -> tuple[onnx.ModelProto | None, int]:
    """The model at an opset Tessel reads (converted by onnx itself when needed), and its own opset; None
    when onnx's converter has no form of it there (an op that did not exist yet, a type it lacked)."""
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    low, high = OPSET_RANGE
    if low <= opset <= high:
        return model, opset
    try:
        return version_converter.convert_version(model, min(max(opset, low), high)), opset
    except Exception:  # the converter reports a missing adapter by several exception types
        return None, opset


def _const_fed_inputs(model: onnx.ModelProto) -> set[str]:
    """Graph inputs that decide a const input of some node, directly or through other nodes (not
    through Shape/Size, whose results are constant whatever their input holds)."""
    producers = {name: node for node in model.graph.node for name in node.output}
    graph_inputs = {info.name for info in model.graph.input}
    found: set[str] = set()
    pending = [
        node.input[index]
        for node in model.graph.node
        if is_registered(node.op_type)
        for index, _ in get_op(node.op_type).const_inputs
        if index < len(node.input) and node.input[index]
    ]
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in graph_inputs:
            found.add(name)
        elif name in producers and producers[name].op_type not in ("Shape", "Size"):
            pending.extend(i for i in producers[name].input if i)
    return found


def _array(data) -> np.ndarray:
    return numpy_helper.to_array(data) if isinstance(data, TensorProto) else np.asarray(data)


def _compare(name: str, actual: np.ndarray, expected: np.ndarray) -> str | None:
    actual = np.asarray(actual)
    if actual.dtype != expected.dtype:
        return f"output {name!r} has dtype {actual.dtype}, expected {expected.dtype}"
    if actual.shape != expected.shape:
        return f"output {name!r} has shape {list(actual.shape)}, expected {list(expected.shape)}"
    try:
        if np.issubdtype(expected.dtype, np.floating):
            # two float16 ulps: chains of float16 ops round at every step (onnxruntime differs as much)
            rtol = 2e-3 if expected.dtype == np.float16 else 1e-4
            np.testing.assert_allclose(actual, expected, rtol=rtol, atol=1e-5, equal_nan=True)
        else:
            np.testing.assert_array_equal(actual, expected)
    except AssertionError as error:
        details = [line.strip() for line in str(error).splitlines() if line.strip().startswith(("Mismatch", "Max"))]
        return f"output {name!r} differs: {'; '.join(details)}"
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}"


def _unsupported_reason(error: UnsupportedOpError) -> str:
    missing = sorted(op for op in error.ops if not supported_op(op))
    if missing:
        return f"unsupported op {', '.join(missing)}"
    return f"unsupported: {str(error)[:100]}"


def _run_case(case, runner: Runner) -> CaseResult:
    model = case.model
    op = _case_op(case.name, model)
    if case.name in KNOWN_BAD:
        return CaseResult(case.name, op, "skipped", f"known-bad ONNX data: {KNOWN_BAD[case.name]}")
    reason = _skip_reason(model)
    if reason is not None:
        return CaseResult(case.name, op, "skipped", reason)
    model, opset = _within_opsets(model)
    if model is None:
        return CaseResult(case.name, op, "skipped", f"opset {opset}, not convertible")
    result = functools.partial(CaseResult, case.name, op, converted_from=None if model is case.model else opset)
    (inputs, outputs), *_ = case.data_sets
    arrays = {info.name: _array(data) for info, data in zip(model.graph.input, inputs)}
    bound = _const_fed_inputs(model)
    if bound:
        model = onnx.ModelProto.FromString(model.SerializeToString())
        model.graph.initializer.extend(numpy_helper.from_array(arrays[name], name) for name in sorted(bound))
    feeds = {name: array for name, array in arrays.items() if name not in bound}
    try:
        graph = load_onnx(model)
        results = runner(graph, feeds)
    except UnsupportedOpError as error:
        return result("skipped", _unsupported_reason(error))
    except Exception as error:  # a case that crashes is a failure to report, not a reason to stop the loop
        return result("failed", _first_line(error))
    for info, expected in zip(model.graph.output, outputs):
        if info.name not in results:
            return result("failed", f"no output {info.name!r}")
        problem = _compare(info.name, results[info.name], _array(expected))
        if problem:
            return result("failed", problem)
    return result("passed")
