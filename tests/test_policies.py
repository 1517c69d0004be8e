"""Exit policies in the decode loop: each exits exactly where its rule says."""

import pytest
from hypothesis import given, strategies as st

from river_core import ExitConfig, GenerationConfig, RiverModel, Step
from river_torch.plugin import tiny_backend


class Recording:
    """The hf backend, recording each backbone layer's sub-block cosines per step."""

    def __init__(self, inner) -> None:
        self._inner, self.seen = inner, []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def embed(self, p):
        self.seen.append([])
        return self._inner.embed(p)

    def layer(self, p, i, h, rows, sub_blocks=False):
        out, pairs = self._inner.layer(p, i, h, rows, sub_blocks)
        if pairs is not None:
            self.seen[-1].append(float(min(pairs[0])))
        return out, pairs


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
    from river_core.method.predictor import relative_error

    b = tiny_backend("llama", 0, 4)
    full = RiverModel(b).generate_ids([[1, 30, 31, 32, 33]], ExitConfig(kv="full"),
                                      GenerationConfig(max_new_tokens=8))
    want = [b.read_kv(i) for i in range(b.num_layers)]
    out = _cascade(b, margin=1.0)
    assert out.tokens == full.tokens
    assert set(out.exit_layers[0]) == {b.num_layers - 1}
    for i in range(b.num_layers):
        for got, exact in zip(b.read_kv(i), want[i]):
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


def test_margin_and_entropy():
    import numpy as np
    from river_policies.signals import entropy, margin

    sure, flat = np.array([10.0, 0.0, 0.0]), np.zeros(4)
    assert margin(sure) > 0.99 and margin(flat) == 0.0
    assert entropy(sure) < 1e-3 and abs(entropy(flat) - np.log(4)) < 1e-9


def _exits(settings, n=10, family="llama"):
    b = tiny_backend(family, 0, 4)
    out = RiverModel(b).generate_ids([[1, 30, 31, 32, 33]], ExitConfig(**settings),
                                     GenerationConfig(max_new_tokens=n))
    return out.exit_layers[0], b.num_layers


@pytest.mark.parametrize("policy, sure, never", [
    ("confidence", {"threshold": 0.0}, {"threshold": 1.0}),
    ("entropy", {"threshold": 100.0}, {"threshold": 0.0}),
])
def test_confidence_rules_exit_where_the_early_softmax_says(policy, sure, never):
    exits, n = _exits({"policy": policy, "options": {**sure, "min_layer": 2}})
    assert set(exits) == {2}
    exits, n = _exits({"policy": policy, "options": never})
    assert set(exits) == {n - 1}
    exits, n = _exits({"policy": policy, "options": {**sure, "min_layer": 0, "layers": [3]}})
    assert set(exits) == {3}


def test_a_policy_that_reads_logits_sees_the_state_after_each_layer():
    import numpy as np

    from river_core.loop.decode import Run, generate_ids
    from river_core.method.kv import River
    from river_core.method.policy import Policy
    from river_core.method.predictor import TransitionPredictor

    class Watching(Policy):
        def __init__(self):
            self.seen = {}

        def should_exit(self, row):
            self.seen.setdefault(row.step, {})[row.layer] = row.logits().copy()
            return False

    b, policy = tiny_backend("llama", 0, 4), Watching()
    run = Run(River(), policy, TransitionPredictor)
    generate_ids(b, [[1, 30, 31]], GenerationConfig(max_new_tokens=2), run)
    token = generate_ids(b, [[1, 30, 31]], GenerationConfig(max_new_tokens=1),
                         run).tokens[0][0]
    b.prefill([[1, 30, 31]], 5)
    p = b.begin([token], Step(3))
    h = b.embed(p)
    assert np.allclose(policy.seen[0][-1], b.logits(h)[0], atol=1e-6)
    for layer in range(b.num_layers - 1):
        h, _ = b.layer(p, layer, h, None)
        assert np.allclose(policy.seen[0][layer], b.logits(h)[0], atol=1e-5)


def test_the_depth_budget_steers_tokens_to_its_target():
    exits, n = _exits({"policy": "budget", "options": {"target": 2.0, "tau": 1.0,
                                                       "rate": 0.5, "min_layer": 0}}, n=80)
    late = [k + 1 for k in exits[40:]]
    assert abs(sum(late) / len(late) - 2.0) < 1.0
    assert exits[0] == n - 1   # tau 1 at first: nothing settles that far


def test_policy_options_are_checked():
    from river_core import ConfigError

    model = RiverModel(tiny_backend("llama", 0, 8))
    with pytest.raises(ConfigError, match="layers must be a list"):
        model.generate("abc", policy="confidence", layers=[99])
    with pytest.raises(ConfigError, match="threshold"):
        model.generate("abc", policy="confidence", threshold=2.0)


def test_an_external_distribution_installs_and_loads_by_entry_point(tmp_path, monkeypatch):
    """plugins/river-example-policy, pip-installed (offline) into a folder on sys.path, as a
    user's own package would be: its policy is found through its entry point and runs."""
    import subprocess
    import sys
    from pathlib import Path

    from river_core.plugins import Registry

    source = Path(__file__).resolve().parents[1] / "plugins" / "river-example-policy"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--target", str(tmp_path), str(source)],
                   check=True, capture_output=True, timeout=300)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry()
    entry = registry.entries("policy")["halfway"]
    assert entry.provider == "river-example-policy 0.1.0"
    assert [o[0] for o in entry.options] == ["fraction"]
    b = tiny_backend("llama", 0, 4)
    out = RiverModel(b, registry).generate_ids([[1, 30, 31]], ExitConfig(
        policy="halfway", options={"fraction": 0.5}), GenerationConfig(max_new_tokens=5))
    assert set(out.exit_layers[0]) == {b.num_layers // 2 - 1}
