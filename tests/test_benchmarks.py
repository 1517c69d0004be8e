"""The benchmarks: every one runs at a tiny size (a tiny model, a few tokens, its results in a
temporary folder, the checkout untouched), and the harness's scoring and sandbox, which their
figures rest on."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from river_bench.library import gsm8k, humaneval
from river_cli.prompts import GSM8K_TRAIN as TRAIN   # bundled with River

ROOT = Path(__file__).resolve().parents[1]


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


def test_task_configs_name_exit_and_speculative_modes():
    from river_bench.library.runs import Config
    from river_core import ConfigError, ExitConfig

    river = Config.parse("river:0.2@int8")
    assert (river.exit_config, river.bits, river.model_key("onnx")) == \
        (ExitConfig(kv="river", policy="similarity", options={"threshold": 0.2}), 8, ("onnx", 8))
    assert Config.parse("river").exit_config == ExitConfig()   # the paper's rule
    assert Config.parse("river/settled:0.95").exit_config == \
        ExitConfig(kv="river", policy="settled", options={"tau": 0.95})
    assert Config.parse("mask/fixed:3").exit_config.options == {"layer": 3}
    assert Config.parse("llamacpp").model_key("hf") == ("llamacpp", 4)
    assert Config.parse("quantized@int8").exit_config.options == {"layer": -1}
    exact, adaptive = Config.parse("lossless/fixed:-1/4="), Config.parse("lossless/settled:0.97/6")
    assert exact.speculative and not Config.parse("river").speculative
    assert exact.exit_config == ExitConfig(mode="speculative", policy="fixed",
                                           options={"layer": -1}, draft_tokens=4,
                                           adaptive=False)
    assert (adaptive.exit_config.draft_tokens, adaptive.exit_config.adaptive) == (6, True)
    assert Config.parse("river/settled:0.95+stand-in-head").exit_config == \
        ExitConfig(kv="river", policy="settled", options={"tau": 0.95}, exit_head="stand-in")
    for bad in ("full:0.2", "river:0.2@int2", "river/teleport:1", "lossless/fixed:-1",
                "lossless/teleport:1/4", "lossless/fixed:-1/x", "river+head8"):
        with pytest.raises(ConfigError):
            Config.parse(bad)


def test_paper_summary_picks_the_fastest_river_that_recovers_half_the_gap():
    from river_bench.library.runs import paper_summary

    rows = {"full": {"speedup": 1.0, "nll_delta": 0.0},
            "quantized": {"speedup": 2.0, "nll_delta": 0.2},
            "river/settled:0.9": {"speedup": 1.9, "nll_delta": 0.15},    # recovers 25%
            "river/settled:0.95": {"speedup": 1.8, "nll_delta": 0.08},   # 60%
            "river/settled:0.97": {"speedup": 1.5, "nll_delta": 0.02}}   # 90%
    s = paper_summary(rows)
    assert s["river_config"] == "river/settled:0.95"
    assert abs(s["river_speed_vs_full_quant"] - 0.9) < 1e-9
    assert abs(s["nll_gap_recovered"] - 0.6) < 1e-9
    assert abs(s["every_river_config"]["river/settled:0.9"]["nll_gap_recovered"] - 0.25) < 1e-9
    assert paper_summary({"full": rows["full"]}) is None


@pytest.mark.parametrize("command", [["-m", "benchmarks"], ["-m", "river_cli.main", "bench"]])
def test_every_benchmark_explains_itself_from_any_folder(command, tmp_path, monkeypatch, capsys):
    """`python -m benchmarks` in a checkout, `river bench` anywhere (the installed package):
    each benchmark's help names it as it is run and describes it in full (the listing and one
    benchmark's help through each, in a process of its own; every benchmark's through `river
    bench`'s dispatcher, in this one, from an empty folder)."""
    import river_bench
    from river_cli.main import main

    cwd = ROOT if command[1] == "benchmarks" else tmp_path
    run = lambda *a: subprocess.run([sys.executable, *command, *a], cwd=cwd,
                                    capture_output=True, text=True, timeout=120)
    listing = run("--help")
    assert listing.returncode == 0
    names = [line.split()[0] for line in listing.stdout.splitlines()
             if line.startswith("  ") and not line.strip().startswith(("-", "name", "args"))]
    assert names == river_bench.names()

    def shows(name: str, text: str) -> None:
        assert f"usage: river bench {name}" in text, name
        assert river_bench.summary(name) in " ".join(text.split()), name
    shown = run(names[0], "--help")
    assert shown.returncode == 0
    shows(names[0], shown.stdout)
    if command[1] != "benchmarks":
        monkeypatch.chdir(tmp_path)
        for name in names[1:]:
            with pytest.raises(SystemExit) as done:
                main(["bench", name, "--help"])
            assert done.value.code == 0
            shows(name, capsys.readouterr().out)
    assert list(tmp_path.iterdir()) == []   # --help writes nothing


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """A tiny model with a long context, its results folder, and a runner."""
    from river_conformance.fixtures import tiny

    model = tiny.save(tmp_path_factory.mktemp("bench-model"), positions=4096)
    out = tmp_path_factory.mktemp("bench-out")

    def run(name: str, *args: str) -> Path:
        import river_bench

        river_bench.run(name, ["--out", str(out), *args], "river bench")
        return out
    run.model = model
    return run


