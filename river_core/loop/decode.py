"""The decode loop: prefill at full depth, then one token per step with per-token exits.

Backends supply primitives (backend.py); this module alone decides which layer runs where.
"""

from __future__ import annotations

import collections
import functools
import numbers
import time
from typing import Callable, Collection, Generator, Mapping, Sequence

import attrs
import numpy as np

from ..contract.backend import Backend, Pass, Step
from ..settings.config import GenerationConfig
from .detokenize import StopScan
from ..settings.errors import ConfigError
from .finite import checked
from ..method.kv import KVStrategy, subset
from ..method.policy import ExitPolicy, RowView
from ..method.predictor import SimilarityPredictor
from .sampling import Sampler, log_softmax, make_sampler

PredictorFactory = Callable[[Sequence[float], Sequence[float]], SimilarityPredictor]


@attrs.frozen
class DecodeResult:
    """Generated ids per sequence, where each decode step's token left the backbone, and times.

    Layers, one convention everywhere: a token's **exit layer** is the 0-based index of the
    last backbone layer it ran (L-1: full depth; -1: none, stand-ins only), as in
    `exit_layers`, `Token.exit_layer`, `prefill_exit`, `min_layer` and the fixed policy's
    `layer`; **layers run** is the count, exit layer + 1 (`mean_layers_run`,
    `layers_run_histogram`).

    Speed, one definition in every mode: the first token of each sequence comes from prefill
    (`prefill_ms`); `decoded_tokens` are the rest, and `ms_per_token` and `tokens_per_second`
    are both all decode time over them (nan when nothing was decoded); `median_step_ms` is a
    second figure where a step is one token (exit mode; at batch 1 the median ms/token).
    """

    tokens: list[list[int]]
    exit_layers: list[list[int]]   # per sequence, per decode step (speculative: per draft step)
    num_layers: int
    prefill_seconds: float
    step_seconds: list[float]      # wall time of each decode step (the whole batch); in
                                   # speculative mode, of each draft-and-verify round
    drafted: list[int] = attrs.field(factory=list)    # speculative mode, per round
    accepted: list[int] = attrs.field(factory=list)   # drafts the backbone kept, per round
    draft_sources: list[str] = attrs.field(factory=list)   # per round, the source that
                                                           # drafted it ("plain": none)
    interrupted: bool = False      # stopped by Ctrl-C: tokens hold what came before

    @property
    def speculative(self) -> bool:
        return bool(self.drafted)

    @property
    def rounds_by_source(self) -> dict[str, int]:
        """Speculative mode: how many rounds each draft source drafted ("plain": none)."""
        return dict(collections.Counter(self.draft_sources))

    @property
    def decoded_tokens(self) -> int:
        """Tokens decoding produced: every token but each sequence's first (prefill's)."""
        return sum(max(len(t) - 1, 0) for t in self.tokens)

    @property
    def prefill_ms(self) -> float:
        return self.prefill_seconds * 1e3

    @property
    def ms_per_token(self) -> float:
        """All decode time over the tokens decoding produced, in milliseconds (every mode)."""
        n = self.decoded_tokens
        return sum(self.step_seconds) * 1e3 / n if n > 0 else float("nan")

    @property
    def median_step_ms(self) -> float:
        """The median decode step in milliseconds, in exit mode (nan in speculative mode,
        whose rounds yield several tokens each)."""
        if not self.step_seconds or self.speculative:
            return float("nan")
        return float(np.median(self.step_seconds)) * 1e3

    @property
    def acceptance_rate(self) -> float:
        """Speculative mode: the share of drafted tokens the backbone kept (nan: no drafts,
        as where the draft length stepped aside from the start)."""
        return sum(self.accepted) / sum(self.drafted) if self.speculative and \
            sum(self.drafted) else float("nan")

    @property
    def tokens_per_round(self) -> float:
        """Speculative mode: tokens each verification yields (kept drafts plus its own)."""
        return (sum(self.accepted) + len(self.accepted)) / len(self.accepted) \
            if self.speculative else float("nan")

    @property
    def tokens_per_second(self) -> float:
        """Decoded tokens over decode time (prefill apart, in `prefill_ms`): 1000 / ms/token
        at batch 1."""
        seconds = sum(self.step_seconds)
        return self.decoded_tokens / seconds if seconds > 0 else float("nan")

    @property
    def _all_exits(self) -> np.ndarray:
        return np.array([k for row in self.exit_layers for k in row], dtype=np.int64)

    @property
    def mean_layers_run(self) -> float:
        """Mean number of backbone layers a decode step's token ran (L: full depth)."""
        e = self._all_exits
        return float(e.mean() + 1) if e.size else float("nan")

    @property
    def skipped_share(self) -> float:
        """Share of backbone layers skipped over all decode steps."""
        e = self._all_exits
        if not e.size:
            return 0.0
        return float((self.num_layers - 1 - e).sum() / (e.size * self.num_layers))

    def layers_run_histogram(self) -> np.ndarray:
        """Count of decode steps by backbone layers run (index 0..num_layers)."""
        return np.bincount(self._all_exits + 1, minlength=self.num_layers + 1)


