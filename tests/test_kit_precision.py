"""The conformance kit's bounds per float type: float32's as they always were, float16's
measured, and the one rule by which greedy tokens may part in float16 (a near tie)."""

import numpy as np

from river_conformance.kit import (FLOAT16, FLOAT32, FULL_DEPTH_RTOL, NEAR_TIE, PARTED, SAME,
                                   Subject)


def _chose_0(gap: float) -> list[np.ndarray]:
    """Logits of one step that chose token 0 over token 1 by `gap` (norm about 2.8)."""
    return [np.array([2.0, 2.0 - gap, 0.0, 0.0])]


def test_float32_bounds_are_the_kits_full_depth_tolerance_everywhere():
    assert FLOAT32.rtol == FLOAT32.own_rtol == FLOAT32.fused_rtol == FULL_DEPTH_RTOL
    assert not FLOAT32.near_ties


def test_float32_greedy_tokens_must_be_equal_even_at_an_exact_tie():
    assert FLOAT32.keeps_to([0, 5], [0, 5], lambda: [], FLOAT32.rtol)
    assert not FLOAT32.keeps_to([1], [0], lambda: _chose_0(0.0), FLOAT32.rtol)


def test_float16_greedy_tokens_part_only_at_a_near_tie_of_the_one_they_keep_to():
    # logits within rtol move any two logits' gap by at most sqrt(2) * rtol * ||logits||
    bound = np.sqrt(2) * FLOAT16.rtol * np.linalg.norm(_chose_0(0.0)[0])
    assert FLOAT16.keeps_to([1], [0], lambda: _chose_0(0.9 * bound), FLOAT16.rtol)
    assert not FLOAT16.keeps_to([1], [0], lambda: _chose_0(1.1 * bound), FLOAT16.rtol)
    # the first difference is the one judged: step 1 here, a near tie
    steps = [np.array([5.0, 0.0, 0.0, 0.0]), _chose_0(0.01)[0]]
    assert FLOAT16.keeps_to([0, 1, 3], [0, 0, 2], lambda: steps, FLOAT16.rtol)
    assert not FLOAT16.keeps_to([1, 0], [0, 0], lambda: steps, FLOAT16.rtol)
    # a run that stops early without choosing another token does not keep to the longer one
    assert not FLOAT16.keeps_to([0], [0, 0], lambda: steps, FLOAT16.rtol)


def test_the_verdict_tells_the_same_from_a_near_tie_from_parted():
    """What keeps_to answers, told apart (the benchmarks' identity columns show all three)."""
    steps = [np.array([5.0, 0.0, 0.0, 0.0]), _chose_0(0.01)[0]]
    judge = lambda got, precision=FLOAT16: precision.agreement(got, [0, 0], lambda: steps,
                                                                 precision.rtol)
    assert (judge([0, 0]), judge([0, 1]), judge([1, 0])) == (SAME, NEAR_TIE, PARTED)
    assert judge([0, 1], FLOAT32) == PARTED


def test_a_subject_takes_the_bounds_of_the_float_type_its_backend_computes_in():
    assert Subject.registered("onnx").precision is FLOAT32
    assert Subject.registered("onnx-float16").precision is FLOAT16
