"""What llama.cpp's converter (`convert_hf_to_gguf.py`) writes for a transformers config: each
architecture's metadata keys (and the ones it leaves for the loader to assume) and its
tensors' names and shapes. The GGUFs River's tests and benchmarks make itself (the tiny ones,
the real-shaped ones) are written by it, so they carry exactly what a user's file carries.

Read from the converter's model classes and llama-model.cpp's loader (docs/models.md, "What a
GGUF holds"). Per architecture:
- every one: context, width, layers, FFN width, heads, K/V heads, RMS epsilon, rope base,
  the file type; `attention.key_length`/`value_length` only where the config has `head_dim`
  (Qwen2's has none);
- llama (Llama, Mistral, SmolLM2) and mistral3 (Ministral 3): `vocab_size` and
  `rope.dimension_count`; their Q/K rows permuted for ggml's normal rotation; Llama 3's
  scaling as a tensor of per-frequency divisors (`rope_freqs`), no scaling key; Mistral's
  sliding window dropped (llama.cpp's llama has none); mistral3's YaRN keys, its log
  multiplier (`mscale_all_dim`) and Llama 4's query scale (`attention.temperature_scale`);
- gemma3: its window and `rope.freq_base_swa`, linear scaling where the config scales (4B
  and up), never the sliding pattern (the loader takes five sliding layers in six), never
  the query scalar (the loader takes the head width); every norm stored as 1 + w;
- phi3: its own short list (no key/value length), the partial rotary's dimensions, the
  original context, the window (0 for none), and with LongRoPE factors their tensors and
  the attention factor; q, k, v fused as `attn_qkv`, gate and up fused as `ffn_up`.
"""

from __future__ import annotations

import math

# llama.cpp's architecture for each family River names (transformers' model types, and the
# suite's "llama3": Llama with Llama 3's rope scaling)
ARCH = {"llama": "llama", "mistral": "llama", "llama3": "llama", "qwen2": "qwen2",
        "qwen3": "qwen3", "gemma3": "gemma3", "phi3": "phi3", "ministral3": "mistral3"}
# the architectures llama.cpp rotates the normal (GPT-J) way, whose Q/K rows its converter
# permutes
PERMUTED = ("llama", "mistral3")
# families whose config holds `head_dim` (the converter writes key/value lengths from it)
HEAD_DIM_IN_CONFIG = ("llama3", "qwen3", "gemma3", "ministral3")
QUANTIZATION_VERSION = 2   # GGML_QUANT_VERSION, written by the converter into every file


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _rope_parameters(family: str, config) -> dict:
    rope = dict(config.rope_parameters or {})
    return rope["full_attention"] if family == "gemma3" else rope


def add_metadata(w, family: str, config, file_type: int, context: int | None = None) -> None:
    """`config`'s keys into GGUF writer `w` (made for ARCH[family]) as the converter writes
    them; `context` in place of the config's (a shorter one for a test)."""
    import gguf

    rope = _rope_parameters(family, config)
    add_dimensions(w, context or config.max_position_embeddings, config.hidden_size,
                   config.intermediate_size, config.num_hidden_layers,
                   config.num_attention_heads, config.num_key_value_heads, config.rms_norm_eps,
                   file_type)
    w.add_rope_freq_base(float(rope["rope_theta"]))
    if family == "phi3":
        w.add_rope_scaling_orig_ctx_len(rope.get("original_max_position_embeddings",
                                                 config.max_position_embeddings))
        factor = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1))
        w.add_rope_dimension_count(int(factor * config.hidden_size)
                                   // config.num_attention_heads)
        w.add_sliding_window(config.sliding_window or 0)
        if "long_factor" in rope:
            w.add_rope_scaling_attn_factors(phi3_attn_factor(config))
        return
    if family in HEAD_DIM_IN_CONFIG:
        w.add_key_length(head_dim(config))
        w.add_value_length(head_dim(config))
    if ARCH[family] in ("llama", "mistral3"):
        w.add_vocab_size(config.vocab_size)
        w.add_rope_dimension_count(head_dim(config))
    kind = rope.get("rope_type", "default")
    if kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    elif kind == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    if family == "ministral3":
        w.add_rope_scaling_yarn_log_mul(rope["mscale_all_dim"])
        w.add_attn_temperature_scale(rope["llama_4_scaling_beta"])
    if family == "gemma3":
        w.add_sliding_window(config.sliding_window)
        w.add_rope_freq_base_swa(float(config.rope_parameters["sliding_attention"]
                                       ["rope_theta"]))


def add_dimensions(w, context: int, hidden: int, intermediate: int, layers: int, heads: int,
                   kv_heads: int, eps: float, file_type: int) -> None:
    """The keys every architecture's file holds: its shape, its RMS epsilon, its file type."""
    w.add_context_length(context)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(intermediate)
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(eps)
    w.add_file_type(file_type)


def phi3_attn_factor(config) -> float:
    """The cos/sin scale the converter writes beside LongRoPE's factors:
    sqrt(1 + ln(s) / ln(original)), s the context over the original one."""
    rope = _rope_parameters("phi3", config)
    original = rope["original_max_position_embeddings"]
    s = config.max_position_embeddings / original
    return 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(original))


def llama3_divisors(config):
    """Llama 3's rope scaling as the converter stores it (`rope_freqs`): each frequency's
    divisor, 1 above the band, the factor below it, smooth between."""
    import numpy as np

    rope = _rope_parameters("llama3", config)
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
    """The rotary tensors the converter adds: Llama 3's divisors, Phi-3's LongRoPE factors."""
    import numpy as np

    rope = _rope_parameters(family, config)
    if family == "llama3":
        return {"rope_freqs.weight": llama3_divisors(config)}
    if family == "phi3" and "long_factor" in rope:
        return {f"rope_factors_{k}.weight": np.asarray(rope[f"{k}_factor"], np.float32)
                for k in ("long", "short")}
    return {}


def tensor_shapes(family: str, config) -> dict[str, tuple[int, ...]]:
    """Every tensor the converter writes for `config`, [rows, columns] as numpy holds them (a
    norm or bias: [width]), in the order it writes them."""
    hd, h = head_dim(config), config.hidden_size
    q, kv, ff = config.num_attention_heads * hd, config.num_key_value_heads * hd, \
        config.intermediate_size
    shapes = {"token_embd.weight": (config.vocab_size, h),
              **{name: t.shape for name, t in rope_tensors(family, config).items()}}
    for i in range(config.num_hidden_layers):
        layer = {"attn_norm.weight": (h,)}
        if family == "phi3":
            layer["attn_qkv.weight"] = (q + 2 * kv, h)
        else:
            layer.update({"attn_q.weight": (q, h), "attn_k.weight": (kv, h),
                          "attn_v.weight": (kv, h)})
        if family == "qwen2":
            layer.update({"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)})
        if family in ("qwen3", "gemma3"):
            layer.update({"attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,)})
        layer["attn_output.weight"] = (h, q)
        if family == "gemma3":
            layer["post_attention_norm.weight"] = (h,)
        layer["ffn_norm.weight"] = (h,)
        if family == "phi3":
            layer["ffn_up.weight"] = (2 * ff, h)
        else:
            layer.update({"ffn_gate.weight": (ff, h), "ffn_up.weight": (ff, h)})
        layer["ffn_down.weight"] = (h, ff)
        if family == "gemma3":
            layer["post_ffw_norm.weight"] = (h,)
        shapes.update({f"blk.{i}.{k}": v for k, v in layer.items()})
    shapes["output_norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["output.weight"] = (config.vocab_size, h)
    return shapes
