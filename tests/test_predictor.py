"""The predictor and the similarity policy: pure core, no backend."""

import math

from hypothesis import given, strategies as st

from river_core.method.policy import RowView, SimilarityOptions, SimilarityPolicy
from river_core.method.predictor import TransitionPredictor, transition

cosines = st.floats(-1.0, 1.0)
layers = st.integers(2, 12)


def predictor_for(sims, eps):
    p = TransitionPredictor(eps, sims)
    for i, s in enumerate(sims):
        p.observe(i, s)
    return p


@given(cosines)
def test_transition_is_a_chord_length(s):
    t = transition(s)
    assert 0.0 <= t <= 2.0
    assert math.isclose(t * t, 2 - 2 * s, abs_tol=1e-12)


@given(layers.flatmap(lambda n: st.tuples(st.lists(cosines, min_size=n, max_size=n),
                                          st.lists(st.floats(0, 0.5), min_size=n, max_size=n))))
def test_error_is_nonnegative_zero_at_the_end_and_falls_with_depth(case):
    sims, eps = case
    p = predictor_for(sims, eps)
    errors = [p.predicted_error(k) for k in range(len(sims))]
    assert all(e >= 0 for e in errors)
    assert errors[-1] == 0.0
    assert all(a >= b - 1e-12 for a, b in zip(errors, errors[1:]))


@given(layers.flatmap(lambda n: st.tuples(st.lists(cosines, min_size=n, max_size=n),
                                          st.lists(st.floats(0, 0.5), min_size=n, max_size=n),
                                          st.integers(0, n - 1), st.floats(0, 0.5))))
def test_a_noisier_river_never_predicts_less_error(case):
    sims, eps, layer, extra = case
    worse = list(eps)
    worse[layer] += extra
    for k in range(len(sims)):
        assert predictor_for(sims, worse).predicted_error(k) >= \
            predictor_for(sims, eps).predicted_error(k) - 1e-12


def test_a_token_that_moves_less_than_usual_predicts_less_error():
    eps, prior = [0.01] * 6, [0.5] * 6
    calm, busy = TransitionPredictor(eps, prior), TransitionPredictor(eps, prior)
    calm.observe(0, 0.9)
    busy.observe(0, 0.1)
    assert calm.predicted_error(0) < busy.predicted_error(0)


def test_running_statistics_follow_observed_tokens():
    p = TransitionPredictor([0.01] * 3, [0.0] * 3)
    for _ in range(200):
        for i in range(3):
            p.observe(i, 1.0)
        p.end_token()
    assert max(p.typical) < 1e-6   # blocks that stopped moving are expected to stay still


def test_similarity_policy_exits_at_first_allowed_layer_that_fits():
    p = predictor_for([0.5] * 8, [0.02] * 8)
    threshold = p.predicted_error(4)
    policy = SimilarityPolicy(SimilarityOptions(threshold, min_layer=2), num_layers=8)
    view = lambda k: RowView(k, 0, p, None, lambda: None)
    decisions = [policy.should_exit(view(k)) for k in range(8)]
    assert decisions.index(True) == 4
    later = SimilarityPolicy(SimilarityOptions(threshold, min_layer=6), num_layers=8)
    assert not later.should_exit(view(4))
