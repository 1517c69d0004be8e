"""A loaded transformers causal LM as River's `ModelSpec` and `Weights` (`describe`): every
transformers detail in one place, each family's quirks from its record (river_models.families).
Tested with transformers 5.23 (pinned in pyproject.toml).
"""

from __future__ import annotations

import numpy as np

from river_core.settings.errors import ModelError

from .families import BY_MODEL_TYPE, WRAPPERS
from .spec import ACTIVATIONS, LayerWeights, ModelSpec, QueryScale, Rotary, Weights

STATIC_ROPE = ("default", "linear", "llama3", "yarn")   # inv_freq fixed after construction


def text_config(config):
    """The config of the model River runs: a wrapper's text model's, else `config`."""
    if config.model_type not in WRAPPERS:
        return config
    text = config.text_config
    if text.model_type != WRAPPERS[config.model_type]:
        raise ModelError(f"a {config.model_type!r} checkpoint whose text model is "
                         f"{text.model_type!r}; River reads its {WRAPPERS[config.model_type]!r}")
    return text


def text_model(wrapper):
    """A wrapper's (transformers *ForConditionalGeneration) language model and head as the
    *ForCausalLM `describe` reads, sharing their weights; the vision tower is left out."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):   # every module is replaced below: nothing to allocate
        causal = AutoModelForCausalLM.from_config(wrapper.config.text_config)
    causal.model, causal.lm_head = wrapper.model.language_model, wrapper.lm_head
    causal.generation_config = wrapper.generation_config
    return causal.eval()


def check_architecture(config) -> None:
    config = text_config(config)
    if config.model_type not in BY_MODEL_TYPE:
        raise ModelError(f"unsupported architecture {config.model_type!r}; River "
                         f"supports {', '.join(BY_MODEL_TYPE)} (and {', '.join(WRAPPERS)}: "
                         f"their text model)")
    if getattr(config, "attn_logit_softcapping", None) is not None:
        raise ModelError("attention logit soft-capping is not supported")
    activation = getattr(config, "hidden_activation", None) or config.hidden_act
    if activation not in ACTIVATIONS:
        raise ModelError(f"activation {activation!r} is not supported; River supports "
                         f"{', '.join(ACTIVATIONS)}")


def _windows(config) -> tuple[int | None, ...]:
    n = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if types is not None:
        return tuple(window if t == "sliding_attention" else None for t in types)
    return (window,) * n if BY_MODEL_TYPE[config.model_type].windowed else (None,) * n


def _rope_keys(config) -> tuple[str, ...]:
    """One rotary table per attention type where the family has them; else one table."""
    if BY_MODEL_TYPE[config.model_type].rope_per_layer_type:
        return tuple(config.layer_types)
    return ("",) * config.num_hidden_layers


def _floats(t) -> tuple[float, ...]:
    return tuple(float(f) for f in t.float().cpu().numpy())


def _rotary(inner, config, key: str) -> Rotary:
    emb = inner.rotary_emb
    prefix = f"{key}_" if key else ""
    kind = emb.rope_type[key] if key else emb.rope_type
    scaling = float(getattr(emb, f"{prefix}attention_scaling"))
    if kind == "longrope":   # the short table is the one built; the long one as transformers
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS   # switches to it

        switch = config.rope_parameters["original_max_position_embeddings"]
        long_freq, _ = ROPE_INIT_FUNCTIONS[kind](config, None, seq_len=switch + 1)
        return Rotary(_floats(emb.original_inv_freq), scaling, _floats(long_freq), switch)
    if kind not in STATIC_ROPE:
        raise ModelError(f"rotary type {kind!r} changes with the sequence length; River "
                         f"supports {', '.join(STATIC_ROPE + ('longrope',))}")
    return Rotary(_floats(getattr(emb, f"{prefix}inv_freq")), scaling)


def _query_scale(config) -> QueryScale | None:
    """Llama 4's position-dependent query scaling, where the family has it and the config
    sets it."""
    rope = getattr(config, "rope_parameters", None) or {}
    beta = rope.get("llama_4_scaling_beta") if BY_MODEL_TYPE[config.model_type].query_scale \
        else None
    return None if beta is None else QueryScale(float(beta),
                                                int(rope["original_max_position_embeddings"]))


def eos_ids(model, tokenizer) -> tuple[int, ...]:
    """Every id that ends generation: the generation config's and the tokenizer's."""
    eos = model.generation_config.eos_token_id
    ids = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return tuple(sorted(ids))


def _np(t) -> np.ndarray | None:
    return None if t is None else t.detach().float().cpu().numpy()


def _projections(attn, mlp) -> tuple[dict, dict]:
    """(weights, biases) by River's projection names. A fused family stores q, k and v as one
    matrix and gate and up as one: split by rows here, and River's FUSED concatenates them back."""
    if hasattr(attn, "qkv_proj"):
        q = attn.config.num_attention_heads * attn.head_dim
        kv = attn.num_key_value_heads * attn.head_dim
        qkv, gate_up = _np(attn.qkv_proj.weight), _np(mlp.gate_up_proj.weight)
        half = len(gate_up) // 2
        weights = {"q": qkv[:q], "k": qkv[q:q + kv], "v": qkv[q + kv:], "o": _np(attn.o_proj.weight),
                   "gate": gate_up[:half], "up": gate_up[half:], "down": _np(mlp.down_proj.weight)}
        return weights, {}
    modules = {"q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj, "o": attn.o_proj,
               "gate": mlp.gate_proj, "up": mlp.up_proj, "down": mlp.down_proj}
    return ({n: _np(m.weight) for n, m in modules.items()},
            {n: _np(m.bias) for n, m in modules.items() if m.bias is not None})