has_vllm = importlib.util.find_spec("vllm") is not None
has_lm_eval = importlib.util.find_spec("lm_eval") is not None
has_ggml = importlib.util.find_spec("ggml") is not None
has_llama_cpp = importlib.util.find_spec("llama_cpp") is not None
TINY = [   # each benchmark at a tiny size, in an order that gives later ones their inputs
    ("tasks", "--configs", "full", "quantized", "river/settled:0.97", "lossless/fixed:-1/3=",
     "--gsm8k-limit", "1", "--humaneval-limit", "1", "--shots", "1", "--max-tokens", "4",
     "--name", "tasks-hf"),
    ("tasks", "--report", "tasks-hf", "--name", "lossless"),   # scaling reads its summary
    ("calibration", "--backend", "hf", "--prompts", "2", "--tokens", "2", "--gsm8k-limit", "1",
     "--max-tokens", "3", "--layer-prompts", "1", "--targets", "agreement=0.9"),
    ("oracle", "--backend", "hf", "--gsm8k-limit", "1", "--policies", "settled:0.97"),
    ("scaling", "--measure", "--batches", "1", "2"),
    ("grid", "--engines", "hf", "onnx", "transformers", "--shapes", "default", "tiny",
     "--configs", "backbone", "exit", "lossless", "whole-4bit", "exit@1", "lossless@8",
     "--positions", "8", "16", "--tokens", "3", "--prompts", "1"),
    pytest.param(("grid", "--engines", "ggml", "--shapes", "tiny", "--configs", "backbone",
                  "exit@1", "--positions", "8", "--tokens", "3", "--prompts", "1", "--name",
                  "grid-ggml"),
                 marks=pytest.mark.skipif(not has_ggml, reason="needs the ggml extra")),
    pytest.param(("ggml_kernels", "--count", "2", "--rows", "64", "--columns", "64",
                  "--tokens", "1", "2", "--repeats", "1"),
                 marks=pytest.mark.skipif(not has_ggml, reason="needs the ggml extra")),
    pytest.param(("kit_margins", "--subject", "ggml", "--prompts", "1"),
                 marks=pytest.mark.skipif(not has_ggml, reason="needs the ggml extra")),
    pytest.param(("ggml_cost", "--types", "F16", "--contexts", "8", "--decode", "2",
                  "--repeats", "1", "--llamacpp", "none"),   # the embedded model's F16 copy
                 marks=pytest.mark.skipif(not has_ggml, reason="needs the ggml extra")),
    pytest.param(("ggml_overhead", "--modes", "full depth", "--context", "8", "--short", "2",
                  "--long", "4", "--repeats", "1"),   # the embedded model's F16 copy
                 marks=pytest.mark.skipif(not has_ggml, reason="needs the ggml extra")),
    pytest.param(("first_call", "--types", "--shapes", "--llamacpp", "none", "--tokens", "2"),
                 marks=pytest.mark.skipif(not has_ggml, reason="needs the ggml extra")),
    pytest.param(("real_files", "--size", "small", "--families", "qwen2", "--no-more-types",
                  "--tokens", "4"),
                 marks=pytest.mark.skipif(not (has_ggml and has_llama_cpp),
                                          reason="needs the ggml and llamacpp extras")),
    ("projection", "--engine", "hf", "--shape", "tiny", "--positions", "8", "--prompts", "1",
     "--tokens", "4", "--repeats", "1"),
    # parts 2-5 at a random tiny shape (the suite's budget: part 1, the tests, runs in the lent
    # image's simulation, test_gpu_image.py; part 6 starts vLLM, whose sizing the dry run
    # checks and whose server the vllm benchmark's run starts)
    ("gpu", "--device", "cpu", "--shapes", "tiny", "--positions", "8", "--prompts", "1",
     "--tokens", "3", "--rounds", "1", "--parts", "2", "3", "4", "5"),
    ("first_contact", "--engines", "onnx", "--repeats", "2", "--short", "1", "--long", "0",
     "--short-tokens", "3", "--llamacpp", "none"),
    ("ngram", "--engines", "onnx", "--kinds", "summary", "gsm8k", "--prompts", "1",
     "--tokens", "3", "--llamacpp", "none"),
    ("levers",),
    ("frontier", "--questions", "1", "--tokens", "4", "--llamacpp", "none"),
    ("predictor_fidelity", "--prompts", "1", "--tokens", "2"),
    ("prefill_exit", "--problems", "1", "--exits", "1"),
    ("quantizers", "--solutions", "1"),
    ("river_kv_error", "--trials", "1", "--seeds", "1"),
    ("walk", "--engines", "hf", "--tokens", "2", "--rounds", "1"),
    ("paper_models",),
    # no sampled check (an engine more: the suite's budget; test_vllm.py's sampled tests are
    # the same check through the same engines)
    pytest.param(("vllm", "--prompts", "1", "--max-tokens", "4", "--rounds", "1", "--samples",
                  "0", "--backends", "hf", "--configs", "vllm plain",
                  "River lossless mode in vllm"),
                 marks=pytest.mark.skipif(not has_vllm, reason="needs the vllm extra")),
    pytest.param(("evaluate", "--servers", "river-exit", "--limit", "2", "--max-tokens", "4",
                  "--concurrent", "2", "--context", "1024"),
                 marks=pytest.mark.skipif(not (has_vllm and has_lm_eval),
                                          reason="needs the vllm and eval extras")),
]
NO_MODEL = {"river_kv_error", "paper_models", "ggml_kernels", "kit_margins", "ggml_cost",
            "ggml_overhead", "first_call", "real_files"}


