"""Tiny random decoder-only models built in code, one per supported family. No downloads.

`model()` is the transformers model (the reference for parity tests), `checkpoint()` the same
model as River reads it, ready for any backend.
"""

from __future__ import annotations

import functools

VOCAB = 96
LAYERS = 6
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "llama3", "phi3", "ministral3")

# The paper's models' special config fields, kept at tiny widths (head_dim 16): Llama-3.2-1B's
# llama3 rope (original context 8,192 brought down to 64) and tied embeddings; Phi-4-mini's
# partial rotary (0.75: 12 of 16 dims, 6 factors), LongRoPE and tied embeddings, its switch
# (original context 4,096) brought down to 48 positions; Ministral-3-8B's YaRN and query
# scaling, its original context (16,384) brought down to 16.
LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=64)
PHI3_SWITCH = 48
PHI3_ROPE = dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.75,
                 short_factor=[1.0, 1.0, 1.1, 1.3, 1.6, 2.0],
                 long_factor=[1.0, 1.5, 3.0, 6.0, 12.0, 24.0],
                 original_max_position_embeddings=PHI3_SWITCH)
MINISTRAL3_PERIOD = 16
MINISTRAL3_ROPE = dict(rope_type="yarn", rope_theta=1000000.0, factor=16.0,
                       original_max_position_embeddings=MINISTRAL3_PERIOD, beta_fast=32.0,
                       beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0, llama_4_scaling_beta=0.1)


# serving engines' attention kernels take wider heads (vLLM's CPU attention: 32 and up)
SERVING = dict(num_attention_heads=2, num_key_value_heads=1)
SERVING_HEAD = 32


def _wider(rope: dict) -> dict:
    """LongRoPE's factors (one per rotary pair of a 16-wide head) for heads of SERVING_HEAD."""
    repeat = SERVING_HEAD // 16
    return {**rope, **{k: [f for f in rope[k] for _ in range(repeat)]
                       for k in ("short_factor", "long_factor")}}


PHI3_SERVING_ROPE = _wider(PHI3_ROPE)


def _config(family: str, serving: bool = False):
    import transformers as t

    if serving:
        return {"llama": t.LlamaConfig, "qwen2": t.Qwen2Config,
                "qwen3": lambda **c: t.Qwen3Config(**c, head_dim=SERVING_HEAD),
                "phi3": lambda **c: _phi3(c, PHI3_SERVING_ROPE),
                "ministral3": lambda **c: t.Ministral3Config(**c, head_dim=SERVING_HEAD,
                                                             rope_parameters=MINISTRAL3_ROPE)}[
            family](**{**COMMON, **SERVING})
    return {
        "llama": lambda: t.LlamaConfig(**COMMON),
        "mistral": lambda: t.MistralConfig(**COMMON, sliding_window=8),
        "qwen2": lambda: t.Qwen2Config(**COMMON),
        "qwen3": lambda: t.Qwen3Config(**COMMON, head_dim=16),
        "gemma3": lambda: t.Gemma3TextConfig(
            # llama.cpp's pattern (five sliding layers, then one global) and scale (the head
            # width's, as every Gemma 3 but 27B sets query_pre_attn_scalar)
            **COMMON, head_dim=16, query_pre_attn_scalar=16, sliding_window=6,
            layer_types=["sliding_attention"] * 5 + ["full_attention"]),
        "llama3": lambda: t.LlamaConfig(**{**COMMON, "tie_word_embeddings": True},
                                        rope_parameters=LLAMA3_ROPE),
        "phi3": lambda: _phi3(COMMON, PHI3_ROPE),
        "ministral3": lambda: t.Ministral3Config(**COMMON, head_dim=16,
                                                 rope_parameters=MINISTRAL3_ROPE),
    }[family]()


def _phi3(common: dict, rope: dict):
    import transformers as t

    return t.Phi3Config(**{**common, "tie_word_embeddings": True},
                        original_max_position_embeddings=PHI3_SWITCH, partial_rotary_factor=0.75,
                        rope_parameters=rope, sliding_window=262144)


@functools.cache
def tokenizer():
    """A character-level tokenizer over printable ASCII, ids 3..VOCAB-1."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 32 + VOCAB - 3)]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")


@functools.cache
def model(family: str, seed: int = 0, dtype: str = "float32", serving: bool = False,
          positions: int | None = None):
    """`serving`: two heads of width 32 (llama, qwen2, qwen3, phi3, ministral3), for serving
    engines' kernels; `positions`: a longer context than the tests' 256 (benchmarks' prompts)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = _config(family, serving)
    if positions is not None:
        config.max_position_embeddings = positions
    config.initializer_range = 0.2   # larger weights: sharper, less tie-prone logits
    m = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype)).eval()
    m.generation_config.pad_token_id = 0
    return m


@functools.cache
def checkpoint(family: str, seed: int = 0, dtype: str = "float32"):
    from .source import checkpoint_of

    return checkpoint_of(model(family, seed, dtype), tokenizer(), f"tiny-{family}",
                         f"seed{seed}-{dtype}")


def save(folder, family: str = "llama", serving: bool = True, positions: int | None = None,
         chat: bool = True) -> str:
    """A tiny model as a Hugging Face folder any River command or engine loads (with a chat
    template: one turn's text and a newline), e.g. for `river bench NAME --model FOLDER`."""
    import copy

    model(family, serving=serving, positions=positions).save_pretrained(folder)
    tok = copy.deepcopy(tokenizer())   # the shared one stays without a template
    if chat:
        tok.chat_template = ("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    tok.save_pretrained(folder)
    return str(folder)


def save_mistral3(folder) -> str:
    """The tiny Ministral 3 as Ministral-3-8B's hub checkpoint holds it: a "mistral3" text and
    vision model (a one-layer Pixtral tower) whose language model is `model("ministral3")`."""
    import transformers as t

    text = model("ministral3")
    vision = t.PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, head_dim=16, image_size=32,
                                   patch_size=16)
    wrapper = t.Mistral3ForConditionalGeneration(t.Mistral3Config(
        text_config=text.config.to_dict(), vision_config=vision.to_dict(), image_token_index=3,
        tie_word_embeddings=False)).eval()
    wrapper.model.language_model.load_state_dict(text.model.state_dict())
    wrapper.lm_head.load_state_dict(text.lm_head.state_dict())
    wrapper.generation_config = text.generation_config
    wrapper.save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return str(folder)


def stand_ins(checkpoint, bits: int, method: str = "hqq"):
    """The stand-ins every backend's conformance factory uses for a tiny model: one setting
    for all, so their cross-engine comparison compares the same weights (groups of 32: the
    tiny widths are 64 and 128); not cached, they take milliseconds."""
    from river_core.config import QuantSpec

    from .quant import stand_ins as quantized

    return quantized(checkpoint, QuantSpec(bits=bits, group_size=32, method=method),
                     cache=False)
