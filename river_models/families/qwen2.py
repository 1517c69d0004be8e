"""Qwen2 (Qwen2.5): Llama with biases on q, k and v (large ones, on the published models)."""

from .base import COMMON_KEYS, ROPE_SCALING, Family, Gguf

FAMILY = Family(
    name="qwen2", model_types=("qwen2",), architecture="Qwen2ForCausalLM",
    config_class="Qwen2Config",
    gguf=Gguf("qwen2", COMMON_KEYS + (ROPE_SCALING,)),
    qkv_bias=True,
    serving={},
    hub="Qwen/Qwen2.5-1.5B-Instruct",
    real=dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
              num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
              max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
              rope_parameters=dict(rope_type="default", rope_theta=1e6)),
    small=dict(hidden_size=768, intermediate_size=2048, num_attention_heads=12,
               num_key_value_heads=2, tie_word_embeddings=True,
               rope_parameters=dict(rope_type="default", rope_theta=1e6)),
    vllm="qwen2:Qwen2ForCausalLM")
