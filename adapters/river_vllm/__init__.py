"""River inside vLLM, through vLLM's own extension points (no patch to vLLM).

The entry point `river` in the group `vllm.general_plugins` calls `register()` in every vLLM
process: it registers River's model classes (models.py) under their own architecture names,
which a server selects with `--hf-overrides`:

    vllm serve FOLDER --enforce-eager --hf-overrides '{"architectures": ["RiverLlamaForCausalLM"],
                                                       "river": {"policy": "settled",
                                                                 "options": {"tau": 0.97}}}'

(River's forward refuses CUDA graphs, hence `--enforce-eager`.) `river serve FOLDER` (serve.py)
writes that for the model's family. Nothing here imports vLLM at import time, so the package
costs nothing to processes that never start vLLM.
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs

from river_core import Capabilities, ConfigError, ExitConfig, QuantSpec
from river_models.families import FAMILIES

# what River can do inside vLLM's step (known without importing vLLM): vLLM's speculative
# decoding verifies the drafts of lossless mode (drafter.py); its model sees tokens, not
# requests, so no state per sequence, and no rerun of chosen rows after a step
CAPABILITIES = Capabilities(exits=True, stand_in=True, sub_blocks=True, batch=True,
                            verify=True, windowed_drafts=True, sequences=False, rerun=False)
# rows decoding in one step above which River steps aside (vLLM's own step), per mode, where
# the settings name none: the crossover `river bench vllm --crossover` measured on the
# project's 2-core machine (docs/scaling.md); elsewhere measure it and set step_aside_above
STEP_ASIDE_ABOVE = {"exit": 4, "speculative": 1}
_EXIT = {f.name for f in attrs.fields(ExitConfig)}
_QUANT = {f.name for f in attrs.fields(QuantSpec)}


def settings(river: Mapping[str, Any] | None) -> tuple[ExitConfig, QuantSpec]:
    """The `river` entry of a model config: `ExitConfig`'s fields and `QuantSpec`'s (`bits`,
    `group_size`, `method`) by name, each defaulting as everywhere in River but
    `step_aside_above`, which defaults to the mode's measured crossover (STEP_ASIDE_ABOVE)."""
    river = dict(river or {})
    unknown = sorted(set(river) - _EXIT - _QUANT)
    if unknown:
        raise ConfigError(f"unknown River settings {unknown} in the model config; it takes "
                          f"{', '.join(sorted(_EXIT | _QUANT))}")
    if river.get("exit_head", "backbone") != "backbone":
        raise ConfigError("River inside vLLM gives every token the model's own head "
                          "(exit_head 'backbone'): vLLM computes a step's logits in one call")
    mode = river.get("mode", ExitConfig().mode)
    river.setdefault("step_aside_above", STEP_ASIDE_ABOVE.get(mode))
    return (ExitConfig(**{k: v for k, v in river.items() if k in _EXIT}),
            QuantSpec(**{k: v for k, v in river.items() if k in _QUANT}))


def river_entry(exit_config: ExitConfig, quant: QuantSpec) -> dict:
    """What `settings` reads back: the settings that differ from its defaults."""
    base = settings({"mode": exit_config.mode})[0]
    return {**({"mode": exit_config.mode} if exit_config.mode != ExitConfig().mode else {}),
            **{k: v for k, v in attrs.asdict(exit_config).items() if v != getattr(base, k)},
            **{k: v for k, v in attrs.asdict(quant).items() if v != getattr(QuantSpec(), k)}}


# a checkpoint's architecture (config.json) -> River's class for it, one for each family vLLM
# serves with River's exits (models.py makes it from the family's vLLM class)
ARCHITECTURES = {f.architecture: f"River{f.architecture}" for f in FAMILIES if f.vllm}


def model_overrides(config: Mapping[str, Any]) -> dict:
    """The `--hf-overrides` that run a model (its config.json) with River's class for its
    family, River's settings aside: the River architecture and `query_scaling`'s field."""
    family = (config.get("architectures") or ["?"])[0]
    if "text_config" in config:   # text and vision (a "mistral3"): vLLM runs it multimodal
        raise ConfigError(f"River inside vLLM runs text models; this is {family} (text and "
                          f"vision): serve a folder of its text model alone (docs/models.md)")
    if family not in ARCHITECTURES:
        raise ConfigError(f"River inside vLLM runs {', '.join(ARCHITECTURES)}; this model is "
                          f"{family}")
    return {"architectures": [ARCHITECTURES[family]], **query_scaling(config)}


def query_scaling(config: Mapping[str, Any]) -> dict:
    """Llama 4's position-dependent query scaling where vLLM 0.32 reads it:
    only from a Mistral-format config (`llama_4_scaling`). A Hugging Face config holds it in
    rope_parameters (`llama_4_scaling_beta`), which vLLM ignores, running every position from
    the original context on without it (docs/models.md); spelled out, vLLM's attention (and so
    River's walk) applies it as transformers and River's own engines do."""
    rope = config.get("rope_parameters") or {}
    if "llama_4_scaling" in config or rope.get("llama_4_scaling_beta") is None:
        return {}
    return {"llama_4_scaling": {
        "beta": rope["llama_4_scaling_beta"],
        "original_max_position_embeddings": rope["original_max_position_embeddings"]}}


def verifies(exit_config: ExitConfig, speculative_config: object | None) -> bool:
    """Whether River's forward verifies: lossless mode, read from the settings
    (`ExitConfig.lossless`, as every engine reads it), which must agree with vLLM's
    engine: a speculative config to verify with, and only then."""
    if exit_config.lossless != (speculative_config is not None):
        raise ConfigError("River's lossless mode inside vLLM is mode 'speculative' in the river "
                          "settings with a speculative config (river_vllm.draft_config()), "
                          "both or neither: `river serve --mode speculative` writes both")
    return exit_config.lossless


def draft_config(draft_tokens: int = ExitConfig().draft_tokens) -> dict:
    """vLLM's `speculative_config` for River's lossless mode (drafter.py)."""
    return {"method": "custom_class", "model": "river_vllm.drafter.RiverDrafter",
            "num_speculative_tokens": draft_tokens}


def register() -> None:
    """vLLM's general-plugin hook: River's classes, by name, imported lazily."""
    from vllm import ModelRegistry

    for river in ARCHITECTURES.values():
        if river not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(river, f"river_vllm.models:{river}")