@attrs.frozen
class Run:
    """What one generation runs: a fresh KV strategy (strategies may keep state across steps),
    the exit policy, the predictor factory, (stand_in_error, prompt_similarity) -> predictor,
    the rows per step above which River steps aside (ExitConfig.step_aside_above), the
    drafts' attention window (ExitConfig.draft_window) and whether exited tokens take the
    head's stand-in (ExitConfig.exit_head).
    `Plan.run()` makes one; tests and measurements may build their own."""

    strategy: KVStrategy
    policy: ExitPolicy
    new_predictor: PredictorFactory
    step_aside_above: int | None = None
    draft_window: int | None = None
    stand_in_head: bool = False

    def steps_aside(self, rows: int) -> bool:
        """Whether a step of `rows` decoding rows runs at full depth, drafting nothing."""
        return self.step_aside_above is not None and rows > self.step_aside_above


@attrs.define
class Row:
    """One sequence's own state across steps: its predictor and its policy's state."""

    predictor: SimilarityPredictor
    policy_state: object


def start_rows(backend: Backend, run: Run,
               prompt_similarity: Sequence[Sequence[float]]) -> list[Row]:
    """A fresh `Row` per sequence, its predictor primed with its prompt's similarities and
    scaled by the stand-ins' errors where the run may exit (an engine that makes its
    stand-ins when first asked for them is not asked by a run at full depth)."""
    errors = stand_in_error(backend) if run.strategy.allows_exit else \
        [0.0] * backend.num_layers
    return [Row(run.new_predictor(errors, s), run.policy.new_row()) for s in prompt_similarity]


