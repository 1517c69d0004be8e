"""Tokenizers behind the core's `Tokenizer` protocol: a transformers tokenizer (`Tokenizer`),
or a saved one read without transformers (`FileTokenizer`: tokenizer.json through the
`tokenizers` package and the chat template rendered with jinja2 as transformers renders it),
so an engine that needs no torch starts without importing transformers (3-4 s)."""

from __future__ import annotations

import functools
import json
from datetime import datetime
from pathlib import Path
from typing import Sequence

from river_core.settings.errors import ModelError


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


# the special tokens transformers passes to a chat template by name (its special_tokens_map)
SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
           "mask_token")


class FileTokenizer:
    """A tokenizer saved by transformers (`save_pretrained`), read from its folder without
    transformers: the same ids for text and for a chat turn (tests/test_models.py checks them
    against transformers on the embedded model and a tiny one)."""

    def __init__(self, folder: Path, eos_ids: Sequence[int]) -> None:
        from tokenizers import Tokenizer as Backend

        folder = Path(folder)
        try:
            self._tok = Backend.from_file(str(folder / "tokenizer.json"))
            config = json.loads((folder / "tokenizer_config.json").read_text())
        except Exception as e:   # a missing or damaged file: one line
            raise ModelError(f"cannot read the tokenizer in {folder}: {e}") from None
        template = folder / "chat_template.jinja"
        self.chat_template = template.read_text() if template.is_file() else \
            config.get("chat_template")
        self._special = {}
        for name in SPECIAL:
            value = config.get(name)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                self._special[name] = value
        self._clean_up = bool(config.get("clean_up_tokenization_spaces", False))
        self.eos_ids = frozenset(eos_ids)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids: Sequence[int]) -> str:
        text = self._tok.decode(list(ids), skip_special_tokens=True)
        return _clean_up(text) if self._clean_up else text

    def chat(self, prompt: str) -> list[int]:
        if self.chat_template is None:
            return self.encode(prompt)
        text = _compiled(self.chat_template).render(
            messages=[{"role": "user", "content": prompt}], tools=None, documents=None,
            add_generation_prompt=True, **self._special)
        return self._tok.encode(text, add_special_tokens=False).ids


def _clean_up(text: str) -> str:
    """transformers' clean_up_tokenization: no space before punctuation and contractions."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                          (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
                          (" 're", "'re")):
        text = text.replace(before, after)
    return text


@functools.cache
def _compiled(template: str):
    """The template in transformers' jinja2 environment: sandboxed, trim_blocks and
    lstrip_blocks, loop controls, its tojson (no HTML escaping), raise_exception and
    strftime_now; `{% generation %}` blocks render their body."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body
                                          ).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    return env.from_string(template)
