"""Prompt files: JSONL (a "question", "prompt" or "text" field per line) or plain text (a
prompt per non-empty line); and the GSM8K slices bundled with River (data/gsm8k/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

from river_core.settings.errors import ConfigError

GSM8K = Path(__file__).resolve().parent / "data" / "gsm8k"
GSM8K_TRAIN = GSM8K / "train.jsonl"
GSM8K_TEST_DEV = GSM8K / "test_dev.jsonl"
FIELDS = ("question", "prompt", "text")


def read_prompts(path: Path, limit: int | None = None, offset: int = 0) -> list[str]:
    """Prompts offset..offset+limit-1 of `path`."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read prompts from {path}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ConfigError(f"{path} is not valid UTF-8: byte 0x{raw[e.start]:02x} at byte offset "
                          f"{e.start} (line {line})") from None
    lines = [line for line in text.splitlines() if line.strip()]
    lines = lines[offset:] if limit is None else lines[offset:offset + limit]
    if path.suffix == ".jsonl":
        lines = [_field(line, path, offset + i) for i, line in enumerate(lines)]
    if not lines:
        raise ConfigError(f"no prompts in {path} from line {offset + 1}")
    return lines


def _field(line: str, path: Path, index: int) -> str:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} line {index + 1} is not JSON: {e.msg}") from None
    for name in FIELDS:
        if isinstance(row, dict) and isinstance(row.get(name), str):
            return row[name]
    raise ConfigError(f"{path} line {index + 1} has none of the fields {', '.join(FIELDS)}")
