"""How a whole model's outputs are compared with onnxruntime's, for every target's zoo tests."""

import numpy as np


def assert_close_to_onnxruntime(actual, wanted, err_msg: str = "") -> None:
    """Within rtol 1e-4, and an absolute tolerance of 1e-5 of the output's range (at least 1e-5): Winograd's
    transforms (F(4, 3)'s coefficients up to 8) round differently from a direct sum, about 3e-6 of the range where
    the direct conv makes 5e-7."""
    scale = max(1.0, float(np.abs(wanted).max()))
    np.testing.assert_allclose(actual, wanted, rtol=1e-4, atol=1e-5 * scale, err_msg=err_msg)
