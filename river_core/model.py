"""RiverModel: load a model through a backend plugin and generate with early exit."""

from __future__ import annotations

import threading
from typing import Any, Collection, Mapping, Sequence

import attrs

from .contract.backend import Backend, ModelShape, Tokenizer
from .settings.config import ExitConfig, GenerationConfig, QuantSpec
from .loop.decode import (DecodeResult, Forced, Stream, Token, check_prompts, drain, stream_ids,
                          teacher_force)
from .loop.detokenize import Detokenizer
from .settings.errors import ConfigError
from .plan import Plan, check_exits_allowed, resolve
from .plugins import Registry, default_registry
from .method.policy import ScriptedExits
from .loop.sampling import Sampler
from .loop.drafting import DraftStore
from .method.draft_length import DraftLength
from .loop.speculative import speculative_stream
from .method.verify_costs import VerifyCosts

_EXIT_FIELDS = {f.name for f in attrs.fields(ExitConfig)} - {"options"}
_GEN_FIELDS = {f.name for f in attrs.fields(GenerationConfig)}


@attrs.frozen
class Completion:
    texts: list[str]
    stats: DecodeResult

    @property
    def text(self) -> str:
        return self.texts[0]


def split_settings(settings: Mapping[str, Any], exit_config: ExitConfig | Plan | None,
                   generation_config: GenerationConfig | None,
                   options: Mapping[str, Any] | None
                   ) -> tuple[ExitConfig | Plan, GenerationConfig]:
    """Keyword settings by name: ExitConfig fields, GenerationConfig fields, and any other
    name as a plugin option (not beside a resolved plan, which has its settings)."""
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(f"options must be a mapping of names to values, got {options!r} "
                          f"({type(options).__name__})")
    generation_config = attrs.evolve(generation_config or GenerationConfig(),
                                     **{k: v for k, v in settings.items() if k in _GEN_FIELDS})
    exit_settings = {k: v for k, v in settings.items() if k not in _GEN_FIELDS}
    if isinstance(exit_config, Plan):
        if exit_settings or options:
            raise ConfigError(f"a resolved plan takes no exit settings: "
                              f"{', '.join(sorted({*exit_settings, *(options or {})}))}")
        return exit_config, generation_config
    exit_config = exit_config or ExitConfig()
    plugin_options = {**exit_config.options, **(options or {}),
                      **{k: v for k, v in exit_settings.items() if k not in _EXIT_FIELDS}}
    exit_config = attrs.evolve(exit_config, options=plugin_options,
                               **{k: v for k, v in exit_settings.items() if k in _EXIT_FIELDS})
    return exit_config, generation_config


