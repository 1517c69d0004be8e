"""The operating point: fitted once (`river fit`, or the first call that asks for exit mode) as
`river calibrate` fits it (to recover half the whole 4-bit model's NLL gap by default), checked
on held-apart prompts, timed against full depth, cached by the model's content and reused; a
short line states the point, or says no faster point exists and runs lossless mode instead. A
call that asks for nothing on a model without a point fits nothing and makes no stand-ins: it
runs lossless mode on n-gram drafts and says how to fit (issue 59)."""

import attrs
import pytest

from river_cli import operating_point as op
from river_cli.main import main
from river_cli.profile import DEFAULT_TARGET, Profile, Quality, Target, default_path
from river_conformance import example_backend
from river_core import ConfigError, ExitConfig, RiverModel
from river_core.plugins import default_registry


@pytest.fixture(autouse=True)
def small_fit(monkeypatch, tmp_path, request):
    """The fit's own procedure on a few short prompts (seconds on the tiny models), into a
    cache of the test's own (the embedded model's tests keep the session's: its builds)."""
    if not request.node.get_closest_marker("slow"):
        monkeypatch.setenv("RIVER_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "calibration.txt"
    text.write_text("How many legs?\nAdd 3 and 4.\nName a color.\nIs it red?\nCount to 5.\n"
                    "Say hi.\n")
    monkeypatch.setattr(op, "CALIBRATION", text)
    for name, value in (("FIT_PROMPTS", 4), ("HELD_APART", 2), ("TOKENS", 4),
                        ("SPEED_PROMPTS", 1), ("SPEED_TOKENS", 4),
                        ("FASTER", 0.0)):   # tiny models' speed shows nothing: fit them
        monkeypatch.setattr(op, name, value)


@pytest.fixture
def fits(monkeypatch):
    """The fits that ran, in order."""
    ran = []
    fit = op.fit_point

    def counted(*a, **k):
        ran.append(a[0])
        return fit(*a, **k)
    monkeypatch.setattr(op, "fit_point", counted)
    return ran


def model(seed: int = 0) -> RiverModel:
    return RiverModel(example_backend.make("llama", seed, 4), default_registry())


def test_the_gap_target_is_half_the_whole_4bit_models_nll_increase():
    whole = Quality(0.8, 0.4, 0.0)
    assert DEFAULT_TARGET == Target("gap", 0.5) == Target.parse("gap=0.5")
    assert DEFAULT_TARGET.resolved(whole) == Target("nll", 0.2)
    assert DEFAULT_TARGET.met(Quality(0.9, 0.2, 3.0), whole)
    assert not DEFAULT_TARGET.met(Quality(0.9, 0.21, 3.0), whole)
    assert Quality(0.9, 0.1, 3.0).recovered(whole) == pytest.approx(0.75)
    with pytest.raises(ConfigError, match="measured against the whole 4-bit model"):
        DEFAULT_TARGET.met(Quality(0.9, 0.1, 3.0))
    with pytest.raises(ConfigError, match="gap target is in"):
        Target("gap", 1.5)


def test_the_point_is_fitted_once_and_reused(fits):
    first = op.operating_point(model(), ExitConfig())
    assert len(fits) == 1 and first.point is not None and first.target == DEFAULT_TARGET
    assert default_path(fits[0].backend, "settled").is_file()
    again = op.operating_point(model(), ExitConfig())   # another process would find it too
    assert len(fits) == 1 and again == first
    point = first.point
    assert point.fitted.value == first.options["tau"] and point.default.value == 0.97
    assert point.fitted.speed > 0 and point.seconds > 0 and first.whole_model is not None


@pytest.fixture
def gguf(tmp_path):
    """A tiny random model as a GGUF file of its own (the ggml engine runs it)."""
    import shutil

    pytest.importorskip("ggml")
    from river_conformance.fixtures.tiny_gguf import gguf_file

    path = tmp_path / "models" / "tiny.gguf"
    path.parent.mkdir()
    shutil.copy(gguf_file(0), path)
    return path


GENERATE = ["generate", "abc", "--no-chat", "--max-new-tokens", "3"]


def test_a_first_call_fits_nothing_makes_no_stand_ins_and_says_how_to_fit(fits, gguf, capsys,
                                                                          tmp_path):
    import os

    assert main([*GENERATE, "--model", str(gguf)]) == 0
    err = capsys.readouterr().err
    assert fits == [] and "river: lossless mode (full depth's own output, n-gram drafts): no " \
        f"operating point fitted to this model yet; `river fit --model {gguf}` fits" in err
    made = lambda: {"ggml-stand-ins", "profiles"} & set(os.listdir(tmp_path / "cache"))
    assert not made()   # no stand-ins, no profile
    assert main([*GENERATE, "--model", str(gguf), "--kv", "full"]) == 0   # full depth: none
    assert not made() and fits == []


def test_river_fit_fits_once_and_generate_then_runs_the_point(fits, gguf, capsys):
    assert main(["fit", "--model", str(gguf)]) == 0
    out = capsys.readouterr().out
    assert len(fits) == 1 and "operating point" in out and "kept: " in out
    assert main([*GENERATE, "--model", str(gguf)]) == 0
    err = capsys.readouterr().err
    assert "no operating point" not in err and ("river: exit mode at tau=" in err or
                                                 "exit mode does not meet" in err)
    assert len(fits) == 1


def test_the_profile_is_keyed_by_the_models_content(fits, gguf, tmp_path, capsys):
    import shutil

    copy = tmp_path / "elsewhere" / "renamed.gguf"
    copy.parent.mkdir()
    shutil.copy(gguf, copy)
    assert main([*GENERATE, "--model", str(gguf), "--mode", "exit"]) == 0   # fits once
    assert "river: " in capsys.readouterr().err and len(fits) == 1
    assert main([*GENERATE, "--model", str(copy)]) == 0   # the same weights: the same point
    assert "no operating point" not in capsys.readouterr().err and len(fits) == 1
    op.operating_point(model(seed=1), ExitConfig())         # other weights: fitted anew
    assert len(fits) == 2


def test_overrides_are_honoured(fits, gguf, tiny_folder, capsys):
    generate = [*GENERATE, "--model", str(gguf)]
    assert main([*generate, "-o", "tau=0.9"]) == 0        # the user's own threshold
    assert main([*generate, "--no-profile"]) == 0         # the policy's defaults
    assert main([*generate, "--mode", "speculative"]) == 0   # lossless: nothing to fit
    assert main([*GENERATE, "--model", tiny_folder("llama")]) == 0   # a folder: calibrate's
    err = capsys.readouterr().err   # nothing fitted, no point stated
    assert fits == [] and "exit mode at" not in err and "does not meet" not in err
    assert main([*generate, "--target", "agreement=0.5"]) == 0
    err = capsys.readouterr().err
    assert "exit mode at tau=" in err or "does not meet agreement=0.5" in err
    assert main([*generate, "--target", "agreement=0.5"]) == 0   # saved for that target
    assert main(generate) == 0                                   # any saved target will do
    assert len(fits) == 1
    assert op.operating_point(model(), ExitConfig(options={"tau": 0.9})) is None
    assert op.operating_point(model(), ExitConfig(policy="fixed")) is None   # nothing to tune
    assert op.operating_point(model(seed=2), ExitConfig(), fit=False) is None and len(fits) == 1


def test_a_reached_point_runs_exit_mode_at_the_fitted_value(monkeypatch):
    monkeypatch.setattr(op, "FASTER", 0.0)   # any speed counts as faster
    profile = op.fit_point(model(), ExitConfig(), Target("agreement", 0.3))
    assert profile.point.reached
    config = op.chosen(profile, ExitConfig(), ExitConfig(mode="speculative"))
    assert config == ExitConfig(options={"tau": profile.options["tau"]})
    short = op.describe(profile, 4)
    assert short.startswith(f"river: exit mode at tau={profile.options['tau']:.4g}, fitted to "
                            f"this model (") and "--verbose" in short and "\n" not in short
    line = op.describe(profile, 4, verbose=True)
    assert line.startswith("operating point (agreement=0.3, fitted to this model once, in ")
    assert f" s): settled tau={profile.options['tau']:.4g}: " in line
    for figure in ("of 4 layers a token", "agreement", "NLL", "full depth's speed",
                   "the whole 4-bit model"):
        assert figure in line


def test_an_unreachable_target_says_so_and_runs_lossless_mode(monkeypatch):
    monkeypatch.setattr(op, "FASTER", 0.0)   # the fastest exit mode passes: the fit runs
    fitted = op.fit_point(model(), ExitConfig())
    profile = attrs.evolve(fitted, point=attrs.evolve(fitted.point, reached=False))
    lossless = ExitConfig(mode="speculative")
    assert op.chosen(profile, ExitConfig(), lossless) == lossless
    line = op.describe(profile, 4, verbose=True)
    assert line.startswith("operating point: no settled tau meets gap=0.5 at 0x full "
                           "depth's speed or more on this model")
    assert "so River runs lossless mode" in line and "-o tau=0.97, the policy's default (" in line
    assert "\n" not in line
    assert op.describe(profile, 4).startswith(
        "river: lossless mode (full depth's own output): on this model exit mode does not "
        "meet gap=0.5 at 0x full depth's speed (fitted once; --verbose")


def test_where_even_the_fastest_setting_is_not_faster_nothing_is_fitted(monkeypatch, gguf,
                                                                        capsys, fits):
    """The tuned option's permissive end runs the fewest layers a token, the fastest the
    policy runs: timed first, and where it is not FASTER than full depth the answer is clear
    before any fit (issue 59: 154 s on a 1.5B Q4_K_M whose exits all decode below full depth's
    speed)."""
    monkeypatch.setattr(op, "FASTER", 1e9)   # no exit is that much faster than full depth
    monkeypatch.setattr(op, "calibrate", None)   # never reached
    profile = op.fit_point(model(), ExitConfig())
    point = profile.point
    assert not point.reached and point.fitted is None and 0 < point.ceiling < 1e9
    assert not profile.met and profile.trials == () and profile.options == {}
    lossless = ExitConfig(mode="speculative")
    assert op.chosen(profile, ExitConfig(), lossless) == lossless
    line = op.describe(profile, 4, verbose=True)
    assert line.startswith("operating point: exit mode cannot pay on this model on this "
                           "machine: its fastest setting (tau=0.5, the fewest layers a token) "
                           f"decodes at {point.ceiling:.2f}x full depth's speed, below 1e+09x")
    assert "so nothing was fitted and River runs lossless mode" in line and "\n" not in line
    assert main([*GENERATE, "--model", str(gguf), "--mode", "exit"]) == 0
    err = capsys.readouterr().err
    assert "river: lossless mode (full depth's own output): exit mode cannot pay on this " \
        "model here: its fastest setting (tau=0.5" in err
    assert "speculative:" in err   # lossless mode's statistics
    path = default_path(fits[-1].backend, "settled")
    assert Profile.load(path).point.ceiling is not None   # kept: read back as written


def test_a_saved_profile_of_an_older_format_is_fitted_again(fits):
    path = default_path(model().backend, "settled")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"format": 1}')
    assert op.operating_point(model(), ExitConfig()).point is not None and len(fits) == 1
    assert Profile.load(path).point is not None


