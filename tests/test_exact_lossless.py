"""Issue 60, the exact mode a user can trust: lossless mode's greedy text is full depth's on
every engine, on every run, whatever drafts were tried (each verification computes its tokens
bitwise as steps: `Verifies.extend`, checked per engine by the conformance kit), and where no
draft can pay it takes full depth's own steps and nothing more."""

from __future__ import annotations

import numpy as np
import pytest

from river_core import ModelError, RiverModel
from river_core.contract.backend import Step
from river_core.method.verify_costs import VerifyCosts

# n-grams of the prompt repeat, so both sources propose; a fixed length drafts every round
# that has a proposal, so verifications of every width up to 5 tokens run
PROMPT = "one two three four five six seven eight nine ten, one two three four five six"
LOSSLESS = dict(chat=False, max_new_tokens=24, mode="speculative", drafts="river,ngram",
                policy="fixed", layer=0, draft_tokens=4, adaptive=False)


def _model(engine: str, tiny_folder) -> RiverModel:
    """ggml on the embedded model (a real one: its near ties are real); onnx and hf on a
    tiny random llama, whose flat logits put near ties everywhere."""
    if engine == "ggml":
        try:
            return RiverModel.from_pretrained(backend="ggml")
        except ModelError as e:
            pytest.skip(str(e))
    return RiverModel.from_pretrained(tiny_folder("llama"), backend=engine)


@pytest.mark.parametrize("engine", ["ggml", "onnx", "hf"])
def test_the_same_lossless_call_three_times_is_full_depths_text_each_time(engine, tiny_folder):
    model = _model(engine, tiny_folder)
    full = model.generate(PROMPT, chat=False, max_new_tokens=24, kv="full").stats.tokens
    for _ in range(3):
        got = model.generate(PROMPT, **LOSSLESS).stats
        assert got.tokens == full
        assert any(d > 1 for d in got.drafted)   # verifications of several tokens ran


@pytest.mark.parametrize("context, width", [(40, None), (600, None), (40, 4)])
def test_a_ggml_verification_is_its_steps_bitwise_on_either_side_of_512_keys(
        context, width, tiny_folder, monkeypatch):
    """On the embedded model, below and past the 512 keys from which ggml would split a lone
    query's keys among threads (a step there runs on its reference kernels: blocks.py); and
    a verification wider than the engine's exact width, run as several passes."""
    b = _model("ggml", tiny_folder).backend
    if width is not None:
        monkeypatch.setattr(b, "exact_width", width)
    prompt, cont = [100 + i % 500 for i in range(context)], [7, 300, 41, 9, 1200, 77]
    b.prefill([prompt], context + len(cont))
    steps = np.stack([b.decode([t], Step(context + j))[0] for j, t in enumerate(cont)])
    b.prefill([prompt], context + len(cont))
    assert np.array_equal(b.extend(cont, context), steps)


def test_where_no_draft_can_pay_lossless_mode_takes_full_depths_steps_and_nothing_more(
        tiny_folder, monkeypatch, tmp_path):
    """A machine whose verification of k tokens costs k steps: no acceptance could make a
    draft pay, so from the first round every round is a plain step, a one-token pass as full
    depth's decode step is, and no source is asked to propose (no per-round overhead)."""
    from river_core.loop import speculative
    from river_core.loop.drafting import DraftStore
    from river_core.loop.ngram import NgramSource

    monkeypatch.setenv("RIVER_CACHE", str(tmp_path))
    model = RiverModel.from_pretrained(tiny_folder("llama"))
    full = model.generate(PROMPT, chat=False, max_new_tokens=16, kv="full").stats.tokens
    steps = VerifyCosts((1, 2, 4, 8, 16), (0.01, 0.02, 0.04, 0.08, 0.16),
                        model.backend.num_layers)
    context = len(model.encode(PROMPT, chat=False)[0]).bit_length()
    DraftStore(model.backend).write(f"context {context}", steps)
    widths = []
    extend = model.backend.extend
    monkeypatch.setattr(model.backend, "extend",
                        lambda tokens, start: widths.append(len(tokens)) or extend(tokens, start))
    monkeypatch.setattr(speculative, "measure", lambda *a: pytest.fail("measured again"))
    for source in (speculative.RiverSource, NgramSource):
        monkeypatch.setattr(source, "start", lambda *a: pytest.fail("a source started"))
    got = model.generate(PROMPT, chat=False, max_new_tokens=16, mode="speculative",
                         drafts="river,ngram").stats
    assert got.tokens == full and set(got.draft_sources) == {"plain"}
    assert set(widths) == {1}


@pytest.mark.parametrize("fault", ["raises", "outside the vocabulary", "too many", "start"])
def test_a_draft_source_at_fault_costs_its_drafts_never_a_wrong_token(fault, tiny_folder,
                                                                      monkeypatch):
    """A draft source plugin that raises, drafts a token outside the vocabulary or more than
    it was asked: the generation drops it, says so once, and its text is full depth's."""
    from river_core.loop.ngram import NgramDrafter, NgramSource
    from river_core.loop.speculative import Drafts

    model = RiverModel.from_pretrained(tiny_folder("llama"))
    full = model.generate(PROMPT, chat=False, max_new_tokens=16, kv="full").stats.tokens
    faulty = {"raises": lambda self, token, position, gamma: 1 / 0,
              "outside the vocabulary": lambda self, token, position, gamma:
                  Drafts([10 ** 9], [None], []),
              "too many": lambda self, token, position, gamma:
                  Drafts([1] * (gamma + 1), [None] * (gamma + 1), [])}
    if fault == "start":
        monkeypatch.setattr(NgramSource, "start", lambda self, generation: 1 / 0)
    else:
        monkeypatch.setattr(NgramDrafter, "propose", faulty[fault])
    with pytest.warns(RuntimeWarning, match="draft source 'ngram' failed") as said:
        got = model.generate(PROMPT, **(LOSSLESS | {"max_new_tokens": 16,
                                                    "drafts": "ngram"})).stats
    assert got.tokens == full
    assert len([w for w in said if "draft source" in str(w.message)]) == 1


def test_a_huge_draft_length_is_full_depths_text(tiny_folder):
    """`--draft-tokens 100000`: a round drafts at most what the answer has left."""
    model = RiverModel.from_pretrained(tiny_folder("llama"))
    full = model.generate(PROMPT, chat=False, max_new_tokens=12, kv="full").stats.tokens
    got = model.generate(PROMPT, **(LOSSLESS | {"max_new_tokens": 12,
                                                "draft_tokens": 100_000})).stats
    assert got.tokens == full and max(got.drafted) <= 11
