"""The Python API on a tiny model saved to disk, loaded through the `hf` entry point."""

import pytest

from river_core import ConfigError, ExitConfig, RiverModel
from river_cli.main import main


@pytest.fixture(scope="module")
def folder(tiny_folder):
    return tiny_folder("llama")


def test_generate_returns_text_and_stats(folder):
    model = RiverModel.from_pretrained(folder)
    out = model.generate("abc", chat=False, max_new_tokens=6, min_layer=1)
    assert isinstance(out.text, str)
    assert 1 <= len(out.stats.tokens[0]) <= 6
    assert out.stats.layers_run_histogram().sum() == len(out.stats.exit_layers[0])
    assert 0.0 <= out.stats.skipped_share <= 1.0


def test_batch_of_prompts(folder):
    out = RiverModel.from_pretrained(folder).generate(["abc", "hello there"], chat=False,
                                                      max_new_tokens=4)
    assert len(out.texts) == 2


def test_stop_string_ends_generation(folder):
    model = RiverModel.from_pretrained(folder)
    free = model.generate("abc", chat=False, max_new_tokens=12, kv="full")
    stop = free.text[2:4]
    stopped = model.generate("abc", chat=False, max_new_tokens=12, kv="full", stop=[stop])
    assert len(stopped.stats.tokens[0]) < len(free.stats.tokens[0])
    assert stop not in stopped.text and free.text.startswith(stopped.text)


def test_sampling_is_reproducible_with_a_seed(folder):
    model = RiverModel.from_pretrained(folder)
    a = model.generate("abc", chat=False, max_new_tokens=8, temperature=1.0, top_p=0.9, seed=3)
    b = model.generate("abc", chat=False, max_new_tokens=8, temperature=1.0, top_p=0.9, seed=3)
    assert a.stats.tokens == b.stats.tokens


def test_bad_options(folder):
    model = RiverModel.from_pretrained(folder)
    with pytest.raises(ConfigError, match="unknown option"):
        model.generate("abc", temprature=1.0)
    with pytest.raises(ConfigError, match="past the model's last layer"):
        model.generate("abc", min_layer=99)
    with pytest.raises(ConfigError, match="exceeds the model's context"):
        model.generate("a" * 250, chat=False, max_new_tokens=10)
    with pytest.raises(ConfigError, match="fixed policy needs a layer"):
        model.generate("abc", exit_config=ExitConfig(policy="fixed"))


def test_cli_generate_prints_text_and_stats(folder, capsys):
    assert main(["generate", "abc", "--model", folder, "--no-chat", "--max-new-tokens", "5",
                 "-o", "min_layer=1"]) == 0
    err = capsys.readouterr().err
    assert "ms/token (median step" in err and "tokens/s" in err
    assert "backbone layers on average" in err
    assert "% of layers skipped" in err and "histogram of backbone layers run" in err
