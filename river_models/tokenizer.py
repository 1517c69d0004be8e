"""A Hugging Face tokenizer behind the core's `Tokenizer` protocol."""

from __future__ import annotations

from typing import Sequence


class Tokenizer:
    def __init__(self, hf_tokenizer, eos_ids: Sequence[int]) -> None:
        self.hf = hf_tokenizer
        self.eos_ids = frozenset(eos_ids)

    def encode(self, text: str) -> list[int]:
        return list(self.hf(text)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def chat(self, prompt: str) -> list[int]:
        if self.hf.chat_template is None:
            return self.encode(prompt)
        out = self.hf.apply_chat_template([{"role": "user", "content": prompt}],
                                          add_generation_prompt=True, tokenize=True)
        ids = out["input_ids"] if not isinstance(out, list) else out   # dict-like in v5
        return list(ids[0] if ids and isinstance(ids[0], list) else ids)
