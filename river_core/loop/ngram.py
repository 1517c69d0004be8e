"""Drafts from the context's own n-grams (prompt lookup): where the last tokens of the context
(prompt and output) occurred before, what followed them then is proposed next, at no model cost.

Where an answer copies its prompt (a summary of a given passage, an answer from a quoted
document, an edit of given code) the longest such match usually continues the copy, and the
backbone keeps whole runs of it in one verification. Where nothing repeats, nothing is
proposed, and the round drafts from another source or takes a plain step.

The index is built once from the prompt and grows with each token that stands: for every
length n in [shortest, longest] it keeps the positions that followed the n tokens' latest
CANDIDATES occurrences. A lookup tries the longest suffix first (a long match is a copy, a
short one often a common phrase), and of its occurrences takes the one whose context agrees
with the current one furthest back (up to REACH tokens; the latest on a tie, where a copy
under way continues): the match length. Memory: (longest - shortest + 1) entries per context
token, each at most CANDIDATES positions.

How many tokens to draft follows the match length, as in SuffixDecoding (arXiv 2411.04975):
a copy twenty tokens long is likely to go on, a two-token match ("of the") often does not.
Each generation keeps, per match length (in powers of two), how many drafted tokens the
backbone kept and how many drafts it cut short (`Acceptance`, from a prior that trusts longer
matches more); with the
verification costs measured on this machine (verify_costs.py) a round drafts the length that
buys the most expected tokens a second, and nothing where even that does not beat a plain
step: a verification of k tokens costs several steps on a CPU, so a draft the backbone rejects
at once loses most of a step. Without costs (vLLM's drafter) a draft is as long as its match.
"""

from __future__ import annotations

from typing import Sequence

import attrs

from ..method.draft_length import DraftLength
from ..settings.errors import ConfigError
from ..settings.options import at_least, option
from .speculative import Drafts, Generation
from ..method.verify_costs import VerifyCosts

SHORTEST = 2   # a single repeated token ("the", ",") predicts little
LONGEST = 8
CANDIDATES = 4  # occurrences of an n-gram remembered: its latest
REACH = 64      # how far back a candidate's agreement with the context is measured


class NgramIndex:
    """Where each n-gram of a token sequence ended, its latest CANDIDATES occurrences, for n
    in [shortest, longest]."""

    def __init__(self, shortest: int = SHORTEST, longest: int = LONGEST) -> None:
        if not 1 <= shortest <= longest:
            raise ConfigError(f"n-gram lengths must satisfy 1 <= shortest <= longest, got "
                              f"{shortest} and {longest}")
        self.shortest, self.longest = shortest, longest
        self.tokens: list[int] = []
        # n-gram -> the positions of the tokens that followed its latest occurrences, oldest
        # first
        self._next: dict[tuple[int, ...], list[int]] = {}

    def extend(self, tokens: Sequence[int]) -> None:
        """Append `tokens`; each n-gram that now has a token after it is indexed."""
        for t in tokens:
            end = len(self.tokens)   # the n-grams ending before `t` are followed by it
            for n in range(self.shortest, min(self.longest, end) + 1):
                follows = self._next.setdefault(tuple(self.tokens[end - n:end]), [])
                follows.append(end)
                del follows[:-CANDIDATES]
            self.tokens.append(t)

    def match(self) -> tuple[int, int] | None:
        """(where the copy starts, the match length): of the longest suffix of the sequence
        that occurred before, the occurrence whose context agrees with the sequence's furthest
        back (up to REACH tokens; the latest of equals). None where no suffix of at least
        `shortest` tokens occurred before."""
        end = len(self.tokens)
        for n in range(min(self.longest, end), self.shortest - 1, -1):
            follows = self._next.get(tuple(self.tokens[end - n:]))
            if follows:
                return max(((start, self._agreement(start, n)) for start in follows),
                           key=lambda sl: (sl[1], sl[0]))
        return None

    def _agreement(self, start: int, n: int) -> int:
        """How many tokens before `start` equal the sequence's last ones (n at least: the
        n-gram matched)."""
        end, length = len(self.tokens), n
        reach = min(REACH, start)
        while length < reach and self.tokens[start - length - 1] == self.tokens[end - length - 1]:
            length += 1
        return length

    def copy(self, start: int, most: int) -> list[int]:
        """`most` tokens continuing the copy that starts at `start`: the context's tokens from
        there, and where they run into the end of the context, the copy's own tokens again
        (the suffix repeats every end - start tokens: "a b a b" proposes "a b a b ...")."""
        period = len(self.tokens) - start
        out: list[int] = []
        for k in range(most):
            out.append(self.tokens[start + k] if k < period else out[k - period])
        return out


