"""Speculative (lossless) mode beyond the kit: the sampling rule, the draft length, the API."""

import numpy as np
import pytest

from river_core import RiverModel
from river_core.cli import main
from river_core.sampling import verify_draft
from river_core.speculative import DraftLength, Round


@pytest.mark.parametrize("seed", range(4))
def test_the_sampling_rule_leaves_the_target_distribution(seed):
    """Whatever the draft distribution, the token that stands follows the target's: checked
    over 40,000 draws on a five-token vocabulary (total variation < 0.015, about 5 sigma)."""
    rng = np.random.default_rng(seed)
    target, draft = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5) * 0.5)
    n, counts = 40_000, np.zeros(5)
    for _ in range(n):
        token = int(rng.choice(5, p=draft))
        correction = verify_draft(target, draft, token, rng)
        counts[token if correction is None else correction] += 1
    assert 0.5 * np.abs(counts / n - target).sum() < 0.015


def test_a_draft_equal_to_the_target_always_stands():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(7))
    assert all(verify_draft(p, p, int(rng.choice(7, p=p)), rng) is None for _ in range(500))


def _rounds(length, accepted, drafted, draft_ms, verify_ms, n=30):
    for _ in range(n):
        length.update(Round([0] * (accepted + 1), drafted, accepted, [-1] * drafted,
                            draft_ms * drafted / 1e3, verify_ms / 1e3))


def test_the_draft_length_follows_acceptance_and_cost():
    sure = DraftLength(6)
    _rounds(sure, accepted=6, drafted=6, draft_ms=3, verify_ms=30)
    assert sure.next() == 6 and sure.acceptance > 0.95
    doubtful = DraftLength(6)
    _rounds(doubtful, accepted=0, drafted=2, draft_ms=15, verify_ms=30)
    assert doubtful.next() == 1 and doubtful.acceptance < 0.1
    fixed = DraftLength(3, adaptive=False)
    _rounds(fixed, accepted=0, drafted=3, draft_ms=15, verify_ms=30)
    assert fixed.next() == 3


@pytest.fixture(scope="module")
def folder(tiny_folder):
    return tiny_folder("llama")


def test_speculative_generation_through_the_api(folder):
    model = RiverModel.from_pretrained(folder)
    full = model.generate("abc", chat=False, max_new_tokens=12, kv="full")
    lossless = model.generate("abc", chat=False, max_new_tokens=12, mode="speculative",
                              policy="fixed", layer=0)
    assert lossless.text == full.text
    stats = lossless.stats
    assert stats.speculative and 0.0 <= stats.acceptance_rate <= 1.0
    assert stats.tokens_per_round >= 1.0 and len(stats.drafted) == len(stats.step_seconds)
    sampled = [model.generate("abc", chat=False, max_new_tokens=8, mode="speculative",
                              temperature=1.0, seed=5).stats.tokens for _ in range(2)]
    assert sampled[0] == sampled[1]


def test_cli_speculative_mode(folder, capsys):
    assert main(["generate", "abc", "--model", folder, "--no-chat", "--max-new-tokens", "8",
                 "--mode", "speculative", "--draft-tokens", "3", "--policy", "fixed",
                 "-o", "layer=1"]) == 0
    err = capsys.readouterr().err
    assert "drafts kept" in err and "tokens per verification" in err
    assert main(["generate", "abc", "--model", folder, "--mode", "speculative",
                 "--draft-tokens", "0"]) == 2
    assert "draft_tokens must be >= 1" in capsys.readouterr().err
