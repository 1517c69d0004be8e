"""Drafts from the context's own n-grams (prompt lookup): where the last tokens of the context
(prompt and output) occurred before, what followed them then is proposed next, at no model cost.

Where an answer copies its prompt (a summary of a given passage, an answer from a quoted
document, an edit of given code) the longest such match usually continues the copy, and the
backbone keeps whole runs of it in one verification. Where nothing repeats, nothing is
proposed, and the round drafts from another source or takes a plain step.

The index is built once from the prompt and grows with each token that stands: for every
length n in [shortest, longest] it maps the n tokens ending at a position to the position
that followed their latest occurrence (the latest, because a copy under way continues from
where it last matched). A lookup tries the longest suffix first: a long match is a copy, a
short one often a common phrase. Memory: (longest - shortest + 1) entries per context token.
"""

from __future__ import annotations

from typing import Sequence

import attrs

from .errors import ConfigError
from .options import at_least, option
from .speculative import Drafts, Generation

SHORTEST = 2   # a single repeated token ("the", ",") predicts little
LONGEST = 8


class NgramIndex:
    """Where each n-gram of a token sequence last ended, for n in [shortest, longest]."""

    def __init__(self, shortest: int = SHORTEST, longest: int = LONGEST) -> None:
        if not 1 <= shortest <= longest:
            raise ConfigError(f"n-gram lengths must satisfy 1 <= shortest <= longest, got "
                              f"{shortest} and {longest}")
        self.shortest, self.longest = shortest, longest
        self.tokens: list[int] = []
        # n-gram -> the position of the token that followed its latest occurrence
        self._next: dict[tuple[int, ...], int] = {}

    def extend(self, tokens: Sequence[int]) -> None:
        """Append `tokens`; each n-gram that now has a token after it is indexed."""
        for t in tokens:
            end = len(self.tokens)   # the n-grams ending before `t` are followed by it
            for n in range(self.shortest, min(self.longest, end) + 1):
                self._next[tuple(self.tokens[end - n:end])] = end
            self.tokens.append(t)

    def propose(self, most: int) -> list[int]:
        """Up to `most` tokens that followed the longest suffix of the sequence that occurred
        before (none where no suffix of at least `shortest` tokens did)."""
        end = len(self.tokens)
        for n in range(min(self.longest, end), self.shortest - 1, -1):
            start = self._next.get(tuple(self.tokens[end - n:]))
            if start is not None:
                return self._copy(start, most)
        return []

    def _copy(self, start: int, most: int) -> list[int]:
        """`most` tokens continuing the copy that starts at `start`: the context's tokens from
        there, and where they run into the end of the context, the copy's own tokens again
        (the suffix repeats every end - start tokens: "a b a b" proposes "a b a b ...")."""
        period = len(self.tokens) - start
        out: list[int] = []
        for k in range(most):
            out.append(self.tokens[start + k] if k < period else out[k - period])
        return out


@attrs.frozen
class NgramOptions:
    ngram_min: int = option(SHORTEST, "the shortest suffix of the context looked up", at_least(1))
    ngram_max: int = option(LONGEST, "the longest suffix of the context looked up (tried "
                            "first)", at_least(1))
    ngram_tokens: int = option(8, "the most tokens an n-gram match drafts in a round",
                               at_least(1))

    def __attrs_post_init__(self) -> None:
        if self.ngram_min > self.ngram_max:
            raise ConfigError(f"ngram_min must be <= ngram_max, got {self.ngram_min} and "
                              f"{self.ngram_max}")


@attrs.frozen
class NgramSource:
    """Drafts what followed the longest earlier occurrence of the context's last tokens
    (prompt lookup), at no model cost; nothing where no suffix repeats."""

    options: NgramOptions = NgramOptions()

    @property
    def most(self) -> int:
        return self.options.ngram_tokens

    def start(self, generation: Generation) -> "NgramDrafter":
        index = NgramIndex(self.options.ngram_min, self.options.ngram_max)
        index.extend(generation.prompt)
        return NgramDrafter(index)


class NgramDrafter:
    """One generation's n-gram drafts: the index holds the prompt and every token that stood."""

    def __init__(self, index: NgramIndex) -> None:
        self.index = index

    def propose(self, token: int, position: int, gamma: int) -> Drafts:
        # `token`, the round's first, stood last round: the index holds it already
        tokens = self.index.propose(gamma)
        return Drafts(tokens, [None] * len(tokens), [])

    def stood(self, tokens: Sequence[int]) -> None:
        self.index.extend(tokens)
