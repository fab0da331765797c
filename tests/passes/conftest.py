"""Shared checks for the pass tests: graphs compared by their printed text with value names
normalised, and numeric equivalence under the reference executor (the unoptimised graph is the oracle)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from compiler.graph.ir import Graph
from compiler.graph.reference import run_reference


def normalized_text(graph: Graph) -> str:
    """`str(graph)` with each value renamed %v0, %v1... in order of first appearance."""
    names: dict[str, str] = {}
    return re.sub(r"%(\w+)", lambda m: "%" + names.setdefault(m[1], f"v{len(names)}"), str(graph))


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {v.name: rng.standard_normal(v.type.shape).astype(v.type.dtype) for v in graph.inputs}


@pytest.fixture
def assert_same_structure():
    def check(actual: Graph, expected: Graph) -> None:
        actual.verify()
        assert normalized_text(actual) == normalized_text(expected), f"got:\n{actual}\nexpected:\n{expected}"

    return check


@pytest.fixture
def assert_same_results():
    def check(before: Graph, after: Graph, rtol: float = 1e-5, atol: float = 1e-6) -> None:
        inputs = random_inputs(before)
        expected, actual = run_reference(before, inputs), run_reference(after, inputs)
        assert list(actual) == list(expected), "graph outputs changed names"
        for name, array in expected.items():
            np.testing.assert_allclose(actual[name], array, rtol=rtol, atol=atol, err_msg=name)

    return check
