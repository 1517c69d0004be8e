"""Text out in O(n): the streaming detokenizer gives exactly the whole decode, decoding each id
a bounded number of times, and stop strings and streams read it."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from river_core import Capabilities, ModelError, Prefill, RiverModel
from river_core.loop.detokenize import Detokenizer, StopScan


class ByteTokenizer:
    """Ids 0..255 are bytes (so a character may span ids), 256 the end of text (no text), 257
    the two bytes of "é" at once; decode is lossy UTF-8 over the bytes, like a byte-level BPE.
    Counts its decode calls and the ids they decode."""

    EOS = 256
    eos_ids = frozenset({EOS})

    def __init__(self) -> None:
        self.calls = self.decoded = 0

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def chat(self, prompt: str) -> list[int]:
        return self.encode(prompt)

    def decode(self, ids) -> str:
        self.calls += 1
        self.decoded += len(ids)
        pieces = {self.EOS: b"", 257: "é".encode()}
        return b"".join(pieces.get(i, bytes([i % 256])) for i in ids).decode(errors="replace")


def streamed(tokenizer, ids) -> str:
    text = Detokenizer(tokenizer)
    return "".join(text.add(i) for i in ids) + text.finish()


@given(st.lists(st.one_of(st.integers(0, 257), st.sampled_from([0xC3, 0xA9, 0xE2, 0x82,
                                                                  0xAC, 0xF0, 0x9F, 0xFF])),
                max_size=40))
def test_streamed_text_is_the_whole_decode_of_any_bytes(ids):
    """Characters split over ids, bytes no character has, an end of text with no text."""
    assert streamed(ByteTokenizer(), ids) == ByteTokenizer().decode(ids)


@given(st.lists(st.integers(0, 60), max_size=40))
def test_streamed_text_is_the_whole_decode_with_the_tiny_tokenizer(ids):
    """Its decoder joins ids with spaces and skips special ids: an id's text depends on the
    ids before it."""
    from river_conformance.fixtures import tiny
    from river_models.tokenizer import Tokenizer

    tokenizer = Tokenizer(tiny.tokenizer(), [2])
    assert streamed(tokenizer, ids) == tokenizer.decode(ids)


@pytest.fixture(scope="module")
def smollm2():
    from river_models import open_model
    try:
        return open_model().tokenizer
    except ModelError as e:   # the embedded model's package is not installed
        pytest.skip(str(e))


@pytest.mark.slow
@settings(max_examples=200)
@given(st.lists(st.one_of(st.integers(0, 49151), st.integers(0, 300)), max_size=40))
def test_streamed_text_is_the_whole_decode_with_the_embedded_tokenizer(smollm2, ids):
    """SmolLM2's byte-level BPE: random ids, byte ids and special ids (0..16) among them."""
    assert streamed(smollm2, ids) == smollm2.decode(ids)


def test_a_stop_string_straddling_ids_is_seen_at_the_id_that_completes_it():
    scan = StopScan(ByteTokenizer(), ["é!", "never"])
    seen = [scan.add(i) for i in [*b"ab", 0xC3, 0xA9, *b"!"]]
    assert seen == [False, False, False, False, True]


class ScriptedBackend:
    """An engine that writes a fixed script, whatever it is fed: prefill chooses script[0],
    the token at position p chooses the one after it. Verifies, so lossless mode runs on it
    (every draft stands)."""

    name, num_layers, runs_on = "scripted", 2, ("cpu",)
    capabilities = Capabilities(verify=True)

    def __init__(self, script: list[int], prompt: int) -> None:
        self.script, self.prompt = script, prompt
        self.tokenizer = ByteTokenizer()
        self.max_positions = prompt + len(script) + 8

    def _logits(self, position: int) -> np.ndarray:
        out = np.zeros(258, dtype=np.float32)
        out[self.script[min(position - self.prompt + 1, len(self.script) - 1)]] = 1.0
        return out

    def prefill(self, prompts, capacity, prefill_exit=None) -> Prefill:
        return Prefill(self._logits(self.prompt - 1)[None],
                       np.ones((1, self.num_layers), dtype=np.float32))

    def decode(self, tokens, step) -> np.ndarray:
        return self._logits(step.start)[None]

    def extend(self, tokens, start: int) -> np.ndarray:
        return np.stack([self._logits(start + t) for t in range(len(tokens))])

    def trim(self, offset: int) -> None:
        pass


N = 2048


@pytest.mark.parametrize("mode", ["exit", "speculative"])
@pytest.mark.parametrize("stop_at_end", [True, False])
def test_a_2048_token_generation_with_a_stop_string_decodes_each_id_a_few_times(mode,
                                                                                  stop_at_end):
    """Decoding the whole text again at every token would decode about N²/2 = 2 million ids;
    the stream decodes at most a few per token, and the text is still the whole decode."""
    body = [*"é and €, ".encode()] * (N // 12 + 1) + [257]
    script = (body[:N - 4] + [*b"STOP"]) if stop_at_end else body[:N]
    backend = ScriptedBackend(script, prompt=3)
    model = RiverModel(backend)
    out = model.generate("abc", chat=False, kv="full", mode=mode, max_new_tokens=N,
                         stop=["STOP", "never"])
    tokenizer = backend.tokenizer
    assert tokenizer.decoded <= 6 * N and tokenizer.calls <= 3 * N, \
        (tokenizer.calls, tokenizer.decoded)   # the stop scan's, and the answer's one decode
    assert out.stats.tokens[0] == script[:N]
    assert out.text == tokenizer.decode(script[:N - 4] if stop_at_end else script)


def test_a_streams_text_grows_by_new_ids_and_ends_as_the_whole_decode():
    script = [*"naïve €".encode(), *b"tail", ByteTokenizer.EOS]
    backend = ScriptedBackend(script, prompt=3)
    stream = RiverModel(backend).stream("abc", chat=False, kv="full", max_new_tokens=20)
    texts = [stream.text() for _ in stream]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert "\ufffd" not in "".join(texts)   # whole characters only
    assert backend.tokenizer.decoded <= 4 * len(script)
    assert stream.text() == "naïve €tail" == RiverModel(backend).text(stream.ids())