def test_every_benchmark_runs_in_the_suite():
    import river_bench

    ran = {(p.values[0] if hasattr(p, "values") else p)[0] for p in TINY}
    assert ran == set(river_bench.names())


def grid_rows_cover_the_grid(out: Path) -> None:
    """Every (shape, engine, configuration, length) has its row; transformers' generate() runs
    the real model only; lossless mode's output is the backbone's; a token leaving early reads
    fewer bytes than one at full depth."""
    import json

    rows = json.loads((out / "grid.json").read_text())["rows"]
    cells = {(r["shape"], r["engine"], r["config"], r["positions"]) for r in rows}
    river = {(s, e, c, n) for s in ("default", "tiny") for e in ("hf", "onnx")
             for c in ("backbone", "exit", "lossless", "whole-4bit", "exit@1", "lossless@8")
             for n in (8, 16)}
    assert cells == river | {("default", "transformers", "backbone", n) for n in (8, 16)}
    by = {(r["shape"], r["engine"], r["config"], r["positions"]): r for r in rows}
    for s, e, c, n in river:
        r = by[(s, e, c, n)]
        assert r["ms_per_token"] > 0 and r["runs"] == 1
        if c.startswith("lossless"):
            assert r["same_as_backbone"] == 1.0 and r["limit_ms_per_token"] is None
            assert r["agreement"] == {"same": 1.0, "near tie": 0.0, "parted": 0.0}
        else:
            assert r["limit_ms_per_token"] > 0
    assert by[("tiny", "hf", "exit@1", 8)]["mean_layers_run"] == 2
    assert by[("tiny", "hf", "whole-4bit", 8)]["bytes_per_token"] < \
        by[("tiny", "hf", "exit@1", 8)]["bytes_per_token"] < \
        by[("tiny", "hf", "backbone", 8)]["bytes_per_token"]


