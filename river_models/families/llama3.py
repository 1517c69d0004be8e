"""Llama 3.1/3.2: a llama config with Llama 3's rope scaling, which llama.cpp's converter keeps
only as each frequency's divisor (tensor `rope_freqs`). A test variant of Llama: no model type
of its own, its files read as Llama's; its published configs hold `head_dim`."""

import attrs

from . import llama
from .base import COMMON_KEYS, HEAD_DIM_KEYS, ROPE_SCALING

# Llama-3.2-1B's rope scaling; the tiny model's original context (8,192) brought down to 64
REAL_ROPE = dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                 high_freq_factor=4.0, original_max_position_embeddings=8192)
TINY_ROPE = {**REAL_ROPE, "original_max_position_embeddings": 64}

FAMILY = attrs.evolve(
    llama.FAMILY, name="llama3", model_types=(),
    gguf=attrs.evolve(llama.FAMILY.gguf, reads_back=False, keys=COMMON_KEYS + HEAD_DIM_KEYS
                      + ("vocab_size", "rope.dimension_count", ROPE_SCALING)),
    tiny=dict(tie_word_embeddings=True, rope_parameters=TINY_ROPE),
    serving=None,
    hub="meta-llama/Llama-3.2-1B-Instruct",
    real=dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
              num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
              max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
              rope_parameters=REAL_ROPE),
    small=dict(hidden_size=512, intermediate_size=2048, num_attention_heads=8,
               num_key_value_heads=2, head_dim=64, tie_word_embeddings=True,
               rope_parameters=REAL_ROPE))
