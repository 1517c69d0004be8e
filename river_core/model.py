"""RiverModel: load a model through a backend plugin and generate with early exit."""

from __future__ import annotations

import functools
import threading
import typing
from typing import Any, Collection, Mapping, Sequence

import attrs

from .backend import Backend, Capabilities
from .config import ExitConfig, GenerationConfig, QuantSpec
from .decode import (DecodeResult, Forced, PredictorFactory, Stream, Token, drain, stream_ids,
                     teacher_force)
from .errors import CapabilityError, ConfigError
from .kv import KVStrategy
from .options import bind
from .plugins import Registry, default_registry
from .policy import ExitPolicy
from .sampling import Sampler
from .speculative import DraftLength, check as check_speculative, speculative_stream

_EXIT_FIELDS = {f.name for f in attrs.fields(ExitConfig)} - {"options"}
_GEN_FIELDS = {f.name for f in attrs.fields(GenerationConfig)}


@attrs.frozen
class Completion:
    texts: list[str]
    stats: DecodeResult

    @property
    def text(self) -> str:
        return self.texts[0]


@attrs.frozen
class Plan:
    """What runs a generation: the KV strategy, the exit policy and the predictor factory."""

    strategy: KVStrategy
    policy: ExitPolicy
    make_predictor: PredictorFactory
    prefill_exit: int | None
    draft_length: DraftLength | None   # speculative mode only


def bound_options(registry: Registry, config: ExitConfig) -> dict[str, Any]:
    """Each chosen plugin's options instance; fails on unknown names or bad values without
    needing a model."""
    return bind(config.options, {"policy": registry.policy(config.policy),
                                 "predictor": registry.predictor(config.predictor),
                                 "kv": registry.kv_strategy(config.kv)})


def check(registry: Registry, config: ExitConfig, caps: Capabilities, backend_name: str) -> None:
    """Everything about `config` that needs no model, against a backend's declared
    capabilities, before it loads (the policy's flags from its factory's return annotation;
    `plan` checks the made policy again)."""
    strategy = registry.kv_strategy(config.kv)(bound_options(registry, config)["kv"])
    _check(config, strategy, _returns(registry.policy(config.policy)), caps, backend_name)


def _check(config: ExitConfig, strategy: KVStrategy, policy, caps: Capabilities,
           backend_name: str) -> None:
    if strategy.allows_exit and not caps.exits:
        raise CapabilityError(f"backend {backend_name!r} cannot exit early; "
                              f"use kv strategy 'full'")
    if strategy.requires and not getattr(caps, strategy.requires):
        raise CapabilityError(f"backend {backend_name!r} does not support the "
                              f"{config.kv!r} kv strategy")
    if strategy.allows_exit and getattr(policy, "sub_blocks", False) and not caps.sub_blocks:
        raise CapabilityError(f"the {config.policy!r} policy reads sub-block similarities, "
                              f"which backend {backend_name!r} does not report")
    if strategy.allows_exit and getattr(policy, "rechecks", False) and not strategy.drafts:
        raise ConfigError(f"the {config.policy!r} policy recomputes doubtful tokens through "
                          f"the backbone, which the {config.kv!r} kv strategy cannot take "
                          f"(river or propagate can)")
    if config.prefill_exit is not None and strategy.skipped_reads != "stand_in":
        raise ConfigError(f"prefill_exit runs the prompt's deep layers as stand-ins; the "
                          f"{config.kv!r} kv strategy has none")
    if config.mode == "speculative":
        check_speculative(caps, backend_name, strategy, 1)
        if config.prefill_exit is not None:
            raise ConfigError("speculative mode is lossless, but prefill_exit would leave "
                              "stand-in K/V in the prompt's slots; drop one of them")


def _returns(factory) -> Any:
    """The class a plugin factory is annotated to return (None: not annotated)."""
    try:
        made = typing.get_type_hints(factory).get("return")
    except Exception:   # annotations a plugin did not make resolvable
        return None
    return made if isinstance(made, type) else None