def gpu_parts_are_each_recorded(out: Path) -> None:
    """On the CPU every part asked for runs, each in a process of its own, or says why not:
    GPU memory needs CUDA."""
    import json

    parts = json.loads((out / "gpu.json").read_text())["parts"]
    assert list(parts) == ["speed", "layers", "memory", "onnx"]
    assert {r["config"] for r in parts["speed"]["result"]["rows"]} == \
        {"backbone", "whole-4bit", "exit", "lossless", "exit@3"}
    assert set(parts["layers"]["result"]) == {"tiny"}
    assert max(parts["layers"]["result"]["tiny"]["int4_error"].values()) < 0.02
    assert {"prefill_ms", "plain_step_ms", "lossless_round_ms", "round_over_step"} <= \
        set(parts["layers"]["result"]["tiny"])
    assert parts["layers"]["result"]["tiny"]["transformers_agreement"]["same"] == 1.0
    assert parts["memory"] == parts["memory"] | {"status": "skipped"} and \
        "CUDA" in parts["memory"]["reason"]
    assert {r["engine"] for r in parts["onnx"]["result"]["rows"]} == {"onnx", "hf"}
    # what a lent machine's call brings back from $OUT: 8 files of 16 MiB at most (the suite's
    # folder holds every benchmark's results: gpu's are those named for it)
    files = [f for f in out.rglob("*") if f.is_file() and "gpu" in f.name]
    assert {f.name for f in files} == {"gpu.json", "gpu.md", "gpu.log"}
    assert all(f.stat().st_size <= 16 << 20 for f in files)


CHECKS = {"grid": grid_rows_cover_the_grid, "gpu": gpu_parts_are_each_recorded}

def test_gpu_dry_run_shows_each_parts_processes_dtype_memory_and_time(capsys, monkeypatch):
    """What a GPU host's call would run (every part's packages installed), without a GPU:
    each part a process with its time limit; the memory part one per shape and one without
    backbone weights; onnx at a dtype CUDA takes; vLLM sized from the free memory."""
    from river_bench import gpu

    monkeypatch.setattr(gpu, "missing", lambda number, args: None)
    gpu.main(["--dry-run", "--device", "cuda", "--shapes", "default", "llama-8b"])
    out = capsys.readouterr().out
    for unit in gpu.plan(gpu.argparse.Namespace(shapes=["default", "llama-8b"], rounds=2,
                                                prompts=2, tokens=64), gpu.PARTS, 16):
        assert f"unit {unit.shape or unit.name}: about {unit.estimate_s:.0f} s " \
            f"({unit.how}), at most {unit.limit_s} s" in out
    assert out.count("--child 4") == 2 and out.count("--child 2") == 2   # a unit a shape
    assert "engines: onnx:float16, hf:bfloat16" in out or \
        "engines: onnx:bfloat16, hf:bfloat16" in out
    assert "gpu_memory_utilization = (free - 1 GiB) / total" in out
    assert "19,562 MB weights" in out


def test_a_gpu_part_that_overruns_fails_alone_and_keeps_the_other_parts_rows(tmp_path):
    import json

    from river_bench import gpu

    info = {"cpu": "x", "cores": 1, "device": "cuda", "memory_bandwidth_gb_s": 1, "torch": "t"}
    earlier = {"part": 2, "date": "then", "command": "c", "status": "ran", "seconds": 1,
               "machine": info, "result": {"rows": []}}
    (tmp_path / "gpu.json").write_text(json.dumps({"parts": {"speed": earlier}}))
    gpu.main(["--out", str(tmp_path), "--parts", "1", "--device", "cpu", "--budget", "1"])
    parts = json.loads((tmp_path / "gpu.json").read_text())["parts"]
    assert parts["speed"] == earlier
    assert parts["tests"]["status"] == "failed" and "timed out" in parts["tests"]["error"]
    assert "| 1 tests | failed: timed out" in (tmp_path / "gpu.md").read_text()


