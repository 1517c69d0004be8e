"""`river calibrate`: a policy's threshold fitted to a quality target with forward passes only,
saved as a profile that `river generate` uses for that model and precision alone."""

import json

import attrs
import pytest

from river_conformance import example_backend
from river_core import ConfigError, ExitConfig, RiverModel
from river_cli.calibrate import calibrate, tuned_option
from river_cli.main import main
from river_core.settings.options import tuned
from river_core.plugins import default_registry
from river_cli.profile import Profile, Target, fingerprint
from river_cli.prompts import GSM8K_TEST_DEV, GSM8K_TRAIN, read_prompts

PROMPTS = [[3, 17, 5, 9], [11, 2, 40, 7, 7], [1, 30, 12], [25, 4, 19, 8]]


def model(seed: int = 0, bits: int = 4) -> RiverModel:
    return RiverModel(example_backend.make("llama", seed, bits), default_registry())


def fitted(target: Target, policy: str = "similarity", **kw) -> Profile:
    [profile] = calibrate(model(), PROMPTS, ExitConfig(policy=policy), [target], tokens=6,
                          layer_prompts=2, **kw)
    return profile


@pytest.mark.parametrize("target", [Target("agreement", 0.6), Target("nll", 0.05)])
def test_the_fit_is_the_most_permissive_value_tried_that_meets_the_target(target):
    profile = fitted(target)
    value = profile.options["threshold"]   # similarity: a larger threshold lets more out
    assert target.met(profile.quality)
    assert any(t.value == value and t.quality == profile.quality for t in profile.trials)
    assert all(not target.met(t.quality) for t in profile.trials if t.value > value)


def test_full_agreement_is_always_within_reach():
    # the strict end exits no token: full depth itself
    assert fitted(Target("agreement", 1.0)).quality.agreement == 1.0


def test_the_layer_table_has_every_exit_and_the_real_kv_error():
    profile = fitted(Target("agreement", 0.5))
    n = model().backend.num_layers
    assert [r.exit_layer for r in profile.layers] == list(range(-1, n - 1))
    assert all(r.kv_error is not None and 0.0 < r.kv_error < 1.0 for r in profile.layers)
    assert all(r.quality.mean_layers == r.exit_layer + 1 for r in profile.layers)


def test_a_profile_survives_a_round_trip_and_refuses_another_model(tmp_path):
    profile = fitted(Target("agreement", 0.6), model_name="tiny", precision="int4")
    path = profile.save(tmp_path / "p.json")
    assert Profile.load(path) == profile
    profile.check(model().backend, path)
    with pytest.raises(ConfigError, match="was made for tiny"):
        profile.check(model(seed=1).backend, path)
    with pytest.raises(ConfigError, match="was made for tiny"):
        profile.check(model(bits=8).backend, path)   # another river precision
    assert fingerprint(model().backend) == fingerprint(model().backend)


def test_profile_options_yield_to_the_users_own(tmp_path):
    profile = fitted(Target("agreement", 0.6))
    config = ExitConfig(policy="similarity")
    assert profile.exit_config(config).options == profile.options
    mine = attrs.evolve(config, options={"threshold": 0.5})
    assert profile.exit_config(mine).options == {"threshold": 0.5}
    with pytest.raises(ConfigError, match="for policy similarity"):
        profile.exit_config(ExitConfig(policy="settled"))


def test_a_profile_of_another_format_is_refused(tmp_path):
    path = fitted(Target("agreement", 0.6)).save(tmp_path / "p.json")
    path.write_text(json.dumps({**json.loads(path.read_text()), "format": 0}))
    with pytest.raises(ConfigError, match="calibrate again"):
        Profile.load(path)


@pytest.mark.parametrize("config, message", [
    (ExitConfig(policy="fixed"), "marks no option for calibration"),
    (ExitConfig(options={"tau": 0.9}), "calibration fits tau: leave it unset"),
    (ExitConfig(mode="speculative", kv="river"), "lossless already"),
])
def test_what_cannot_be_calibrated_is_refused(config, message):
    with pytest.raises(ConfigError, match=message):
        tuned_option(default_registry(), config)


