"""Which source drafts a lossless round, and how many tokens: `DraftLength`, from the cost of
each source's last rounds against plain steps (a round of no drafts), modelled from the
verification costs measured on this machine (verify_costs.py) or, without them, clocked. The
loop that drafts and verifies is speculative.py; this is what it (and vLLM's drafter)
consults between rounds."""

from __future__ import annotations

from typing import Collection, Mapping

import attrs
import numpy as np

from .verify_costs import VerifyCosts

RIVER = "river"   # the exit river's drafts: the source of a round that names none
PLAIN = "plain"   # a round of no drafts: the backbone's next token alone


@attrs.frozen
class Round:
    """One draft-and-verify round (the first, from prefill, drafts nothing)."""

    tokens: list[int]       # what stands: the accepted drafts, then the backbone's token
    drafted: int
    accepted: int
    exit_layers: list[int]  # per draft step, the last backbone layer it ran
    draft_seconds: float
    verify_seconds: float
    source: str = RIVER     # the draft source (a round that drafted nothing is a plain step)


@attrs.define
class _Way:
    """One way of taking rounds: its last KEEP rounds' [seconds, tokens], and when it is next
    tried while it loses (a draft source's `wait` counts towards a try of drafting with it;
    plain steps' towards a try of plain steps while some source wins)."""

    most: int = 0
    next: int = 0           # a source's draft length
    rounds: list[list[float]] = attrs.Factory(list)
    wait: int = 0
    since: int = 0