@pytest.mark.slow
@pytest.mark.parametrize("as_file", [False, True], ids=["default", "its GGUF as a file"])
def test_the_embedded_model_finds_its_shipped_profile(as_file):
    """Made by the same fit (river_cli/data/profiles); the fit runs for a model the user
    cache and River hold none for. The embedded GGUF passed as a user's file runs its Q4_1
    weights as they are (the default runs their F16 copy): a profile of its own."""
    pytest.importorskip("ggml")
    from river_models import default_gguf

    embedded = RiverModel.from_pretrained(str(default_gguf()) if as_file else None,
                                          backend="ggml")
    profile = op.operating_point(embedded, ExitConfig(), fit=False)
    assert profile is not None and profile.point is not None
    assert profile.target == DEFAULT_TARGET and not default_path(embedded.backend,
                                                                  "settled").exists()


def test_an_interrupted_fit_leaves_nothing_half_written(fits, gguf, monkeypatch, capsys,
                                                         tmp_path):
    """Ctrl-C inside `river fit`: exit status 130, no profile kept, and the next call runs
    as a first call does (the stand-ins, where made, are whole: the cache keeps only complete
    builds, tests/test_cache.py)."""
    def interrupted(*a, **k):
        raise KeyboardInterrupt
    calibrate = op.calibrate
    monkeypatch.setattr(op, "calibrate", interrupted)
    assert main(["fit", "--model", str(gguf)]) == 130
    assert "river: interrupted" in capsys.readouterr().err
    assert not list((tmp_path / "cache").rglob("profiles/*"))
    monkeypatch.setattr(op, "calibrate", calibrate)
    assert main([*GENERATE, "--model", str(gguf)]) == 0
    assert "no operating point fitted to this model yet" in capsys.readouterr().err
