"""Speculative (lossless) mode beyond the kit: the sampling rule, the draft length, the API."""

import json

import numpy as np
import pytest

from river_core import ConfigError, RiverModel
from river_cli.main import main
from river_core.loop.sampling import verify_draft
from river_core.method.draft_length import DraftLength, Round
from river_core.method.verify_costs import VerifyCosts
from river_conformance.kit import SAMPLED_SETTINGS, lossless_against_plain


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


def _round(drafted, accepted, draft_seconds=0.01, verify_seconds=0.03):
    return Round([0] * (accepted + 1), drafted, accepted, [-1] * drafted, draft_seconds,
                 verify_seconds)


def _run(length: DraftLength, rounds: int, plain: float, drafted: float = 0.010) -> list[int]:
    """The lengths chosen over `rounds` rounds where a plain step costs `plain` seconds and a
    round that drafted `drafted` seconds a token (every draft kept)."""
    chosen = []
    for _ in range(rounds):
        g = length.next()
        chosen.append(g)
        length.update(_round(g, g, drafted * g, drafted) if g else _round(0, 0, 0.0, plain))
    return chosen


@pytest.mark.parametrize("drafting_pays", [True, False])
def test_adaptive_drafting_chooses_within_a_few_rounds_and_tries_the_other_way_ever_less(
        drafting_pays):
    """Rounds that drafted cost 10 ms a token; plain steps 20 ms, or 5 ms. A plain step, then
    TRIAL rounds drafting, then the cheaper way, trying the other after 4, 8, 16 ... rounds."""
    length = DraftLength(4, adaptive=True)
    chosen = _run(length, 80, plain=0.020 if drafting_pays else 0.005)
    first = 1 + length.TRIAL
    assert chosen[0] == 0 and all(g > 0 for g in chosen[1:first])
    assert length.drafting_pays == drafting_pays
    tries = [i for i, g in enumerate(chosen[first:]) if (g > 0) != drafting_pays]
    gaps = np.diff([-1] + tries).tolist()
    assert gaps == [5, 9, 17, 33][:len(gaps)] and len(tries) == 4


def test_a_try_that_wins_switches_at_once():
    """Drafts lose for a while, then become cheap (a stretch the river drafts well): the first
    try of drafting after the change wins, and drafting goes on."""
    length = DraftLength(4, adaptive=True)
    _run(length, 12, plain=0.005)
    assert not length.drafting_pays
    chosen = _run(length, 20, plain=0.005, drafted=0.001)
    start = chosen.index(next(g for g in chosen if g > 0))
    assert all(g > 0 for g in chosen[start:start + 4]) and length.drafting_pays


def test_the_draft_length_grows_while_drafts_stand_and_shrinks_on_rejection(monkeypatch):
    monkeypatch.setattr(DraftLength, "PROBE", 1000)   # the length rule alone
    length = DraftLength(6, adaptive=True)
    length.update(_round(0, 0, 0.0, 1.0))   # a plain step measured: drafting is the cheaper
    assert length.next() == 6
    for want in (5, 4, 3, 2, 1, 1):
        length.update(_round(length.next(), 0))
        assert length.next() == want
    for want in (2, 3, 4, 5, 6, 6):
        length.update(_round(length.next(), length.next()))
        assert length.next() == want
    length.update(_round(6, 3))
    assert length.next() == 5
    assert length.acceptance == (0 + 21 + 3) / (21 + 21 + 6)
    fixed = DraftLength(3, adaptive=False)
    fixed.update(_round(3, 0))
    assert fixed.next() == 3 and fixed.acceptance == 0.0


@pytest.fixture(scope="module")
def folder(tiny_folder):
    return tiny_folder("llama")


