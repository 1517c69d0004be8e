"""A GGUF's tokenizer, built from its own metadata into a `tokenizers` tokenizer, without
transformers (3-4 s to import; its GGUF reader took minutes on a loaded machine).

It reads the fields llama.cpp reads (`tokenizer.ggml.model`, `.pre`, `.tokens`, `.scores`,
`.token_type`, `.merges`, the special ids, `.add_bos_token`, `tokenizer.chat_template`) and builds
the pipeline transformers' GGUF tokenizer builds from them (transformers 5.23,
`integrations/gguf/gguf_tokenizer_mapping.py` and the classes it hands them to), so the two give
the same ids token for token (tests/test_gguf_tokenizer.py checks them on every family's tiny
GGUF and on the embedded model):
- `gpt2` (byte-level BPE): GPT-2's byte alphabet and the file's merges,
  the text split by the regex its `pre` names;
- `llama` (SentencePiece BPE with byte fallback): "▁" for a
  space, merges from the file or, as transformers recovers them, from the vocabulary and its
  scores; spaces spelled as the kind its family's record names (`Gguf.tokenizer`, SPM_KINDS).
The tokens the file marks as control are special (matched whole, dropped by decode), those it
marks user-defined are matched whole too.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np

from river_core.settings.errors import ModelError

from .families import BY_ARCH

CONTROL, USER_DEFINED = 3, 4   # llama.cpp's token types
SPACE = "\u2581"   # SentencePiece's visible space

# the split each `tokenizer.ggml.pre` names (transformers' GGUF_PRE_TOKENIZER_SPLITS); a name not
# here keeps GPT-2's own split
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
           r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
           r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
          r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
          r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {**dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                           "midm-2.0", "lfm2", "jina-v5-nano", "dbrx", "smaug-bpe"), _LLAMA3),
          "tekken": _TEKKEN,
          **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2),
          "qwen35": _QWEN35,
          **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O)}
MODELS = ("gpt2", "llama")   # the `tokenizer.ggml.model`s River builds
# how transformers builds a SentencePiece vocabulary, by the kind the file's family names:
# "▁" for a space from a Metaspace pre-tokenizer, or from a normalizer that also prepends one,
# or spaces stored as spaces, merges in the file's order and the named tokens of its own class
SPM_KINDS = ("metaspace", "prepend", "spaces")
# the special tokens transformers' tokenizer registers by name, and the ids it takes them from
NAMED = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
         "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}
# the named tokens of the class transformers builds each vocabulary with (its defaults, in the
# order it registers them): one missing from the vocabulary is added after it, under a new id
BUILDER_TOKENS = {"gpt2": ("<|endoftext|>",) * 3, "llama": ("<s>", "</s>", "<unk>"),
                  "spaces": ("<bos>", "<eos>", "<unk>", "<pad>", "<mask>")}


@functools.cache
def byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of each byte (its `bytes_to_unicode`)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    spelled, extra = {}, 0
    for b in range(256):
        if b in printable:
            spelled[b] = chr(b)
        else:
            spelled[b] = chr(256 + extra)
            extra += 1
    return spelled


def _field(meta: dict[str, Any], key: str, gguf: str):
    value = meta.get(key)
    if value is None:
        raise ModelError(f"{gguf}: no {key} in its metadata; River cannot build its tokenizer")
    return value


def recovered_merges(tokens: list[str], scores: dict[str, float]) -> list[tuple[str, str]]:
    """The merges a SentencePiece vocabulary implies (transformers' `generate_merges` with
    scores): every split of a token into two tokens, best score first."""
    index = {t: i for i, t in enumerate(tokens)}
    merges = []
    for token, score in scores.items():
        local = [(token[:k], token[k:], score) for k in range(1, len(token))
                 if token[:k] in index and token[k:] in index]
        local.sort(key=lambda m: (index[m[0]], index[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def _byte_level(tokens: list[str], merges: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    spelled = byte_alphabet()
    alphabet = set(spelled.values())
    vocab = {t if set(t) <= alphabet else "".join(spelled[b] for b in t.encode("utf-8")): i
             for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges],
                               dropout=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece(meta: dict[str, Any], tokens: list[str], kind: str, gguf: str):
    """The tokenizer of a SentencePiece vocabulary of `kind` (SPM_KINDS)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    merges = meta.get("tokenizer.ggml.merges")
    if kind == "spaces":   # spaces stored as spaces; merges in the file's order, not its scores'
        tokens = [SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
        order = {t: -i for i, t in enumerate(tokens)}
    elif merges is None:
        scores = _field(meta, "tokenizer.ggml.scores", gguf)
        order = dict(zip(tokens, np.asarray(scores, np.float64).tolist()))
    vocab = {t: i for i, t in enumerate(tokens)}
    if kind == "spaces" and "<unk>" not in vocab:   # tokenizers would fail on any unknown piece
        raise ModelError(f"{gguf}: tokenizer.ggml.tokens has no <unk>, which its tokenizer "
                         f"falls back to")
    pairs = [tuple(m.split(" ")) for m in merges] if merges is not None else \
        recovered_merges(tokens, order)
    if kind == "spaces":
        tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=True, dropout=None,
                                   unk_token="<unk>", byte_fallback=True))
        tok.normalizer = normalizers.Replace(" ", SPACE)
        tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous",
                                                 invert=False)
        tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(),
                                         decoders.Fuse()])
        return tok
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=True, byte_fallback=True,
                               dropout=None))
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(content=" ", left=1)])
    if kind == "prepend":   # the prefix space from a normalizer (it shows on text led by spaces)
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(prepend=SPACE),
                                               normalizers.Replace(pattern=" ", content=SPACE)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first",
                                                     split=False)
    return tok


