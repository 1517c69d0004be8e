"""Plugin options: each plugin declares its own; users set them by name, from the CLI or the API."""

import attrs
import pytest

from river_core import ConfigError, ExitConfig, RiverModel
from river_cli.main import main
from river_core.contract.backend import ModelShape
from river_core.settings.options import parse
from river_core.plan import resolve
from river_core.plugins import default_registry
from river_torch.plugin import tiny_backend


def resolved(config: ExitConfig):
    """`config` resolved as the CLI does before loading: the backend's declared capabilities
    and the model's shape, no model."""
    registry = default_registry()
    return resolve(config, registry, registry.backend("hf").capabilities, ModelShape(6, 64), "hf")


@pytest.fixture(scope="module")
def model():
    return RiverModel(tiny_backend("llama", 0, 8))


def test_values_are_read_as_json_where_they_parse():
    assert parse(["threshold=0.2", "layer=-1", "min_layer=null", "name=abc"]) == \
        {"threshold": 0.2, "layer": -1, "min_layer": None, "name": "abc"}


def test_each_option_goes_to_the_plugin_that_declares_it():
    config = ExitConfig(policy="similarity", options={"threshold": 0.3, "momentum": 0.5})
    plan = resolved(config)
    assert plan.policy.threshold == 0.3 and plan.predictor_options.momentum == 0.5


@pytest.mark.parametrize("options, message", [
    ({"layer": 2}, "unknown option 'layer'; the chosen plugins take: min_layer, momentum, "
                   "threshold"),
    ({"tau": 2}, "unknown option 'tau'"),
    ({"threshold": 11}, "threshold must be in [0.0, 10.0]"),
    ({"min_layer": -2}, "min_layer must be an integer >= -1"),
    ({"momentum": "high"}, "momentum must be in [0.0, 1.0]"),
])
def test_bad_options_fail_before_any_model_is_needed(options, message):
    with pytest.raises(ConfigError) as e:
        resolved(ExitConfig(policy="similarity", options=options))
    assert str(e.value).startswith(message)


def test_similarity_policy_options_change_where_tokens_exit(model):
    late = model.generate("abc", chat=False, max_new_tokens=6, policy="similarity",
                          threshold=0.0, min_layer=3)
    early = model.generate("abc", chat=False, options={"threshold": 10.0, "min_layer": 1},
                           policy="similarity", max_new_tokens=6)
    assert set(early.stats.exit_layers[0]) == {1}
    assert min(late.stats.exit_layers[0]) >= 3


def test_fixed_policy_takes_its_layer(model):
    out = model.generate("abc", chat=False, policy="fixed", layer=2, max_new_tokens=4)
    assert set(out.stats.exit_layers[0]) == {2}


def test_predictor_momentum_is_passed_to_the_predictor(model):
    plan = model.plan(ExitConfig(options={"momentum": 0.25}))
    assert plan.run().new_predictor([0.1] * 6, [0.9] * 6).momentum == 0.25


def test_cli_sets_options_of_every_kind(tiny_folder, capsys):
    folder = tiny_folder("llama")
    args = ["generate", "abc", "--model", folder, "--no-chat", "--max-new-tokens", "3"]
    assert main(args + ["--policy", "fixed", "-o", "layer=1", "-o", "momentum=0.5"]) == 0
    assert "  2 | " in capsys.readouterr().err   # every token ran 2 backbone layers
    assert main(args + ["--policy", "similarity", "-o", "threshold=10", "-o", "min_layer=0"]) == 0
    assert "  1 | " in capsys.readouterr().err
    assert main(args + ["-o", "tau=-1", "-o", "min_layer=0"]) == 0   # the default: settled
    assert "  1 | " in capsys.readouterr().err


def test_plugins_lists_each_plugins_options(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    for line in ("-o threshold=0.15:", "-o min_layer=null:", "-o layer=null:", "-o tau=0.97:",
                 "-o momentum=0.9:"):
        assert line in out


def test_each_mode_runs_its_own_policy_where_none_is_named():
    """Exit mode: the paper's rule. Speculative mode: stand-ins-only drafts, adaptive; a named
    policy or given options replace the mode's, on the command line as in the API."""
    import argparse

    from river_core import arguments

    assert (ExitConfig().policy, ExitConfig().options) == ("settled", {})
    drafts = ExitConfig(mode="speculative")
    assert (drafts.policy, drafts.options, drafts.adaptive) == ("fixed", {"layer": -1}, True)
    assert ExitConfig(mode="speculative", policy="settled").options == {}
    assert ExitConfig(mode="speculative", options={"layer": 3}).options == {"layer": 3}
    parser = argparse.ArgumentParser()
    arguments.add_exit_arguments(parser)
    cli = lambda *a: arguments.exit_config(parser.parse_args(list(a)))
    assert cli("--mode", "speculative") == drafts
    assert cli("--mode", "speculative", "--no-adaptive-draft").adaptive is False
    assert cli("--mode", "speculative", "--policy", "settled", "-o", "tau=0.9") == \
        ExitConfig(mode="speculative", policy="settled", options={"tau": 0.9})


def test_every_setting_is_declared_once_for_every_command():
    """generate, calibrate and serve take the exit settings from the same declarations, with
    ExitConfig's and QuantSpec's defaults; River inside vLLM reads them back as the same
    ExitConfig and QuantSpec (adaptive drafting and the quantizer included)."""
    import argparse

    from river_core import QuantSpec, arguments
    from river_vllm import river_entry, settings

    for speculative in (True, False):
        parser = argparse.ArgumentParser()
        arguments.add_exit_arguments(parser, speculative=speculative)
        arguments.add_quant_arguments(parser)
        args = parser.parse_args([])
        assert arguments.exit_config(args) == ExitConfig()
        assert arguments.quant_spec(args) == QuantSpec()
    given = (ExitConfig(policy="similarity", options={"threshold": 0.3}, mode="speculative",
                        draft_tokens=3, adaptive=True), QuantSpec(bits=8, method="rtn"))
    assert settings(river_entry(*given)) == given
    never = (attrs.evolve(given[0], step_aside_above=None), given[1])
    assert settings(river_entry(*never)) == never
    assert river_entry(*settings({})) == {}   # only what differs from vLLM's defaults travels
