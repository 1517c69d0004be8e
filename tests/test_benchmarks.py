"""The benchmark harness's scoring and sandbox, which its figures rest on."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.append(str(Path(__file__).parents[1] / "benchmarks"))   # last: benchmarks/vllm.py
# must not shadow the vllm package

import gsm8k  # noqa: E402
import humaneval  # noqa: E402

from river_cli.prompts import GSM8K_TRAIN as TRAIN  # noqa: E402  (bundled with River)


@pytest.mark.parametrize("text, answer", [
    ("She has 5 + 3 = 8 apples.\nThe answer is 8.", "8"),
    ("... so 1,250 dollars. The answer is $1,250.", "1250"),
    ("It costs 3.50 each, 7 in all", "7"),
    ("The answer is -4.\n\nQuestion: 12 apples", "-4"),
    ("no digits here", None),
])
def test_gsm8k_final_answer_extraction(text, answer):
    assert gsm8k.extract(text) == answer


def test_gsm8k_prompts_are_built_from_train_solutions():
    shots = gsm8k.load(str(TRAIN), limit=2)
    assert "<<" not in shots[0].solution and shots[0].solution.endswith(f"{shots[0].answer}.")
    assert gsm8k.correct(shots[0].solution, shots[0])
    prompt = gsm8k.prompt(shots[1], shots[:1])
    assert prompt.startswith("Question: ") and prompt.endswith("\nAnswer:")


def test_humaneval_reference_solution_passes_and_a_wrong_one_fails():
    problem = humaneval.load(limit=1)[0]   # has_close_elements
    good = ("    for i, a in enumerate(numbers):\n        for b in numbers[i + 1:]:\n"
            "            if abs(a - b) < threshold:\n                return True\n"
            "    return False\n")
    assert humaneval.check(problem, good) == (True, "passed")
    assert humaneval.check(problem, "    return True\n")[0] is False


@pytest.mark.parametrize("source, reason", [
    ("while True: pass", "timeout"),
    ("x = bytearray(2 << 30)", "MemoryError"),
])
def test_humaneval_sandbox_contains_runaway_programs(source, reason, monkeypatch):
    monkeypatch.setattr(humaneval, "CPU_SECONDS", 1)
    monkeypatch.setattr(humaneval, "WALL_SECONDS", 3)
    passed, why = humaneval.run_program(source)
    assert not passed and reason in why


def test_task_configs_name_a_strategy_policy_value_and_precision():
    import tasks
    from river_core import ConfigError, ExitConfig

    river = tasks.Config.parse("river:0.2@int8")
    assert (river.kv, river.policy, river.value, river.bits, river.model_key("onnx")) == \
        ("river", "similarity", 0.2, 8, ("onnx", 8))
    assert tasks.Config.parse("river/settled:0.95").exit_config() == \
        ExitConfig(kv="river", policy="settled", options={"tau": 0.95})
    assert tasks.Config.parse("mask/fixed:3").exit_config().options == {"layer": 3}
    assert tasks.Config.parse("llamacpp").model_key("hf") == ("llamacpp", 4)
    assert tasks.Config.parse("quantized@int8").exit_config().options == {"layer": -1}
    for bad in ("river", "full:0.2", "river:0.2@int2", "river/teleport:1"):
        with pytest.raises(ConfigError):
            tasks.Config.parse(bad)


def test_paper_summary_picks_the_fastest_river_that_recovers_half_the_gap():
    import tasks

    rows = {"full": {"speedup": 1.0, "nll_delta": 0.0},
            "quantized": {"speedup": 2.0, "nll_delta": 0.2},
            "river/settled:0.9": {"speedup": 1.9, "nll_delta": 0.15},    # recovers 25%
            "river/settled:0.95": {"speedup": 1.8, "nll_delta": 0.08},   # 60%
            "river/settled:0.97": {"speedup": 1.5, "nll_delta": 0.02}}   # 90%
    s = tasks.paper_summary(rows)
    assert s["river_config"] == "river/settled:0.95"
    assert abs(s["river_speed_vs_full_quant"] - 0.9) < 1e-9
    assert abs(s["nll_gap_recovered"] - 0.6) < 1e-9
    assert abs(s["every_river_config"]["river/settled:0.9"]["nll_gap_recovered"] - 0.25) < 1e-9
    assert tasks.paper_summary({"full": rows["full"]}) is None


@pytest.mark.parametrize("command", [["-m", "benchmarks"], ["-m", "river_cli.main", "bench"]])
def test_every_benchmark_explains_itself_from_any_folder(command, tmp_path):
    """`python -m benchmarks` in a checkout, `river bench` anywhere (the installed package)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    cwd = root if command[1] == "benchmarks" else tmp_path
    run = lambda *a: subprocess.run([sys.executable, *command, *a], cwd=cwd,
                                    capture_output=True, text=True, timeout=120)
    listing = run("--help")
    assert listing.returncode == 0
    names = [line.split()[0] for line in listing.stdout.splitlines()
             if line.startswith("  ") and not line.strip().startswith(("-", "name", "args"))]
    assert {"tasks", "lossless", "oracle", "reliability", "calibration", "speed"} <= set(names)
    for name in names:
        shown = run(name, "--help")
        assert shown.returncode == 0 and "usage" in shown.stdout, name
    assert list(tmp_path.iterdir()) == []   # --help writes nothing


def test_results_go_where_river_results_says_and_data_is_always_there(tmp_path):
    import os
    import subprocess

    code = "import common; print(common.RESULTS, common.GSM8K_TRAIN)"
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(gsm8k.__file__).parent,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "RIVER_RESULTS": str(tmp_path)})
    results, train = out.stdout.split()
    assert results == str(tmp_path)
    assert Path(train).is_file()   # the whole file beside a checkout, else the bundled slice


@pytest.mark.parametrize("kind, tolerance", [("F32", 0.0), ("F16", 1e-3), ("Q8_0", 1e-2)])
def test_the_anchors_ggufs_hold_the_same_weights_and_metadata(kind, tolerance, tmp_path):
    """llama.cpp's F32/F16/Q8_0 anchors are the source GGUF's weights stored another way."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    import anchors
    from river_llamacpp.tiny import gguf_file

    source = GGUFReader(gguf_file())
    written = GGUFReader(anchors.write_gguf(gguf_file(), tmp_path / f"{kind}.gguf", kind))
    assert {n for n in source.fields if n != "general.file_type"} <= set(written.fields)
    assert written.fields["qwen2.block_count"].contents() == \
        source.fields["qwen2.block_count"].contents()
    for a, b in zip(source.tensors, written.tensors, strict=True):
        assert a.name == b.name
        x, y = (dequantize(t.data, t.tensor_type) for t in (a, b))
        assert np.abs(x - y).max() <= tolerance * max(np.abs(x).max(), 1e-6)
