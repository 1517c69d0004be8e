"""Tiny random decoder-only models built in code, one per supported family, from the fields
its record names (`Family.tiny`, river_models.families). No downloads.

`model()` is the transformers model (the reference for parity tests), `checkpoint()` the same
model as River reads it, ready for any backend.
"""

from __future__ import annotations

import functools

from .families import BY_NAME

VOCAB = 96
LAYERS = 6
# the dimensions every tiny family shares, scaled down from the paper's models; each keeps its
# own special fields (its record's), at these widths
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
FAMILIES = tuple(BY_NAME)
# serving engines' attention kernels take wider heads (vLLM's CPU attention: 32 and up)
SERVING = dict(num_attention_heads=2, num_key_value_heads=1)


def _config(family: str, serving: bool = False):
    import transformers

    record = BY_NAME[family]
    if serving and record.serving is None:
        raise ValueError(f"the tiny {family} has no serving form")
    fields = {**COMMON, **record.tiny, **(SERVING | record.serving if serving else {})}
    return getattr(transformers, record.config_class)(**fields)


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
    """`serving`: two heads of width 32 (the families with a `serving` form), for serving
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


def save_wrapped(folder, family: str) -> str:
    """The tiny `family` as a text-and-vision checkpoint of its first wrapper type holds it (as
    a vision-language hub checkpoint holds its text model): its language model `model(family)`,
    its vision tower the record's (`Family.tiny_wrapper`)."""
    import copy

    from transformers import AutoConfig, AutoModelForImageTextToText

    record, text = BY_NAME[family], model(family)
    wrapper = AutoModelForImageTextToText.from_config(AutoConfig.for_model(
        record.wrappers[0], text_config=text.config.to_dict(),
        **copy.deepcopy(dict(record.tiny_wrapper)))).eval()
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
