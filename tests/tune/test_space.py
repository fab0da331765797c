"""Schedule spaces (compiler/schedules/space.py): what define_split / define_knob / define_reorder enumerate, index <->
config round trips, filters, records that do not fit, and configs applied to real schedules checked against numpy."""

import json
import math
import warnings

import numpy as np
import pytest

import compiler.te as te
from compiler.build import build
from compiler.compute import group_to_te
from compiler.errors import TuningError
from compiler.graph.ir import Graph, TensorType
from compiler.passes.pipeline import optimize
from compiler.schedules.cpu import divisor_at_most, lanes, schedule_group, vector_registers
from compiler.schedules.space import ConfigSpace, TuningWarning, run_template
from compiler.target import Target

RNG = np.random.default_rng(0)


def small_space_template(cfg: ConfigSpace) -> None:
    cfg.define_split("tile_x", 12, num_outputs=3, default=(2, 3))
    cfg.define_knob("unroll", [0, 1], default=1)
    cfg.define_reorder("order", 3)


def small_space(values=None) -> ConfigSpace:
    cfg = ConfigSpace(values)
    small_space_template(cfg)
    return cfg


def test_space_size_and_index_round_trips():
    cfg = small_space()
    # (a, b, c) with a * b * c = 12: 18 ordered factorizations; 2 options; 3! orders
    assert len(cfg.knobs["tile_x"].choices) == 18
    assert cfg.size == len(cfg) == 18 * 2 * 6
    seen = set()
    for index in range(cfg.size):
        config = cfg.get(index)
        assert config.index == index
        record = json.loads(json.dumps(config.to_json()))
        assert cfg.config(record) == config and cfg.config(record).index == index
        # a fresh cfg given the record builds that config
        assert small_space(record).current == config
        seen.add(json.dumps(record, sort_keys=True))
    assert len(seen) == cfg.size
    with pytest.raises(TuningError, match="outside the space"):
        cfg.get(cfg.size)


def test_fallback_is_the_default_and_applies_without_values():
    cfg = small_space()
    assert cfg.current == cfg.fallback
    assert cfg["tile_x"].size == (2, 2, 3) and cfg["unroll"].val == 1 and cfg["order"].perm == (0, 1, 2)
    # values left out of a record stay at their defaults
    assert cfg.config({"unroll": 0}).to_json() == {"tile_x": [2, 2, 3], "unroll": 0, "order": [0, 1, 2]}


def test_split_policies():
    factors = ConfigSpace()
    factors.define_split("x", 12)
    assert factors.knobs["x"].choices == ((12, 1), (6, 2), (4, 3), (3, 4), (2, 6), (1, 12))
    power2 = ConfigSpace()
    power2.define_split("x", 10, policy="power2")
    # inner sizes are powers of two up to the extent; the outer loop covers the rest (with a tail)
    assert power2.knobs["x"].choices == ((10, 1), (5, 2), (3, 4), (2, 8))
    deep = ConfigSpace()
    deep.define_split("x", 8, num_outputs=4, policy="power2")
    # three powers of two whose product is at most 8: 2^a 2^b 2^c with a + b + c <= 3
    assert len(deep.knobs["x"].choices) == 20
    assert all(choice[0] * math.prod(choice[1:]) == 8 for choice in deep.knobs["x"].choices)
    candidates = ConfigSpace()
    candidates.define_split("x", 12, policy=[2, [-1, 5], [3, 4]])
    # candidates may give the inner size, or every size with -1 (or the true extent) outermost
    assert candidates.knobs["x"].choices == ((6, 2), (3, 5), (3, 4))
    three = ConfigSpace()
    three.define_split("x", 24, num_outputs=3, policy=[(2, 3), (4, 2)])
    assert three.knobs["x"].choices == ((4, 2, 3), (3, 4, 2))
    with pytest.raises(ValueError, match="policy"):
        ConfigSpace().define_split("x", 12, policy="primes")
    with pytest.raises(ValueError, match="num_outputs"):
        ConfigSpace().define_split("x", 12, num_outputs=5)


