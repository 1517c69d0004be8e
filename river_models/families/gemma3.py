"""Gemma 3: sandwich norms scaling by 1 + w, per-head q/k norms, GELU, embeddings times
sqrt(hidden), five sliding layers in six with a rotary table of their own.

llama.cpp's converter writes the window and the sliding layers' rope base, never the sliding
pattern nor the query scalar: its loader takes five sliding layers in six and the head
width's scale (27B, 62 layers: hidden / heads), and so does River. Its SentencePiece vocabulary
stores spaces as spaces."""

from .base import COMMON_KEYS, HEAD_DIM_KEYS, ROPE_SCALING, Family, Gguf

WIDE_QUERY_LAYERS = (62,)   # Gemma 3 27B: the one whose query scale is not its head width's


def _query_scalar(config, meta, tensors) -> None:
    """The query scalar, in no file, as llama.cpp takes it."""
    config.query_pre_attn_scalar = config.hidden_size // config.num_attention_heads \
        if config.num_hidden_layers in WIDE_QUERY_LAYERS else config.head_dim


FAMILY = Family(
    name="gemma3", model_types=("gemma3_text",), architecture="Gemma3ForCausalLM",
    config_class="Gemma3TextConfig",
    gguf=Gguf("gemma3", COMMON_KEYS + HEAD_DIM_KEYS
              + (ROPE_SCALING, "attention.sliding_window", "rope.freq_base_swa"),
              tokenizer="spaces", sliding_period=6, defaults={"rope.freq_base_swa": 10000.0},
              wide_query_layers=WIDE_QUERY_LAYERS, restore=_query_scalar),
    activation="gelu_pytorch_tanh", norm_offset=True, sandwich=True, qk_norm=True,
    embed_scaled=True, rope_per_layer_type=True,
    # llama.cpp's pattern (five sliding layers, then one global) and scale (the head width's,
    # as every Gemma 3 but 27B sets query_pre_attn_scalar)
    tiny=dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=6,
              layer_types=["sliding_attention"] * 5 + ["full_attention"]),
    hub="google/gemma-3-270m-it",
    real=dict(hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
              num_attention_heads=4, num_key_value_heads=1, head_dim=256,
              query_pre_attn_scalar=256, vocab_size=262144, sliding_window=512,
              max_position_embeddings=32768, rms_norm_eps=1e-6),
    # 6 layers, to hold a global layer after five sliding ones
    small=dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=6,
               num_attention_heads=4, num_key_value_heads=1, head_dim=256,
               query_pre_attn_scalar=256, sliding_window=16, tie_word_embeddings=True),
    llamacpp_differs="its GELU reads ggml's float16 table (the tiny Gemma 3's logits 2.7e-4 "
                     "from transformers', past the kit's float32 bound of 1e-4)")