class RiverModel:
    """A backend plus the plugins that drive it.

    >>> model = RiverModel.from_pretrained()          # the embedded SmolLM2-135M-Instruct
    >>> model.generate("What is 7 * 8?", tau=0.97, max_new_tokens=32).text

    Every call takes its exit settings as an `ExitConfig` (resolved against this model) or as a
    `Plan` already resolved, e.g. by the CLI before the model loaded.
    """

    def __init__(self, backend: Backend, registry: Registry | None = None) -> None:
        self.backend = backend
        self.registry = registry or default_registry()
        # a backend owns one KV cache: calls on one model take turns, two models run at once
        self.lock = threading.Lock()
        # speculative mode's verification costs by context scale, measured once on this
        # machine and kept between calls and processes (`_draft_length`)
        self._verify_costs: dict[str, VerifyCosts] = {}
        self._draft_store: DraftStore | None = None

    @classmethod
    def from_pretrained(cls, model: str | None = None, *, backend: str = "hf",
                        device: str = "cpu", dtype: str | None = None,
                        quant: QuantSpec | None = None, progress: bool = False,
                        registry: Registry | None = None) -> "RiverModel":
        """`model`: a local Hugging Face folder or GGUF file; None for the embedded default.
        `dtype` None: the backend's default for the device; `quant` None: the backend's own
        stand-ins (`BackendPlugin.quant`)."""
        registry = registry or default_registry()
        plugin = registry.backend(backend)
        chosen = {} if dtype is None else {"dtype": dtype}
        return cls(plugin.load(model, device=device, quant=quant or plugin.quant,
                               progress=progress, **chosen), registry)

    @property
    def shape(self) -> ModelShape:
        return ModelShape(self.backend.num_layers, self.backend.max_positions)

    def plan(self, exit_config: ExitConfig | Plan) -> Plan:
        """`exit_config` resolved against this model (a plan made elsewhere is checked to be
        for this model's backend and depth)."""
        if isinstance(exit_config, Plan):
            plan = exit_config
            if (plan.backend, plan.shape.num_layers) != (self.backend.name, self.shape.num_layers):
                raise ConfigError(f"this plan was resolved for backend {plan.backend!r} and "
                                  f"{plan.shape.num_layers} layers, not {self.backend.name!r} "
                                  f"and {self.shape.num_layers}")
            check_exits_allowed(plan.config, plan.kv_plugin.make, self.backend.capabilities)
            return plan
        return resolve(exit_config, self.registry, self.backend.capabilities, self.shape,
                       self.backend.name)

    def generate(self, prompt: str | Sequence[str], *, chat: bool = True,
                 exit_config: ExitConfig | Plan | None = None,
                 generation_config: GenerationConfig | None = None,
                 options: Mapping[str, Any] | None = None, **settings) -> Completion:
        """Generate for one prompt or a batch. `settings` name ExitConfig fields (kv="full"),
        GenerationConfig fields (max_new_tokens=64) or plugin options (threshold=0.2), which
        `options` may also carry as a dict."""
        exit_config, generation_config = split_settings(settings, exit_config,
                                                        generation_config, options)
        stats = self.generate_ids(self.encode(prompt, chat), exit_config, generation_config)
        texts = [self.text(t, generation_config.stop) for t in stats.tokens]
        return Completion(texts, stats)

    def stream(self, prompt: str | Sequence[str], *, chat: bool = True,
               exit_config: ExitConfig | Plan | None = None,
               generation_config: GenerationConfig | None = None,
               options: Mapping[str, Any] | None = None, **settings) -> "TokenStream":
        """`generate`, a token at a time: iterate the result for `Token`s (id, row, exit
        layer) as they are chosen; `text(row)` as it grows; its `stats` afterwards.

        >>> for token in (s := model.stream("What is 7 * 8?")):
        ...     print(s.text(0), end="\r")
        """
        exit_config, generation_config = split_settings(settings, exit_config,
                                                        generation_config, options)
        return TokenStream(self._stream(self.encode(prompt, chat), exit_config,
                                        generation_config), self.backend.tokenizer,
                           generation_config.stop)

    def encode(self, prompt: str | Sequence[str], chat: bool = True) -> list[list[int]]:
        """Token ids of one prompt or a batch, under the chat template unless `chat` is False;
        refuses empty prompts and text that is not valid UTF-8."""
        if isinstance(prompt, (bytes, bytearray)):
            raise ConfigError("prompt must be text (str), got bytes: decode them first, e.g. "
                              "data.decode('utf-8')")
        if not isinstance(prompt, (str, list, tuple)):
            raise ConfigError(f"prompt must be text (str) or a list of texts, got {prompt!r} "
                              f"({type(prompt).__name__})")
        prompts = [check_text(p) for p in ([prompt] if isinstance(prompt, str) else prompt)]
        check_prompts(prompts)
        tok = self.backend.tokenizer
        return [tok.chat(p) if chat else tok.encode(p) for p in prompts]

    def text(self, tokens: Sequence[int], stop: Sequence[str] = ()) -> str:
        """Generated ids as returned text: without the final EOS, cut at the first stop."""
        tok = self.backend.tokenizer
        return _cut(tok.decode(_until_eos(list(tokens), tok.eos_ids)), stop)

    def generate_ids(self, prompts: Sequence[Sequence[int]], exit_config: ExitConfig | Plan,
                     generation_config: GenerationConfig) -> DecodeResult:
        return drain(self._stream(prompts, exit_config, generation_config))

    def stream_ids(self, prompts: Sequence[Sequence[int]], exit_config: ExitConfig | Plan,
                   generation_config: GenerationConfig, *, sample: Sampler | None = None,
                   eos: Collection[int] | None = None) -> "TokenStream":
        """`stream` over token ids. A caller with its own token choice and stopping rules
        (transformers' generate) passes `sample` and `eos` (decode.stream_ids) and
        `interrupt()`s the stream once it is done."""
        return TokenStream(self._stream(prompts, exit_config, generation_config, sample, eos),
                           self.backend.tokenizer, generation_config.stop)

    def _stream(self, prompts: Sequence[Sequence[int]], exit_config: ExitConfig | Plan,
                generation_config: GenerationConfig, sample: Sampler | None = None,
                eos: Collection[int] | None = None) -> Stream:
        plan = self.plan(exit_config)
        if plan.config.lossless:
            if sample is not None or eos is not None:
                raise ConfigError("speculative mode chooses tokens by its own verification "
                                  "rule: it takes no caller's sampler or EOS set")
            key = f"context {len(prompts[0]).bit_length()}"
            length = self._draft_length(plan, key, generation_config)
            stream = speculative_stream(self.backend, prompts, generation_config, plan.run(),
                                        length, plan.draft_sources)
            if length.adaptive and length.costs is None:
                stream = self._remembered(stream, key, length)
        else:
            stream = stream_ids(self.backend, prompts, generation_config, plan.run(),
                                plan.config.prefill_exit, sample, eos)
        return _holding(self.lock, stream)

    def _draft_length(self, plan: Plan, key: str, gen: GenerationConfig) -> DraftLength:
        """A fresh draft length for this generation, so that what it drafts follows from the
        prompt alone, judging rounds by the verification costs measured on this machine at
        contexts of the same power of two (`key`), in this process or, from the user cache,
        in an earlier one on this CPU (`drafting.py`); where none cover its widest round (no
        wider than `gen` asks tokens), the generation measures them (`speculative.rounds`)."""
        length = plan.draft_length()
        if length.adaptive:
            costs = self._verify_costs.get(key) or self._drafts().read(key)
            if costs is not None and costs.covers(min(length.widest, gen.max_new_tokens)):
                self._verify_costs[key] = costs
                length.use(costs)
        return length

    def _drafts(self) -> DraftStore:
        if self._draft_store is None:
            self._draft_store = DraftStore(self.backend)
        return self._draft_store

    def _remembered(self, stream: Stream, key: str, length: DraftLength) -> Stream:
        """`stream`, and once it is done, the verification costs it measured, kept."""
        result = yield from stream
        if length.costs is not None:   # none where it ended before a round
            self._verify_costs[key] = length.costs
            self._drafts().write(key, length.costs)
        return result

    def teacher_force(self, prompts: Sequence[Sequence[int]],
                      continuations: Sequence[Sequence[int]], exit_config: ExitConfig | Plan,
                      exits: Sequence[int | None] | None = None,
                      capacity: int | None = None) -> list[Forced]:
        """Feed each continuation after its prompt a token a step, all sequences at once
        (fewer, larger engine calls), every row exiting on its own under `exit_config`'s
        policy and strategy, or, with `exits`, step s of every row after layer exits[s]
        (None or past the last layer: full depth): logits at every position (for NLL) and
        where each token left. `capacity`: the cache's size (`decode.teacher_force`)."""
        plan = self.plan(exit_config)
        if plan.config.lossless:
            raise ConfigError("speculative mode scores exactly as full depth: teacher-force "
                              "with kv='full'")
        run = plan.run()
        if exits is not None:
            run = attrs.evolve(run, policy=ScriptedExits(exits))
        with self.lock:
            return teacher_force(self.backend, prompts, continuations, run,
                                 plan.config.prefill_exit, capacity)