def _layer(layer, sandwich: bool) -> LayerWeights:
    attn, mlp = layer.self_attn, layer.mlp
    norm = lambda m: None if m is None else _np(m.weight)
    projections, biases = _projections(attn, mlp)
    return LayerWeights(
        input_norm=norm(layer.input_layernorm),
        pre_mlp_norm=norm(layer.pre_feedforward_layernorm if sandwich
                          else layer.post_attention_layernorm),
        projections=projections, biases=biases,
        post_attn_norm=norm(layer.post_attention_layernorm) if sandwich else None,
        post_mlp_norm=norm(layer.post_feedforward_layernorm) if sandwich else None,
        q_norm=norm(getattr(attn, "q_norm", None)), k_norm=norm(getattr(attn, "k_norm", None)))


def describe(model, tokenizer) -> tuple[ModelSpec, Weights]:
    """A transformers *ForCausalLM (any dtype) as River's spec and float32 weights."""
    config = model.config
    check_architecture(config)
    inner = model.model
    family = BY_MODEL_TYPE[config.model_type]
    sandwich = family.sandwich
    keys = _rope_keys(config)
    attn = inner.layers[0].self_attn
    spec = ModelSpec(
        family=config.model_type, num_layers=config.num_hidden_layers,
        hidden=config.hidden_size, intermediate=config.intermediate_size,
        heads=config.num_attention_heads, kv_heads=config.num_key_value_heads,
        head_dim=attn.head_dim, vocab=config.vocab_size,
        max_positions=config.max_position_embeddings, eos_ids=eos_ids(model, tokenizer),
        windows=_windows(config), rope_keys=keys,
        rotary={k: _rotary(inner, config, k) for k in set(keys)},
        activation=getattr(config, "hidden_activation", None) or config.hidden_act,
        norm_eps=float(config.rms_norm_eps), norm_offset=family.norm_offset,
        sandwich=sandwich, qk_norm=hasattr(attn, "q_norm"), attn_scale=float(attn.scaling),
        embed_scale=float(getattr(inner.embed_tokens, "scalar_embed_scale", 1.0)),
        final_softcap=getattr(config, "final_logit_softcapping", None),
        query_scale=_query_scale(config))
    embed = _np(inner.embed_tokens.weight)
    tied = model.lm_head.weight.data_ptr() == inner.embed_tokens.weight.data_ptr()
    weights = Weights(embed=embed, final_norm=_np(inner.norm.weight),
                      head=embed if tied else _np(model.lm_head.weight),
                      layers=tuple(_layer(l, sandwich) for l in inner.layers))
    return spec, weights
