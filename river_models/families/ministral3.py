"""Ministral 3 (Ministral-3-8B's text model): YaRN (with mscale) and Llama 4's
position-dependent query scale (`llama_4_scaling_beta`). Its hub checkpoint is a "mistral3",
text and vision, whose language model River runs.

llama.cpp writes it as `mistral3`: Q/K rows permuted as Llama's, YaRN's keys, its log
multiplier (`mscale_all_dim`) and the query scale (`attention.temperature_scale`).
transformers reads no mistral3 GGUF."""

from .base import COMMON_KEYS, HEAD_DIM_KEYS, ROPE_SCALING, Family, Gguf

# Ministral-3-8B's rope; the tiny model's original context (16,384) brought down to 16
REAL_ROPE = dict(rope_type="yarn", rope_theta=1000000.0, factor=16.0,
                 original_max_position_embeddings=16384, beta_fast=32.0, beta_slow=1.0,
                 mscale=1.0, mscale_all_dim=1.0, llama_4_scaling_beta=0.1)
PERIOD = 16
TINY_ROPE = {**REAL_ROPE, "original_max_position_embeddings": PERIOD}

FAMILY = Family(
    name="ministral3", model_types=("ministral3",), architecture="Ministral3ForCausalLM",
    config_class="Ministral3Config",
    gguf=Gguf("mistral3", COMMON_KEYS + HEAD_DIM_KEYS
              + ("vocab_size", "rope.dimension_count", ROPE_SCALING,
                 "rope.scaling.yarn_log_multiplier", "attention.temperature_scale"),
              neox=False, yarn=True),
    windowed=True, query_scale=True,
    wrappers=("mistral3",),
    # its vision tower one Pixtral layer
    tiny_wrapper=dict(vision_config=dict(model_type="pixtral", hidden_size=32,
                                         intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, head_dim=16, image_size=32,
                                         patch_size=16),
                      image_token_index=3, tie_word_embeddings=False),
    tiny=dict(head_dim=16, rope_parameters=TINY_ROPE), serving=dict(head_dim=32),
    hub="mistralai/Ministral-3-8B-Instruct-2512 (its text model)",
    real=dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=34,
              num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=131072,
              max_position_embeddings=262144, rms_norm_eps=1e-5, rope_parameters=REAL_ROPE),
    small=dict(hidden_size=512, intermediate_size=1536, num_attention_heads=8,
               num_key_value_heads=2, head_dim=128, max_position_embeddings=262144,
               rope_parameters=REAL_ROPE),
    vllm="mistral:MistralForCausalLM")
