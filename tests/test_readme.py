"""The README's code does what it says: its Python blocks run as written on the real embedded
model and print what their `# prints:` comments say; its first command gives the answer the
README promises."""

import contextlib
import io
import re
from pathlib import Path

import pytest

from river_core import ModelError

README = Path(__file__).resolve().parents[1] / "README.md"
TEXT = README.read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, re.S)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def embedded():
    from river_models import default_gguf
    try:
        default_gguf()
    except ModelError as e:
        pytest.skip(str(e))


def test_the_readme_shows_the_api_and_transformers():
    assert len(BLOCKS) >= 2 and any("custom_generate" in b for b in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block-{i}" for i in range(len(BLOCKS))])
def test_a_readme_block_prints_what_it_says(block):
    expected = re.findall(r"# prints: (.+)$", block, re.M)
    assert expected, "a README block says what it prints"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, str(README), "exec"), {})
    for text in expected:
        assert text.strip() in printed.getvalue(), (text, printed.getvalue())


def test_the_first_command_answers_as_the_readme_says(capsys):
    from river_cli.main import main

    promised = re.search(r"River answers `([^`]+)`", TEXT).group(1)
    assert main(["generate", "What is the capital of France?"]) == 0
    out, err = capsys.readouterr()
    # its decode statistics (the layers a draft ran only where the river drafted: n-gram
    # drafts and plain rounds run none of its own)
    assert out.strip() == promised and "ms/token" in err and "speculative:" in err
