"""Prompts: GSM8K questions from the whole files beside a checkout (the project's own runs) or
the slices bundled with River."""

from __future__ import annotations

from pathlib import Path

from river_core import ConfigError
from river_cli.prompts import GSM8K, read_prompts

_SHARED = Path(__file__).resolve().parents[3] / "shared/data/gsm8k"
GSM8K_TRAIN = (_SHARED if (_SHARED / "train.jsonl").is_file() else GSM8K) / "train.jsonl"
GSM8K_TEST = GSM8K_TRAIN.with_name("test_dev.jsonl")


def gsm8k_questions(path: Path, n: int, offset: int = 0) -> list[str]:
    try:
        return read_prompts(path, n, offset)
    except ConfigError as e:
        raise SystemExit(f"{e} (pass --data)") from None


def prompt_of(model, length: int, offset: int = 0) -> list[int]:
    """`length` tokens of a `RiverModel`'s encoding of GSM8K train questions from the
    `offset`th on, joined until long enough."""
    ids: list[int] = []
    n = 8
    while len(ids) < length:
        ids = model.encode("\n\n".join(gsm8k_questions(GSM8K_TRAIN, n, offset)),
                           chat=False)[0]
        n *= 2
    return ids[:length]
