"""Tiny random decoder-only models built in code, one per supported family. No downloads."""

from __future__ import annotations

import functools

import torch
from transformers import (AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, MistralConfig,
                          PreTrainedTokenizerFast, Qwen2Config, Qwen3Config)
from tokenizers import Tokenizer, models, pre_tokenizers

from river_core.config import RiverSpec
from river_hf.backend import HFBackend

VOCAB = 96
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)

CONFIGS = {
    "llama": lambda: LlamaConfig(**COMMON),
    "mistral": lambda: MistralConfig(**COMMON, sliding_window=8),
    "qwen2": lambda: Qwen2Config(**COMMON),
    "qwen3": lambda: Qwen3Config(**COMMON, head_dim=16),
    "gemma3": lambda: Gemma3TextConfig(**COMMON, head_dim=16, sliding_window=6,
                                       layer_types=["sliding_attention", "full_attention"] * 3),
}
FAMILIES = tuple(CONFIGS)


@functools.cache
def tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer over printable ASCII, ids 3..VOCAB-1."""
    chars = [chr(c) for c in range(32, 32 + VOCAB - 3)]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")


@functools.cache
def model(family: str, seed: int = 0, dtype: torch.dtype = torch.float32):
    torch.manual_seed(seed)
    config = CONFIGS[family]()
    config.initializer_range = 0.2   # larger weights: sharper, less tie-prone logits
    m = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    m.generation_config.pad_token_id = 0
    return m


def backend(family: str, seed: int = 0, bits: int = 8, dtype=torch.float32) -> HFBackend:
    return HFBackend(model(family, seed, dtype), tokenizer(), RiverSpec(bits=bits, group_size=32))
