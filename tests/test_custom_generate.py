"""River inside transformers: `model.generate(..., custom_generate=custom_generate)` on a plain
transformers model gives `river generate`'s tokens and honours transformers' own settings."""

import pytest
import torch
from transformers import (AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList,
                          StoppingCriteria, StoppingCriteriaList)

from river_core import ConfigError, ExitConfig, GenerationConfig, RiverModel
from river_torch.generate import custom_generate

SETTLED = ExitConfig(policy="settled", options={"tau": 0.5})   # exits a lot on a tiny model


@pytest.fixture(scope="module")
def folder(tiny_folder):
    return tiny_folder("llama")


@pytest.fixture(scope="module")
def hf(folder):
    return AutoModelForCausalLM.from_pretrained(folder).eval()


@pytest.fixture(scope="module")
def prompt(folder):
    return AutoTokenizer.from_pretrained(folder)("hello there, abc")["input_ids"]


def river(hf, ids, config=SETTLED, **settings):
    return hf.generate(torch.tensor([ids]), custom_generate=custom_generate, river=config,
                       **settings)[0, len(ids):].tolist()


@pytest.mark.parametrize("config", [SETTLED, ExitConfig(policy="similarity"),
                                    ExitConfig(kv="full")])
def test_greedy_tokens_are_river_generates(hf, folder, prompt, config):
    ours = RiverModel.from_pretrained(folder).generate_ids(
        [prompt], config, GenerationConfig(max_new_tokens=10)).tokens[0]
    theirs = river(hf, prompt, config, max_new_tokens=10, do_sample=False)
    assert theirs[:len(ours)] == ours
    if config.kv == "full":   # and full depth is transformers' own greedy output
        assert theirs == hf.generate(torch.tensor([prompt]), max_new_tokens=10,
                                     do_sample=False)[0, len(prompt):].tolist()


def test_max_new_tokens_and_eos(hf, prompt):
    free = river(hf, prompt, max_new_tokens=7, do_sample=False)
    assert len(free) == 7
    stop_at = free[3]
    ended = river(hf, prompt, max_new_tokens=7, do_sample=False, eos_token_id=stop_at)
    assert ended == free[:free.index(stop_at) + 1]


def test_a_finished_row_is_padded_while_the_others_go_on(hf, prompt):
    other = prompt[:3]
    free = [river(hf, p, max_new_tokens=6, do_sample=False) for p in (prompt, other)]
    stop_at = free[1][1]
    batch = torch.tensor([prompt, [0] * (len(prompt) - 3) + other])
    mask = torch.tensor([[1] * len(prompt), [0] * (len(prompt) - 3) + [1] * 3])
    out = hf.generate(batch, attention_mask=mask, custom_generate=custom_generate, river=SETTLED,
                      max_new_tokens=6, do_sample=False, eos_token_id=stop_at, pad_token_id=0)
    rows = out[:, len(prompt):].tolist()
    for row, alone in zip(rows, free):
        cut = alone.index(stop_at) + 1 if stop_at in alone else len(alone)
        assert row[:cut] == alone[:cut] and set(row[cut:]) <= {0}


class Forbid(LogitsProcessor):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores):
        scores[:, self.token] = -float("inf")
        return scores


class After(StoppingCriteria):
    def __init__(self, length):
        self.length = length

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.length)


def test_the_callers_logits_processors_and_stopping_criteria(hf, prompt):
    free = river(hf, prompt, max_new_tokens=6, do_sample=False)
    banned = river(hf, prompt, max_new_tokens=6, do_sample=False,
                   logits_processor=LogitsProcessorList([Forbid(free[0])]))
    assert free[0] not in banned
    stopped = river(hf, prompt, max_new_tokens=6, do_sample=False,
                    stopping_criteria=StoppingCriteriaList([After(len(prompt) + 2)]))
    assert stopped == free[:2]


def test_sampling_follows_torchs_generator(hf, prompt):
    def sampled(seed):
        torch.manual_seed(seed)
        return river(hf, prompt, max_new_tokens=8, do_sample=True, temperature=1.5, top_k=0)
    assert sampled(1) == sampled(1)
    assert len({tuple(sampled(s)) for s in range(4)}) > 1


def test_what_it_refuses(hf, prompt):
    with pytest.raises(ConfigError, match="exit mode"):
        river(hf, prompt, ExitConfig(mode="speculative"), max_new_tokens=3)
    with pytest.raises(ConfigError, match="one beam"):
        river(hf, prompt, max_new_tokens=3, num_beams=2)


def test_stand_ins_come_from_the_cache_the_cli_uses(folder, prompt, tmp_path, monkeypatch):
    """A model read from a local folder finds the stand-ins `river generate` made for that
    folder: quantized once, not in every process."""
    from river_models import quant

    monkeypatch.setenv("RIVER_CACHE", str(tmp_path))
    builds, build = [], quant.build_stand_ins
    monkeypatch.setattr(quant, "build_stand_ins", lambda *a: builds.append(1) or build(*a))
    RiverModel.from_pretrained(folder).generate_ids([prompt], SETTLED,
                                                    GenerationConfig(max_new_tokens=2))
    fresh = AutoModelForCausalLM.from_pretrained(folder).eval()   # a new model object
    river(fresh, prompt, max_new_tokens=2, do_sample=False)
    assert len(builds) == 1