def build(meta: dict[str, Any], gguf: str = "the GGUF") -> tuple[str, dict[str, Any]]:
    """(tokenizer.json, tokenizer_config) of the tokenizer `meta` (a GGUF header read with its
    arrays) describes, as river_models.tokenizer.FileTokenizer reads them; ModelError naming
    the field where River cannot build it."""
    from tokenizers import AddedToken, Regex, pre_tokenizers, processors

    model = _field(meta, "tokenizer.ggml.model", gguf)
    if model not in MODELS:
        raise ModelError(f"{gguf}: tokenizer.ggml.model is {model!r}; River builds "
                         f"{', '.join(MODELS)}")
    tokens = _field(meta, "tokenizer.ggml.tokens", gguf)
    if not isinstance(tokens, list) or not tokens:
        raise ModelError(f"{gguf}: tokenizer.ggml.tokens is not a list of tokens")
    arch = meta.get("general.architecture", "")
    kind = BY_ARCH[arch].gguf.tokenizer if arch in BY_ARCH else "metaspace"
    types = meta.get("tokenizer.ggml.token_type")
    types = [] if types is None or isinstance(types, int) else np.asarray(types).tolist()
    if model == "gpt2":
        tok = _byte_level(tokens, _field(meta, "tokenizer.ggml.merges", gguf))
        alphabet = set(byte_alphabet().values())
        control = [t for t, k in zip(tokens, types) if k == CONTROL and set(t) <= alphabet]
    else:
        tok = _sentencepiece(meta, tokens, kind, gguf)
        control = [t for t, k in zip(tokens, types) if k == CONTROL]
    builder = "spaces" if model == "llama" and kind == "spaces" else model
    tok.add_special_tokens([AddedToken(t, special=True)
                            for t in dict.fromkeys(BUILDER_TOKENS[builder])])
    vocab = tok.get_vocab()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, k in zip(tokens, types) if k == USER_DEFINED and t in vocab])
    split = SPLITS.get(meta.get("tokenizer.ggml.pre"))
    if split is not None:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])

    config: dict[str, Any] = {}
    for name, key in NAMED.items():
        i = meta.get(f"tokenizer.ggml.{key}")
        config[name] = tokens[i] if i is not None and 0 <= i < len(tokens) else None
    if builder == "spaces":   # transformers' class for these keeps its own
        config["mask_token"] = "<mask>"
    named = [t for t in config.values() if t is not None]
    tok.add_special_tokens([AddedToken(t, special=True) for t in named])   # as transformers does
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", model == "llama"))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    bos, eos = config["bos_token"], config["eos_token"]
    add_bos, add_eos = add_bos and bos is not None, add_eos and eos is not None
    single = " ".join([f"{bos}:0"] * add_bos + ["$A:0"] + [f"{eos}:0"] * add_eos)
    pair = " ".join([single] + [f"{bos}:1"] * add_bos + ["$B:1"] + [f"{eos}:1"] * add_eos)
    tok.post_processor = processors.TemplateProcessing(
        single=single, pair=pair,
        special_tokens=[(bos, tok.token_to_id(bos))] * add_bos
        + [(eos, tok.token_to_id(eos))] * add_eos)
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str):
        config["chat_template"] = template
    config["clean_up_tokenization_spaces"] = False
    return tok.to_str(), config


def write(meta: dict[str, Any], folder, gguf: str = "the GGUF") -> None:
    """The tokenizer's files in `folder`, as FileTokenizer reads them."""
    from pathlib import Path

    text, config = build(meta, gguf)
    (Path(folder) / "tokenizer.json").write_text(text)
    (Path(folder) / "tokenizer_config.json").write_text(json.dumps(config))