def test_speculative_generation_through_the_api(folder):
    model = RiverModel.from_pretrained(folder)
    full = model.generate("abc", chat=False, max_new_tokens=12, kv="full")
    lossless = model.generate("abc", chat=False, max_new_tokens=12, mode="speculative",
                              policy="fixed", layer=0, adaptive=False)   # drafts every round
    assert lossless.text == full.text
    stats = lossless.stats
    assert stats.speculative and 0.0 <= stats.acceptance_rate <= 1.0
    assert stats.tokens_per_round >= 1.0 and len(stats.drafted) == len(stats.step_seconds)
    # a seeded sampled generation repeats, its drafts chosen alike each time, whether fixed
    # or adaptive (judged by the verification costs measured once, not by a clock)
    for adaptive in (False, True):
        sampled = [model.generate("abc", chat=False, max_new_tokens=8, mode="speculative",
                                  temperature=1.0, seed=5, adaptive=adaptive).stats.tokens
                   for _ in range(2)]
        assert sampled[0] == sampled[1]


def test_cli_speculative_mode(folder, capsys):
    assert main(["generate", "abc", "--model", folder, "--no-chat", "--max-new-tokens", "8",
                 "--mode", "speculative", "--draft-tokens", "3", "--policy", "fixed",
                 "-o", "layer=1"]) == 0
    err = capsys.readouterr().err   # whether a draft pays is this machine's measure
    assert "speculative: " in err and "rounds: " in err
    assert main(["generate", "abc", "--model", folder, "--mode", "speculative",
                 "--draft-tokens", "0"]) == 2
    assert "draft_tokens must be >= 1" in capsys.readouterr().err


def test_drafting_stops_at_an_end_of_text(folder, monkeypatch):
    """Nothing the backbone could keep follows an end of text, so no draft is made after one:
    every verification sees EOS only last, and the output still ends where full depth's
    does."""
    model = RiverModel.from_pretrained(folder)
    tokens = model.generate("abc", chat=False, max_new_tokens=12, kv="full").stats.tokens[0]
    eos = next(t for k, t in enumerate(tokens) if k >= 3 and t not in tokens[:k])
    monkeypatch.setattr(model.backend.tokenizer, "eos_ids", frozenset({eos}))
    verified, extend = [], model.backend.extend
    monkeypatch.setattr(model.backend, "extend",
                        lambda ids, start: verified.append(ids) or extend(ids, start))
    full = model.generate("abc", chat=False, max_new_tokens=12, kv="full").stats.tokens[0]
    lossless = model.generate("abc", chat=False, max_new_tokens=12, mode="speculative",
                              policy="fixed", layer=-1, draft_tokens=4).stats.tokens[0]
    assert lossless == full and full[-1] == eos
    assert verified and all(eos not in ids[:-1] for ids in verified)


def test_ignore_eos_decodes_the_whole_budget_in_every_mode(folder, monkeypatch):
    """With ignore_eos (llama.cpp's --ignore-eos, for timings of one length) an end of text
    does not end the generation: full depth and lossless mode decode max_new_tokens tokens,
    the same ones."""
    model = RiverModel.from_pretrained(folder)
    tokens = model.generate("abc", chat=False, max_new_tokens=12, kv="full").stats.tokens[0]
    eos = next(t for k, t in enumerate(tokens) if k >= 3 and t not in tokens[:k])
    monkeypatch.setattr(model.backend.tokenizer, "eos_ids", frozenset({eos}))
    full, lossless = (model.generate("abc", chat=False, max_new_tokens=12, ignore_eos=True,
                                     **mode).stats.tokens[0]
                      for mode in ({"kv": "full"}, {"mode": "speculative", "policy": "fixed",
                                                    "layer": -1, "draft_tokens": 4}))
    assert full == lossless == tokens and eos in full[:-1]


@pytest.fixture(scope="module")
def tiny4(fastest_tiny_backend):
    """A tiny llama with 4-bit stand-ins on the fastest engine installed: the sampling rule
    under test is the core's, the same over every engine's logits."""
    return fastest_tiny_backend("llama", 0, 4)


def test_speculative_sampling_with_top_k_draws_full_depths_distribution(tiny4):
    comparison = lossless_against_plain(tiny4, temperature=0.8, top_k=12)
    assert comparison.same, comparison.summary()


def _keep_every_draft(target, draft, token, rng):
    return None



