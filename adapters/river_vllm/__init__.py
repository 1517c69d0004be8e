"""River inside vLLM, through vLLM's own extension points (no patch to vLLM).

The entry point `river` in the group `vllm.general_plugins` calls `register()` in every vLLM
process: it registers River's model classes (models.py) under their own architecture names,
which a server selects with `--hf-overrides`:

    vllm serve FOLDER --hf-overrides '{"architectures": ["RiverLlamaForCausalLM"],
                                       "river": {"policy": "settled", "options": {"tau": 0.97}}}'

`river serve FOLDER` (serve.py) writes that for the model's family. Nothing here imports vLLM
at import time, so the package costs nothing to processes that never start vLLM.
"""

from river_core import Capabilities

# what River can do inside vLLM's step (known without importing vLLM); vLLM's speculative
# decoding verifies the drafts of lossless mode (drafter.py)
CAPABILITIES = Capabilities(exits=True, stand_in=True, sub_blocks=True, batch=True,
                            verify=True)

ARCHITECTURES = {
    "LlamaForCausalLM": "RiverLlamaForCausalLM",
    "Qwen2ForCausalLM": "RiverQwen2ForCausalLM",
    "Qwen3ForCausalLM": "RiverQwen3ForCausalLM",
}


def draft_config(draft_tokens: int = 4) -> dict:
    """vLLM's `speculative_config` for River's lossless mode (drafter.py)."""
    return {"method": "custom_class", "model": "river_vllm.drafter.RiverDrafter",
            "num_speculative_tokens": draft_tokens}


def register() -> None:
    """vLLM's general-plugin hook: River's classes, by name, imported lazily."""
    from vllm import ModelRegistry

    for river in ARCHITECTURES.values():
        if river not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(river, f"river_vllm.models:{river}")
