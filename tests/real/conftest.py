"""The real-architecture zoo's small sizes, exported once per test session (and pytest worker) into a temporary
folder, and the check every model passes: compiled for a target, each output against onnxruntime's on the same file."""

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import compiler
from compiler import real_zoo
from tests.model_checks import assert_close_in_range


@pytest.fixture(scope="session")
def real_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("real-zoo")


@pytest.fixture(scope="session")
def check_small_model(real_cache):
    """check(name, target, range_tolerance): the small size of `name` compiled for `target` gives onnxruntime's
    outputs, by name; onnxruntime runs each exported file once."""
    references: dict[str, tuple[list[str], list[np.ndarray]]] = {}

    def check(name: str, target: str, range_tolerance: float = 1e-5) -> None:
        path = real_zoo.export(name, "small", real_cache)
        feeds = real_zoo.sample_inputs(name, "small")
        if name not in references:
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            references[name] = ([output.name for output in session.get_outputs()], session.run(None, feeds))
        output_names, wanted = references[name]
        module = compiler.compile_model(str(path), target=target)
        assert [spec.name for spec in module.outputs] == output_names
        results = module.run(feeds)
        for output, want in zip(output_names, wanted, strict=True):
            # an output that does not vary would hide any error upstream of it (a zero-initialised classifier)
            assert np.ptp(want) > 0, f"{name}: output {output} is constant"
            assert_close_in_range(results[output], want, f"{name} on {target}: output {output}", range_tolerance)

    return check
