"""Qwen3: Llama with per-head q/k norms and heads wider than hidden / heads (128 on
Qwen3-0.6B, whose 1024 / 16 is 64): its GGUF's `attention.key_length`, which transformers' GGUF
loader reads only where the config has a `head_dim`."""

from .base import COMMON_KEYS, HEAD_DIM_KEYS, ROPE_SCALING, Family, Gguf

FAMILY = Family(
    name="qwen3", model_types=("qwen3",), architecture="Qwen3ForCausalLM",
    config_class="Qwen3Config",
    gguf=Gguf("qwen3", COMMON_KEYS + HEAD_DIM_KEYS + (ROPE_SCALING,)),
    qk_norm=True,
    tiny=dict(head_dim=16), serving=dict(head_dim=32),
    hub="Qwen/Qwen3-0.6B",
    real=dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
              num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
              max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True,
              rope_parameters=dict(rope_type="default", rope_theta=1e6)),
    small=dict(hidden_size=512, intermediate_size=1536, num_attention_heads=8,
               num_key_value_heads=4, head_dim=128, tie_word_embeddings=True,
               rope_parameters=dict(rope_type="default", rope_theta=1e6)),
    vllm="qwen3:Qwen3ForCausalLM")