def plan(registry: Registry, config: ExitConfig, backend: Backend) -> Plan:
    """The plugins `config` names, made with their options and checked against the backend."""
    options = bound_options(registry, config)
    strategy = registry.kv_strategy(config.kv)(options["kv"])
    policy = registry.policy(config.policy)(options["policy"], backend.num_layers)
    _check(config, strategy, policy, backend.capabilities, backend.name)
    predictor = functools.partial(registry.predictor(config.predictor), options["predictor"])
    if config.prefill_exit is not None and config.prefill_exit >= backend.num_layers:
        raise ConfigError(f"prefill_exit {config.prefill_exit} is past the model's last "
                          f"layer ({backend.num_layers - 1})")
    length = None
    if config.mode == "speculative":
        length = DraftLength(config.draft_tokens, config.adaptive)
    return Plan(strategy, policy, predictor, config.prefill_exit, length)


def split_settings(settings: Mapping[str, Any], exit_config: ExitConfig | None,
                   generation_config: GenerationConfig | None,
                   options: Mapping[str, Any] | None) -> tuple[ExitConfig, GenerationConfig]:
    """Keyword settings by name: ExitConfig fields, GenerationConfig fields, and any other
    name as a plugin option."""
    exit_config = exit_config or ExitConfig()
    plugin_options = {**exit_config.options, **(options or {}),
                      **{k: v for k, v in settings.items()
                         if k not in _EXIT_FIELDS and k not in _GEN_FIELDS}}
    exit_config = attrs.evolve(exit_config, options=plugin_options,
                               **{k: v for k, v in settings.items() if k in _EXIT_FIELDS})
    generation_config = attrs.evolve(generation_config or GenerationConfig(),
                                     **{k: v for k, v in settings.items() if k in _GEN_FIELDS})
    return exit_config, generation_config