class Walk:
    """One decode step's way through the layers, for every engine: which rows are still in
    the backbone (`deep`), which have left (`gone`), what the policy reads on the way, and
    where each row left (`exits`). `rows` holds the state of the rows that may leave (by
    index in the batch; the others, prompt tokens inside a serving engine, run every layer).
    The engine supplies numerics only, through `run.strategy.layer`: any object with what the
    walk reads (backend.py, `Layered` and the sub-protocols the strategy needs), each call
    given the step's pass `p` (what the engine made of the step; the walk reads nothing else
    of it)."""

    def __init__(self, backend, p: Pass, run: Run, rows: Mapping[int, Row], step: int,
                 batch: int) -> None:
        self.backend, self.p, self.run, self.rows = backend, p, run, rows
        self.step, self.batch = step, batch
        strategy, needs = run.strategy, run.policy.needs
        self.deep, self.gone = list(range(batch)), []
        self.exits = [backend.num_layers - 1] * batch
        self.watch = strategy.allows_exit and needs.similarity and bool(rows)
        self.sub_blocks = self.watch and needs.sub_blocks
        # once every row has left, the rest is one call unless the predictor watches exited rows
        self.watch_exited = self.watch and strategy.moves_state and not self.sub_blocks
        self.rechecks = strategy.allows_exit and needs.recheck
        self.exit_states: dict[int, object] = {}   # exit layer -> the state then, for a recheck

    def through(self, h):
        """Every layer for `h`, rows leaving as the policy says; the state for the head."""
        strategy = self.run.strategy
        # i = -1: a policy may exit a token before the first layer, so it runs stand-ins only
        # (the whole model quantized: the baseline River is measured against)
        if self._leave(-1, h):
            return strategy.skipped_tail(self.backend, self.p, 0, h,
                                         subset(self.gone, self.batch))
        for i in range(self.backend.num_layers):
            h = self._layer(i, h)
            if self._leave(i, h):
                return strategy.skipped_tail(self.backend, self.p, i + 1, h,
                                             subset(self.gone, self.batch))
        return h

    def _layer(self, i: int, h):
        """Layer i: the backbone for deep rows, the strategy's way for rows that left."""
        before, strategy = h, self.run.strategy
        h, cosines = strategy.layer(self.backend, self.p, i, h, self.deep, self.gone,
                                    self.batch, self.sub_blocks)
        if not self.watch:
            return h
        if self.sub_blocks and cosines is not None:   # the paper's rule: the deep rows' blocks
            for r, pair in zip(self.deep, cosines):
                if r in self.rows:
                    self.rows[r].predictor.observe(i, float(min(pair)))
            return h
        # whole blocks; with a strategy that moves the state, rows that left keep moving
        seen = [r for r in sorted(self.deep + self.gone if strategy.moves_state else self.deep)
                if r in self.rows]
        if seen:
            cosines = self.backend.similarity(self.p, before, h, subset(seen, self.batch))
            for r, s in zip(seen, cosines):
                self.rows[r].predictor.observe(i, s)
        return h

    def _leave(self, i: int, h) -> bool:
        """Rows whose policy says so leave after layer i; True when the rest is one call."""
        strategy = self.run.strategy
        if not strategy.allows_exit or not self.deep or i == self.backend.num_layers - 1:
            return False
        early = functools.cache(lambda: self.backend.logits(h))   # only if a policy reads it
        leaving = []
        for r in self.deep:
            row = self.rows.get(r)
            if row is not None and (
                    (strategy.caps_depth and _capped(strategy.ceiling(r), i)) or
                    self.run.policy.should_exit(RowView(i, self.step, row.predictor,
                                                        row.policy_state,
                                                        lambda r=r: early()[r]))):
                leaving.append(r)
        for r in leaving:
            self.exits[r] = i
            self.deep.remove(r)
        if leaving and self.rechecks:
            self.exit_states[i] = h
        self.gone = sorted(self.gone + leaving)
        return not self.deep and not self.watch_exited

    def finish(self, logits: np.ndarray | None = None) -> None:
        """After the head: the predictors fold the token in, a policy may recheck rows (their
        `logits` and exits become full depth's), the strategy learns each row's exit."""
        if self.watch:
            for row in self.rows.values():
                row.predictor.end_token()
        if self.rechecks and logits is not None:
            self._recheck(logits)
        for r, k in enumerate(self.exits):
            self.run.strategy.exited(r, k)

    def _recheck(self, logits: np.ndarray) -> None:
        """A cascade: exited rows the policy doubts run the backbone from their exit on, which
        overwrites the river's K/V in those layers; their logits and exits become full
        depth's."""
        n = self.backend.num_layers
        for r, k in enumerate(self.exits):
            if k < n - 1 and self.run.policy.recheck(logits[r]):
                h = self.exit_states[k]
                for i in range(k + 1, n):
                    h = self.backend.layer(self.p, i, h, [r])[0]
                logits[r] = self.backend.logits(h)[r]
                self.exits[r] = n - 1


def decode_step(backend: Backend, tokens: Sequence[int], run: Run, rows: list[Row],
                step: int, at: Step) -> tuple[np.ndarray, list[int]]:
    """Decode step number `step`: one token per sequence through the layers, writing `at`'s
    slot; return logits and each exit layer. A draft's step (`at.draft`) takes its logits from
    the head's stand-in where the backend has stand-ins."""
    caps = backend.capabilities
    if not caps.exits:   # an engine that only decodes at full depth
        return backend.decode(tokens, at), [backend.num_layers - 1] * len(tokens)
    movable = {} if run.steps_aside(len(tokens)) else dict(enumerate(rows))
    if not at.draft and not (run.strategy.allows_exit and movable):
        # no row can leave: the whole backbone and the head in the engine's one call
        full = backend.num_layers - 1
        logits = backend.decode(tokens, at)
        for r in range(len(tokens)):
            run.strategy.exited(r, full)
        return logits, [full] * len(tokens)
    p = backend.begin(tokens, at)
    walk = Walk(backend, p, run, movable, step, len(tokens))
    h = walk.through(backend.embed(p))
    if at.draft and caps.stand_in:
        logits = backend.stand_in_logits(h)
    elif run.stand_in_head:   # the plan checked the backend has a head's stand-in
        logits = _exit_heads(backend, h, walk.exits)
    else:
        logits = backend.logits(h)
    walk.finish(logits)
    return logits, walk.exits