class DraftLength:
    """Which source drafts next, and how many tokens. Agreement comes in runs (a number copied
    from the question, a formula's boilerplate, a passage the answer quotes) more than token by
    token, so each source's length follows its last round: one more after a round the backbone
    kept whole, one less after a rejection, between 1 and its `most` (on GSM8K train this beat
    a cost model that assumed independent acceptances, but not a fixed length:
    docs/benchmarks.md, "Lossless mode").

    And it steps aside where drafts do not pay (a CPU whose verification of several tokens
    costs about as many steps, a prompt whose drafts the backbone rejects): it keeps the cost
    and tokens of the last KEEP rounds of each source (the river, the context's n-grams, ...)
    and of plain steps (a round of no drafts: the backbone's next token alone), and asks a
    source to draft only while its cost per token over them is lower than plain steps' by
    MARGIN at least: where the two ways cost about the same a plain step is full depth's own,
    and never slower. Sources that pay are asked cheapest first; a source may have nothing to
    propose (no n-gram of the context repeats), and the next is asked. A source's rounds are
    those it proposed in, so its cost per token is what it costs where it drafts: the rounds'
    cost over their tokens, not a median of each round's own ratio, which counts a round that
    kept every draft as much as one that kept none.

    A round's cost is modelled (`use`: the verification costs measured on this machine and
    model, verify_costs.py): plain steps' is known from the start, a source that could not pay
    even with every draft kept is never asked, and every choice follows from the drafts the
    backbone kept, so a prompt drafts alike on every run. Without a model (vLLM's drafter, its
    batch's steps not one sequence's) a round costs its clocked seconds, counted at most CLIP
    times the median round's, so a one-off cost weighs as a slow round, not as ten.

    The first round is a plain step (unless the model knows its cost) and each source's first
    TRIAL rounds are trials, asked before any measured source, so it has chosen once every
    source has proposed TRIAL times. Then a losing source is tried again after PROBE rounds,
    plain steps likewise while some source wins (clocked only: a modelled plain step costs
    what it is known to), and after twice as many each time that way still loses (at most
    LONGEST): a losing way costs ever fewer rounds. A try that beats the chosen way replaces
    the other's record and wins at once. Fixed at each source's `most` when not adaptive,
    every source asked in its order."""

    TRIAL = 2
    PROBE = 4
    LONGEST = 64
    KEEP = 10       # rounds of each way: a round of drafts gives 1 to `most` + 1 tokens
    MARGIN = 0.05   # of a plain step's time per token
    CLIP = 2.0      # a round's seconds count at most this many median rounds'

    def __init__(self, most: int | Mapping[str, int], adaptive: bool = False,
                 sized: Collection[str] = ()) -> None:
        """`most`: the most tokens each source drafts a round, by name, in the order they are
        asked before they are measured; a number: the river's alone. `sized`: the sources
        that size their own drafts (`DraftSource.sizes_drafts`), always asked for `most`."""
        most = {RIVER: most} if isinstance(most, int) else dict(most)
        self.adaptive, self.sized = adaptive, frozenset(sized)
        self._ways = {name: _Way(n, n, wait=self.PROBE) for name, n in most.items()}
        self._plain = _Way(wait=self.PROBE)
        self._kept = self._drafted = 0
        self._trying: set[str] = set()   # the ways the last `order` tried
        self.costs: VerifyCosts | None = None

    @property
    def widest(self) -> int:
        """The most tokens a round verifies: the longest draft and the token before it."""
        return max(w.most for w in self._ways.values()) + 1

    def use(self, costs: VerifyCosts) -> None:
        """Judge rounds by `costs` from now on (class docstring): plain steps cost a step,
        and the sources that could not pay are left out."""
        self.costs = costs
        self._plain.rounds = [[costs.step, 1]]
        self._ways = {name: w for name, w in self._ways.items()
                      if costs.can_pay(w.most, self.MARGIN)}

    @property
    def sources(self) -> list[str]:
        return list(self._ways)

    @property
    def acceptance(self) -> float:
        """The share of drafted tokens kept so far."""
        return self._kept / self._drafted if self._drafted else float("nan")

    @property
    def seconds_per_token(self) -> dict[str, float | None]:
        """Time per token of each source's last rounds, and of plain steps (PLAIN)."""
        ways = self._ways | {PLAIN: self._plain}
        return {name: self._per_token(w.rounds) if w.rounds else None
                for name, w in ways.items()}

    def _per_token(self, rounds: list[list[float]]) -> float:
        seconds, tokens = np.array(rounds).T
        if self.costs is None:   # clocked: a one-off cost weighs as a slow round
            seconds = np.minimum(seconds, self.CLIP * np.median(seconds))
        return float(seconds.sum() / tokens.sum())

    def pays(self, source: str) -> bool:
        """Whether drafting with `source` beats plain steps (or either is not measured yet)."""
        drafted, plain = self._ways[source].rounds, self._plain.rounds
        return not drafted or not plain or self.beats(self._per_token(drafted),
                                                      self._per_token(plain))

    @property
    def drafting_pays(self) -> bool:
        """Whether some source's drafts beat plain steps."""
        return any(self.pays(name) for name in self._ways)

    @classmethod
    def beats(cls, drafted: float, plain: float) -> bool:
        """Whether drafting at `drafted` seconds a token beats plain steps at `plain` (by
        MARGIN): the rule for a source's rounds here, and for a round's draft length where a
        source sizes its own (ngram.py)."""
        return drafted <= (1 - cls.MARGIN) * plain

    def _decided(self, way: _Way) -> bool:
        return bool(self._plain.rounds) and len(way.rounds) >= self.TRIAL

    def order(self) -> list[tuple[str, int]]:
        """The sources to ask this round, first first, each with its draft length; none: a
        plain step."""
        if not self.adaptive:
            return [(name, w.most) for name, w in self._ways.items()]
        self._trying = set()
        if not self._plain.rounds:
            return []
        trials = [n for n, w in self._ways.items() if not self._decided(w)]
        decided = [n for n in self._ways if n not in trials]
        paying = sorted((n for n in decided if self.pays(n)),
                        key=lambda n: self._per_token(self._ways[n].rounds))
        if paying and not trials and self.costs is None and \
                self._plain.since >= self._plain.wait:
            self._trying = {PLAIN}
            return []
        tries = [n for n in decided if n not in paying
                 and self._ways[n].since >= self._ways[n].wait]
        self._trying = set(tries)
        return [(n, self._ways[n].next) for n in trials + tries + paying]

    def next(self) -> int:
        """The first source's draft length this round (0: a plain step): for a caller with
        one source."""
        order = self.order()
        return order[0][1] if order else 0

    def update(self, r: Round) -> None:
        if r.verify_seconds > 0 and r.tokens:   # a round after prefill's
            seconds = r.draft_seconds + r.verify_seconds if self.costs is None else \
                self.costs.round(r.drafted, r.exit_layers)
            self._time(r.source if r.drafted else PLAIN, [seconds, len(r.tokens)])
        if r.drafted:
            self._kept += r.accepted
            self._drafted += r.drafted
            way = self._ways[r.source]
            # a short proposal kept whole does not shorten the next
            if self.adaptive and r.source not in self.sized:
                way.next = min(way.most, max(way.next, r.drafted + 1)) \
                    if r.accepted == r.drafted else max(1, r.drafted - 1)

    def _time(self, name: str, seconds_tokens: list[float]) -> None:
        way = self._plain if name == PLAIN else self._ways[name]
        kept = (way.rounds + [seconds_tokens])[-self.KEEP:]
        if name not in self._trying:
            for w in self._ways.values():
                w.since += self._decided(w)
            self._plain.since += any(self._decided(w) for w in self._ways.values())
            way.rounds = kept
            return
        self._trying.discard(name)
        way.since = 0
        tried = self._per_token([seconds_tokens])
        if name == PLAIN:   # a try of plain steps against the cheapest source that paid
            best = min(self._per_token(w.rounds) for n, w in self._ways.items()
                       if self._decided(w) and self.pays(n))
            wins = not self.beats(best, tried)
        else:
            wins = self.beats(tried, self._per_token(self._plain.rounds))
        if wins:   # it replaces its record, and the ways it beat are tried from now
            way.rounds, way.wait = [seconds_tokens], self.PROBE
            others = self._ways.values() if name == PLAIN else [self._plain]
            for w in others:
                w.wait, w.since = self.PROBE, 0
        else:
            way.rounds, way.wait = kept, min(2 * way.wait, self.LONGEST)