def test_a_gpu_rerun_replaces_only_the_rows_it_measured():
    from river_bench.gpu import merged

    row = lambda shape, ms: {"shape": shape, "engine": "hf", "config": "exit",
                             "positions": 512, "ms_per_token": ms}
    old = {"rows": [row("llama-1b", 1.0), row("llama-8b", 2.0)]}
    assert merged(old, {"rows": [row("llama-8b", 3.0)]})["rows"] == \
        [row("llama-1b", 1.0), row("llama-8b", 3.0)]
    assert merged({"llama-1b": {"weights_mb": 1}}, {"llama-1b": {"exit mode": 2},
                                                    "tiny": {"weights_mb": 3}}) == \
        {"llama-1b": {"weights_mb": 1, "exit mode": 2}, "tiny": {"weights_mb": 3}}


@pytest.mark.parametrize("args", TINY, ids=lambda a: a[0])
def test_each_benchmark_runs_at_a_tiny_size(bench, args):
    name, *rest = args
    model = [] if name in NO_MODEL else ["--model", bench.model]
    out = bench(name, *model, *rest)
    assert any(out.glob("*.md")) and any(out.glob("*.json"))
    CHECKS.get(name, lambda out: None)(out)


def test_the_grid_names_river_configurations_as_exit_configs():
    from river_bench.grid import exit_config
    from river_core import ExitConfig

    assert exit_config("backbone") == ExitConfig(kv="full")
    assert exit_config("exit") == ExitConfig()   # the paper's rule: River's default
    assert exit_config("exit@3").options == {"layer": 3}
    assert exit_config("lossless@64") == ExitConfig(mode="speculative", draft_window=64)
    assert exit_config("lossless/3") == ExitConfig(mode="speculative", draft_tokens=3)
    for bad in ("fast", "backbone@2", "whole-4bit@1", "exit/2", "lossless/2@64"):
        with pytest.raises(SystemExit):
            exit_config(bad)


def test_the_kits_reference_engine_is_built_on_the_test_device(test_device):
    """RIVER_TEST_DEVICE reaches the engines the conformance kit and the tests build."""
    import torch

    from river_torch.plugin import tiny_backend

    assert tiny_backend("llama", 0, 8).device == torch.device(test_device)


def test_the_benchmarks_leave_the_checkout_as_it_was(bench, tmp_path, monkeypatch):
    """From any folder, with no --out: results go to ./river-results there, never into the
    checkout (a clean clone stays clean; where git is at hand, its status says so)."""
    import river_bench

    before = _status()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RIVER_RESULTS", raising=False)
    river_bench.run("river_kv_error", ["--trials", "1", "--seeds", "1"], "river bench")
    assert (tmp_path / "river-results" / "river-kv-error.md").is_file()
    assert _status() == before


def _status() -> str:
    if not (ROOT / ".git").exists():
        return ""
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                          capture_output=True, text=True).stdout


def test_the_checkouts_docs_are_written_only_when_asked():
    from river_bench.library import output

    assert output.IN_CHECKOUT   # this suite runs in a checkout
    assert output.Output(output.parser("x", "doc").parse_args([])).folder != output.DOCS
    assert output.Output(output.parser("x", "doc").parse_args(["--docs"])).folder == output.DOCS


def test_the_gsm8k_data_is_always_there():
    from river_bench.library.prompts import GSM8K_TRAIN

    assert GSM8K_TRAIN.is_file()   # the whole file beside a checkout, else the bundled slice


