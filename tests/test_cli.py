"""The CLI and bad input: one clear message, a non-zero exit, no traceback, nothing half-written."""

import subprocess
import sys

import pytest

from river_cli.main import main

def run(*args):
    return subprocess.run([sys.executable, "-m", "river_cli.main", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("args, message", [
    (["generate", "hi", "--kv", "teleport"], "unknown kv strategy 'teleport'; available: "),
    (["generate", "hi", "--policy", "nope"], "unknown policy 'nope'"),
    (["generate", "hi", "--backend", "tpu"], "unknown backend 'tpu'"),
    (["generate", "hi", "--policy", "similarity", "-o", "threshold=-1"],
     "threshold must be in [0.0, 10.0]"),
    (["generate", "hi", "-o", "tau=2"], "tau must be in [-1.0, 1.0]"),
    (["generate", "hi", "-o", "treshold=0.2"], "unknown option 'treshold'; the chosen plugins take: "),
    (["generate", "hi", "-o", "threshold"], "options are key=value"),
    (["generate", "hi", "--policy", "fixed", "-o", "layer=0", "-o", "momentum=2"],
     "momentum must be in [0.0, 1.0]"),
    (["generate", "hi", "--bits", "3"], "stand-in precision must be 4 or 8 bits"),
    (["generate", "hi", "--max-new-tokens", "0"], "max_new_tokens must be >= 1, got 0"),
    (["generate", "   "], "empty prompt"),
    (["generate", "hi", "--model", "/nonexistent/model"], "model not found"),
    (["generate", "hi", "--device", "tpu"], "unknown device 'tpu'"),
    (["generate", "hi", "--backend", "hf", "--dtype", "int3"], "unknown dtype 'int3'"),
])
def test_bad_input_gets_one_clear_message(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cuda_where_there_is_none(capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["generate", "hi", "--device", "cuda"]) == 2
    assert "CUDA was asked for" in capsys.readouterr().err


def test_unknown_names_are_listed(capsys):
    main(["generate", "hi", "--kv", "teleport"])
    err = capsys.readouterr().err
    assert all(name in err for name in ("river", "propagate", "full"))


def test_corrupt_gguf_is_reported_and_leaves_no_cache(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    monkeypatch.setenv("RIVER_CACHE", str(tmp_path / "cache"))
    assert main(["generate", "hi", "--model", str(bad)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "river: error: broken.gguf: no general.architecture in its metadata (damaged, or not a "
        "model's GGUF)"]
    leftovers = [p for p in (tmp_path / "cache").glob("*/*") if p.parent.name != ".locks"]
    assert leftovers == []


def test_folder_without_config(tmp_path, capsys):
    assert main(["generate", "hi", "--model", str(tmp_path)]) == 2
    assert "not a Hugging Face model folder" in capsys.readouterr().err


def test_unsupported_architecture_names_the_supported_ones(tmp_path, capsys):
    from transformers import GPT2Config
    GPT2Config(n_layer=1, n_embd=32, n_head=2).save_pretrained(tmp_path)
    assert main(["generate", "hi", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unsupported architecture 'gpt2'" in err and "llama" in err and "gemma3_text" in err


def test_plugins_lists_every_kind_with_its_distribution():
    out = run("plugins")
    assert out.returncode == 0
    for name in ("hf", "similarity", "fixed", "transition", "river", "propagate", "full"):
        assert f"  {name} " in out.stdout
    assert "river-llm" in out.stdout
    assert "phi3" in out.stdout and "ministral3" in out.stdout   # the architectures


@pytest.mark.parametrize("args, message", [
    (["--kv", "mask", "--mode", "speculative"], "cannot draft"),
    (["--policy", "cascade", "--kv", "monotonic"], "recomputes doubtful tokens"),
    (["--backend", "llamacpp"], "cannot exit early"),
    (["--max-new-tokens", "100000"], "leaves no room for a prompt"),
    (["-o", "tau=2"], "tau"),
    (["--seed", "-1"], "seed must be >= 0, got -1"),
    (["--stop", ""], "a stop string must not be empty"),
    (["--temperature", "inf"], "temperature must be finite, got inf"),
    (["--top-k", "-2"], "top_k must be >= 0, got -2"),
])
def test_checks_that_need_no_model_run_before_it_loads(tiny_folder, monkeypatch, capsys, args,
                                                       message):
    import river_models

    def loaded(*a, **k):
        raise AssertionError("the model was loaded before the plan was checked")
    monkeypatch.setattr(river_models, "open_model", loaded)
    assert main(["generate", "hi", "--model", tiny_folder("llama"), *args]) == 2
    assert message in capsys.readouterr().err


def test_a_prompt_that_is_not_utf8_is_refused_with_its_byte_offset():
    for extra in ([], ["--no-chat"]):
        out = subprocess.run([sys.executable, "-m", "river_cli.main", "generate",
                              b"ok \xff\xfe bytes", *extra], capture_output=True, timeout=300)
        err = out.stderr.decode()
        assert out.returncode == 2 and "Traceback" not in err
        assert "prompt is not valid UTF-8: byte 0xff at byte offset 3" in err


def test_the_api_refuses_text_no_tokenizer_takes(tiny_folder):
    from river_core import ConfigError, RiverModel

    model = RiverModel.from_pretrained(tiny_folder("llama"))
    with pytest.raises(ConfigError, match="byte 0xfe at byte offset 2"):
        model.generate("ab\udcfe", max_new_tokens=2)
    with pytest.raises(ConfigError, match="lone surrogate U\\+D800 at character 1"):
        model.generate("a\ud800", max_new_tokens=2)


def test_a_prompt_file_that_is_not_utf8_is_refused_with_its_line(tmp_path):
    from river_cli.prompts import read_prompts
    from river_core import ConfigError

    bad = tmp_path / "prompts.txt"
    bad.write_bytes(b"first\nsecond \xc3\x28\n")
    with pytest.raises(ConfigError, match=r"byte 0xc3 at byte offset 13 \(line 2\)"):
        read_prompts(bad)


@pytest.mark.parametrize("keep", [1000, 30000])
def test_a_truncated_gguf_is_named_as_such(tmp_path, capsys, monkeypatch, keep):
    import shutil

    from river_conformance.fixtures.tiny_gguf import gguf_file

    cut = tmp_path / "cut.gguf"
    shutil.copy(gguf_file(0), cut)
    with cut.open("r+b") as f:
        f.truncate(keep)
    monkeypatch.setenv("RIVER_CACHE", str(tmp_path / "cache"))
    assert main(["generate", "hi", "--model", str(cut)]) == 2
    err = capsys.readouterr().err
    assert f"truncated GGUF {cut}: {keep} bytes, its " in err and "Traceback" not in err


def _offline(hub, cache):
    import os

    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub),
            "RIVER_CACHE": str(cache)}


def test_a_hub_id_offline_gets_one_clear_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "river_cli.main", "generate", "hi", "--model",
                          "some-org/not-here"], capture_output=True, text=True, timeout=300,
                         env=_offline(tmp_path / "hub", tmp_path / "cache"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "cannot fetch some-org/not-here from the Hugging Face hub" in out.stderr


def test_a_hub_id_resolves_to_the_hub_caches_snapshot(tmp_path, tiny_folder):
    """Laid out as huggingface_hub lays out its cache: refs/main names a snapshot folder."""
    import shutil

    repo = tmp_path / "hub" / "models--some-org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    shutil.copytree(tiny_folder("llama"), repo / "snapshots" / ("0" * 40))
    out = subprocess.run([sys.executable, "-m", "river_cli.main", "generate", "abc", "--model",
                          "some-org/tiny", "--no-chat", "--max-new-tokens", "3"],
                         capture_output=True, text=True, timeout=300,
                         env=_offline(tmp_path / "hub", tmp_path / "cache"))
    assert out.returncode == 0, out.stderr
    assert " tokens: prefill " in out.stderr and "backend hf" in out.stderr


@pytest.mark.parametrize("args, settings", [
    (["--seed", "-1"], {"seed": -1}),
    (["--stop", ""], {"stop": ""}),
    (["--temperature", "nan"], {"temperature": float("nan")}),
    (["--max-new-tokens", "0"], {"max_new_tokens": 0}),
])
def test_the_cli_and_the_api_refuse_a_setting_with_the_same_line(tiny_folder, capsys, args,
                                                                 settings):
    from river_core import ConfigError, RiverModel

    assert main(["generate", "hi", "--model", tiny_folder("llama"), *args]) == 2
    cli = capsys.readouterr().err.strip()
    with pytest.raises(ConfigError) as api:
        RiverModel.from_pretrained(tiny_folder("llama")).generate("hi", **settings)
    assert cli == f"river: error: {api.value}"


def test_river_serve_without_vllm_says_what_to_install(tiny_folder, monkeypatch, capsys):
    import importlib.util

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else find(name, *a))
    assert main(["serve", tiny_folder("llama")]) == 2
    err = capsys.readouterr().err
    assert "river serve runs vLLM, which is not installed: pip install -e '.[vllm]'" in err


def test_the_default_engine_is_ggml_where_it_runs_and_is_fastest(monkeypatch):
    """`river generate` with no --backend: llama.cpp's kernels for the embedded model or a GGUF
    on the CPU (the fastest engine at the defaults: docs/backends.md), hf for a folder, for a
    GPU, or without the ggml extra."""
    import importlib.util

    from river_cli.main import default_backend
    from river_core import default_registry

    registry = default_registry()
    has_ggml = importlib.util.find_spec("ggml") is not None
    assert default_backend(None, "cpu", registry) == ("ggml" if has_ggml else "hf")
    assert default_backend("model.gguf", "cpu", registry) == ("ggml" if has_ggml else "hf")
    assert default_backend("a/folder", "cpu", registry) == "hf"
    assert default_backend(None, "cuda", registry) == "hf"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert default_backend(None, "cpu", registry) == "hf"