@pytest.mark.parametrize("sampling", SAMPLED_SETTINGS.values(), ids=SAMPLED_SETTINGS.keys())
def test_the_kits_sampled_test_catches_drafts_kept_without_the_ratio_test(tiny4, monkeypatch,
                                                                          sampling):
    """The kit's distribution test has the power it claims: a verification that keeps every
    draft fails it at both of its settings."""
    monkeypatch.setattr("river_core.loop.speculative.verify_draft", _keep_every_draft)
    comparison = lossless_against_plain(tiny4, **sampling)
    assert not comparison.same, comparison.summary()



def test_speculative_mode_keeps_stop_strings_and_refuses_unknown_sampling_settings(folder):
    """Every sampling setting River's engines take (temperature, top_p, top_k, seed, stop) is
    exact in lossless mode (the kit's tests, and above); any other is refused by name."""
    model = RiverModel.from_pretrained(folder)
    full = model.generate("abc", chat=False, max_new_tokens=12, kv="full").text
    stop = full[3:5]
    lossless = model.generate("abc", chat=False, max_new_tokens=12, mode="speculative",
                              policy="fixed", layer=0, stop=[stop])
    assert lossless.text == full[:full.index(stop)]
    with pytest.raises(ConfigError, match="unknown option 'min_p'"):
        model.generate("abc", chat=False, mode="speculative", temperature=1.0, min_p=0.1)


def test_a_model_measures_verification_once_and_drafts_a_prompt_alike_on_every_call(
        folder, monkeypatch, tmp_path):
    """What verifying costs is measured on the first lossless generation and kept, in the
    process and the user cache; every call starts a fresh draft length judged by those costs,
    so the same prompt drafts alike each time (no clock decides), text unchanged. Another
    context scale measures its own."""
    from river_core.loop import speculative

    monkeypatch.setenv("RIVER_CACHE", str(tmp_path))   # nothing measured before
    measured = []
    real = speculative.measure
    monkeypatch.setattr(speculative, "measure", lambda *a: measured.append(a) or real(*a))
    model = RiverModel.from_pretrained(folder)
    settings = dict(chat=False, max_new_tokens=12, mode="speculative", policy="fixed", layer=0)
    calls = [model.generate("abc", **settings).stats for _ in range(3)]
    assert len(measured) == 1
    assert calls[0].tokens == calls[1].tokens == calls[2].tokens
    assert calls[0].drafted == calls[1].drafted == calls[2].drafted
    assert calls[0].accepted == calls[1].accepted == calls[2].accepted
    model.generate("abc" * 40, **settings)
    assert len(measured) == 2


def _costs(step: float, per_token: float, layers: int) -> VerifyCosts:
    """Verification of k tokens at step + (k - 1) * per_token seconds."""
    widths = (1, 2, 4, 8, 16)   # wider than any round of the default sources
    return VerifyCosts(widths, tuple(step + (k - 1) * per_token for k in widths), layers)


def test_a_new_process_starts_from_what_the_last_one_measured_on_this_cpu(folder, tmp_path,
                                                                          monkeypatch):
    """The verification costs go to the user cache after the first lossless generation, keyed
    by engine, model bytes and CPU: the next process measures nothing and follows them (where
    no draft can pay, plain steps from its first round); another CPU's entry is not used."""
    from river_core.settings import machine
    from river_core.loop import speculative

    monkeypatch.setenv("RIVER_CACHE", str(tmp_path))
    settings = dict(chat=False, max_new_tokens=12, mode="speculative", policy="fixed", layer=0)
    first = RiverModel.from_pretrained(folder).generate("abc", **settings)
    [entry] = (tmp_path / "drafts").iterdir()
    [(key, stored)] = json.loads(entry.read_text()).items()
    assert VerifyCosts.from_json(stored).covers(3)   # two drafts and the token before
    layers = stored["layers"]
    measured = []
    monkeypatch.setattr(speculative, "measure", lambda *a: measured.append(a) or
                        _costs(0.01, 0.01, layers))
    # drafting cheap: the river drafts from the first round; verifying k tokens costing k
    # steps: no draft can pay, plain steps throughout
    for per_token, drafts in ((0.001, True), (0.01, False)):
        entry.write_text(json.dumps({key: _costs(0.01, per_token, layers).as_json()}))
        again = RiverModel.from_pretrained(folder).generate("abc", **settings)
        assert (again.stats.drafted[0] > 0) == drafts and again.text == first.text
        assert drafts or set(again.stats.draft_sources) == {"plain"}
    assert not measured
    # on another CPU the entry is not found: measured afresh
    monkeypatch.setattr(machine, "cpu_key", lambda: "another-cpu")
    monkeypatch.setattr("river_core.loop.drafting.cpu_key", lambda: "another-cpu")
    RiverModel.from_pretrained(folder).generate("abc", **settings)
    assert len(measured) == 1


