"""What llama.cpp's converter (`convert_hf_to_gguf.py`) writes for a transformers config: each
family's metadata keys (`Gguf.keys` of its record in river_models.families, where what it
leaves for the loader to assume is named too) and its tensors' names and shapes. The GGUFs
River's tests and benchmarks make itself (the tiny ones, the real-shaped ones) are written by
it, so they carry exactly what a user's file carries.

Read from the converter's model classes and llama-model.cpp's loader (docs/models.md, "What a
GGUF holds"): `KEYS` holds each key's value, read from the config as the converter reads it;
the rotary tensors it adds (Llama 3's scaling as per-frequency divisors, LongRoPE's factors)
follow the config's rope type; Q/K rows permuted where llama.cpp rotates the normal way, norms
scaling by 1 + w stored so, fused projections fused.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import attrs

from .families import BY_NAME, Family

QUANTIZATION_VERSION = 2   # GGML_QUANT_VERSION, written by the converter into every file


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rope_parameters(family: Family, config) -> dict:
    """The config's rope parameters; the global layers' where each attention type has its own."""
    rope = dict(config.rope_parameters or {})
    return rope["full_attention"] if family.rope_per_layer_type else rope


@attrs.frozen
class _Source:
    """What a key's value is read from: the config, its rope parameters, the context the file
    declares and its file type."""

    config: Any
    rope: dict
    context: int
    file_type: int


def _rope_scaling(w, s: _Source) -> None:
    import gguf

    kind = s.rope.get("rope_type", "default")
    if kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(s.rope["factor"])
    elif kind == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(s.rope["factor"])
        w.add_rope_scaling_orig_ctx_len(s.rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(s.rope["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(s.rope["beta_slow"])


def _attn_factor(w, s: _Source) -> None:
    if "long_factor" in s.rope:   # beside LongRoPE's factors
        w.add_rope_scaling_attn_factors(longrope_attn_factor(s.config, s.rope))


def _rotary_dims(s: _Source) -> int:
    """The dimensions the rotary turns: the head's, or the partial rotary's share of it."""
    factor = s.rope.get("partial_rotary_factor",
                        getattr(s.config, "partial_rotary_factor", None) or 1)
    return int(factor * head_dim(s.config))


# each key a family's converter may write (`Gguf.keys`), written into GGUF writer w from `s`
KEYS: dict[str, Callable[[Any, _Source], None]] = {
    "context_length": lambda w, s: w.add_context_length(s.context),
    "embedding_length": lambda w, s: w.add_embedding_length(s.config.hidden_size),
    "feed_forward_length": lambda w, s: w.add_feed_forward_length(s.config.intermediate_size),
    "block_count": lambda w, s: w.add_block_count(s.config.num_hidden_layers),
    "attention.head_count": lambda w, s: w.add_head_count(s.config.num_attention_heads),
    "attention.head_count_kv": lambda w, s: w.add_head_count_kv(s.config.num_key_value_heads),
    "attention.layer_norm_rms_epsilon":
        lambda w, s: w.add_layer_norm_rms_eps(s.config.rms_norm_eps),
    "rope.freq_base": lambda w, s: w.add_rope_freq_base(float(s.rope["rope_theta"])),
    "general.file_type": lambda w, s: w.add_file_type(s.file_type),
    "attention.key_length": lambda w, s: w.add_key_length(head_dim(s.config)),
    "attention.value_length": lambda w, s: w.add_value_length(head_dim(s.config)),
    "vocab_size": lambda w, s: w.add_vocab_size(s.config.vocab_size),
    "rope.dimension_count": lambda w, s: w.add_rope_dimension_count(_rotary_dims(s)),
    "rope.scaling.type": _rope_scaling,
    "rope.scaling.original_context_length": lambda w, s: w.add_rope_scaling_orig_ctx_len(
        s.rope.get("original_max_position_embeddings", s.config.max_position_embeddings)),
    "rope.scaling.attn_factor": _attn_factor,
    "rope.scaling.yarn_log_multiplier":
        lambda w, s: w.add_rope_scaling_yarn_log_mul(s.rope["mscale_all_dim"]),
    "attention.temperature_scale":
        lambda w, s: w.add_attn_temperature_scale(s.rope["llama_4_scaling_beta"]),
    "attention.sliding_window": lambda w, s: w.add_sliding_window(s.config.sliding_window or 0),
    "rope.freq_base_swa": lambda w, s: w.add_rope_freq_base_swa(
        float(s.config.rope_parameters["sliding_attention"]["rope_theta"])),
}


DIMENSIONS = ("context_length", "embedding_length", "feed_forward_length", "block_count",
              "attention.head_count", "attention.head_count_kv",
              "attention.layer_norm_rms_epsilon", "general.file_type")
"""The keys every architecture's file holds: its shape, its RMS epsilon, its file type."""


