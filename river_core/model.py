"""RiverModel: load a model through a backend plugin and generate with early exit."""

from __future__ import annotations

from typing import Sequence

import attrs

from .backend import Backend
from .config import ExitConfig, GenerationConfig, RiverSpec
from .decode import Forced, Generation, generate_ids, teacher_force
from .errors import CapabilityError, ConfigError
from .plugins import Registry, default_registry

_EXIT_FIELDS = {f.name for f in attrs.fields(ExitConfig)}
_GEN_FIELDS = {f.name for f in attrs.fields(GenerationConfig)}


@attrs.frozen
class Completion:
    texts: list[str]
    stats: Generation

    @property
    def text(self) -> str:
        return self.texts[0]


class RiverModel:
    """A backend plus the plugins that drive it.

    >>> model = RiverModel.from_pretrained()          # the embedded SmolLM2-135M-Instruct
    >>> model.generate("What is 7 * 8?", threshold=0.15, max_new_tokens=32).text
    """

    def __init__(self, backend: Backend, registry: Registry | None = None) -> None:
        self.backend = backend
        self.registry = registry or default_registry()

    @classmethod
    def from_pretrained(cls, model: str | None = None, *, backend: str = "hf",
                        device: str = "cpu", dtype: str = "float32",
                        river: RiverSpec = RiverSpec(), progress: bool = False,
                        registry: Registry | None = None) -> "RiverModel":
        """`model`: a local Hugging Face folder or GGUF file; None for the embedded default."""
        registry = registry or default_registry()
        load = registry.backend(backend)
        return cls(load(model, device=device, dtype=dtype, river=river, progress=progress),
                   registry)

    def generate(self, prompt: str | Sequence[str], *, chat: bool = True,
                 exit: ExitConfig | None = None, generation: GenerationConfig | None = None,
                 **options) -> Completion:
        """Generate for one prompt or a batch. `options` set ExitConfig and GenerationConfig
        fields by name (threshold=0.2, max_new_tokens=64, kv="propagate", ...)."""
        unknown_opts = set(options) - _EXIT_FIELDS - _GEN_FIELDS
        if unknown_opts:
            raise ConfigError(f"unknown option(s): {', '.join(sorted(unknown_opts))}")
        exit = attrs.evolve(exit or ExitConfig(),
                            **{k: v for k, v in options.items() if k in _EXIT_FIELDS})
        generation = attrs.evolve(generation or GenerationConfig(),
                                  **{k: v for k, v in options.items() if k in _GEN_FIELDS})
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        if not prompts or any(not p.strip() for p in prompts):
            raise ConfigError("empty prompt")
        tok = self.backend.tokenizer
        ids = [tok.chat(p) if chat else tok.encode(p) for p in prompts]
        stats = self.generate_ids(ids, exit, generation)
        texts = [self.text(t, generation.stop) for t in stats.tokens]
        return Completion(texts, stats)

    def text(self, tokens: Sequence[int], stop: Sequence[str] = ()) -> str:
        """Generated ids as returned text: without the final EOS, cut at the first stop."""
        tok = self.backend.tokenizer
        return _cut(tok.decode(_until_eos(list(tokens), tok.eos_ids)), stop)

    def generate_ids(self, prompts: Sequence[Sequence[int]], exit: ExitConfig,
                     generation: GenerationConfig) -> Generation:
        return generate_ids(self.backend, prompts, generation, *self._plan(exit))

    def teacher_force(self, prompt: Sequence[int], continuation: Sequence[int],
                      exit: ExitConfig) -> Forced:
        """Feed `continuation` after `prompt` token by token under `exit`'s policy and
        strategy: logits at every position (for NLL) and where each token left."""
        return teacher_force(self.backend, prompt, continuation, *self._plan(exit))

    def _plan(self, exit: ExitConfig):
        """(strategy, policy, predictor factory) for `exit`, checked against the backend."""
        strategy = self.registry.kv_strategy(exit.kv)()
        caps = self.backend.capabilities
        if strategy.allows_exit and not caps.exits:
            raise CapabilityError(f"backend {self.backend.name!r} cannot exit early; "
                                  f"use kv strategy 'full'")
        if strategy.requires and not getattr(caps, strategy.requires):
            raise CapabilityError(f"backend {self.backend.name!r} does not support the "
                                  f"{exit.kv!r} kv strategy")
        policy = self.registry.policy(exit.policy)(exit, self.backend.num_layers)
        return strategy, policy, self.registry.predictor(exit.predictor)


def _cut(text: str, stop: Sequence[str]) -> str:
    """The text before the first stop string."""
    return min((text[:text.index(s)] for s in stop if s in text), key=len, default=text)


def _until_eos(tokens: list[int], eos: frozenset[int]) -> list[int]:
    return tokens[:-1] if tokens and tokens[-1] in eos else tokens
