"""Llama (Llama 2's shape; the embedded SmolLM2 is one): the plain block the other families
vary."""

from .base import COMMON_KEYS, ROPE_SCALING, Family, Gguf

FAMILY = Family(
    name="llama", model_types=("llama",), architecture="LlamaForCausalLM",
    config_class="LlamaConfig",
    gguf=Gguf("llama", COMMON_KEYS + ("vocab_size", "rope.dimension_count", ROPE_SCALING),
              neox=False),
    serving={},
    hub="meta-llama/Llama-2-7b-hf",
    real=dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
              num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
              max_position_embeddings=4096, rms_norm_eps=1e-5,
              rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
    small=dict(hidden_size=512, intermediate_size=1536, num_attention_heads=8,
               num_key_value_heads=2),
    vllm="llama:LlamaForCausalLM")
