"""The static memory plan: values alive at the same time never share bytes, values that never coexist
do, and every offset is 64-byte aligned; checked pairwise on hand-made and random lifetimes."""

import itertools

import numpy as np
import pytest

from compiler.memory_plan import ALIGNMENT, Lifetime, align, plan_memory


def _check_no_alias(lifetimes, plan):
    for a, b in itertools.combinations(lifetimes, 2):
        if a.overlaps(b):
            start_a, start_b = plan.offsets[a.name], plan.offsets[b.name]
            apart = start_a + max(a.size, 1) <= start_b or start_b + max(b.size, 1) <= start_a
            assert apart, f"{a} at {start_a} and {b} at {start_b} are alive together and overlap"
    for item in lifetimes:
        assert plan.offsets[item.name] % ALIGNMENT == 0
        assert plan.offsets[item.name] + item.size <= plan.arena_bytes


def test_values_with_disjoint_lifetimes_share_memory():
    chain = [Lifetime(f"v{step}", 1000, step, step + 1) for step in range(6)]
    plan = plan_memory(chain)
    _check_no_alias(chain, plan)
    # a chain needs two buffers whatever its length: each value lives from its writer to its reader
    assert plan.arena_bytes == 2 * align(1000)
    assert plan.total_bytes == 6 * align(1000)
    assert plan.offsets["v0"] == plan.offsets["v2"] == plan.offsets["v4"]


def test_overlapping_lifetimes_never_alias():
    lifetimes = [Lifetime("a", 100, 0, 5), Lifetime("b", 100, 1, 2), Lifetime("c", 300, 2, 3), Lifetime("d", 1, 4, 4)]
    plan = plan_memory(lifetimes)
    _check_no_alias(lifetimes, plan)
    assert len({plan.offsets["a"], plan.offsets["b"], plan.offsets["c"]}) == 3


@pytest.mark.parametrize("seed", range(20))
def test_random_lifetimes_are_placed_without_alias(seed):
    rng = np.random.default_rng(seed)
    lifetimes = []
    for index in range(40):
        first = int(rng.integers(0, 30))
        lifetimes.append(Lifetime(f"v{index}", int(rng.integers(0, 5000)), first, first + int(rng.integers(0, 6))))
    plan = plan_memory(lifetimes)
    _check_no_alias(lifetimes, plan)
    peak_alive = max(
        sum(align(max(item.size, 1)) for item in lifetimes if item.first <= step <= item.last) for step in range(40)
    )
    assert peak_alive <= plan.arena_bytes <= plan.total_bytes


def test_alignment_and_empty_plan():
    plan = plan_memory([Lifetime("odd", 3, 0, 1), Lifetime("empty", 0, 0, 1), Lifetime("other", 65, 1, 2)])
    assert all(offset % 64 == 0 for offset in plan.offsets.values())
    assert plan.arena_bytes == 3 * 64 + 64
    assert plan_memory([]).arena_bytes == 0


def test_duplicate_names_are_refused():
    with pytest.raises(ValueError, match="distinct name"):
        plan_memory([Lifetime("x", 4, 0, 0), Lifetime("x", 4, 1, 1)])