@pytest.mark.parametrize("kind, tolerance", [("F32", 0.0), ("F16", 1e-3), ("Q8_0", 1e-2)])
def test_the_anchors_ggufs_hold_the_same_weights_and_metadata(kind, tolerance, tmp_path):
    """llama.cpp's F32/F16/Q8_0 anchors are the source GGUF's weights stored another way."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from river_bench.library import anchors
    from river_conformance.fixtures.tiny_gguf import gguf_file

    source = GGUFReader(gguf_file())
    written = GGUFReader(anchors.write_gguf(gguf_file(), tmp_path / f"{kind}.gguf", kind))
    assert {n for n in source.fields if n != "general.file_type"} <= set(written.fields)
    assert written.fields["qwen2.block_count"].contents() == \
        source.fields["qwen2.block_count"].contents()
    for a, b in zip(source.tensors, written.tensors, strict=True):
        assert a.name == b.name
        x, y = (dequantize(t.data, t.tensor_type) for t in (a, b))
        assert np.abs(x - y).max() <= tolerance * max(np.abs(x).max(), 1e-6)


def test_first_contact_reads_llamacpps_closing_statistics():
    """llama-speculative-simple's "decoded N tokens in S seconds" and llama-completion's perf
    lines give the prompt's and the decoded tokens and ms/token."""
    from river_bench.first_contact import parse_llamacpp

    spec = parse_llamacpp("I encoded   16 tokens in    2.284 seconds, speed:    7.004 t/s\n"
                          "I decoded   20 tokens in    0.500 seconds, speed:   40.000 t/s\n"
                          "I n_accept  = 14\nI accept    = 82.353%\n")
    assert spec == {"prompt_tokens": 16, "decoded": 20, "ms_per_token": 25.0,
                    "acceptance_rate": 0.82353}
    plain = parse_llamacpp(
        "llama_perf_context_print: prompt eval time =      40.00 ms /    71 tokens\n"
        "llama_perf_context_print:        eval time =     180.00 ms /    10 runs   "
        "(   18.00 ms per token,    55.56 tokens per second)\n")
    assert plain == {"prompt_tokens": 71, "decoded": 10, "ms_per_token": 18.0,
                     "acceptance_rate": None}


@pytest.mark.parametrize("start, end, busy", [
    ((0.3, 30.0), (1.9, 29.0), None),                        # its own threads at the end
    ((2.5, 30.0), (2.0, 30.0), "load average 2.5 at the start"),
    ((0.5, 30.0), (4.5, 30.0), "load average 4.5 at the end"),
    ((0.5, 14.0), (0.5, 30.0), "copy bandwidth 14.0 GB/s at the start"),
    ((0.5, 30.0), (0.5, 4.8), "copy bandwidth 4.8 GB/s at the end"),
])
def test_a_busy_machine_is_told_by_its_load_and_bandwidth(start, end, busy):
    """docs/benchmarks.md's rule on 2 cores with a quiet copy bandwidth of 30 GB/s."""
    from river_bench.library import quiet

    found = quiet.busy(quiet.Reading(*start), quiet.Reading(*end), 2, 30.0)
    assert found is None if busy is None else found.startswith(busy)


@pytest.mark.parametrize("loads", [(0.2, 1.0), (3.0, 1.0)])
def test_a_docs_run_on_a_busy_machine_does_not_write_docs_results(loads, tmp_path,
                                                                   monkeypatch):
    """Fake readings: a quiet run writes docs/results with the machine's state recorded; a
    busy one writes the default folder instead, marked, and says so."""
    import argparse
    import json

    from river_bench.library import output, quiet

    docs, default = tmp_path / "docs", tmp_path / "results"
    monkeypatch.setattr(output, "DOCS", docs)
    monkeypatch.setattr(output, "IN_CHECKOUT", True)
    monkeypatch.setenv("RIVER_RESULTS", str(default))
    monkeypatch.setattr(output.os, "cpu_count", lambda: 2)
    readings = iter([quiet.Reading(loads[0], 30.0), quiet.Reading(loads[1], 29.0)])
    monkeypatch.setattr(quiet, "read", lambda bandwidth: next(readings))
    out = output.Output(argparse.Namespace(docs=True, out=None))
    out.write("result", {"figure": 1}, "# A result\n")
    busy = loads[0] > 2
    written = (default if busy else docs) / "result.json"
    assert not ((docs if busy else default) / "result.json").exists()
    state = json.loads(written.read_text())["machine_state"]
    assert state["load_average"] == {"start": loads[0], "end": 1.0}
    assert state["bandwidth_gb_s"] == {"start": 30.0, "end": 29.0} and state["cores"] == 2
    assert (state["busy"] is not None) == busy and "extensions" in state
    assert ("BUSY" in written.with_suffix(".md").read_text()) == busy
