"""Text out as ids come, decoding each id a bounded number of times: O(n) over a generation.

Decoding the whole output again on every token is O(n²). A tokenizer's text is not the sum of
its ids' texts, though: a character may span several byte tokens (each alone decodes to
U+FFFD), and an id's text may depend on the ids before it (a SentencePiece "▁word" loses its
space at the start of a text; a decoder without one joins ids with spaces). So, as
mlx-lm's and vLLM's streaming detokenizers do, `Detokenizer` decodes a short window: the ids
since the last stable point, after the chunk before it as context (whose text is already
out), and gives out the window's text past the context's. A point is stable once the window's
text ends in a whole character; before that, the characters ahead of a trailing run of U+FFFD
are given out at once (lossy UTF-8 decoding never changes a character once another follows
it), and the window moves on once the text of its ids but the last is followed by a new whole
character. Only the core's `Tokenizer.decode` is used. The window grows only while the text
stays an unbroken run of replacement characters or ids with no text at all.
"""

from __future__ import annotations

from typing import Sequence

from ..contract.backend import Tokenizer

REPLACEMENT = "\ufffd"


class Detokenizer:
    """One sequence's text, an id at a time: `add` gives the text each id makes final, `finish`
    the rest; together they are exactly `tokenizer.decode(ids)`."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._start = 0   # the window is ids[start:]
        self._read = 0    # ids[start:read]: the context, its text out
        self._shown = 0   # characters of the window's text out (>= head)
        self._last = ""   # the window's text before the newest id

    def add(self, token: int) -> str:
        """The text `token` makes final (empty while a character is incomplete)."""
        self.ids.append(token)
        window = self.tokenizer.decode(self.ids[self._start:])
        whole = len(window.rstrip(REPLACEMENT))   # characters no later id can change
        if whole == len(window):
            return self._give(window, len(window), len(self.ids))
        before = self._last   # the text of the ids but the newest, followed by a new character
        if len(self.ids) - 1 > self._read and window.startswith(before) and whole > len(before):
            return self._give(window, whole, len(self.ids) - 1, len(before))
        piece = window[self._shown:whole]
        self._shown = max(self._shown, whole)
        self._last = window
        return piece

    def finish(self) -> str:
        """The text not given out yet (a last incomplete character's replacement)."""
        return self.tokenizer.decode(self.ids[self._start:])[self._shown:]

    def _give(self, window: str, final: int, stable: int, stable_len: int | None = None) -> str:
        """Give out window[shown:final]; ids[:stable] are final, their text ends at
        `stable_len` in the window (default: the whole window); move the window on."""
        piece = window[self._shown:final]
        shown = max(self._shown, final)
        stable_len = len(window) if stable_len is None else stable_len
        chunk = self.tokenizer.decode(self.ids[self._read:stable])
        if chunk:   # the new context: the chunk just made stable (a chunk with no text, e.g.
            # a skipped special id, is no context: the one before it stays)
            self._start, head = self._read, chunk
        else:
            head = window[:stable_len]
        self._read = stable
        self._shown = len(head) + shown - stable_len
        self._last = head + window[stable_len:]
        return piece


class StopScan:
    """Whether a stop string has appeared in a sequence's text, an id at a time, reading only
    the new text and the few characters before it that a stop string could start in."""

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str]) -> None:
        self.text = Detokenizer(tokenizer)
        self.stop = tuple(stop)
        self._keep = max((len(s) for s in self.stop), default=1) - 1
        self._tail = ""

    def add(self, token: int) -> bool:
        if not self.stop:
            return False
        seen = self._tail + self.text.add(token)
        self._tail = seen[-self._keep:] if self._keep else ""
        return any(s in seen for s in self.stop)
