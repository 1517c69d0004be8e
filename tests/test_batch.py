"""Batch > 1: each sequence exits on its own and gets what it would get alone."""

import pytest

from river_torch.plugin import tiny_backend
from river_conformance.fixtures import tiny
from river_core.settings.config import GenerationConfig
from river_core.loop.decode import Run, generate_ids
from river_core.settings.errors import ConfigError
from river_core.method.kv import Full, Propagate, Recompute, River
from river_core.method.policy import Policy, RowView
from river_core.method.predictor import TransitionPredictor
from river_policies import FixedDepth

PROMPTS = [[1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50], [1, 7, 8], [1, 60, 61, 62, 63, 64]]
GEN = GenerationConfig(max_new_tokens=8)


@pytest.mark.parametrize("family", tiny.FAMILIES)
@pytest.mark.parametrize("strategy,policy", [(Full(), FixedDepth(-1)), (River(), FixedDepth(2)),
                                             (Propagate(), FixedDepth(3))])
def test_batched_rows_match_single_runs(family, strategy, policy):
    b = tiny_backend(family, 0, 8)
    run = Run(strategy, policy, TransitionPredictor)
    batched = generate_ids(b, PROMPTS, GEN, run)
    for r, prompt in enumerate(PROMPTS):
        alone = generate_ids(b, [prompt], GEN, run)
        assert batched.tokens[r] == alone.tokens[0]
        assert batched.exit_layers[r] == alone.exit_layers[0]


class PerRow(Policy):
    """Each sequence's own state is its exit layer, handed out in row order."""

    def __init__(self, layers) -> None:
        self.layers = iter(layers)

    def new_row(self):
        return next(self.layers)

    def should_exit(self, row: RowView) -> bool:
        return row.layer == row.state


@pytest.mark.parametrize("strategy", [River(), Propagate()])
def test_rows_exiting_at_different_layers_in_one_step_match_single_runs(strategy):
    b = tiny_backend("qwen3", 0, 8)
    own = [1, 4, None]
    batched = generate_ids(b, PROMPTS, GEN, Run(strategy, PerRow(own), TransitionPredictor))
    for r, prompt in enumerate(PROMPTS):
        alone = generate_ids(b, [prompt], GEN,
                             Run(strategy, PerRow([own[r]]), TransitionPredictor))
        assert batched.tokens[r] == alone.tokens[0]
        assert set(batched.exit_layers[r]) == {tiny.LAYERS - 1
                                               if own[r] is None else own[r]}


@pytest.mark.parametrize("kv", ["propagate", "river"])
def test_similarity_policy_runs_once_every_row_has_left(kv):
    from river_core import ExitConfig, RiverModel

    model = RiverModel(tiny_backend("llama", 0, 8))
    config = ExitConfig(kv=kv, policy="similarity",
                        options={"threshold": 10.0, "min_layer": 0})
    out = model.generate_ids([[1, 20, 21]], config,
                             GenerationConfig(max_new_tokens=4))
    assert set(out.exit_layers[0]) == {0}


def test_recompute_runs_one_sequence_at_a_time():
    with pytest.raises(ConfigError, match="one sequence at a time"):
        generate_ids(tiny_backend("llama", 0, 8), PROMPTS, GEN,
                     Run(Recompute(), FixedDepth(2), TransitionPredictor))


@pytest.mark.parametrize("strategy,policy", [(River(), FixedDepth(2)), (Full(), FixedDepth(-1))])
def test_batched_teacher_forcing_matches_single_runs(strategy, policy):
    """Continuations of different lengths: each row's logits and exits are its own. On the
    float example backend: hf's stand-ins run bfloat16 activations, whose rounding depends on
    the batch's shape."""
    import numpy as np

    from river_conformance import example_backend
    from river_core.loop.decode import teacher_force

    b = example_backend.make("llama", 0, 8)
    continuations = [[5, 6, 7, 8], [9], [10, 11, 12]]
    run = Run(strategy, policy, TransitionPredictor)
    batched = teacher_force(b, PROMPTS, continuations, run)
    for prompt, cont, forced in zip(PROMPTS, continuations, batched):
        [alone] = teacher_force(b, [prompt], [cont], run)
        assert forced.exit_layers == alone.exit_layers and len(forced.logits) == len(cont) + 1
        assert all(np.allclose(x, y, atol=1e-4) for x, y in zip(forced.logits, alone.logits))


def test_a_batch_above_the_step_aside_threshold_runs_at_full_depth():
    from river_core import ExitConfig, GenerationConfig, RiverModel
    from river_torch.plugin import tiny_backend

    model = RiverModel(tiny_backend("llama", 0, 4))
    rows, gen = [[1, 20, 21], [1, 30, 31, 32], [1, 40]], GenerationConfig(max_new_tokens=6)
    exiting = dict(policy="fixed", options={"layer": 1})
    full = model.generate_ids(rows, ExitConfig(kv="full"), gen)
    aside = model.generate_ids(rows, ExitConfig(**exiting, step_aside_above=2), gen)
    assert aside.tokens == full.tokens and set(aside.exit_layers[0]) == {5}
    exits = model.generate_ids(rows, ExitConfig(**exiting, step_aside_above=3), gen)
    assert set(exits.exit_layers[0]) == {1}


def test_exited_rows_take_the_heads_stand_in_when_asked_and_the_others_the_head():
    """ExitConfig.exit_head "stand-in": a row that left takes the head's stand-in (here
    marked: it always says token 5), a row at full depth the model's own head, in one step."""
    import numpy as np

    b = tiny_backend("qwen3", 0, 8)
    own = [1, None, 2]
    plain = generate_ids(b, PROMPTS, GEN, Run(River(), PerRow(own), TransitionPredictor))

    def marked(h):
        logits = np.zeros((len(h), tiny.VOCAB), np.float32)
        logits[:, 5] = 1
        return logits

    b.stand_in_logits = marked
    heads = generate_ids(b, PROMPTS, GEN, Run(River(), PerRow(own), TransitionPredictor,
                                              stand_in_head=True))
    assert heads.tokens[0][1:] == heads.tokens[2][1:] == [5] * (GEN.max_new_tokens - 1)
    assert heads.tokens[1] == plain.tokens[1] and 5 not in plain.tokens[1]
