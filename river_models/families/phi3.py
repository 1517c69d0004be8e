"""Phi-3 (Phi-4-mini, Phi-3.5-mini): q, k, v fused and gate, up fused, partial rotary, LongRoPE
(its long table past a switch), tied embeddings.

llama.cpp's converter writes its own short list of keys (no key/value length), the partial
rotary's dimensions, the original context, the window (0 for none; written, but its loader
applies none) and, with LongRoPE, its factors as tensors and the attention factor.
transformers' GGUF loader drops the rotary's dimensions, the factors and the original context:
`_restore` puts them back. Its SentencePiece vocabulary takes the prefix space from a
normalizer."""

import numpy as np

from .base import Family, Gguf

# the tiny model's LongRoPE: Phi-4-mini's partial rotary (0.75: 12 of 16 dims, 6 factors),
# its switch (original context 4,096) brought down to 48 positions
SWITCH = 48
TINY_ROPE = dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.75,
                 short_factor=[1.0, 1.0, 1.1, 1.3, 1.6, 2.0],
                 long_factor=[1.0, 1.5, 3.0, 6.0, 12.0, 24.0],
                 original_max_position_embeddings=SWITCH)
# the serving tiny's heads are twice as wide: one factor per rotary pair, each twice
SERVING_ROPE = {**TINY_ROPE, **{k: [f for f in TINY_ROPE[k] for _ in range(2)]
                                for k in ("short_factor", "long_factor")}}


def _published_rope(pairs: int) -> dict:
    """Phi-4-mini's LongRoPE (its factors' count and range; the values made up, smooth)."""
    ramp = np.linspace(0, 1, pairs)
    return dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.75,
                original_max_position_embeddings=4096,
                short_factor=(1 + 0.2 * ramp ** 2).tolist(),
                long_factor=(1 + 40 * ramp ** 3).tolist())


def _restore(config, meta, tensors) -> None:
    """The partial rotary, LongRoPE's factors and the original context from the file; the
    window dropped, as llama.cpp's loader drops it."""
    head_dim = config.hidden_size // config.num_attention_heads
    rope = {"rope_type": "default", "rope_theta": config.rope_parameters["rope_theta"],
            "partial_rotary_factor": meta.get("phi3.rope.dimension_count", head_dim) / head_dim}
    original = meta.get("phi3.rope.scaling.original_context_length")
    if "rope_factors_long.weight" in tensors:
        rope.update(rope_type="longrope", original_max_position_embeddings=original,
                    long_factor=tensors["rope_factors_long.weight"].tolist(),
                    short_factor=tensors["rope_factors_short.weight"].tolist())
    config.rope_parameters = rope
    config.partial_rotary_factor = rope["partial_rotary_factor"]
    if original is not None:
        config.original_max_position_embeddings = original
    config.sliding_window = None
    config.pad_token_id = meta.get("tokenizer.ggml.padding_token_id")


FAMILY = Family(
    name="phi3", model_types=("phi3",), architecture="Phi3ForCausalLM",
    config_class="Phi3Config",
    gguf=Gguf("phi3", ("context_length", "rope.scaling.original_context_length",
                       "embedding_length", "feed_forward_length", "block_count",
                       "attention.head_count", "attention.head_count_kv",
                       "attention.layer_norm_rms_epsilon", "rope.dimension_count",
                       "rope.freq_base", "general.file_type", "attention.sliding_window",
                       "rope.scaling.attn_factor"),
              tokenizer="prepend", longrope=True, restore=_restore),
    fused=True, windowed=True,
    tiny=dict(tie_word_embeddings=True, original_max_position_embeddings=SWITCH,
              partial_rotary_factor=0.75, rope_parameters=TINY_ROPE, sliding_window=262144),
    serving=dict(rope_parameters=SERVING_ROPE),
    hub="microsoft/Phi-4-mini-instruct",
    real=dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
              num_attention_heads=24, num_key_value_heads=8, vocab_size=200064,
              max_position_embeddings=131072, original_max_position_embeddings=4096,
              rms_norm_eps=1e-5, tie_word_embeddings=True, partial_rotary_factor=0.75,
              sliding_window=262144, rope_parameters=_published_rope(48)),
    small=dict(hidden_size=768, intermediate_size=2048, num_attention_heads=6,
               num_key_value_heads=2, tie_word_embeddings=True,
               max_position_embeddings=131072, original_max_position_embeddings=4096,
               partial_rotary_factor=0.75, sliding_window=262144,
               rope_parameters=_published_rope(48)),
    vllm="phi3:Phi3ForCausalLM",
    llamacpp_differs="it takes Phi-3's LongRoPE factors by the context allocated, not the "
                     "position")
