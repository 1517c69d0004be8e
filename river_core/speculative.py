"""Lossless River: the exit river drafts, the backbone verifies, over one shared cache.

A round starts from the last token `x` the backbone stands behind, at position p. The river
drafts up to gamma tokens, one ordinary decode step each at slots p, p+1, ... (the configured
exit policy and KV strategy; logits from the head's stand-in; attending the draft window),
writing their K/V into the backbone's own slots as River always does: no second cache. Then
`extend(x and the drafts, p)` runs them through the whole backbone in one multi-token pass at
slots p..p+gamma, overwriting what the drafts wrote with exact values, and returns the
backbone's logits at each. The longest prefix of drafts the backbone agrees with stands,
followed by the backbone's own next token (greedy: its argmax; sampling: the
speculative-sampling rule, so the output follows the backbone's distribution exactly), and the
next round starts after it. Nothing is rewound: the slots past the round's end are overwritten
by the next round before anything reads them. No river K/V survives a round, so the output is
the backbone's, only faster when drafts are cheap and mostly right.

`rounds` reads as gpt-fast's speculative loop: prefill, then per round `draft`, `verify`,
accept, trim.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, Sequence

import attrs
import numpy as np

from .backend import Backend, Step
from .config import GenerationConfig
from .decode import (DecodeResult, Row, Run, Stream, Token, check_capacity, decode_step,
                     drain, stand_in_error, start_rows)
from .detokenize import StopScan
from .errors import ConfigError
from .finite import checked
from .sampling import draw, probabilities, verify_draft


@attrs.frozen
class Round:
    """One draft-and-verify round (the first, from prefill, drafts nothing)."""

    tokens: list[int]       # what stands: the accepted drafts, then the backbone's token
    drafted: int
    accepted: int
    exit_layers: list[int]  # per draft step, the last backbone layer it ran
    draft_seconds: float
    verify_seconds: float


class DraftLength:
    """How many tokens to draft next. Agreement comes in runs (a number copied from the
    question, a formula's boilerplate) more than token by token, so the length follows the
    last round: one more after a round the backbone kept whole, one less after a rejection,
    between 1 and `most` (on GSM8K train this beat a cost model that assumed independent
    acceptances, but not a fixed length: docs/benchmarks.md, "Lossless mode").

    And it steps aside where drafts do not pay (a CPU whose low-bit kernel is slower than the
    float one, docs/benchmarks.md "Defaults that never lose"): it keeps the seconds and tokens
    of the last KEEP rounds that drafted and of plain steps (a round of no drafts: the
    backbone's next token alone) and drafts only while drafting's time per token over them is
    lower by MARGIN at least: where the two ways cost about the same, a call-to-call spread of
    a few percent would otherwise choose drafting half the time and lose as often as it wins,
    while a plain step is full depth's own (first contact, hf: 0.96x). The time per token is
    the rounds' seconds over their tokens, as a user's clock adds them up, not a median of
    each round's own ratio: that counts a round that kept every draft as much as one that kept
    none, and inside vLLM at one request it put drafting 9% under plain steps where it cost 3%
    more (docs/benchmarks.md). A round counts at most CLIP times the median round's seconds, so
    a one-off cost (hf's first prepacked verification) weighs as a slow round, not as ten.
    The first round is a plain step and the next TRIAL rounds draft, so by round TRIAL + 2 it
    has chosen. Then it tries the other way after PROBE rounds, and after twice as many each
    time that way still loses (at most LONGEST): a losing way costs ever fewer rounds. A try
    that beats the chosen way replaces the other's record and wins at once. Fixed at `most`
    when not adaptive."""

    TRIAL = 2
    PROBE = 4
    LONGEST = 64
    KEEP = 10       # rounds of each way: a round of drafts gives 1 to `most` + 1 tokens
    MARGIN = 0.05   # of a plain step's time per token
    CLIP = 2.0      # a round's seconds count at most this many median rounds'

    def __init__(self, most: int, adaptive: bool = False) -> None:
        self.most, self.adaptive = most, adaptive
        self._next = most
        self._kept = self._drafted = 0
        # per way (drafted: True), the last KEEP rounds' [seconds, tokens]
        self._rounds: dict[bool, list[list[float]]] = {True: [], False: []}
        self._wait, self._since, self._trying = self.PROBE, 0, False

    def state(self) -> dict:
        """What it has measured and chosen, as JSON (`resume` takes it, in another process:
        `drafting.DraftStore`)."""
        return {"drafted": self._rounds[True], "plain": self._rounds[False],
                "next": self._next, "wait": self._wait}

    def resume(self, state: dict) -> None:
        """Start from `state` (another generation's `state()`): its choice stands from the
        first round, and it keeps measuring and trying the other way as before."""
        self._rounds = {True: [list(r) for r in state["drafted"]][-self.KEEP:],
                        False: [list(r) for r in state["plain"]][-self.KEEP:]}
        self._next = min(self.most, max(1, int(state["next"])))
        self._wait = min(max(self.PROBE, int(state["wait"])), self.LONGEST)

    @property
    def acceptance(self) -> float:
        """The share of drafted tokens kept so far."""
        return self._kept / self._drafted if self._drafted else float("nan")

    @property
    def seconds_per_token(self) -> dict[bool, float | None]:
        """Time per token of the last rounds that drafted (True) and of plain steps."""
        return {arm: self._per_token(r) if r else None for arm, r in self._rounds.items()}

    def _per_token(self, rounds: list[list[float]]) -> float:
        seconds, tokens = np.array(rounds).T
        return float(np.minimum(seconds, self.CLIP * np.median(seconds)).sum() / tokens.sum())

    @property
    def drafting_pays(self) -> bool:
        drafted, plain = self.seconds_per_token[True], self.seconds_per_token[False]
        return drafted is None or plain is None or self._pays(drafted, plain)

    def _pays(self, drafted: float, plain: float) -> bool:
        """Whether drafting at `drafted` seconds a token beats plain steps at `plain`."""
        return drafted <= (1 - self.MARGIN) * plain

    def next(self) -> int:
        if not self.adaptive:
            return self.most
        if not self._rounds[False]:
            return 0
        if len(self._rounds[True]) < self.TRIAL:
            return self._next
        self._trying = self._since >= self._wait
        return self._next if self.drafting_pays != self._trying else 0

    def update(self, r: Round) -> None:
        if r.verify_seconds > 0 and r.tokens:   # a round after prefill's
            self._time(r.drafted > 0, [r.draft_seconds + r.verify_seconds, len(r.tokens)])
        if r.drafted:
            self._kept += r.accepted
            self._drafted += r.drafted
            if self.adaptive:
                grow = r.accepted == r.drafted
                self._next = min(self.most, r.drafted + 1) if grow else max(1, r.drafted - 1)

    def _time(self, drafted: bool, seconds_tokens: list[float]) -> None:
        chosen = self.drafting_pays
        kept = (self._rounds[drafted] + [seconds_tokens])[-self.KEEP:]
        if not (self._trying and drafted != chosen):
            decided = bool(self._rounds[False]) and len(self._rounds[True]) >= self.TRIAL
            self._rounds[drafted] = kept
            self._since += decided
            return
        self._trying, self._since = False, 0   # a try of the losing way
        tried, other = self._per_token([seconds_tokens]), self.seconds_per_token[chosen]
        if self._pays(tried, other) if drafted else not self._pays(other, tried):
            self._rounds[drafted], self._wait = [seconds_tokens], self.PROBE
        else:
            self._rounds[drafted] = kept
            self._wait = min(2 * self._wait, self.LONGEST)


@attrs.frozen
class Choice:
    """How a generation picks a token from logits: greedy (temperature 0) or sampled, with
    the distribution the speculative-sampling rule compares drafts under."""

    gen: GenerationConfig
    rng: np.random.Generator

    @property
    def sampled(self) -> bool:
        return self.gen.temperature > 0

    def distribution(self, logits: np.ndarray) -> np.ndarray | None:
        """Sampling: the probabilities a token is drawn from; greedy: None."""
        if not self.sampled:
            return None
        return probabilities(logits, self.gen.temperature, self.gen.top_p, self.gen.top_k)

    def token(self, logits: np.ndarray, distribution: np.ndarray | None = None) -> int:
        """Greedy: the argmax; sampling: a draw from `distribution` (made from `logits` where
        the caller has none)."""
        if not self.sampled:
            return int(logits.argmax())
        return draw(self.distribution(logits) if distribution is None else distribution,
                    self.rng)


@attrs.frozen
class Drafts:
    """What the river drafted in one round."""

    tokens: list[int]
    probabilities: list   # per draft, its distribution (sampling; greedy: None)
    exit_layers: list[int]


def draft(backend: Backend, token: int, gamma: int, p: int, run: Run, rows: list[Row],
          step: int, choice: Choice) -> Drafts:
    """Up to gamma draft steps after `token` at slots p.. (ordinary decode steps, their
    logits from the head's stand-in), ending at an end of text."""
    drafts = Drafts([], [], [])
    for n in range(gamma):
        logits, layers = decode_step(backend, [token], run, rows, step + n,
                                     Step(p + n, draft_window=run.draft_window, draft=True))
        q = choice.distribution(logits[0])
        token = choice.token(logits[0], q)
        drafts.tokens.append(token)
        drafts.probabilities.append(q)
        drafts.exit_layers.append(layers[0])
        if token in backend.tokenizer.eos_ids:
            break   # nothing the backbone could keep follows an end of text
    return drafts


def verify(backend: Backend, token: int, drafts: Drafts, p: int, choice: Choice,
           check: Callable[[np.ndarray], np.ndarray]) -> tuple[int, int]:
    """One backbone pass over `token` and the drafts at slots p..: how many drafts it keeps
    (the longest prefix it agrees with; sampling: the speculative-sampling rule) and its own
    token after them. `check` sees the pass's logits first (finite.checked)."""
    target = check(backend.extend([token] + drafts.tokens, p))
    for accepted, (logits, d, q) in enumerate(zip(target, drafts.tokens,
                                                  drafts.probabilities)):
        correction = verify_draft(choice.distribution(logits), q, d, choice.rng) \
            if choice.sampled else (None if d == int(logits.argmax()) else int(logits.argmax()))
        if correction is not None:
            return accepted, correction
    # every draft stood: the backbone's next token comes free
    return len(drafts.tokens), choice.token(target[len(drafts.tokens)])


def rounds(backend: Backend, prompt: Sequence[int], gen: GenerationConfig, run: Run,
           length: DraftLength) -> Iterator[Round]:
    """Prefill `prompt`, then rounds of draft, verify, accept, trim until EOS, a stop string
    or gen.max_new_tokens; each round's tokens end at whichever comes first. `run` comes from
    a resolved plan (`Plan.run`), whose resolution checked that the backend and the strategy
    can draft."""
    check_capacity(backend, [prompt], gen.max_new_tokens)
    choice = Choice(gen, np.random.default_rng(gen.seed))
    eos, out, stops = backend.tokenizer.eos_ids, [], StopScan(backend.tokenizer, gen.stop)

    def stand(new: list[int]) -> tuple[list[int], bool]:
        """The tokens of `new` that stand, and whether generation ends with them."""
        for n, t in enumerate(new, 1):
            out.append(t)
            if t in eos or len(out) == gen.max_new_tokens or stops.add(t):
                return new[:n], True
        return new, False

    start = time.perf_counter()
    pre = backend.prefill([prompt], len(prompt) + gen.max_new_tokens)
    rows = start_rows(stand_in_error(backend), run, pre.similarity)
    first = checked(pre.logits, backend, lambda r: list(prompt), 0)[0]
    tokens, done = stand([choice.token(first)])
    yield Round(tokens, 0, 0, [], time.perf_counter() - start, 0.0)
    x, step, p = tokens[-1], 0, len(prompt)   # x goes to slot p
    while not done:
        # a round yields at most gamma + 1 tokens, so it never writes past the capacity
        gamma = min(length.next(), gen.max_new_tokens - len(out) - 1)
        start = time.perf_counter()
        drafts = draft(backend, x, gamma, p, run, rows, step, choice)
        step += len(drafts.tokens)
        middle = time.perf_counter()
        accepted, correction = verify(
            backend, x, drafts, p, choice,
            lambda target: checked(target, backend,
                                   lambda t: [*prompt, *out, *drafts.tokens[:t]], len(out)))
        p += accepted + 1   # accept: the kept drafts and the backbone's token
        backend.trim(p)     # trim: the cache ends after them
        tokens, done = stand(drafts.tokens[:accepted] + [correction])
        end = time.perf_counter()
        r = Round(tokens, len(drafts.tokens), accepted, drafts.exit_layers, middle - start,
                  end - middle)
        length.update(r)
        yield r
        x = tokens[-1]


def speculative_ids(backend: Backend, prompts: Sequence[Sequence[int]], gen: GenerationConfig,
                    run: Run, length: DraftLength) -> DecodeResult:
    """Generate like `generate_ids` at full depth, with the river drafting (batch 1)."""
    return drain(speculative_stream(backend, prompts, gen, run, length))


def speculative_stream(backend: Backend, prompts: Sequence[Sequence[int]],
                       gen: GenerationConfig, run: Run, length: DraftLength) -> Stream:
    """`speculative_ids` as a stream: each round's tokens as it ends (every one the
    backbone's choice; `drafted` marks the drafts it kept). Ctrl-C ends it early."""
    if len(prompts) != 1:
        raise ConfigError("speculative mode runs one sequence at a time")
    done, interrupted, last = [], False, backend.num_layers - 1
    try:
        for r in rounds(backend, prompts[0], gen, run, length):
            done.append(r)
            for n, t in enumerate(r.tokens):
                yield Token(0, t, last, drafted=n < r.accepted)
    except KeyboardInterrupt:   # Ctrl-C: the rounds so far, and their statistics
        interrupted = True
    if not done:
        raise KeyboardInterrupt
    first, *rest = done
    return DecodeResult(
        tokens=[first.tokens + [t for r in rest for t in r.tokens]],
        exit_layers=[[k for r in rest for k in r.exit_layers]],
        num_layers=backend.num_layers, prefill_seconds=first.draft_seconds,
        step_seconds=[r.draft_seconds + r.verify_seconds for r in rest],
        drafted=[r.drafted for r in rest], accepted=[r.accepted for r in rest],
        interrupted=interrupted)
