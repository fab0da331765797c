"""Model fuzzing (issue 14): damaged protobufs of the zoo's models and of small ones, each of which must end in a
result that matches onnxruntime or in one TesselError. `run_cases` runs seeded cases in this process and sorts
each outcome; `python -m tests.fuzz` and tests/fuzz/test_fuzz_models.py run it in a child process, so that a
signal or a hang is caught and pinned on the case that was running."""

from __future__ import annotations

import random
import signal
import sys
import traceback
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from compiler.build import compile_model
from compiler.errors import TesselError
from compiler.frontend import load_onnx
from compiler.graph.reference import run_reference
from compiler.passes.pipeline import optimize
from compiler.target import Target

# Outcomes that are not defects: one clear error, or a result onnxruntime agrees with. A model Tessel accepts and
# onnxruntime refuses is a defect: Tessel's result would be a guess about an invalid model.
GOOD = ("error", "match")
# A case that runs the reference executor takes well under a second; one that compiles resnet18 can take a minute
# on a loaded machine. Past these it counts as a hang.
CASE_SECONDS = 20
COMPILED_CASE_SECONDS = 240
onnxruntime.set_default_logger_severity(4)  # refusals are expected here, and judged; their log lines are noise
# The oracle is the model as written: onnxruntime's own fusions do not check what a damaged model breaks (its
# LayerNormFusion refuses a Mul that ONNX broadcasting allows).
_ONNXRUNTIME_OPTIONS = onnxruntime.SessionOptions()
_ONNXRUNTIME_OPTIONS.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL


def _model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "fuzz", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _info(name, shape, elem_type=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem_type, shape)


