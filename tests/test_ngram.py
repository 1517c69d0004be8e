"""N-gram drafts (river_core/loop/ngram.py) and the round's choice between draft sources
(speculative.DraftLength): the drafter's proposals, and the chooser on simulated rounds."""

import pytest

from river_core import ConfigError
import attrs

from river_core.loop.ngram import NgramDrafter, NgramIndex, NgramOptions, bucket
from river_core.method.verify_costs import VerifyCosts
from river_core.method.draft_length import PLAIN, DraftLength, Round


def _index(tokens, shortest=2, longest=8) -> NgramIndex:
    index = NgramIndex(shortest, longest)
    index.extend(tokens)
    return index


def _proposed(index: NgramIndex, most: int) -> list[int]:
    """Up to `most` tokens of the copy the index's best match starts (none without one), as
    the n-gram drafter takes them."""
    found = index.match()
    return index.copy(found[0], most) if found else []


def test_the_tokens_that_followed_the_suffix_before_are_proposed():
    assert _proposed(_index([5, 6, 7, 8, 9, 5, 6]), 3) == [7, 8, 9]


def test_the_longest_suffix_that_occurred_before_wins_over_a_later_shorter_one():
    """(1 2 3 4) occurred, followed by 9; (3 4) occurred later, followed by 7: the copy of the
    longer match is proposed."""
    assert _proposed(_index([1, 2, 3, 4, 9, 5, 3, 4, 7, 1, 2, 3, 4]), 2) == [9, 5]


def test_of_equally_long_matches_the_latest_wins():
    assert _proposed(_index([1, 2, 7, 1, 2, 8, 1, 2]), 1) == [8]


def test_nothing_is_proposed_below_the_shortest_suffix():
    """Only a single token repeats (3): with shortest 2 nothing is proposed; with 1 it is."""
    tokens = [3, 4, 5, 6, 3]
    assert _proposed(_index(tokens), 4) == []
    assert _proposed(_index(tokens, shortest=1), 2) == [4, 5]
    assert _proposed(_index([1, 2]), 3) == []


def test_a_copy_that_runs_into_the_end_of_the_context_repeats_itself():
    """"1 2 1 2": the suffix (1 2) continues "1 2" after its first occurrence, which reaches
    the end of the context; what follows is the copy itself again."""
    assert _proposed(_index([1, 2, 1, 2]), 5) == [1, 2, 1, 2, 1]
    assert _proposed(_index([7, 7, 7]), 3) == [7, 7, 7]


def test_at_most_the_asked_tokens_are_proposed():
    tokens = list(range(10, 30)) + [10, 11]
    assert _proposed(_index(tokens), 4) == [12, 13, 14, 15]


def test_the_index_grows_with_the_tokens_that_stand_as_if_built_at_once():
    tokens = [4, 5, 6, 4, 5, 7, 8, 4, 5, 6, 9, 4, 5]
    grown = NgramIndex(2, 4)
    for k in range(0, len(tokens), 3):
        grown.extend(tokens[k:k + 3])
        assert _proposed(grown, 3) == _proposed(_index(tokens[:k + 3], 2, 4), 3)
    assert _proposed(grown, 3) == [6, 9, 4]


def test_of_several_occurrences_the_one_whose_context_agrees_furthest_back_is_copied():
    """(3 4) occurred three times; before the first, the context's own (1 2) as well: that
    occurrence is a longer match (4 tokens) than the later ones (2), so its copy is proposed,
    and `match` says how long the agreement runs."""
    tokens = [1, 2, 3, 4, 9, 9, 5, 3, 4, 7, 6, 3, 4, 8, 1, 2, 3, 4]
    index = _index(tokens, 2, 2)
    assert index.match() == (4, 4)
    assert _proposed(index, 2) == [9, 9]


def test_a_match_is_measured_back_to_where_the_contexts_part():
    """A copy under way: the last 20 tokens repeat the first 20, so the match is 20 tokens
    long though the index holds n-grams of at most 8."""
    copy = list(range(100, 120))
    index = _index(copy + [5, 6] + copy)
    assert index.match() == (20, 20)


def _drafter(tokens, costs=None) -> NgramDrafter:
    return NgramDrafter(_index(tokens), costs)


# a step 10 ms; verifying k tokens 10 + 5 (k - 1) ms: each drafted token costs half a step
HALF_A_STEP = VerifyCosts((1, 2, 4, 8, 16, 32), (0.010, 0.015, 0.025, 0.045, 0.085, 0.165), 4)