class RiverModel:
    """A backend plus the plugins that drive it.

    >>> model = RiverModel.from_pretrained()          # the embedded SmolLM2-135M-Instruct
    >>> model.generate("What is 7 * 8?", threshold=0.15, max_new_tokens=32).text
    """

    def __init__(self, backend: Backend, registry: Registry | None = None) -> None:
        self.backend = backend
        self.registry = registry or default_registry()
        # a backend owns one KV cache: calls on one model take turns, two models run at once
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, model: str | None = None, *, backend: str = "hf",
                        device: str = "cpu", dtype: str = "float32",
                        quant: QuantSpec = QuantSpec(), progress: bool = False,
                        registry: Registry | None = None) -> "RiverModel":
        """`model`: a local Hugging Face folder or GGUF file; None for the embedded default."""
        registry = registry or default_registry()
        load = registry.backend(backend)
        return cls(load(model, device=device, dtype=dtype, quant=quant, progress=progress),
                   registry)

    def generate(self, prompt: str | Sequence[str], *, chat: bool = True,
                 exit_config: ExitConfig | None = None,
                 generation_config: GenerationConfig | None = None,
                 options: Mapping[str, Any] | None = None, **settings) -> Completion:
        """Generate for one prompt or a batch. `settings` name ExitConfig fields (kv="full"),
        GenerationConfig fields (max_new_tokens=64) or plugin options (threshold=0.2), which
        `options` may also carry as a dict."""
        exit_config, generation_config = split_settings(settings, exit_config,
                                                        generation_config, options)
        stats = self.generate_ids(self._encode(prompt, chat), exit_config, generation_config)
        texts = [self.text(t, generation_config.stop) for t in stats.tokens]
        return Completion(texts, stats)

    def stream(self, prompt: str | Sequence[str], *, chat: bool = True,
               exit_config: ExitConfig | None = None,
               generation_config: GenerationConfig | None = None,
               options: Mapping[str, Any] | None = None, **settings) -> "TokenStream":
        """`generate`, a token at a time: iterate the result for `Token`s (id, row, exit
        layer) as they are chosen; its `stats` afterwards.

        >>> for token in (s := model.stream("What is 7 * 8?")):
        ...     print(model.text(s.ids(0)), end="\r")
        """
        exit_config, generation_config = split_settings(settings, exit_config,
                                                        generation_config, options)
        return TokenStream(self._stream(self._encode(prompt, chat), exit_config,
                                        generation_config))

    def _encode(self, prompt: str | Sequence[str], chat: bool) -> list[list[int]]:
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        if not prompts or any(not p.strip() for p in prompts):
            raise ConfigError("empty prompt")
        tok = self.backend.tokenizer
        return [tok.chat(p) if chat else tok.encode(p) for p in prompts]

    def text(self, tokens: Sequence[int], stop: Sequence[str] = ()) -> str:
        """Generated ids as returned text: without the final EOS, cut at the first stop."""
        tok = self.backend.tokenizer
        return _cut(tok.decode(_until_eos(list(tokens), tok.eos_ids)), stop)

    def generate_ids(self, prompts: Sequence[Sequence[int]], exit_config: ExitConfig,
                     generation_config: GenerationConfig) -> DecodeResult:
        return drain(self._stream(prompts, exit_config, generation_config))

    def stream_ids(self, prompts: Sequence[Sequence[int]], exit_config: ExitConfig,
                   generation_config: GenerationConfig, *, sample: Sampler | None = None,
                   eos: Collection[int] | None = None) -> "TokenStream":
        """`stream` over token ids. A caller with its own token choice and stopping rules
        (transformers' generate) passes `sample` and `eos` (decode.stream_ids) and
        `interrupt()`s the stream once it is done."""
        return TokenStream(self._stream(prompts, exit_config, generation_config, sample, eos))

    def _stream(self, prompts: Sequence[Sequence[int]], exit_config: ExitConfig,
                generation_config: GenerationConfig, sample: Sampler | None = None,
                eos: Collection[int] | None = None) -> Stream:
        p = plan(self.registry, exit_config, self.backend)
        if p.draft_length is not None:
            if sample is not None or eos is not None:
                raise ConfigError("speculative mode chooses tokens by its own verification "
                                  "rule: it takes no caller's sampler or EOS set")
            stream = speculative_stream(self.backend, prompts, generation_config, p.strategy,
                                        p.policy, p.make_predictor, p.draft_length)
        else:
            stream = stream_ids(self.backend, prompts, generation_config, p.strategy,
                                p.policy, p.make_predictor, p.prefill_exit, sample, eos)
        return _holding(self._lock, stream)

    def teacher_force(self, prompt: Sequence[int], continuation: Sequence[int],
                      exit_config: ExitConfig) -> Forced:
        """Feed `continuation` after `prompt` token by token under `exit_config`'s policy and
        strategy: logits at every position (for NLL) and where each token left."""
        if exit_config.mode == "speculative":
            raise ConfigError("speculative mode scores exactly as full depth: teacher-force "
                              "with kv='full'")
        p = plan(self.registry, exit_config, self.backend)
        with self._lock:
            return teacher_force(self.backend, prompt, continuation, p.strategy, p.policy,
                                 p.make_predictor, p.prefill_exit)


def _holding(lock: threading.Lock, stream: Stream) -> Stream:
    """`stream` with `lock` held from its first token until it ends or is dropped."""
    with lock:
        return (yield from stream)


class TokenStream:
    """Tokens as a generation chooses them; `stats` once it has ended."""

    def __init__(self, stream: Stream) -> None:
        self._stream = stream
        self._ids: dict[int, list[int]] = {}
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


def _cut(text: str, stop: Sequence[str]) -> str:
    """The text before the first stop string."""
    return min((text[:text.index(s)] for s in stop if s in text), key=len, default=text)


def _until_eos(tokens: list[int], eos: frozenset[int]) -> list[int]:
    return tokens[:-1] if tokens and tokens[-1] in eos else tokens