def _param(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def small_models() -> dict[str, onnx.ModelProto]:
    """A model per family of checks: attributes and const inputs, dtypes, indices, sparse data, functions."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((4, 3)).astype(np.float32)
    models = {
        "gemm": _model(
            [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, alpha=0.5)],
            [_info("x", [2, 3])],
            [_info("y", [2, 4])],
            [_param("w", weight), _param("b", np.ones(4, np.float32))],
        ),
        "conv_relu": _model(
            [
                helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1], kernel_shape=[3, 3]),
                helper.make_node("Relu", ["c"], ["y"]),
            ],
            [_info("x", [1, 2, 5, 5])],
            [_info("y", [1, 3, 5, 5])],
            [_param("w", rng.standard_normal((3, 2, 3, 3)).astype(np.float32))],
        ),
        "reshape_softmax": _model(
            [
                helper.make_node("Reshape", ["x", "shape"], ["r"], allowzero=0),
                helper.make_node("Softmax", ["r"], ["y"], axis=-1),
            ],
            [_info("x", [2, 6])],
            [_info("y", [3, 4])],
            [_param("shape", np.array([3, 4], np.int64))],
        ),
        "gather_concat": _model(
            [
                helper.make_node("Gather", ["table", "i"], ["g"], axis=0),
                helper.make_node("Concat", ["g", "x"], ["y"], axis=1),
            ],
            [_info("i", [2], TensorProto.INT64), _info("x", [2, 2])],
            [_info("y", [2, 5])],
            [_param("table", weight)],
        ),
        "slice_pad_expand": _model(
            [
                helper.make_node("Slice", ["x", "starts", "ends"], ["s"]),
                helper.make_node("Pad", ["s", "pads"], ["p"], mode="constant"),
                helper.make_node("Expand", ["p", "shape"], ["y"]),
            ],
            [_info("x", [4, 4])],
            [_info("y", [2, 4, 4])],
            [
                _param("starts", np.array([1, 0], np.int64)),
                _param("ends", np.array([3, 4], np.int64)),
                _param("pads", np.array([1, 0, 1, 0], np.int64)),
                _param("shape", np.array([2, 4, 4], np.int64)),
            ],
        ),
        "cast_where": _model(
            [
                helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT32),
                helper.make_node("Greater", ["x", "zero"], ["m"]),
                helper.make_node("Where", ["m", "x", "zero"], ["y"]),
            ],
            [_info("x", [3, 2])],
            [_info("y", [3, 2]), _info("i", [3, 2], TensorProto.INT32)],
            [_param("zero", np.zeros(1, np.float32))],
        ),
    }
    sparse = helper.make_sparse_tensor(
        _param("w", np.array([1.5, -2.0, 3.0], np.float32)), _param("", np.array([0, 5, 11], np.int64)), [3, 4]
    )
    sparse_model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_info("x", [2, 3])], [_info("y", [2, 4])])
    sparse_model.graph.sparse_initializer.append(sparse)
    models["sparse_matmul"] = sparse_model
    swish = helper.make_function(
        "local",
        "Swish",
        ["a"],
        ["b"],
        [helper.make_node("Sigmoid", ["a"], ["s"]), helper.make_node("Mul", ["a", "s"], ["b"])],
        [helper.make_opsetid("", 17)],
    )
    function_model = _model(
        [helper.make_node("Swish", ["x"], ["y"], domain="local")], [_info("x", [2, 3])], [_info("y", [2, 3])]
    )
    function_model.functions.append(swish)
    function_model.opset_import.append(helper.make_opsetid("local", 1))
    models["function"] = function_model
    return models


def base_models(zoo_names: tuple[str, ...]) -> dict[str, bytes]:
    from compiler import zoo

    models = {name: model.SerializeToString() for name, model in small_models().items()}
    models.update({name: zoo.build_model(name).SerializeToString() for name in zoo_names})
    return models


# -- mutations --------------------------------------------------------------------------------------------------

_DIMS = (-2, -1, 0, 1, 3, 7, 1 << 31, 1 << 40, (1 << 63) - 1)
_INTS = (-(1 << 40), -3, -1, 0, 1, 2, 5, 1 << 33)


def _flip_bits(data: bytes, rng: random.Random) -> bytes:
    buffer = bytearray(data)
    for _ in range(rng.choice((1, 2, 8))):
        position = rng.randrange(len(buffer))
        buffer[position] ^= 1 << rng.randrange(8)
    return bytes(buffer)


def _truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data))]


def _edit(data: bytes, rng: random.Random) -> bytes:
    model = onnx.ModelProto()
    model.ParseFromString(data)
    graph = model.graph
    kind = rng.choice(("dims", "dtype", "attribute", "raw_data", "values", "name", "inputs", "op_type", "utf8"))
    tensors = list(graph.initializer) + [s.values for s in graph.sparse_initializer]
    infos = list(graph.input) + list(graph.output)
    node = rng.choice(graph.node) if graph.node else None
    if kind == "dims":
        if tensors and rng.random() < 0.5:
            # a sparse tensor's own dims too: a few bytes that may declare a dense tensor of any size
            dims = rng.choice([t.dims for t in tensors] + [s.dims for s in graph.sparse_initializer])
            if dims:
                dims[rng.randrange(len(dims))] = rng.choice(_DIMS)
        else:
            dims = rng.choice(infos).type.tensor_type.shape.dim
            if dims:
                dims[rng.randrange(len(dims))].dim_value = rng.choice(_DIMS)
    elif kind == "dtype":
        elem_type = rng.choice(list(TensorProto.DataType.values()))
        if tensors and rng.random() < 0.5:
            rng.choice(tensors).data_type = elem_type
        else:
            rng.choice(infos).type.tensor_type.elem_type = elem_type
    elif kind == "attribute" and node is not None:
        _edit_attribute(node, rng)
    elif kind == "raw_data" and tensors:
        tensor = rng.choice(tensors)
        if tensor.HasField("raw_data"):
            tensor.raw_data = tensor.raw_data[: -rng.randrange(1, 9)] if rng.random() < 0.5 else tensor.raw_data + b"\1"
    elif kind == "values":
        # an integer constant (a shape, pads, axes, indices, sparse indices) set to a hostile value
        integers = [
            t for t in [*tensors, *(s.indices for s in graph.sparse_initializer)] if t.data_type == TensorProto.INT64
        ]
        if integers:
            tensor = rng.choice(integers)
            array = numpy_helper.to_array(tensor).copy()
            if array.size:
                array.reshape(-1)[rng.randrange(array.size)] = rng.choice(_INTS + _DIMS)
                tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
    elif kind == "name" and node is not None:
        names = [v for n in graph.node for v in [*n.input, *n.output]] + ["", "nowhere"]
        target = node.input if node.input and rng.random() < 0.5 else node.output
        if target:
            target[rng.randrange(len(target))] = rng.choice(names)
    elif kind == "inputs" and node is not None:
        if node.input and rng.random() < 0.5:
            del node.input[rng.randrange(len(node.input))]
        else:
            node.input.append(rng.choice([*node.input, ""]) if node.input else "")
    elif kind == "op_type" and node is not None:
        node.op_type = rng.choice(("Relu", "Add", "MatMul", "Reshape", "Conv", "Softmax", "Gather", "LayoutTransform"))
    elif kind == "utf8" and node is not None:
        # invalid UTF-8 in a string field of the serialized form: protobuf parses it, Tessel must refuse it
        node.name = "\u00e9\u00e9fuzz"
        return model.SerializeToString().replace("\u00e9\u00e9fuzz".encode(), b"\xff\xfefuzz")
    return model.SerializeToString()


def _edit_attribute(node: onnx.NodeProto, rng: random.Random) -> None:
    choice = rng.random()
    if not node.attribute or choice < 0.25:
        name = rng.choice(("transA", "axis", "pads", "allowzero", "mode", "fuzz"))
        node.attribute.append(helper.make_attribute(name, rng.choice((1, -1, [1, 2], "edge", 0.5))))
        return
    attribute = rng.choice(node.attribute)
    if choice < 0.4:
        node.attribute.remove(attribute)
    elif choice < 0.6:
        replacement = rng.choice(
            (
                helper.make_attribute(attribute.name, helper.make_tensor("t", TensorProto.INT64, [2], [1, 1])),
                helper.make_attribute(attribute.name, 1.5),
                helper.make_attribute(attribute.name, [rng.choice(_INTS) for _ in range(rng.randrange(5))]),
                helper.make_attribute(attribute.name, b"\xff"),
            )
        )
        attribute.CopyFrom(replacement)
    elif attribute.type == AttributeProto.INT:
        attribute.i = rng.choice(_INTS)
    elif attribute.type == AttributeProto.INTS and attribute.ints:
        attribute.ints[rng.randrange(len(attribute.ints))] = rng.choice(_INTS)
    elif attribute.type == AttributeProto.FLOAT:
        attribute.f = rng.choice((float("nan"), float("inf"), -1.0, 0.0))
    else:
        attribute.type = rng.choice((AttributeProto.INT, AttributeProto.INTS, AttributeProto.STRING))


MUTATIONS = (_flip_bits, _truncate, _edit, _edit, _edit)


# -- judging one case -------------------------------------------------------------------------------------------


def _feeds(graph, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for value in graph.inputs:
        shape, dtype = value.type.shape, value.type.dtype
        if dtype == "bool":
            feeds[value.name] = rng.random(shape) < 0.5
        elif dtype in ("int8", "uint8"):
            # quantized data, over its whole range (no index input of ONNX's is 8-bit but OneHot's, which may
            # be out of range)
            info = np.iinfo(dtype)
            feeds[value.name] = rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)
        elif dtype.startswith(("int", "uint")):
            # small non-negative integers, so that an index input stays inside any plausible dim
            feeds[value.name] = rng.integers(0, 2, shape).astype(dtype)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _agree(got: np.ndarray, expected: np.ndarray, wild_weights: bool) -> bool:
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return False
    if got.dtype.kind != "f":
        return bool(np.array_equal(got, expected))
    compared = np.isfinite(got) & np.isfinite(expected)
    if wild_weights:
        # A weight that is nan, inf or past 1e30 leaves it to the implementation where a nan goes (onnxruntime
        # skips a conv's padded taps, so nan * 0 never happens, and its Relu maps nan to 0) and which sums
        # overflow (Tessel folds a scale into the weights before the conv, onnxruntime multiplies after it):
        # only the values that stay clear of that are compared.
        compared &= (np.abs(np.where(compared, got, 0)) < 1e30) & (np.abs(np.where(compared, expected, 0)) < 1e30)
    elif not np.array_equal(got[~compared], expected[~compared], equal_nan=True):
        return False  # elsewhere inf and nan must be exactly where onnxruntime has them
    scale = float(np.abs(expected[compared]).max(initial=0.0))
    # Damaged models are often ill-conditioned (a Div by a matmul that cancels to near zero turns float32 rounding
    # into 1e-4 relative), so the bound is ten times the zoo's: a wrong op, element or index misses it by far more,
    # and the zoo and node tests hold the last digits on well-conditioned models.
    return bool(np.allclose(got[compared], expected[compared], rtol=1e-3, atol=1e-4 * (1.0 + scale)))


def judge(data: bytes, compiled: bool, seed: int) -> str:
    """One of GOOD, or a short description of the defect."""
    try:
        graph = load_onnx(data)
        fused = optimize(graph, target=Target.parse("llvm"))
        if sum(v.type.nbytes for v in fused.values()) > 1 << 28:
            return "error"  # too big to run here; the import and passes are what this case checks
    except TesselError:
        return "error"
    rng = np.random.default_rng(seed)
    feeds = _feeds(graph, rng)
    try:
        session = onnxruntime.InferenceSession(data, _ONNXRUNTIME_OPTIONS, providers=["CPUExecutionProvider"])
        expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    except Exception:  # noqa: BLE001 (any refusal of onnxruntime's)
        return "onnxruntime refuses a model Tessel accepts"
    try:
        results = run_reference(graph, feeds)
        if compiled:
            results = compile_model(data, target="llvm").run(feeds)
    except TesselError:
        return "error"
    wild_weights = any(a.dtype.kind == "f" and a.size and not np.abs(a).max() < 1e30 for a in graph.params.values())
    for name, array in expected.items():
        if name not in results or not _agree(np.asarray(results[name]), array, wild_weights):
            return f"wrong result ({'compiled' if compiled else 'reference'})"
    return "match"


class _CaseTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise _CaseTimeout


@dataclass
class Report:
    outcomes: Counter = field(default_factory=Counter)
    defects: list[str] = field(default_factory=list)


def run_cases(
    cases: int, seed: int, models: dict[str, bytes], compile_every: int, mutations=MUTATIONS, log=sys.stderr
) -> Report:
    """`cases` seeded mutations (one of `mutations` each) over the serialized base models; a case is compiled (not
    only run by the reference executor) every `compile_every` cases."""
    names = sorted(models)
    report = Report()
    signal.signal(signal.SIGALRM, _alarm)
    for number in range(cases):
        case_seed = seed * 1_000_003 + number
        rng = random.Random(case_seed)
        name = rng.choice(names)
        mutation = rng.choice(mutations)
        label = f"case {number} (seed {case_seed}, {name}, {mutation.__name__})"
        print(label, file=log, flush=True)  # the last line a crashed child printed names the crash
        try:
            data = mutation(models[name], rng)
        except Exception:  # noqa: BLE001 (an edit that does not apply to this model: the case is void)
            report.outcomes["void"] += 1
            continue
        compiled = number % compile_every == 0
        seconds = COMPILED_CASE_SECONDS if compiled else CASE_SECONDS
        signal.alarm(seconds)
        try:
            outcome = judge(data, compiled=compiled, seed=case_seed)
        except _CaseTimeout:
            outcome = f"hang (over {seconds} s)"
        except Exception as error:  # noqa: BLE001 (the defect this test looks for)
            frame = traceback.extract_tb(error.__traceback__)[-1]
            outcome = f"{type(error).__name__} at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
        finally:
            signal.alarm(0)
        report.outcomes[outcome] += 1
        if outcome not in GOOD:
            report.defects.append(f"{label}: {outcome}")
    return report
