"""The README's Python blocks run as written, on a tiny random model standing in for the
embedded default (every `from_pretrained()` and `locate()` without a model finds it)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.fixture
def tiny_default(tiny_folder, monkeypatch):
    from river_models import source

    monkeypatch.setattr(source, "default_gguf", lambda: Path(tiny_folder("llama")))


def test_the_readme_shows_the_api_and_transformers():
    assert len(BLOCKS) >= 2 and any("custom_generate" in b for b in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block-{i}" for i in range(len(BLOCKS))])
def test_a_readme_block_runs_as_written(block, tiny_default):
    exec(compile(block, str(README), "exec"), {})