@pytest.mark.parametrize("extent", [1, 7, 12, 13, 24, 56, 112, 196])
@pytest.mark.parametrize("limit", [1, 2, 4, 8, 14, 16, 32])
def test_a_factor_default_is_the_largest_divisor_at_most_it(extent, limit):
    """The fallback of `define_split(default=n)` is the tile the templates took before: divisor_at_most."""
    cfg = ConfigSpace()
    cfg.define_split("x", extent, default=limit)
    assert cfg["x"].size == (extent // divisor_at_most(extent, limit), divisor_at_most(extent, limit))


def test_split_values_a_record_may_give():
    cfg = ConfigSpace()
    cfg.define_split("x", 12)
    space = cfg.knobs["x"]
    assert space.decode(4) == space.decode([4]) == space.decode([3, 4]) == space.decode([-1, 4])
    assert space.decode(5) is None and space.decode([2, 4]) is None and space.decode(True) is None
    assert space.decode("4") is None and space.decode([1, 2, 3]) is None


def test_unknown_knobs_and_values_outside_the_space_raise():
    cfg = small_space()
    with pytest.raises(TuningError, match="no knob 'tile_y'; its knobs are tile_x, unroll, order"):
        cfg["tile_y"]
    with pytest.raises(TuningError, match="no knob 'tile_y'"):
        cfg.config({"tile_y": 2})
    with pytest.raises(TuningError, match="outside the space"):
        cfg.config({"unroll": 2})
    with pytest.raises(TuningError, match="outside the space"):
        cfg.config({"order": [0, 0, 1]})
    with pytest.raises(ValueError, match="declared twice"):
        cfg.define_knob("unroll", [0, 1, 2])
    cfg.define_knob("unroll", [0, 1], default=1)  # the same declaration again is a no-op
    with pytest.raises(ValueError, match="default"):
        ConfigSpace().define_knob("k", [0, 1], default=2)


def test_a_record_that_does_not_fit_warns_and_builds_the_fallback():
    for values, problem in (({"tile_y": 2}, "no knob 'tile_y'"), ({"unroll": 3}, "unroll=3 is outside")):
        with pytest.warns(TuningWarning, match=problem):
            _, cfg = run_template(small_space_template, values)
        assert cfg.current == cfg.fallback and cfg.values == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, cfg = run_template(small_space_template, {"unroll": 0})
    assert cfg["unroll"].val == 0


def test_filters_reject_configs():
    cfg = ConfigSpace()
    cfg.define_split("rows", 16)
    cfg.define_split("columns", 16)
    cfg.add_filter(lambda config: config["rows"].size[-1] * config["columns"].size[-1] <= 16)
    valid = list(cfg.valid_configs())
    assert len(valid) == sum(1 for a in range(5) for b in range(5) if 2 ** (a + b) <= 16) == 15
    assert all(config.valid for config in valid) and not cfg.config({"rows": 8, "columns": 4}).valid


def test_reorder_candidates_and_apply():
    cfg = ConfigSpace()
    cfg.define_reorder("order", 3, policy=[(2, 1, 0), (0, 1, 2)], default=(2, 1, 0))
    assert cfg.size == 2 and cfg["order"].permute("abc") == ["c", "b", "a"]
    with pytest.raises(ValueError, match="permutation"):
        ConfigSpace().define_reorder("order", 2, policy=[(0, 0)])


def matmul_template(cfg: ConfigSpace, n: int = 24):
    a = te.placeholder((n, n), "float32", name="a")
    b = te.placeholder((n, n), "float32", name="b")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    s = te.create_schedule(c.op)
    i, j = s[c].op.axis
    cfg.define_split("tile_i", i, num_outputs=3, policy="power2")
    cfg.define_split("tile_j", j, policy=[4, 8, 6])
    cfg.define_reorder("order", 3, policy=[(0, 1, 2), (1, 0, 2), (0, 2, 1)])
    cfg.define_knob("vectorize", [0, 1])
    i_outer, i_middle, i_inner = cfg["tile_i"].apply(s, c, i)
    j_outer, j_inner = cfg["tile_j"].apply(s, c, j)
    cfg["order"].apply(s, c, [i_outer, j_outer, i_middle])
    s[c].reorder(k, i_inner, j_inner)
    if cfg["vectorize"].val:
        s[c].vectorize(j_inner)
    return s, [a, b, c]


@pytest.mark.parametrize("index", [0, 17, 100, 171])
def test_configs_applied_to_a_schedule_compute_the_matmul(index):
    """Splits (power2 with tails, candidates), a reorder and a knob, at several points of the space, built and run
    against numpy."""
    space = ConfigSpace()
    matmul_template(space)
    # tile_i: an innermost power of two up to 16, then one up to what is left (5 + 4 + 3 + 2 + 2 ways)
    assert space.size == 16 * 3 * 3 * 2
    config = space.get(index % space.size)
    cfg = ConfigSpace(config)
    schedule, args = matmul_template(cfg)
    assert cfg.current == config
    kernel = build(schedule, args, target="llvm")
    a, b = (RNG.standard_normal((24, 24)).astype(np.float32) for _ in range(2))
    c = np.zeros((24, 24), np.float32)
    kernel(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def dense_group(m: int = 16, n: int = 48, k: int = 32):
    graph = Graph()
    x = graph.add_input("x", TensorType((m, k), "float32"))
    w = graph.add_param("w", RNG.standard_normal((k, n)).astype(np.float32))
    (y,) = graph.add_node("MatMul", [x, w])
    (y,) = graph.add_node("Relu", [y])
    graph.outputs = [y]
    (node,) = optimize(graph).nodes
    return graph, node


@pytest.mark.parametrize("target", ["llvm", "wasm"])
def test_a_cpu_template_at_other_points_of_its_space_matches_numpy(target):
    graph, node = dense_group()
    space = ConfigSpace()
    schedule_group(group_to_te(node), Target.parse(target), space)
    assert space.template == "dense" and set(space.knobs) == {
        "tile_m",
        "tile_n",
        "unroll_m",
        "tile_order",
        "parallel",
        "unroll_k",
        "pack_b",
    }
    x, weights = RNG.standard_normal((16, 32)).astype(np.float32), next(iter(graph.params.values()))
    arrays = [x if value.name == "x" else weights for value in node.inputs]
    expected = np.maximum(x @ weights, 0)
    valid = list(space.valid_configs())
    for config in (valid[0], valid[len(valid) // 2], valid[-1]):
        group = group_to_te(node)
        kernel = build(
            schedule_group(group, Target.parse(target), config.to_json()), [*group.inputs, *group.outputs], target
        )
        y = np.zeros((16, 48), np.float32)
        kernel(*arrays, y)
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4, err_msg=str(config))


@pytest.mark.parametrize("target", ["llvm", "llvm -mattr=-avx512f", "wasm"])
def test_register_filter_bounds_the_accumulators(target):
    """The dense template's filter: tile_m rows x the vectors of tile_n columns fit the vector registers."""
    target = Target.parse(target)
    _, node = dense_group(m=64, n=96)
    space = ConfigSpace()
    schedule_group(group_to_te(node), target, space)
    width, registers = lanes(target, "float32"), vector_registers(target)
    accumulators = lambda config: config["tile_m"].size[-1] * -(-config["tile_n"].size[-1] // width)  # noqa: E731
    every = [space.get(index) for index in range(space.size)]
    valid = [config for config in every if config.valid]
    assert valid and len(valid) < len(every)
    assert all((accumulators(config) <= registers) == config.valid for config in every)
    assert space.fallback.valid


def test_vector_registers_per_target():
    assert vector_registers(Target.parse("llvm -mtriple=aarch64-linux-gnu")) == 32
    assert vector_registers(Target.parse("llvm -mtriple=armv7-linux-gnueabihf")) == 16
    assert vector_registers(Target.parse("wasm")) == 32
    assert vector_registers(Target.parse("llvm -mcpu=haswell -mattr=-avx512f")) == 16