def test_without_costs_a_draft_is_no_longer_than_its_match():
    """SuffixDecoding's rule where nothing is measured (vLLM's drafter): a two-token match
    drafts two tokens, a copy twenty tokens long up to the most asked."""
    short = [1, 2, 7, 8, 9, 10, 11, 1, 2]
    assert _drafter(short).propose(0, 0, 8).tokens == [7, 8]
    copy = list(range(100, 140))
    assert len(_drafter(copy + [5] + copy[:20]).propose(0, 0, 8).tokens) == 8


def test_a_draft_is_as_long_as_the_acceptance_of_its_match_length_pays_for():
    """With verification costs: a long copy drafts long, as much as the expected kept tokens
    pay for; a match length whose drafts the backbone kept rejecting drafts nothing at all (a
    plain step is cheaper than a verification the backbone will cut at once)."""
    copy = list(range(100, 140))
    long = _drafter(copy + [5] + copy[:30], HALF_A_STEP)
    drafted = long.propose(0, 0, 16).tokens
    assert 4 <= len(drafted) <= 16 and drafted == copy[30:30 + len(drafted)]
    phrase = [1, 2, 3, 4, 5]   # a five-token match, its prior 4:1
    short = _drafter(phrase + [7, 8, 9, 10, 11] + phrase, HALF_A_STEP)
    for filler in (20, 21):       # tried, and cut at once, twice
        assert short.propose(0, 0, 8).tokens
        short.stood([filler])             # the backbone's token, not the draft's
        short.index.extend(phrase)
    assert short.propose(0, 0, 8).tokens == []
    two = _drafter([1, 2, 7, 8, 9, 10, 11, 1, 2], HALF_A_STEP)
    assert two.propose(0, 0, 8).tokens == []   # even odds on one token never pay half a step


def test_what_the_backbone_kept_of_a_draft_counts_towards_its_match_lengths_rate():
    """A draft of 4 of which 2 stood: 2 kept and one cut in its bucket; a round another
    source drafted (nothing proposed here) counts nothing."""
    copy = list(range(100, 110))
    drafter = _drafter(copy + [5] + copy[:6])
    drafts = drafter.propose(0, 0, 4).tokens
    b = bucket(6)
    before = attrs.evolve(drafter.acceptance[b])
    drafter.stood(drafts[:2] + [7])
    assert drafter.acceptance[b].kept == before.kept + 2
    assert drafter.acceptance[b].cut == before.cut + 1
    drafter.stood([8])
    assert drafter.acceptance[b].kept == before.kept + 2


def test_a_source_that_sizes_its_drafts_is_always_asked_for_its_most():
    """DraftLength shortens a source's length after a rejection, but not one that sizes its
    own drafts (the n-grams: a rejected two-token guess says nothing of the next long copy)."""
    length = DraftLength({"ngram": 16, "river": 4}, adaptive=True, sized={"ngram"})
    length.update(Round([0], 8, 0, [], 0.0, 0.01, "ngram"))
    length.update(Round([0], 4, 0, [], 0.0, 0.01, "river"))
    assert dict(length.order()) == {"ngram": 16, "river": 3} or not length.order()
    assert length._ways["ngram"].next == 16 and length._ways["river"].next == 3


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


class _Costs:
    """A draft store that knows verification costs already: each drafted token half a step
    (the embedded model's on an AVX2 EPYC at a long context, docs/backends.md), so what the
    rounds draft follows from the prompt, whatever a loaded machine would measure."""

    def __init__(self, layers: int) -> None:
        self.costs = attrs.evolve(HALF_A_STEP, layers=layers)

    def read(self, key):
        return self.costs

    def write(self, key, costs):
        pass


@pytest.mark.slow
def test_on_a_copying_prompt_the_round_drafts_from_ngrams(monkeypatch):
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
    monkeypatch.setattr(model, "_drafts", lambda: _Costs(model.backend.num_layers))
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

    monkeypatch.setattr("river_core.loop.speculative.verify_draft", lambda *args: None)
    comparison = lossless_against_plain(fastest_tiny_backend("llama", 0, 4), sources=NGRAM_DRAFTS,
                                        prompt=NGRAM_PROMPT, temperature=1.0)
    assert not comparison.same, comparison.summary()