def bucket(match_length: int) -> int:
    """Match lengths by powers of two: 1-2, 3-4, 5-8, 9-16, 17-32, longer."""
    return min(5, max(0, (match_length - 1).bit_length() - 1))


@attrs.define
class Acceptance:
    """Drafts from matches of one length bucket: drafted tokens the backbone kept, and drafts
    it cut short. A draft's tokens are kept while they agree, so each is kept with the
    continuation rate kept / (kept + cut) given the one before was (a geometric run)."""

    kept: float
    cut: float = 1.0

    @classmethod
    def prior(cls, b: int) -> "Acceptance":
        """Before any draft of bucket `b`: a longer match more likely goes on (1:1 for 1-2
        tokens, 2:1 for 3-4, ... 32:1 past 32), worth one draft cut short, so that a bucket
        is tried and its own drafts soon decide."""
        return cls(float(2 ** b))

    @property
    def rate(self) -> float:
        return self.kept / (self.kept + self.cut)

    def expected_tokens(self, k: int) -> float:
        """Tokens a round drafting k yields, on average: the kept drafts and the backbone's."""
        a = self.rate
        return float(sum(a ** i for i in range(k + 1)))

    def add(self, drafted: int, kept: int) -> None:
        self.kept += kept
        self.cut += kept < drafted


def best_length(acceptance: Acceptance, costs: VerifyCosts, most: int) -> int:
    """The draft length of at most `most` whose round buys the most expected tokens a second;
    0 where even that does not beat plain steps (`DraftLength.beats`)."""
    per_token = lambda k: costs.verification(k + 1) / acceptance.expected_tokens(k)
    k = min(range(1, most + 1), key=per_token)
    return k if DraftLength.beats(per_token(k), costs.step) else 0


@attrs.frozen
class NgramOptions:
    ngram_min: int = option(SHORTEST, "the shortest suffix of the context looked up", at_least(1))
    ngram_max: int = option(LONGEST, "the longest suffix of the context looked up (tried "
                            "first)", at_least(1))
    ngram_tokens: int = option(16, "the most tokens an n-gram match drafts in a round (a "
                               "round drafts fewer where its match is short)", at_least(1))

    def __attrs_post_init__(self) -> None:
        if self.ngram_min > self.ngram_max:
            raise ConfigError(f"ngram_min must be <= ngram_max, got {self.ngram_min} and "
                              f"{self.ngram_max}")


@attrs.frozen
class NgramSource:
    """Drafts what followed the best earlier occurrence of the context's last tokens (prompt
    lookup), at no model cost, as many as its match length pays for; nothing where no suffix
    repeats."""

    options: NgramOptions = NgramOptions()
    sizes_drafts = True   # DraftLength leaves the length to the drafter

    @property
    def most(self) -> int:
        return self.options.ngram_tokens

    def start(self, generation: Generation) -> "NgramDrafter":
        index = NgramIndex(self.options.ngram_min, self.options.ngram_max)
        index.extend(generation.prompt)
        return NgramDrafter(index, generation.costs)


class NgramDrafter:
    """One generation's n-gram drafts: the index holds the prompt and every token that stood;
    the acceptance of its drafts is kept per match length."""

    def __init__(self, index: NgramIndex, costs: VerifyCosts | None = None) -> None:
        self.index, self.costs = index, costs
        self.acceptance = [Acceptance.prior(b) for b in range(bucket(REACH) + 1)]
        self._proposed: tuple[int, list[int]] | None = None   # (bucket, drafts) last round

    def propose(self, token: int, position: int, gamma: int) -> Drafts:
        # `token`, the round's first, stood last round: the index holds it already
        found = self.index.match()
        if found is None:
            return Drafts([], [], [])
        start, length = found
        b = bucket(length)
        k = min(gamma, length) if self.costs is None else \
            best_length(self.acceptance[b], self.costs, gamma)
        tokens = self.index.copy(start, k)
        self._proposed = (b, tokens) if tokens else None
        return Drafts(tokens, [None] * len(tokens), [])

    def stood(self, tokens: Sequence[int]) -> None:
        if self._proposed is not None:   # this source drafted the round: what it kept
            b, drafts = self._proposed
            kept = next((i for i, (d, t) in enumerate(zip(drafts, tokens)) if d != t),
                        min(len(drafts), len(tokens)))
            self.acceptance[b].add(len(drafts), kept)
            self._proposed = None
        self.index.extend(tokens)
