"""Symbolic sizes (compiler/graph/sym.py): integer polynomials over named sizes with ranges, which stand where ints
stand in shapes and in the shape arithmetic folded at import, and fail loudly where a number is needed."""

import numpy as np
import pytest

from compiler.graph.ir import TensorType
from compiler.graph.sym import Sym, SymbolicSizeError, array_dtype, evaluate, parse_size, size_array, upper

SEQ = Sym.symbol("seq", 1, 256)
PAST = Sym.symbol("past", 0, 100)
RANGES = {"seq": (1, 256), "past": (0, 100)}


def test_arithmetic_is_polynomial_and_folds_constants():
    assert SEQ + 0 == SEQ and SEQ * 1 == SEQ
    assert SEQ - SEQ == 0 and isinstance(SEQ - SEQ, int)
    assert (SEQ + 1) * 4 == 4 * SEQ + 4
    assert (SEQ * 64) // 64 == SEQ and (SEQ * 64) // SEQ == 64
    assert (4 * SEQ) % 4 == 0
    assert PAST + SEQ == SEQ + PAST
    assert evaluate(2 * PAST * SEQ + 7, {"seq": 3, "past": 5}) == 37


def test_inexact_division_and_numbers_are_refused_with_the_size_named():
    with pytest.raises(SymbolicSizeError, match=r"seq // 3"):
        SEQ // 3
    with pytest.raises(SymbolicSizeError, match="seq in 1..256"):
        int(SEQ)
    with pytest.raises(SymbolicSizeError):
        np.zeros(SEQ)
    with pytest.raises(SymbolicSizeError, match=r"seq % 2"):
        SEQ % 2


def test_comparisons_answer_only_when_the_ranges_decide():
    assert SEQ > 0 and SEQ >= 1 and SEQ <= 256 and not SEQ > 256 and max(SEQ, 0) == SEQ
    assert SEQ != 64 and SEQ == SEQ
    with pytest.raises(SymbolicSizeError, match="narrower range"):
        assert SEQ > 16
    with pytest.raises(SymbolicSizeError):
        bool(PAST)  # past may be 0
    assert bool(SEQ)


def test_bounds_and_the_largest_value():
    assert (SEQ * SEQ - 1).bounds() == (0, 65535)
    assert upper(PAST + SEQ) == 356 and upper(7) == 7
    assert (3 - SEQ).bounds() == (-253, 2)


@pytest.mark.parametrize("size", [SEQ, 4 * SEQ, PAST + SEQ, SEQ * SEQ - 1, 3 - SEQ, 2 * PAST * SEQ + 7])
def test_text_round_trips(size):
    assert parse_size(str(size), RANGES) == size


@pytest.mark.parametrize("text", ["", "seq+", "other", "seq/2", "2**seq"])
def test_bad_text_is_refused(text):
    with pytest.raises(Exception, match="size"):
        parse_size(text, RANGES)


def test_symbol_names_and_ranges_are_checked():
    with pytest.raises(Exception, match="not a name"):
        Sym.symbol("1seq", 1, 2)
    with pytest.raises(Exception, match="range"):
        Sym.symbol("seq", 5, 2)


def test_shapes_hold_sizes_and_lay_out_at_the_largest():
    t = TensorType((1, SEQ, 64), "float32")
    assert not t.static and t.max_shape == (1, 256, 64) and t.nbytes == 256 * 64 * 4
    assert t.size == 64 * SEQ
    assert str(t) == "float32[1,seq,64]"
    assert TensorType((1, SEQ, 64), "float32") == t


def test_size_arrays_are_int64_when_nothing_is_symbolic():
    assert size_array([1, 2]).dtype == np.int64
    mixed = size_array([1, SEQ])
    assert mixed.dtype == object and array_dtype(mixed) == "int64"
    assert list(mixed + 1) == [2, SEQ + 1]