def _exit_heads(backend: Backend, h, exits: list[int]) -> np.ndarray:
    """Logits of rows that exited from the head's stand-in, of the others from the head."""
    exited = np.array(exits) < backend.num_layers - 1
    if exited.all():
        return backend.stand_in_logits(h)
    logits = backend.logits(h)
    if exited.any():
        logits[exited] = backend.stand_in_logits(h)[exited]
    return logits


def stand_in_error(backend: Backend) -> Sequence[float]:
    """The backend's stand-ins' weight errors; no stand-ins, no error to scale."""
    return getattr(backend, "stand_in_error", None) or [0.0] * backend.num_layers


def _capped(ceiling: int | None, layer: int) -> bool:
    return ceiling is not None and layer >= ceiling


def check_prompts(prompts: Sequence[str] | Sequence[Sequence[int]]) -> None:
    """The one empty-prompt check, for texts (only whitespace is empty) and for token ids,
    wherever a prompt comes in: the API's text and ids, the command line before it loads."""
    if not prompts or any(not (p.strip() if isinstance(p, str) else len(p)) for p in prompts):
        raise ConfigError("empty prompt: give some text, or at least one token id")


def check_capacity(backend: Backend, prompts: Sequence[Sequence[int]], new_tokens: int) -> int:
    """The cache positions a generation needs; refuses empty prompts, ids that are no token
    ids, and context overflow."""
    check_prompts(prompts)
    if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) and t >= 0
               for p in prompts for t in p):
        raise ConfigError("a prompt's token ids must be non-negative integers")
    longest = max(len(p) for p in prompts)
    if longest + new_tokens > backend.max_positions:
        raise ConfigError(f"prompt ({longest} tokens) plus max_new_tokens ({new_tokens}) "
                          f"exceeds the model's context of {backend.max_positions} positions")
    return longest + new_tokens


@attrs.frozen
class Token:
    """One generated token, as it streams out."""

    row: int          # which sequence of the batch
    id: int
    exit_layer: int   # of the step that chose it (DecodeResult: L-1 full depth, -1 none)
    drafted: bool = False   # speculative mode: a draft the backbone kept


Stream = Generator[Token, None, DecodeResult]
"""Yields tokens as they are chosen; returns the statistics (StopIteration.value)."""


def drain(stream: Stream) -> DecodeResult:
    """Run a stream to its end: its statistics."""
    while True:
        try:
            next(stream)
        except StopIteration as done:
            return done.value


def generate_ids(backend: Backend, prompts: Sequence[Sequence[int]], gen: GenerationConfig,
                 run: Run, prefill_exit: int | None = None) -> DecodeResult:
    """Generate up to gen.max_new_tokens per prompt; each sequence stops on EOS or a stop
    string. The prompt runs the backbone up to `prefill_exit` (None: all of it)."""
    return drain(stream_ids(backend, prompts, gen, run, prefill_exit))


