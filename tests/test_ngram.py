"""N-gram drafts (river_core/ngram.py) and the round's choice between draft sources
(speculative.DraftLength): the drafter's proposals, and the chooser on simulated rounds."""

import pytest

from river_core import ConfigError
from river_core.ngram import NgramIndex, NgramOptions
from river_core.draft_length import PLAIN, DraftLength, Round


def _index(tokens, shortest=2, longest=8) -> NgramIndex:
    index = NgramIndex(shortest, longest)
    index.extend(tokens)
    return index


def test_the_tokens_that_followed_the_suffix_before_are_proposed():
    assert _index([5, 6, 7, 8, 9, 5, 6]).propose(3) == [7, 8, 9]


def test_the_longest_suffix_that_occurred_before_wins_over_a_later_shorter_one():
    """(1 2 3 4) occurred, followed by 9; (3 4) occurred later, followed by 7: the copy of the
    longer match is proposed."""
    assert _index([1, 2, 3, 4, 9, 5, 3, 4, 7, 1, 2, 3, 4]).propose(2) == [9, 5]


def test_of_equally_long_matches_the_latest_wins():
    assert _index([1, 2, 7, 1, 2, 8, 1, 2]).propose(1) == [8]


def test_nothing_is_proposed_below_the_shortest_suffix():
    """Only a single token repeats (3): with shortest 2 nothing is proposed; with 1 it is."""
    tokens = [3, 4, 5, 6, 3]
    assert _index(tokens).propose(4) == []
    assert _index(tokens, shortest=1).propose(2) == [4, 5]
    assert _index([1, 2]).propose(3) == []


def test_a_copy_that_runs_into_the_end_of_the_context_repeats_itself():
    """"1 2 1 2": the suffix (1 2) continues "1 2" after its first occurrence, which reaches
    the end of the context; what follows is the copy itself again."""
    assert _index([1, 2, 1, 2]).propose(5) == [1, 2, 1, 2, 1]
    assert _index([7, 7, 7]).propose(3) == [7, 7, 7]


def test_at_most_the_asked_tokens_are_proposed():
    tokens = list(range(10, 30)) + [10, 11]
    assert _index(tokens).propose(4) == [12, 13, 14, 15]


def test_the_index_grows_with_the_tokens_that_stand_as_if_built_at_once():
    tokens = [4, 5, 6, 4, 5, 7, 8, 4, 5, 6, 9, 4, 5]
    grown = NgramIndex(2, 4)
    for k in range(0, len(tokens), 3):
        grown.extend(tokens[k:k + 3])
        assert grown.propose(3) == _index(tokens[:k + 3], 2, 4).propose(3)
    assert grown.propose(3) == [6, 9, 4]


def test_the_suffix_lengths_must_be_ordered():
    with pytest.raises(ConfigError):
        NgramIndex(3, 2)
    with pytest.raises(ConfigError, match="ngram_min must be <= ngram_max"):
        NgramOptions(ngram_min=5, ngram_max=4)
    with pytest.raises(ConfigError, match="ngram_tokens"):
        NgramOptions(ngram_tokens=0)


def _simulate(length: DraftLength, rounds: int, costs: dict, proposes=lambda name, k: True
              ) -> list[str]:
    """The source each of `rounds` rounds drafted from (PLAIN: none), where `costs[name]` is
    (seconds a round, tokens kept of a draft of g) -> and `proposes(name, round)` says
    whether a source has drafts that round."""
    chosen = []
    for k in range(rounds):
        picked = next(((name, g) for name, g in length.order() if proposes(name, k)), None)
        if picked is None:
            chosen.append(PLAIN)
            length.update(Round([0], 0, 0, [], 0.0, costs[PLAIN]))
            continue
        name, g = picked
        seconds, kept = costs[name](g)
        chosen.append(name)
        length.update(Round([0] * (kept + 1), g, kept, [], 0.0, seconds, name))
    return chosen


