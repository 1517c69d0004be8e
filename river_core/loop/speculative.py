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
import warnings
from typing import Callable, Collection, Iterator, Mapping, Protocol, Sequence

import attrs
import numpy as np

from ..contract.backend import Backend, Step
from ..settings.config import GenerationConfig
from .decode import (DecodeResult, Row, Run, Stream, Token, check_capacity, decode_step, drain,
                     start_rows)
from .detokenize import StopScan
from ..settings.errors import ConfigError
from .finite import checked
from ..method.draft_length import PLAIN, RIVER, DraftLength, Round
from .sampling import draw, probabilities, verify_draft
from ..method.verify_costs import VerifyCosts, measure


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
    """What a draft source may read of the generation it drafts for: `similarity`, each
    layer's input-output similarity over the prompt (what a river drafter's predictor
    starts from); `costs`, what verifying k tokens costs on this machine (None: not known,
    as in vLLM's drafter), by which a source that sizes its own drafts sizes them."""

    backend: Backend
    prompt: Sequence[int]
    run: Run
    similarity: Sequence[Sequence[float]]
    choice: Choice
    costs: VerifyCosts | None = None


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
        """The most tokens it drafts a round; None: the config's `draft_tokens`. A source
        may also say `sizes_drafts = True`: each round it is asked for up to `most` and
        drafts as many as it judges worth it (ngram.py), where DraftLength would otherwise
        shorten a source's length after a rejection."""

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
        self.rows: list[Row] | None = None   # its predictor, from its first draft on

    def propose(self, token: int, position: int, gamma: int) -> Drafts:
        g = self.generation
        if self.rows is None:
            self.rows = start_rows(g.backend, g.run, g.similarity)
        drafts = draft(g.backend, token, gamma, position, g.run, self.rows, self.steps,
                       g.choice)
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
    plain step. An adaptive `length` without verification costs has them measured here, after
    prefill (`verify_costs.measure`). `run` comes from a resolved plan (`Plan.run`), whose
    resolution checked that the backend and the strategy can draft."""
    check_capacity(backend, [prompt], gen.max_new_tokens)
    choice = Choice(gen, np.random.default_rng(gen.seed))
    eos, out, stops = gen.ends(backend.tokenizer), [], StopScan(backend.tokenizer, gen.stop)

    def stand(new: list[int]) -> tuple[list[int], bool]:
        """The tokens of `new` that stand, and whether generation ends with them."""
        for n, t in enumerate(new, 1):
            out.append(t)
            if t in eos or len(out) == gen.max_new_tokens or stops.add(t):
                return new[:n], True
        return new, False

    start = time.perf_counter()
    pre = backend.prefill([prompt], len(prompt) + gen.max_new_tokens)
    first = checked(pre.logits, backend, lambda r: list(prompt), 0)[0]
    tokens, done = stand([choice.token(first)])
    if length.adaptive and length.costs is None and not done:   # once per machine and model:
        length.use(measure(backend, tokens[-1], len(prompt),    # the caller keeps them
                           min(length.widest, gen.max_new_tokens)))
    generation = Generation(backend, prompt, run, pre.similarity, choice, length.costs)
    drafters = _started(sources or {RIVER: RiverSource()}, length.sources, generation)
    _told(drafters, tokens)
    yield Round(tokens, 0, 0, [], time.perf_counter() - start, 0.0)
    x, p = tokens[-1], len(prompt)   # x goes to slot p
    while not done:
        # a round yields at most gamma + 1 tokens, so it never writes past the capacity
        left = gen.max_new_tokens - len(out) - 1
        start = time.perf_counter()
        source, drafts = PLAIN, Drafts([], [], [])
        for name, gamma in length.order():
            if name in drafters and min(gamma, left) > 0:
                drafts = _proposal(drafters, name, x, p, min(gamma, left), len(first))
                drafts = drafts.until(eos)
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
        _told(drafters, tokens)
        end = time.perf_counter()
        r = Round(tokens, len(drafts.tokens), accepted, drafts.exit_layers, middle - start,
                  end - middle, source)
        length.update(r)
        yield r
        x = tokens[-1]


def _started(sources: Mapping[str, DraftSource], names: Collection[str],
             generation: Generation) -> dict[str, Drafter]:
    """The drafters of the sources `names` keeps (a source that cannot pay is never
    started); one whose start raises is left out, said once."""
    drafters: dict[str, Drafter] = {}
    for name, source in sources.items():
        if name in names:
            try:
                drafters[name] = source.start(generation)
            except Exception as e:
                _failed(name, e)
    return drafters


def _proposal(drafters: dict[str, Drafter], name: str, token: int, position: int, gamma: int,
              vocab: int) -> Drafts:
    """What source `name` drafts this round, checked: at most `gamma` tokens, each in the
    vocabulary. A source that raises or breaks that is dropped (`_dropped`): the round asks
    the next source, or takes a plain step."""
    try:
        drafts = drafters[name].propose(token, position, gamma)
        outside = [t for t in drafts.tokens if not 0 <= t < vocab]
        if outside:
            raise ValueError(f"drafted token {outside[0]}, outside the vocabulary of {vocab}")
        if len(drafts.tokens) > gamma:
            raise ValueError(f"drafted {len(drafts.tokens)} tokens where {gamma} were asked")
    except Exception as e:   # a plugin's fault costs its drafts, never a wrong token
        _dropped(drafters, name, e)
        return Drafts([], [], [])
    return drafts


def _told(drafters: dict[str, Drafter], tokens: list[int]) -> None:
    """Every source told the tokens that stood; one that raises is dropped."""
    for name in list(drafters):
        try:
            drafters[name].stood(tokens)
        except Exception as e:
            _dropped(drafters, name, e)


def _dropped(drafters: dict[str, Drafter], name: str, error: Exception) -> None:
    """Source `name` drafts no more this generation, said once."""
    del drafters[name]
    _failed(name, error)


def _failed(name: str, error: Exception) -> None:
    warnings.warn(f"draft source {name!r} failed ({type(error).__name__}: {error}); this "
                  "generation drafts without it", RuntimeWarning, stacklevel=4)


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
