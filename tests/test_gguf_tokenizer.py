"""A GGUF's tokenizer read from its own metadata (river_models.gguf_tokenizer), without
transformers, gives transformers' GGUF tokenizer's ids token for token, for text, chat turns
and decoding: on every family's tiny GGUF with its placeholder vocabulary and with real-shaped
SentencePiece and byte-level ones (river_conformance.fixtures.tiny_vocab), and on the embedded model (issue 52).
"""

import json
import subprocess
import sys

import pytest

from river_core.settings.errors import ModelError
from river_models.gguf_header import read_header
from river_models.gguf_tokenizer import build, write
from river_conformance.fixtures.tiny_gguf import gguf_file
from river_models.tokenizer import FileTokenizer

# every tiny family transformers reads from a GGUF (it reads no mistral3 one: Ministral 3's
# GGUF tokenizer is the llama one, checked under llama)
FAMILIES = ["llama", "mistral", "llama3", "qwen2", "qwen3", "gemma3", "phi3"]
TEXTS = ["Hello world", "hello  world   and the cat", " leading space", "   three leading",
         "trailing spaces   ", "tabs\tand\nnew\n\nlines\r\n", "café naïve 東京 🙂 ﬁ",
         "bytes \x00\x01\x7f and \u200b", "<|im_start|>user\nhi<|im_end|>", "<think>is it</think>",
         "<s>a</s> <unk>", "numbers 12345 and 3.14159", "it's we're I'll they've", "",
         "the " * 20]


def ours(path, tmp_path) -> FileTokenizer:
    write(read_header(path, arrays=True).metadata, tmp_path, path.name)
    return FileTokenizer(tmp_path, ())


def theirs(path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def missing_bos(mine: FileTokenizer, reference) -> list[int]:
    """The BOS transformers before 5.20 leaves out where the GGUF's vocabulary calls for one
    (as llama.cpp adds it, and River, and transformers 5.20 and later); [] otherwise."""
    import transformers
    from packaging.version import Version

    old = Version(transformers.__version__) < Version("5.20")
    return mine.encode("")[:1] if old and reference("")["input_ids"] == [] else []


def check_same(path, tmp_path) -> None:
    mine, reference = ours(path, tmp_path), theirs(path)
    bos = missing_bos(mine, reference)
    for text in TEXTS:
        ids = bos + reference(text)["input_ids"]
        assert mine.encode(text) == ids, text
        assert mine.decode(ids) == reference.decode(ids, skip_special_tokens=True), text
    if reference.chat_template is not None:
        for text in TEXTS[:4]:
            want = reference.apply_chat_template([{"role": "user", "content": text}],
                                                 add_generation_prompt=True, tokenize=True)
            want = want["input_ids"] if not isinstance(want, list) else want
            assert mine.chat(text) == list(want), text


@pytest.mark.parametrize("vocabulary", [None, "spm", "bpe"])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_gguf_tokenizer_gives_transformers_ids(family, vocabulary, tmp_path):
    if (family, vocabulary) == ("gemma3", None):   # no <unk>: transformers fails on any text
        with pytest.raises(ModelError, match="has no <unk>, which its tokenizer falls back"):
            ours(gguf_file(0, family), tmp_path)
        return
    check_same(gguf_file(0, family, vocabulary), tmp_path)


def test_the_embedded_models_gguf_tokenizer_gives_transformers_ids(tmp_path):
    from river_models import default_gguf

    try:
        path = default_gguf()
    except ModelError:
        pytest.skip("the embedded model is not installed")
    check_same(path, tmp_path)


def test_it_is_built_without_importing_transformers(tmp_path):
    path = gguf_file(0, "qwen2", "bpe")
    job = ("import sys; from river_models.gguf_header import read_header; "
           "from river_models.gguf_tokenizer import build; "
           f"build(read_header({str(path)!r}, arrays=True).metadata); "
           "print(sorted({'torch', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", job], capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


def test_a_tokenizer_model_river_cannot_build_is_named_in_one_line():
    meta = read_header(gguf_file(0, "llama"), arrays=True).metadata
    with pytest.raises(ModelError, match=r"tokenizer.ggml.model is 'bert'; River builds gpt2, "
                                         r"llama$"):
        build({**meta, "tokenizer.ggml.model": "bert"}, "x.gguf")
    with pytest.raises(ModelError, match="no tokenizer.ggml.merges"):
        build({**meta, "tokenizer.ggml.model": "gpt2"}, "x.gguf")


def test_the_chat_template_and_special_tokens_come_from_the_file():
    meta = read_header(gguf_file(0, "qwen2", "bpe"), arrays=True).metadata
    _, config = build(meta)
    assert config["chat_template"] == meta["tokenizer.chat_template"]
    assert (config["bos_token"], config["eos_token"]) == ("<|endoftext|>", "<|im_end|>")
    assert json.dumps(config)   # what FileTokenizer reads back