# plain steps 10 ms; a river round 4 ms a draft + a verification of 10 ms, half its drafts
# kept (does not pay: 18 ms for 2 tokens at g=2); n-gram drafts free, a verification of g
# drafts 10 + 2 g ms, every draft kept (8 drafts: 26 ms for 9 tokens)
COSTS = {PLAIN: 0.010,
         "river": lambda g: (0.010 + 0.004 * g, g // 2),
         "ngram": lambda g: (0.010 + 0.002 * g, g)}


def test_the_round_drafts_from_ngrams_where_they_propose_and_cost_least():
    """A copying stretch: n-grams propose every round and cost 2.9 ms a token, the river 9 ms,
    plain steps 10: after the first plain step and each source's trials, n-grams draft every
    round but the rare tries of plain steps (and of the river, which loses)."""
    length = DraftLength({"river": 2, "ngram": 8}, adaptive=True)
    chosen = _simulate(length, 60, COSTS)
    assert chosen[:5] == [PLAIN, "river", "river", "ngram", "ngram"]
    tries = [k for k, name in enumerate(chosen) if name != "ngram" and k > 2]
    assert len(tries) <= 6 and all(b - a > 1 for a, b in zip(tries[::2], tries[2::2]))
    assert length.seconds_per_token["ngram"] < length.seconds_per_token["river"]
    assert [name for name, _ in length.order()][:1] == ["ngram"]


def test_where_ngrams_propose_nothing_the_river_or_a_plain_step_is_chosen_as_before():
    """No n-gram ever repeats: the river alone is measured against plain steps, and where it
    does not pay (18 ms for 2 tokens against 10 ms for 1) plain steps run, with ever rarer
    tries of the river."""
    length = DraftLength({"river": 2, "ngram": 8}, adaptive=True)
    chosen = _simulate(length, 40, COSTS, proposes=lambda name, k: name != "ngram")
    assert "ngram" not in chosen and chosen[:3] == [PLAIN, "river", "river"]
    assert chosen[3:].count(PLAIN) >= 33
    assert not length.pays("river")


def test_ngrams_that_are_rejected_lose_to_plain_steps():
    """N-gram drafts that the backbone rejects at once (a verification of 8 drafts, 26 ms for
    one token) are measured as losing and asked only on ever rarer tries."""
    length = DraftLength({"ngram": 8}, adaptive=True)
    chosen = _simulate(length, 40, {PLAIN: 0.010, "ngram": lambda g: (0.010 + 0.002 * g, 0)})
    assert chosen[3:].count(PLAIN) >= 32 and not length.pays("ngram")


def test_each_source_keeps_its_own_draft_length():
    """The n-gram source drafts up to its own most (8), the river up to its own (2)."""
    length = DraftLength({"river": 2, "ngram": 8}, adaptive=True)
    _simulate(length, 6, {PLAIN: 1.0, "river": lambda g: (0.001, g),
                          "ngram": lambda g: (0.001, g)})
    assert dict(length.order()) == {"river": 2, "ngram": 8}


@pytest.fixture(scope="module")
def model(tiny_folder):
    from river_core import RiverModel

    return RiverModel.from_pretrained(tiny_folder("llama"))


LOSSLESS = dict(chat=False, mode="speculative", policy="fixed", layer=-1)


@pytest.mark.parametrize("drafts", ["ngram", "river", "river,ngram", ["ngram", "river"]])
def test_each_choice_of_draft_sources_gives_full_depths_text(model, drafts):
    full = model.generate("abcabcab", chat=False, max_new_tokens=24, kv="full")
    lossless = model.generate("abcabcab", max_new_tokens=24, drafts=drafts, **LOSSLESS)
    assert lossless.text == full.text
    named = drafts.split(",") if isinstance(drafts, str) else drafts
    assert set(lossless.stats.rounds_by_source) <= {*named, PLAIN}


def test_an_unknown_draft_source_or_an_ngram_option_outside_speculative_mode_is_refused(model):
    with pytest.raises(ConfigError, match="unknown draft source 'suffix'"):
        model.generate("abc", drafts="river,suffix", **LOSSLESS)
    with pytest.raises(ConfigError, match="drafts must name one draft source or more"):
        model.generate("abc", drafts="river,river", **LOSSLESS)
    with pytest.raises(ConfigError, match="unknown option 'ngram_tokens'"):
        model.generate("abc", chat=False, ngram_tokens=4)


def test_cli_drafts_option(tiny_folder, capsys):
    from river_cli.main import main

    assert main(["generate", "abcabcab", "--model", tiny_folder("llama"), "--no-chat",
                 "--max-new-tokens", "12", "--mode", "speculative", "--drafts", "ngram",
                 "--policy", "fixed", "-o", "layer=-1", "-o", "ngram_tokens=4"]) == 0
    assert "rounds: " in capsys.readouterr().err
    assert main(["plugins"]) == 0
    listed = capsys.readouterr().out
    assert "draft source:" in listed and "ngram_tokens" in listed


@pytest.mark.slow
def test_on_a_copying_prompt_the_round_drafts_from_ngrams():
    """The embedded model summarising a given passage copies whole phrases of it: with both
    sources the n-grams draft most rounds, each keeping several tokens, and the text is full
    depth's (ggml, the default engine on the CPU)."""
    from benchmarks.library.copying import COPYING
    from river_core import ModelError, RiverModel
    from river_models import default_gguf

    pytest.importorskip("ggml")
    try:
        default_gguf()
    except ModelError as e:
        pytest.skip(str(e))
    model = RiverModel.from_pretrained(backend="ggml")
    prompt = COPYING["summary"][0]
    full = model.generate(prompt, max_new_tokens=48, kv="full")
    both = model.generate(prompt, max_new_tokens=48, mode="speculative", drafts="river,ngram")
    stats = both.stats
    rounds = stats.rounds_by_source
    kept = sum(a for a, s in zip(stats.accepted, stats.draft_sources) if s == "ngram")
    assert both.text == full.text
    assert rounds.get("ngram", 0) > rounds.get("river", 0) and kept >= 24


def test_the_kits_sampled_test_catches_ngram_drafts_kept_without_the_ratio_test(
        monkeypatch, fastest_tiny_backend):
    """The kit's sampled test with n-gram drafts has power: a verification that keeps every
    (point-mass) draft fails it."""
    from river_conformance.kit import NGRAM_DRAFTS, NGRAM_PROMPT, lossless_against_plain

    monkeypatch.setattr("river_core.speculative.verify_draft", lambda *args: None)
    comparison = lossless_against_plain(fastest_tiny_backend("llama", 0, 4), sources=NGRAM_DRAFTS,
                                        prompt=NGRAM_PROMPT, temperature=1.0)
    assert not comparison.same, comparison.summary()