def _holding(lock: threading.Lock, stream: Stream) -> Stream:
    """`stream` with `lock` held from its first token until it ends or is dropped."""
    with lock:
        return (yield from stream)


@attrs.define
class _RowText:
    """One row's text, made from its ids only when asked for (a caller that reads ids alone,
    transformers' generate, decodes nothing)."""

    detokenizer: Detokenizer
    pieces: list[str] = attrs.Factory(list)
    fed: int = 0          # the row's ids the detokenizer has seen
    finished: bool = False


class TokenStream:
    """Tokens as a generation chooses them, each row's text as it grows (each id decoded a
    bounded number of times: `Detokenizer`); `stats` once it has ended."""

    def __init__(self, stream: Stream, tokenizer: Tokenizer, stop: Sequence[str] = ()) -> None:
        self._stream = stream
        self._tokenizer, self._stop = tokenizer, tuple(stop)
        self._ids: dict[int, list[int]] = {}
        self._texts: dict[int, _RowText] = {}
        self.stats: DecodeResult | None = None

    def __iter__(self) -> "TokenStream":
        return self

    def __next__(self) -> Token:
        if self.stats is not None:
            raise StopIteration
        try:
            token = next(self._stream)
        except StopIteration as done:
            self.stats = done.value
            raise StopIteration from None
        self._ids.setdefault(token.row, []).append(token.id)
        return token

    def text(self, row: int = 0) -> str:
        """The text of sequence `row` so far: whole characters, cut before the first stop
        string; once the stream has ended, `RiverModel.text` of its ids."""
        text = self._texts.setdefault(row, _RowText(Detokenizer(self._tokenizer)))
        ids = self._ids.get(row, [])
        for t in ids[text.fed:]:
            if t not in self._tokenizer.eos_ids:
                text.pieces.append(text.detokenizer.add(t))
        text.fed = len(ids)
        if self.stats is not None and not text.finished:   # the last incomplete character
            text.pieces.append(text.detokenizer.finish())
            text.finished = True
        return _cut("".join(text.pieces), self._stop)

    def ids(self, row: int = 0) -> list[int]:
        """The ids of sequence `row` so far."""
        return list(self._ids.get(row, []))

    def interrupt(self) -> DecodeResult:
        """End the generation now, as Ctrl-C does: the statistics of what came so far."""
        if self.stats is None:
            try:
                self._stream.throw(KeyboardInterrupt)
            except StopIteration as done:
                self.stats = done.value
        return self.stats


def check_text(text: str, what: str = "prompt") -> str:
    """`text`, if it is text a tokenizer can take. Python decodes bytes that are not UTF-8 (in
    a command line, say) to lone surrogates; those are refused with the byte's offset."""
    if not isinstance(text, str):
        raise ConfigError(f"{what} must be text (str), got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start]
        if "\udc80" <= bad <= "\udcff":   # an undecodable byte, escaped
            offset = len(text[:e.start].encode("utf-8", "surrogateescape"))
            raise ConfigError(f"{what} is not valid UTF-8: byte 0x{ord(bad) - 0xdc00:02x} at "
                              f"byte offset {offset}") from None
        raise ConfigError(f"{what} holds a lone surrogate U+{ord(bad):04X} at character "
                          f"{e.start}: not text a tokenizer can take") from None
    return text


def _cut(text: str, stop: Sequence[str]) -> str:
    """The text before the first stop string."""
    return min((text[:text.index(s)] for s in stop if s in text), key=len, default=text)


def _until_eos(tokens: list[int], eos: frozenset[int]) -> list[int]:
    return tokens[:-1] if tokens and tokens[-1] in eos else tokens
