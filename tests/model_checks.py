"""How a kernel's or a whole model's outputs are compared with an oracle's (onnxruntime, the reference executor)."""

import numpy as np


def assert_close_in_range(actual, wanted, err_msg: str = "", range_tolerance: float = 1e-5) -> None:
    """Within rtol 1e-4, and an absolute tolerance of `range_tolerance` of the wanted output's range (at least that
    much). A float32 sum's rounding grows with its terms, not its result (an output that cancels to near 0 among
    outputs of magnitude 50 is off by more than 1e-5 in any summation order), and Winograd's transforms (F(4, 3)'s
    coefficients up to 8) round differently from a direct sum, about 3e-6 of the range where the direct conv makes
    5e-7. A deep network adds up such errors layer after layer: the caller passes its measured bound."""
    scale = max(1.0, float(np.max(np.abs(wanted), initial=0.0)))
    np.testing.assert_allclose(actual, wanted, rtol=1e-4, atol=range_tolerance * scale, err_msg=err_msg)