def test_modelled_costs_make_the_choices_follow_the_drafts_kept_not_the_clock():
    """With verification costs, a round costs its modelled seconds: rounds of the same drafts
    and acceptances clocked at wildly different times choose alike; a river draft costs the
    share of a step it ran (exit after layer 1 of 4, two stand-in layers at half a layer each:
    three quarters of a step)."""
    costs = _costs(0.010, 0.002, 4)
    assert costs.round(2, [1, 1]) == pytest.approx(0.015 + 0.014)
    assert costs.verification(6) == pytest.approx(0.020)   # between the widths measured
    chosen = []
    for clock in (0.001, 1.0):
        length = DraftLength(4, adaptive=True)
        length.use(costs)
        picks = []
        for k in range(40):
            g = length.next()
            picks.append(g)
            kept = g if k % 3 else 0
            length.update(Round([0] * (kept + 1), g, kept, [0] * g, clock, clock))
        chosen.append(picks)
    assert chosen[0] == chosen[1] and chosen[0][0] > 0   # plain steps' cost known: no plain
    #                                                      step first


def test_a_source_that_could_not_pay_with_every_draft_kept_is_never_asked():
    length = DraftLength({"river": 2, "ngram": 8}, adaptive=True)
    length.use(_costs(0.010, 0.0098, 30))   # two tokens verified at 19.8 ms: 9.9 ms a token
    assert length.sources == [] and length.order() == [] and not length.drafting_pays


@pytest.mark.parametrize("drafted, chosen", [(0.0098, "plain"), (0.0090, "drafting")])
def test_drafting_is_chosen_only_where_it_saves_a_margin(drafted, chosen):
    """Plain steps at 10 ms a token: drafting at 9.8 ms (a 2% gain, inside a call's spread)
    is not taken, so lossless mode runs full depth's own steps; at 9 ms (10%) it is."""
    length = DraftLength(4, adaptive=True)
    _run(length, 12, plain=0.010, drafted=drafted)
    assert length.drafting_pays == (chosen == "drafting")


def test_drafting_is_judged_by_its_seconds_over_its_tokens():
    """Plain steps at 10 ms a token; rounds of two drafts at 27 ms, two in three kept whole (3
    tokens: 9 ms a token), one in three rejected at once (1 token: 27 ms). Drafting then costs
    81 ms for 7 tokens, 11.6 ms a token: it loses, though its median round (9 ms a token) wins.
    Those are the rounds a user's clock adds up, so plain steps are chosen."""
    length = DraftLength(2, adaptive=True)
    for _ in range(3):
        length.update(_round(0, 0, 0.0, 0.010))
        for kept in (2, 2, 0):
            length.update(_round(2, kept, 0.0, 0.027))
    assert length.seconds_per_token == pytest.approx({"river": 0.081 / 7, "plain": 0.010})
    assert not length.drafting_pays


def test_a_one_off_cost_weighs_as_one_slow_round():
    """Clocked rounds (vLLM's drafter, which has no verification costs): a one-off cost, as a
    first verification's kernel setup, makes one round a hundred times the others'. Drafting
    at 8 ms a token against plain steps' 10 still pays with it in the record: it counts as
    CLIP median rounds, not as a hundred."""
    length = DraftLength(2, adaptive=True)
    length.update(_round(0, 0, 0.0, 0.010))
    length.update(_round(2, 2, 0.0, 2.4))
    for _ in range(8):
        length.update(_round(2, 2, 0.0, 0.024))
    assert length.seconds_per_token["river"] == pytest.approx((8 * 0.024 + 2 * 0.024) / 27)
    assert length.drafting_pays
