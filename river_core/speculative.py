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

Drafts may also come from elsewhere: each round asks its draft sources (plugins, hook
`river_draft_sources`: the river, the context's own n-grams in ngram.py, ...) in the order
`DraftLength` measures cheapest, and verifies the first proposal. A source whose drafts are a
function of the context (n-grams) drafts a point mass, so the sampling rule keeps a draft with
the backbone's probability of it.

`rounds` reads as gpt-fast's speculative loop: prefill, then per round `draft`, `verify`,
accept, trim.
"""

from __future__ import annotations

import time
from typing import Callable, Collection, Iterator, Mapping, Protocol, Sequence

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

    And it steps aside where drafts do not pay (a CPU whose low-bit kernel is slower than the
    float one, docs/benchmarks.md "Defaults that never lose"): it keeps the seconds and tokens
    of the last KEEP rounds of each source (the river, the context's n-grams, ...) and of
    plain steps (a round of no drafts: the backbone's next token alone), and asks a source to
    draft only while its time per token over them is lower than plain steps' by MARGIN at
    least: where the two ways cost about the same, a call-to-call spread of a few percent
    would otherwise choose drafting half the time and lose as often as it wins, while a plain
    step is full depth's own (first contact, hf: 0.96x). Sources that pay are asked cheapest
    first; a source may have nothing to propose (no n-gram of the context repeats), and the
    next is asked. A source's rounds are those it proposed in, so its time per token is what
    it costs where it drafts. The time per token is the rounds' seconds over their tokens, as
    a user's clock adds them up, not a median of each round's own ratio: that counts a round
    that kept every draft as much as one that kept none, and inside vLLM at one request it put
    drafting 9% under plain steps where it cost 3% more (docs/benchmarks.md). A round counts at
    most CLIP times the median round's seconds, so a one-off cost (hf's first prepacked
    verification) weighs as a slow round, not as ten.

    The first round is a plain step and each source's first TRIAL rounds are trials, asked
    before any measured source, so it has chosen once every source has proposed TRIAL times.
    Then a losing source is tried again after PROBE rounds, plain steps likewise while some
    source wins, and after twice as many each time that way still loses (at most LONGEST): a
    losing way costs ever fewer rounds. A try that beats the chosen way replaces the other's
    record and wins at once. Fixed at each source's `most` when not adaptive, every source
    asked in its order."""

    TRIAL = 2
    PROBE = 4
    LONGEST = 64
    KEEP = 10       # rounds of each way: a round of drafts gives 1 to `most` + 1 tokens
    MARGIN = 0.05   # of a plain step's time per token
    CLIP = 2.0      # a round's seconds count at most this many median rounds'

    def __init__(self, most: int | Mapping[str, int], adaptive: bool = False) -> None:
        """`most`: the most tokens each source drafts a round, by name, in the order they are
        asked before they are measured; a number: the river's alone."""
        most = {RIVER: most} if isinstance(most, int) else dict(most)
        self.adaptive = adaptive
        self._ways = {name: _Way(n, n, wait=self.PROBE) for name, n in most.items()}
        self._plain = _Way(wait=self.PROBE)
        self._kept = self._drafted = 0
        self._trying: set[str] = set()   # the ways the last `order` tried

    @property
    def sources(self) -> list[str]:
        return list(self._ways)

    def state(self) -> dict:
        """What it has measured and chosen, as JSON (`resume` takes it, in another process:
        `drafting.DraftStore`)."""
        return {"plain": self._plain.rounds, "wait": self._plain.wait,
                "sources": {name: {"rounds": w.rounds, "next": w.next, "wait": w.wait}
                            for name, w in self._ways.items()}}

    def resume(self, state: dict) -> None:
        """Start from `state` (another generation's `state()`): its choice stands from the
        first round, and it keeps measuring and trying the other ways as before. A source
        the state does not name starts with trials."""
        self._plain.rounds = [list(r) for r in state["plain"]][-self.KEEP:]
        self._plain.wait = self._bounded_wait(state["wait"])
        for name, stored in state["sources"].items():
            if name in self._ways:
                way = self._ways[name]
                way.rounds = [list(r) for r in stored["rounds"]][-self.KEEP:]
                way.next = min(way.most, max(1, int(stored["next"])))
                way.wait = self._bounded_wait(stored["wait"])

    def _bounded_wait(self, wait) -> int:
        return min(max(self.PROBE, int(wait)), self.LONGEST)

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
        return float(np.minimum(seconds, self.CLIP * np.median(seconds)).sum() / tokens.sum())

    def pays(self, source: str) -> bool:
        """Whether drafting with `source` beats plain steps (or either is not measured yet)."""
        drafted, plain = self._ways[source].rounds, self._plain.rounds
        return not drafted or not plain or self._pays(self._per_token(drafted),
                                                      self._per_token(plain))

    @property
    def drafting_pays(self) -> bool:
        """Whether some source's drafts beat plain steps."""
        return any(self.pays(name) for name in self._ways)

    def _pays(self, drafted: float, plain: float) -> bool:
        """Whether drafting at `drafted` seconds a token beats plain steps at `plain`."""
        return drafted <= (1 - self.MARGIN) * plain

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
        if paying and not trials and self._plain.since >= self._plain.wait:
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
            self._time(r.source if r.drafted else PLAIN,
                       [r.draft_seconds + r.verify_seconds, len(r.tokens)])
        if r.drafted:
            self._kept += r.accepted
            self._drafted += r.drafted
            way = self._ways[r.source]
            if self.adaptive:   # a short proposal kept whole does not shorten the next
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
            wins = not self._pays(best, tried)
        else:
            wins = self._pays(tried, self._per_token(self._plain.rounds))
        if wins:   # it replaces its record, and the ways it beat are tried from now
            way.rounds, way.wait = [seconds_tokens], self.PROBE
            others = self._ways.values() if name == PLAIN else [self._plain]
            for w in others:
                w.wait, w.since = self.PROBE, 0
        else:
            way.rounds, way.wait = kept, min(2 * way.wait, self.LONGEST)


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
    """What a source drafted in one round."""

    tokens: list[int]
    probabilities: list   # per draft, its distribution (sampling); None: greedy, or a draft
                          # that is a function of the context (a point mass at the token)
    exit_layers: list[int]   # per model step the drafting ran (none for free drafts)

    def until(self, ends: Collection[int]) -> "Drafts":
        """The drafts up to the first of `ends` (an end of text), which ends them: nothing
        the backbone could keep follows it."""
        cut = next((n + 1 for n, t in enumerate(self.tokens) if t in ends), len(self.tokens))
        return attrs.evolve(self, tokens=self.tokens[:cut],
                            probabilities=self.probabilities[:cut])


@attrs.frozen
class Generation:
    """What a draft source may read of the generation it drafts for."""

    backend: Backend
    prompt: Sequence[int]
    run: Run
    rows: list[Row]
    choice: Choice


class Drafter(Protocol):
    """One generation's drafts from one source."""

    def propose(self, token: int, position: int, gamma: int) -> Drafts:
        """Up to `gamma` tokens to follow `token`, which goes to slot `position` (the last
        token that stood); none where the source has nothing to propose."""

    def stood(self, tokens: Sequence[int]) -> None:
        """The tokens that stood after a round, whichever source drafted it."""


class DraftSource(Protocol):
    """Where a lossless round's drafts come from (the hook `river_draft_sources`)."""

    @property
    def most(self) -> int | None:
        """The most tokens it drafts a round; None: the config's `draft_tokens`."""

    def start(self, generation: Generation) -> Drafter:
        """Its drafter for one generation, after prefill."""


@attrs.frozen
class RiverSource:
    """Drafts from the exit river: each draft an ordinary decode step under the run's exit
    policy, its logits from the head's stand-in."""

    most: int | None = None

    def start(self, generation: Generation) -> "RiverDrafter":
        return RiverDrafter(generation)


class RiverDrafter:
    def __init__(self, generation: Generation) -> None:
        self.generation = generation
        self.steps = 0   # the decode steps drafted so far (the run's policy counts them)

    def propose(self, token: int, position: int, gamma: int) -> Drafts:
        g = self.generation
        drafts = draft(g.backend, token, gamma, position, g.run, g.rows, self.steps, g.choice)
        self.steps += len(drafts.tokens)
        return drafts

    def stood(self, tokens: Sequence[int]) -> None:
        pass   # the river reads the context from the cache


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


def _point_mass(size: int, token: int) -> np.ndarray:
    q = np.zeros(size)
    q[token] = 1.0
    return q


def verify(backend: Backend, token: int, drafts: Drafts, p: int, choice: Choice,
           check: Callable[[np.ndarray], np.ndarray]) -> tuple[int, int]:
    """One backbone pass over `token` and the drafts at slots p..: how many drafts it keeps
    (the longest prefix it agrees with; sampling: the speculative-sampling rule, a draft
    without a distribution taken as certain, so kept with the target's probability of it)
    and its own token after them. `check` sees the pass's logits first (finite.checked)."""
    target = check(backend.extend([token] + drafts.tokens, p))
    for accepted, (logits, d, q) in enumerate(zip(target, drafts.tokens,
                                                  drafts.probabilities)):
        if choice.sampled:
            p_target = choice.distribution(logits)
            q = _point_mass(len(p_target), d) if q is None else q
            correction = verify_draft(p_target, q, d, choice.rng)
        else:
            correction = None if d == int(logits.argmax()) else int(logits.argmax())
        if correction is not None:
            return accepted, correction
    # every draft stood: the backbone's next token comes free
    return len(drafts.tokens), choice.token(target[len(drafts.tokens)])


def rounds(backend: Backend, prompt: Sequence[int], gen: GenerationConfig, run: Run,
           length: DraftLength, sources: Mapping[str, DraftSource] | None = None
           ) -> Iterator[Round]:
    """Prefill `prompt`, then rounds of draft, verify, accept, trim until EOS, a stop string
    or gen.max_new_tokens; each round's tokens end at whichever comes first. Each round asks
    the `sources` (by name, as `length` names them; None: the river alone) in `length`'s order,
    its measure of what each costs a token, and drafts from the first that proposes; none: a
    plain step. `run` comes from a resolved plan (`Plan.run`), whose resolution checked that
    the backend and the strategy can draft."""
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
    generation = Generation(backend, prompt, run, rows, choice)
    drafters = {name: s.start(generation)
                for name, s in (sources or {RIVER: RiverSource()}).items()}
    for drafter in drafters.values():
        drafter.stood(tokens)
    yield Round(tokens, 0, 0, [], time.perf_counter() - start, 0.0)
    x, p = tokens[-1], len(prompt)   # x goes to slot p
    while not done:
        # a round yields at most gamma + 1 tokens, so it never writes past the capacity
        left = gen.max_new_tokens - len(out) - 1
        start = time.perf_counter()
        source, drafts = PLAIN, Drafts([], [], [])
        for name, gamma in length.order():
            if min(gamma, left) > 0:
                drafts = drafters[name].propose(x, p, min(gamma, left)).until(eos)
                if drafts.tokens:
                    source = name
                    break
        middle = time.perf_counter()
        accepted, correction = verify(
            backend, x, drafts, p, choice,
            lambda target: checked(target, backend,
                                   lambda t: [*prompt, *out, *drafts.tokens[:t]], len(out)))
        p += accepted + 1   # accept: the kept drafts and the backbone's token
        backend.trim(p)     # trim: the cache ends after them
        tokens, done = stand(drafts.tokens[:accepted] + [correction])
        for drafter in drafters.values():
            drafter.stood(tokens)
        end = time.perf_counter()
        r = Round(tokens, len(drafts.tokens), accepted, drafts.exit_layers, middle - start,
                  end - middle, source)
        length.update(r)
        yield r
        x = tokens[-1]


def speculative_ids(backend: Backend, prompts: Sequence[Sequence[int]], gen: GenerationConfig,
                    run: Run, length: DraftLength,
                    sources: Mapping[str, DraftSource] | None = None) -> DecodeResult:
    """Generate like `generate_ids` at full depth, with `sources` drafting (batch 1)."""
    return drain(speculative_stream(backend, prompts, gen, run, length, sources))


def speculative_stream(backend: Backend, prompts: Sequence[Sequence[int]],
                       gen: GenerationConfig, run: Run, length: DraftLength,
                       sources: Mapping[str, DraftSource] | None = None) -> Stream:
    """`speculative_ids` as a stream: each round's tokens as it ends (every one the
    backbone's choice; `drafted` marks the drafts it kept). Ctrl-C ends it early."""
    if len(prompts) != 1:
        raise ConfigError("speculative mode runs one sequence at a time")
    done, interrupted, last = [], False, backend.num_layers - 1
    try:
        for r in rounds(backend, prompts[0], gen, run, length, sources):
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
        draft_sources=[r.source if r.drafted else PLAIN for r in rest],
        interrupted=interrupted)
