"""Reliability over time and under concurrency: long generations stay within the K/V bound
with no drift, the cache never runs past its capacity, threads do not trample each other."""

import threading

import numpy as np
import pytest

from river_core import ConfigError, ExitConfig, GenerationConfig, RiverModel, Step
from river_core.method.kv import Full, Mask, Monotonic, Propagate, Recompute, River
from river_core.method.predictor import STAND_IN_BOUND_C
from river_core.method.predictor import relative_error
from river_conformance.scripted import forced_logits
from river_torch.plugin import tiny_backend
from river_conformance.fixtures import tiny

STEPS = 2048


def _long_model():
    """The tiny Llama (trained context 256) given room for STEPS positions: rotary positions
    are computed, not tabled, so only the context check knows the number."""
    b = tiny_backend("llama", 0, 4)
    b.max_positions = STEPS + 64
    return b


@pytest.mark.parametrize("strategy", [River(), Propagate(), Mask(), Monotonic(), Recompute()],
                         ids=lambda s: s.name)
def test_two_thousand_steps_with_exits_stay_finite_and_bounded(strategy):
    """2,048 teacher-forced steps, a token in three exiting after layer 1: every logit finite;
    river K/V within the documented bound in every layer at every stretch of positions, with
    no growth along the sequence (the last stretch's error no more than twice the first's)."""
    b = _long_model()
    rng = np.random.default_rng(0)
    prompt = [1] + rng.integers(3, tiny.VOCAB, 16).tolist()
    tokens = rng.integers(3, tiny.VOCAB, STEPS).tolist()
    exits = [1 if t % 3 == 0 else None for t in range(STEPS)]
    logits = forced_logits(b, prompt, tokens, strategy, exits)
    assert all(np.isfinite(l).all() for l in logits)
    assert b.offset == len(prompt) + STEPS
    if not isinstance(strategy, River):
        return
    got = [b.read_kv(i) for i in range(b.num_layers)]
    forced_logits(b, prompt, tokens, Full())
    stretch = STEPS // 4
    for i in range(2, b.num_layers):   # layer i: a token leaving after layer 1 runs d = i - 1
        bound = STAND_IN_BOUND_C * b.stand_in_error[i] * (i - 1)
        errors = []
        for lo in range(len(prompt), len(prompt) + STEPS, stretch):
            part = slice(lo, lo + stretch)
            errors.append(max(relative_error(g[:, :, part], w[:, :, part])
                              for g, w in zip(got[i], b.read_kv(i))))
        assert max(errors) <= bound, (i, errors)
        assert errors[-1] <= 2 * errors[0] + 1e-6, (i, errors)


def test_the_cache_never_runs_past_its_capacity():
    model = RiverModel(tiny_backend("llama", 0, 8))
    context = model.backend.max_positions
    with pytest.raises(ConfigError, match="exceeds the model's context"):
        model.generate_ids([[1] * 10], ExitConfig(kv="full"),
                           GenerationConfig(max_new_tokens=context - 9))
    b = model.backend
    b.prefill([[1, 5, 6]], 4)
    b.begin([7], Step(3))
    with pytest.raises(ConfigError, match="cache is full"):
        b.begin([8], Step(4))


def test_two_threads_on_two_models_and_on_one_model_match_sequential_runs():
    models = [RiverModel(tiny_backend(f, 0, 4)) for f in ("llama", "qwen2")]
    prompts = [[1, 20, 21, 22], [1, 40, 41]]
    config, gen = ExitConfig(policy="fixed", options={"layer": 1}), \
        GenerationConfig(max_new_tokens=24)
    alone = [m.generate_ids([p], config, gen).tokens for m in models for p in prompts]
    out = {}

    def run(key, model, prompt):
        for _ in range(3):
            out.setdefault(key, []).append(model.generate_ids([prompt], config, gen).tokens)

    threads = [threading.Thread(target=run, args=((m, p), models[m], prompts[p]))
               for m in range(2) for p in range(2)]   # two threads per model, two models
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n, key in enumerate([(m, p) for m in range(2) for p in range(2)]):
        assert out[key] == [alone[n]] * 3


class CtrlC:
    """The hf backend, with Ctrl-C arriving during the n-th decode step: a step of the walk
    (`begin`) or a verification (`extend`), whichever lossless mode's draft length chose."""

    def __init__(self, inner, n: int) -> None:
        self._inner, self._left = inner, n

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _tick(self) -> None:
        self._left -= 1
        if self._left == 0:
            raise KeyboardInterrupt

    def begin(self, tokens, step):
        self._tick()
        return self._inner.begin(tokens, step)

    def extend(self, tokens, start):
        self._tick()
        return self._inner.extend(tokens, start)


@pytest.mark.parametrize("mode", ["exit", "speculative"])
def test_ctrl_c_returns_what_was_generated_and_its_statistics(mode):
    b = tiny_backend("llama", 0, 4)
    config = ExitConfig(mode=mode, policy="fixed", options={"layer": 1})
    gen = GenerationConfig(max_new_tokens=40)
    whole = RiverModel(b).generate_ids([[1, 20, 21]], config, gen)
    cut = RiverModel(CtrlC(b, 6)).generate_ids([[1, 20, 21]], config, gen)
    assert cut.interrupted and not whole.interrupted
    assert 0 < len(cut.tokens[0]) < len(whole.tokens[0])
    assert cut.tokens[0] == whole.tokens[0][:len(cut.tokens[0])]
    assert len(cut.step_seconds) >= 1


def test_ctrl_c_in_the_cli_prints_the_text_so_far_and_the_statistics(tiny_folder,
                                                                     ctrl_c_at_step, capsys):
    from river_cli.main import main

    ctrl_c_at_step(6)
    assert main(["generate", "abc", "--model", tiny_folder("llama"), "--no-chat",
                 "--max-new-tokens", "30"]) == 130
    out, err = capsys.readouterr()
    assert out.strip() and "interrupted: what came before Ctrl-C" in err and "ms/token" in err
