"""Small real-shaped vocabularies for the tiny GGUFs, written as llama.cpp's converter writes
them: one SentencePiece vocabulary with byte fallback, scores and no merges (spaces spelled as
the family's kind spells them: river_models.gguf_tokenizer), one byte-level BPE with merges and
a named split.
They exercise what a GGUF's tokenizer has to get right (bytes, runs of spaces, unicode, control
and user-defined tokens) in tests of River's GGUF tokenizer against transformers'."""

from __future__ import annotations

# llama.cpp's token types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
KINDS = ("spm", "bpe")
CHAT = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n" \
       "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
WORDS = ["the", "he", "hello", "world", "in", "ing", "th", "er", "on", "an", "re", "cat",
         "ca", "at", "wor", "ld", "ll", "lo", "el", "is", "it", "or", "and", "nd"]
SPACE = "\u2581"


def _spm(spaces: bool) -> dict:
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<think>"]
    types = [UNKNOWN, CONTROL, CONTROL, CONTROL, CONTROL, USER_DEFINED]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    pieces = [SPACE] + [c for c in "abcdefghijklmnopqrstuvwxyz.,'!?0123456789"] + WORDS \
        + [SPACE + w for w in WORDS] + ["é", "東"]
    if spaces:   # runs of spaces stored as spaces
        pieces += ["  ", "   "]
    else:
        pieces += [SPACE * 2, SPACE * 3]
    tokens += pieces
    types += [NORMAL] * len(pieces)
    scores = [0.0] * (len(tokens) - len(pieces)) + [-float(i) for i in range(len(pieces))]
    return {"model": "llama", "tokens": tokens, "types": types, "scores": scores,
            "bos": 1, "eos": 2, "unk": 0, "merges": None, "pre": "default"}


def _bpe() -> dict:
    from .gguf_tokenizer import byte_alphabet

    spelled = byte_alphabet()
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>"]
    types = [CONTROL, CONTROL, CONTROL, USER_DEFINED]
    tokens += [spelled[b] for b in range(256)]
    types += [NORMAL] * 256
    merges = []
    for word in ["Ġ" + w for w in WORDS] + WORDS + ["ĠĠ", "ĠĠĠ"]:
        have = word[0]
        for c in word[1:]:   # left to right, each step a merge of known tokens
            merge = f"{have} {c}"
            have += c
            if have not in tokens:
                merges.append(merge)
                tokens.append(have)
                types.append(NORMAL)
    return {"model": "gpt2", "tokens": tokens, "types": types, "scores": None, "bos": 0,
            "eos": 2, "unk": None, "merges": merges, "pre": "qwen2"}


def vocabulary(kind: str, spm_kind: str) -> dict:
    """The fields of vocabulary `kind` ("spm", "bpe") for a family whose SentencePiece
    vocabularies are of `spm_kind` (its `Gguf.tokenizer`)."""
    return _spm(spm_kind == "spaces") if kind == "spm" else _bpe()


UNUSED = 5   # llama.cpp's token type of the converter's padding


def add_vocabulary(w, kind: str, spm_kind: str, size: int | None = None) -> None:
    """Vocabulary `kind`'s fields in GGUF writer `w`, chat template included; padded to
    `size` tokens as llama.cpp's converter pads a vocabulary shorter than the embedding
    (`[PAD{i}]`, unused), for a model of a real vocabulary's width."""
    v = vocabulary(kind, spm_kind)
    if size is not None:
        pad = range(len(v["tokens"]), size)
        v["tokens"] = v["tokens"] + [f"[PAD{i}]" for i in pad]
        v["types"] = v["types"] + [UNUSED] * len(pad)
        if v["scores"] is not None:
            v["scores"] = v["scores"] + [-10000.0] * len(pad)
    w.add_tokenizer_model(v["model"])
    w.add_tokenizer_pre(v["pre"])
    w.add_token_list([t.encode() for t in v["tokens"]])
    w.add_token_types(v["types"])
    if v["scores"] is not None:
        w.add_token_scores(v["scores"])
    if v["merges"] is not None:
        w.add_token_merges([m.encode() for m in v["merges"]])
    w.add_bos_token_id(v["bos"])
    w.add_eos_token_id(v["eos"])
    if v["unk"] is not None:
        w.add_unk_token_id(v["unk"])
    w.add_chat_template(CHAT)
