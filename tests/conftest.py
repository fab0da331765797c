"""Fixtures shared across the test folders."""

import pytest

from compiler.tir import work


@pytest.fixture
def every_parallel_loop_pooled(monkeypatch):
    """Codegen hands every parallel loop to the thread pool, however little work it does, so that tests of the
    pool's mechanics can use small loops (the work threshold itself is tested in tests/runtime/test_thread_pool.py)."""
    monkeypatch.setattr(work, "PARALLEL_MIN_WORK", 0)
