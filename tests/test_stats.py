"""Statistics that can be set side by side: one definition of ms/token in every mode, one
convention for layers (DecodeResult's docstring)."""

import numpy as np
import pytest

from river_core import DecodeResult, RiverModel


def test_ms_per_token_is_all_decode_time_over_decoded_tokens_in_every_mode():
    # 5 tokens: the first from prefill, 4 from decoding; exit mode: one step a token
    exit_mode = DecodeResult([[1, 2, 3, 4, 5]], [[0, 1, 2, 3]], 4, 0.5, [0.01, 0.02, 0.03, 0.10])
    assert exit_mode.ms_per_token == pytest.approx(160 / 4)
    assert exit_mode.median_step_ms == pytest.approx(25.0)
    # speculative: two rounds of 0.08 s yield the same 4 decoded tokens
    rounds = DecodeResult([[1, 2, 3, 4, 5]], [[0, 0, 0]], 4, 0.5, [0.08, 0.08],
                          drafted=[2, 1], accepted=[1, 1])
    assert rounds.ms_per_token == pytest.approx(160 / 4)
    assert np.isnan(rounds.median_step_ms)


def test_exit_layers_are_indices_and_layers_run_are_counts():
    stats = DecodeResult([[1, 2, 3, 4]], [[-1, 0, 3]], 4, 0.1, [0.01] * 3)
    assert stats.mean_layers_run == pytest.approx(np.mean([0, 1, 4]))
    assert stats.layers_run_histogram().tolist() == [1, 1, 0, 0, 1]   # 0, 1 and 4 layers run


@pytest.mark.parametrize("settings", [dict(policy="fixed", layer=1),
                                      dict(mode="speculative", policy="fixed", layer=-1,
                                           draft_tokens=2, adaptive=False)])   # drafts run
def test_the_cli_reports_both_modes_alike(tiny_folder, settings):
    model = RiverModel.from_pretrained(tiny_folder("llama"))
    stats = model.generate("abc", chat=False, max_new_tokens=8, **settings).stats
    from river_cli.main import report_stats
    first = report_stats(stats).splitlines()[0]
    assert f"{stats.ms_per_token:.1f} ms/token" in first
    assert f"{stats.mean_layers_run:.1f}/{stats.num_layers} backbone layers" in first


def test_one_definition_of_speed_and_counts_that_agree():
    """ms/token and tokens/s are both over the decoded tokens (prefill beside them), a single
    token prints no nan, and the histogram counts what the line says was decoded."""
    from river_cli.main import report_stats

    stats = DecodeResult([[1, 2, 3, 4, 5]], [[0, 1, 2, 3]], 4, 0.5, [0.01, 0.02, 0.03, 0.04])
    assert stats.decoded_tokens == 4 and stats.prefill_ms == pytest.approx(500)
    assert stats.tokens_per_second == pytest.approx(1000 / stats.ms_per_token)
    line, heading, *_ = report_stats(stats).splitlines()
    assert line.startswith("5 tokens: prefill 500 ms, 4 decoded at 25.0 ms/token")
    assert "40.0 tokens/s" in line and "(4 in all)" in heading
    one = report_stats(DecodeResult([[7]], [[]], 4, 0.2, []))
    assert "nan" not in one and one == "1 token: prefill 200 ms gave the only one, nothing " \
                                       "was decoded"


def test_a_speculative_run_that_drafted_nothing_reports_no_acceptance():
    """The adaptive draft length starts with a plain step, and may step aside for good: a
    speculative result without drafts has no acceptance, not a division error."""
    import math

    from river_core.loop.decode import DecodeResult

    r = DecodeResult(tokens=[[5, 6]], exit_layers=[[]], num_layers=4, prefill_seconds=0.1,
                     step_seconds=[0.02], drafted=[0], accepted=[0])
    assert r.speculative and math.isnan(r.acceptance_rate) and r.tokens_per_round == 1.0
    from river_cli.main import report_stats

    assert "speculative: no drafts, every round full depth's one-token step" in report_stats(r)
