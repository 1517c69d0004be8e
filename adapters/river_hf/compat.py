"""Everything that depends on the transformers version or model family, in one place.

Tested with transformers 5.23 (pinned in pyproject.toml).
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch

from river_core.errors import ModelError

# model_type -> has a sandwich-normed block (Gemma: norms after attention and after the MLP too)
SUPPORTED = {"llama": False, "mistral": False, "qwen2": False, "qwen3": False,
             "gemma3_text": True}


def check_architecture(config) -> None:
    if config.model_type not in SUPPORTED:
        raise ModelError(f"unsupported architecture {config.model_type!r}; the hf backend "
                         f"supports {', '.join(SUPPORTED)}")
    if getattr(config, "attn_logit_softcapping", None) is not None:
        raise ModelError("attention logit soft-capping is not supported")


def layer_windows(config) -> list[int | None]:
    """Per layer: the sliding-window length, or None for full attention."""
    n = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if types is not None:
        return [window if t == "sliding_attention" else None for t in types]
    return [window] * n if config.model_type == "mistral" else [None] * n


def rope_keys(config) -> list[str | None]:
    """Per layer: which rotary table it uses (Gemma 3 has one per attention type)."""
    if config.model_type == "gemma3_text":
        return list(config.layer_types)
    return [None] * config.num_hidden_layers


def rotary(inner_model) -> Callable[[torch.Tensor, torch.Tensor, str | None], tuple]:
    """(x, position_ids, key) -> (cos, sin), from the model's own rotary module."""
    emb = inner_model.rotary_emb
    if "layer_type" in inspect.signature(emb.forward).parameters:
        return lambda x, pos, key: emb(x, pos, key)
    return lambda x, pos, key: emb(x, pos)


def final_softcap(config) -> float | None:
    return getattr(config, "final_logit_softcapping", None)


def chat_ids(tokenizer, prompt: str) -> list[int]:
    if tokenizer.chat_template is None:
        return tokenizer(prompt)["input_ids"]
    out = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                        add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if not isinstance(out, list) else out   # dict-like in v5
    return list(ids[0] if ids and isinstance(ids[0], list) else ids)


def eos_ids(model, tokenizer) -> set[int]:
    """Every id that ends generation: the generation config's and the tokenizer's."""
    eos = model.generation_config.eos_token_id
    ids = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
    return ids | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())


def inner(model):
    """The decoder stack of a *ForCausalLM."""
    return model.model


# -- what another backend needs to rebuild a block outside PyTorch --------------------------

STATIC_ROPE = ("default", "linear", "llama3", "yarn")   # inv_freq fixed after construction


def rope_frequencies(inner_model, key: str | None) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention scaling) of one rotary table: cos = cos(pos * inv_freq) * scaling."""
    emb = inner_model.rotary_emb
    prefix = "" if key is None else f"{key}_"
    kind = emb.rope_type if key is None else emb.rope_type[key]
    if kind not in STATIC_ROPE:
        raise ModelError(f"rotary type {kind!r} changes with the sequence length; only "
                         f"{', '.join(STATIC_ROPE)} can be exported")
    return getattr(emb, f"{prefix}inv_freq").float(), float(getattr(emb,
                                                                   f"{prefix}attention_scaling"))


def activation(config) -> str:
    return getattr(config, "hidden_activation", None) or config.hidden_act


def norm_scale(norm, config) -> tuple[torch.Tensor, float]:
    """(effective weight, eps) of an RMSNorm; Gemma scales by 1 + weight."""
    w = norm.weight.detach().float()
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    return (1 + w if config.model_type.startswith("gemma") else w), float(eps)


def embed_scale(embedding) -> float:
    return float(getattr(embedding, "scalar_embed_scale", 1.0))