@pytest.mark.parametrize("text", ["agreement=1.5", "nll=-1", "speed=2", "agreement"])
def test_bad_targets(text):
    with pytest.raises(ConfigError):
        Target.parse(text)


def test_every_tuned_option_is_valid_at_both_ends():
    registry = default_registry()
    marked = {}
    for name, entry in registry.entries("policy").items():
        mark = tuned(entry.plugin.options)
        if mark:
            option, strict, permissive = mark
            for value in (strict, permissive):
                entry.plugin.options(**{option: value})   # in range: no ConfigError
            marked[name] = option
    assert marked == {"settled": "tau", "similarity": "threshold", "cascade": "margin",
                      "confidence": "threshold", "entropy": "threshold"}


def test_prompt_files(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"question": "a?"}\n{"prompt": "b"}\n\n{"text": "c", "x": 1}\n')
    assert read_prompts(jsonl) == ["a?", "b", "c"]
    assert read_prompts(jsonl, limit=1, offset=1) == ["b"]
    text = tmp_path / "p.txt"
    text.write_text("one\n\ntwo\n")
    assert read_prompts(text) == ["one", "two"]
    jsonl.write_text('{"answer": 1}\n')
    with pytest.raises(ConfigError, match="line 1 has none of the fields"):
        read_prompts(jsonl)
    with pytest.raises(ConfigError, match="no prompts"):
        read_prompts(text, offset=5)
    with pytest.raises(ConfigError, match="cannot read prompts"):
        read_prompts(tmp_path / "missing.txt")


def test_the_bundled_gsm8k_slices_and_their_licence():
    assert len(read_prompts(GSM8K_TRAIN)) == 500
    assert len(read_prompts(GSM8K_TEST_DEV)) == 200
    assert "MIT License" in (GSM8K_TRAIN.parent / "LICENSE").read_text()


def test_calibrate_then_generate_uses_the_profile(tiny_folder, tmp_path, capsys):
    folder = tiny_folder("llama")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("abc\nhello there\nxyz xyz\n")
    args = ["--model", folder, "--no-chat"]
    assert main(["calibrate", *args, "--prompts", str(prompts), "--tokens", "4",
                 "--layer-prompts", "1", "--target", "agreement=0.5"]) == 0
    out = capsys.readouterr().out
    assert "saved" in out and "every token exiting after layer k" in out
    generate = ["generate", "abc", *args, "--max-new-tokens", "3"]
    assert main(generate) == 0
    assert "calibrated: settled tau=" in capsys.readouterr().err
    assert main([*generate, "--no-profile"]) == 0
    assert "calibrated" not in capsys.readouterr().err
    assert main([*generate, "-o", "tau=0.9"]) == 0   # the user's own value: no profile
    assert "calibrated" not in capsys.readouterr().err
    assert main([*generate, "--policy", "similarity"]) == 0   # no profile for this policy
    assert "calibrated" not in capsys.readouterr().err


def test_generate_refuses_a_profile_made_for_another_model(tiny_folder, tmp_path, capsys):
    other = attrs.evolve(fitted(Target("agreement", 0.6)), model="another model")
    path = other.save(tmp_path / "other.json")
    code = main(["generate", "abc", "--model", tiny_folder("llama"), "--no-chat",
                 "--profile", str(path)])
    assert code == 2
    assert "was made for another model" in capsys.readouterr().err


def test_no_layer_prompts_means_no_layer_table(tiny_folder, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("abc\nhello there\n")
    assert main(["calibrate", "--model", tiny_folder("llama"), "--no-chat", "--prompts",
                 str(prompts), "--tokens", "3", "--layer-prompts", "0", "--target",
                 "agreement=0.5", "--out", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert "no per-layer table" in out and "every token exiting after layer k" not in out