def add_dimensions(w, config, context: int, file_type: int) -> None:
    """DIMENSIONS' keys of `config` (any object with a config's shape fields) into `w`."""
    source = _Source(config, {}, context, file_type)
    for key in DIMENSIONS:
        KEYS[key](w, source)


def add_metadata(w, family: str, config, file_type: int, context: int | None = None) -> None:
    """`config`'s keys into GGUF writer `w` (made for the family's architecture) as the
    converter writes them; `context` in place of the config's (a shorter one for a test)."""
    record = BY_NAME[family]
    source = _Source(config, rope_parameters(record, config),
                     context or config.max_position_embeddings, file_type)
    for key in record.gguf.keys:
        KEYS[key](w, source)


def longrope_attn_factor(config, rope: dict) -> float:
    """The cos/sin scale the converter writes beside LongRoPE's factors:
    sqrt(1 + ln(s) / ln(original)), s the context over the original one."""
    original = rope["original_max_position_embeddings"]
    s = config.max_position_embeddings / original
    return 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(original))


def llama3_divisors(config, rope: dict):
    """Llama 3's rope scaling as the converter stores it (`rope_freqs`): each frequency's
    divisor, 1 above the band, the factor below it, smooth between."""
    import numpy as np

    dim = head_dim(config)
    freqs = 1.0 / rope["rope_theta"] ** (np.arange(0, dim, 2) / dim)
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    wavelength = 2 * math.pi / freqs
    smooth = (old / wavelength - low) / (high - low)
    divisors = np.where(wavelength < old / high, 1.0,
                        np.where(wavelength > old / low, factor,
                                 1 / ((1 - smooth) / factor + smooth)))
    return divisors.astype(np.float32)


def rope_tensors(family: str, config) -> dict:
    """The rotary tensors the converter adds: Llama 3's divisors (the llama3 rope type), the
    LongRoPE factors."""
    import numpy as np

    rope = rope_parameters(BY_NAME[family], config)
    if rope.get("rope_type") == "llama3":
        return {"rope_freqs.weight": llama3_divisors(config, rope)}
    if "long_factor" in rope:
        return {f"rope_factors_{k}.weight": np.asarray(rope[f"{k}_factor"], np.float32)
                for k in ("long", "short")}
    return {}


def tensor_shapes(family: str, config) -> dict[str, tuple[int, ...]]:
    """Every tensor the converter writes for `config`, [rows, columns] as numpy holds them (a
    norm or bias: [width]), in the order it writes them."""
    record, hd, h = BY_NAME[family], head_dim(config), config.hidden_size
    q, kv, ff = config.num_attention_heads * hd, config.num_key_value_heads * hd, \
        config.intermediate_size
    shapes = {"token_embd.weight": (config.vocab_size, h),
              **{name: t.shape for name, t in rope_tensors(family, config).items()}}
    for i in range(config.num_hidden_layers):
        layer = {"attn_norm.weight": (h,)}
        if record.fused:
            layer["attn_qkv.weight"] = (q + 2 * kv, h)
        else:
            layer.update({"attn_q.weight": (q, h), "attn_k.weight": (kv, h),
                          "attn_v.weight": (kv, h)})
        if record.qkv_bias:
            layer.update({"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)})
        if record.qk_norm:
            layer.update({"attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,)})
        layer["attn_output.weight"] = (h, q)
        if record.sandwich:
            layer["post_attention_norm.weight"] = (h,)
        layer["ffn_norm.weight"] = (h,)
        if record.fused:
            layer["ffn_up.weight"] = (2 * ff, h)
        else:
            layer.update({"ffn_gate.weight": (ff, h), "ffn_up.weight": (ff, h)})
        layer["ffn_down.weight"] = (h, ff)
        if record.sandwich:
            layer["post_ffw_norm.weight"] = (h,)
        shapes.update({f"blk.{i}.{k}": v for k, v in layer.items()})
    shapes["output_norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["output.weight"] = (config.vocab_size, h)
    return shapes
