"""Exit policies in the decode loop: each exits exactly where its rule says."""

import pytest
from hypothesis import given, strategies as st

from river_core import ExitConfig, GenerationConfig, RiverModel
from river_hf.plugin import tiny_backend


class Recording:
    """The hf backend, recording each backbone layer's sub-block cosines per step."""

    def __init__(self, inner) -> None:
        self._inner, self.seen = inner, []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def embed(self, tokens):
        self.seen.append([])
        return self._inner.embed(tokens)

    def sub_block_similarity(self, rows):
        pairs = self._inner.sub_block_similarity(rows)
        self.seen[-1].append(min(pairs[0]))
        return pairs


@given(tau=st.floats(0.0, 1.0), min_layer=st.integers(0, 4))
def test_settled_exits_at_the_first_layer_past_min_layer_whose_sub_blocks_exceed_tau(
        tau, min_layer):
    b = Recording(tiny_backend("qwen3", 0, 4))
    out = RiverModel(b).generate_ids(
        [[1, 30, 31, 32, 33]], ExitConfig(policy="settled", options={"tau": tau,
                                                                     "min_layer": min_layer}),
        GenerationConfig(max_new_tokens=6))
    for exit_layer, cosines in zip(out.exit_layers[0], b.seen):
        settled = [i for i, c in enumerate(cosines) if i >= min_layer and c > tau
                   and i < b.num_layers - 1]
        assert exit_layer == (settled[0] if settled else b.num_layers - 1)
        assert len(cosines) == exit_layer + 1   # the rule read only layers the token ran


def test_settled_refuses_a_min_layer_past_the_last_layer():
    from river_core import ConfigError

    with pytest.raises(ConfigError, match="past the model's last layer"):
        RiverModel(tiny_backend("llama", 0, 8)).generate("abc", policy="settled", min_layer=9)


def _cascade(b, margin, prompt=(1, 30, 31, 32, 33), n=8):
    return RiverModel(b).generate_ids(
        [list(prompt)], ExitConfig(policy="cascade", options={"tau": 0.0, "min_layer": 0,
                                                              "margin": margin}),
        GenerationConfig(max_new_tokens=n))


def test_a_cascade_that_doubts_everything_is_full_depth():
    """margin 1: every exited token is recomputed from its exit, so output, exits and every
    layer's K/V are full depth's (the river's K/V never survive the recheck)."""
    from river_core.testing import relative_error

    b = tiny_backend("llama", 0, 4)
    full = RiverModel(b).generate_ids([[1, 30, 31, 32, 33]], ExitConfig(kv="full"),
                                      GenerationConfig(max_new_tokens=8))
    want = [b.kv(i) for i in range(b.num_layers)]
    out = _cascade(b, margin=1.0)
    assert out.tokens == full.tokens
    assert set(out.exit_layers[0]) == {b.num_layers - 1}
    for i in range(b.num_layers):
        for got, exact in zip(b.kv(i), want[i]):
            assert relative_error(got, exact) <= 1e-5


def test_a_cascade_that_doubts_nothing_is_the_papers_rule():
    b = tiny_backend("llama", 0, 4)
    settled = RiverModel(b).generate_ids(
        [[1, 30, 31, 32, 33]], ExitConfig(policy="settled", options={"tau": 0.0, "min_layer": 0}),
        GenerationConfig(max_new_tokens=8))
    assert _cascade(b, margin=0.0).tokens == settled.tokens


def test_a_cascade_needs_a_strategy_that_writes_the_slots():
    from river_core import ConfigError

    with pytest.raises(ConfigError, match="recomputes doubtful tokens"):
        RiverModel(tiny_backend("llama", 0, 8)).generate("abc", policy="cascade", kv="mask")
