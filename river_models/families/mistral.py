"""Mistral: Llama with a sliding window on every layer. llama.cpp's converter writes it as a
llama and drops the window (llama.cpp's llama has none), so its GGUF reads as Llama's."""

import attrs

from . import llama
from .base import Family

FAMILY = Family(
    name="mistral", model_types=("mistral",), architecture="MistralForCausalLM",
    config_class="MistralConfig",
    gguf=attrs.evolve(llama.FAMILY.gguf, reads_back=False),
    windowed=True,
    tiny=dict(sliding_window=8),
    hub="mistralai/Mistral-7B-Instruct-v0.3",
    real=dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
              num_attention_heads=32, num_key_value_heads=8, vocab_size=32768,
              max_position_embeddings=32768, rms_norm_eps=1e-5,
              rope_parameters=dict(rope_type="default", rope_theta=1e6)),
    small=dict(hidden_size=512, intermediate_size=1792, num_attention_heads=8,
               num_key_value_heads=2, sliding_window=16),
    llamacpp_differs="its llama architecture has no sliding window")
