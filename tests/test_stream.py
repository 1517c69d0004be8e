"""Streaming: tokens as they are chosen, with their exit layer; the same tokens as generate."""

import pytest

from river_core import RiverModel
from river_cli.main import main


@pytest.fixture(scope="module")
def model(tiny_folder):
    return RiverModel.from_pretrained(tiny_folder("llama"))


@pytest.mark.parametrize("settings", [dict(policy="fixed", layer=1), dict(kv="full"),
                                      dict(mode="speculative", policy="fixed", layer=-1)],
                         ids=["river", "full", "speculative"])
def test_a_stream_yields_what_generate_returns_token_by_token(model, settings):
    whole = model.generate("abc", chat=False, max_new_tokens=16, **settings).stats
    stream = model.stream("abc", chat=False, max_new_tokens=16, **settings)
    tokens = list(stream)
    assert [t.id for t in tokens] == whole.tokens[0] == stream.ids()
    assert stream.stats.tokens == whole.tokens and not stream.stats.interrupted
    last = model.backend.num_layers - 1
    if whole.speculative:   # every token the backbone's; kept drafts marked (the adaptive
        # draft length follows measured time, so rounds are compared within one run)
        assert {t.exit_layer for t in tokens} == {last}
        assert sum(t.drafted for t in tokens) == sum(stream.stats.accepted)
    else:   # the first from prefill at full depth, then each step's exit
        assert [t.exit_layer for t in tokens] == [last] + whole.exit_layers[0][:len(tokens) - 1]


def test_a_stream_stopped_early_keeps_what_came(model):
    stream = model.stream("abc", chat=False, max_new_tokens=30, kv="full")
    first = [next(stream).id for _ in range(5)]
    stats = stream.interrupt()
    assert stats.interrupted and stats.tokens[0] == first
    assert list(stream) == []


def test_cli_stream_prints_what_generate_prints(tiny_folder, capsys):
    args = ["generate", "abc", "--model", tiny_folder("llama"), "--no-chat",
            "--max-new-tokens", "12", "--kv", "full"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main(args + ["--stream"]) == 0
    assert capsys.readouterr().out == plain
    stop = plain[3:5]
    assert main(args + ["--stream", "--stop", stop]) == 0
    assert stop not in capsys.readouterr().out


def test_cli_stream_interrupted_prints_text_and_statistics(tiny_folder, ctrl_c_at_step,
                                                           capsys):
    ctrl_c_at_step(5)
    assert main(["generate", "abc", "--model", tiny_folder("llama"), "--no-chat", "--stream",
                 "--max-new-tokens", "30"]) == 130
    out, err = capsys.readouterr()
    assert out.strip() and "interrupted: what came before Ctrl-C" in err and "tokens: prefill" in err