def stream_ids(backend: Backend, prompts: Sequence[Sequence[int]], gen: GenerationConfig,
               run: Run, prefill_exit: int | None = None, sample: Sampler | None = None,
               eos: Collection[int] | None = None) -> Stream:
    """`generate_ids` as a stream. Ctrl-C (or `throw(KeyboardInterrupt)`) ends it early with
    what was generated so far, marked `interrupted`. A caller with its own token choice and
    stopping rules (transformers' generate) passes `sample` (instead of gen's temperature,
    top_p and top_k) and `eos` (instead of the tokenizer's; empty: never), and closes the
    stream when it is done."""
    capacity = check_capacity(backend, prompts, gen.max_new_tokens)
    if len(prompts) > 1 and not backend.capabilities.batch:
        raise ConfigError(f"backend {backend.name!r} runs one sequence at a time")
    if len(prompts) > 1 and not run.strategy.batch:
        raise ConfigError(f"kv strategy {run.strategy.name!r} runs one sequence at a time")
    sample = sample or make_sampler(gen.temperature, gen.top_p, gen.seed, gen.top_k)
    eos = gen.ends(backend.tokenizer) if eos is None else eos

    start = time.perf_counter()
    pre = backend.prefill(prompts, capacity, prefill_exit)
    prefill_seconds = time.perf_counter() - start
    rows = start_rows(backend, run, pre.similarity)
    position = max(len(p) for p in prompts)   # every row's next slot (prompts are left-padded)

    batch = len(prompts)
    tokens: list[list[int]] = [[] for _ in range(batch)]
    stops = [StopScan(backend.tokenizer, gen.stop) for _ in range(batch)]
    exits: list[list[int]] = [[] for _ in range(batch)]
    chose = [backend.num_layers - 1 if prefill_exit is None else prefill_exit] * batch
    done = [False] * batch
    steps: list[float] = []
    logits = pre.logits
    try:
        for step in range(gen.max_new_tokens):
            so_far = lambda r: [*prompts[r], *tokens[r]]   # read only after a failure
            for r, t in enumerate(sample(checked(logits, backend, so_far, step))):
                if done[r]:
                    continue
                tokens[r].append(t)
                done[r] = t in eos or stops[r].add(t)
                yield Token(r, t, chose[r])
            if all(done) or step == gen.max_new_tokens - 1:
                break
            start = time.perf_counter()
            logits, chose = decode_step(backend, [row[-1] for row in tokens], run, rows, step,
                                        Step(position + step))
            steps.append(time.perf_counter() - start)
            for r in range(batch):
                if not done[r]:
                    exits[r].append(chose[r])
    except KeyboardInterrupt:   # Ctrl-C: what was generated so far, and its statistics
        return DecodeResult(tokens, exits, backend.num_layers, prefill_seconds, steps,
                            interrupted=True)
    return DecodeResult(tokens, exits, backend.num_layers, prefill_seconds, steps)


@attrs.frozen
class Forced:
    """Teacher forcing: logits after the prompt and after each fed token, and the exits."""

    logits: list[np.ndarray]   # [vocab] each; logits[t] predicts continuation[t]
    exit_layers: list[int]     # per fed token

    def token_nll(self, continuation: Sequence[int]) -> list[float]:
        """Negative log-likelihood of each token of `continuation` (nats)."""
        return [float(-log_softmax(logits)[token])
                for logits, token in zip(self.logits, continuation)]

    def nll(self, continuation: Sequence[int]) -> float:
        """Mean negative log-likelihood of `continuation` (nats per token)."""
        return sum(self.token_nll(continuation)) / max(len(continuation), 1)


def teacher_force(backend: Backend, prompts: Sequence[Sequence[int]],
                  continuations: Sequence[Sequence[int]], run: Run,
                  prefill_exit: int | None = None, capacity: int | None = None) -> list[Forced]:
    """Prefill each prompt (or take the prefill of them the engine's cache still holds:
    `KeepsPrefill`), then feed its continuation a token a step, every row exiting on its own
    as the policy says (several sequences at once: fewer, larger engine calls). A row
    whose continuation is used up keeps repeating its last token, and what it then writes or
    returns is dropped. `capacity` (default: room for the prompts and continuations) names
    the cache's size, so that forcing after a generation of as many positions runs over its
    prefill."""
    longest = max(len(c) for c in continuations)
    capacity = capacity or max(len(p) for p in prompts) + longest
    kept = backend.kept_prefill(prompts, capacity, prefill_exit) \
        if backend.capabilities.keeps_prefill else None
    pre = kept or backend.prefill(prompts, capacity, prefill_exit)
    rows = start_rows(backend, run, pre.similarity)
    position = max(len(p) for p in prompts)
    logits = [[row] for row in pre.logits]
    exits: list[list[int]] = [[] for _ in prompts]
    for step in range(longest):
        fed = [c[min(step, len(c) - 1)] if c else 0 for c in continuations]
        out, layers = decode_step(backend, fed, run, rows, step, Step(position + step))
        for r, c in enumerate(continuations):
            if step < len(c):
                logits[r].append(out[r])
                exits[r].append(layers[r])
    return [Forced(l, e) for l, e in zip(logits, exits)]
