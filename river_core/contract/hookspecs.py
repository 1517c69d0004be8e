"""Plugin hooks, and the typed entries they return. One project name serves as pluggy marker,
plugin name and entry-point group.

A plugin is any module or object with `@hookimpl` functions, listed under the entry-point group
`river_core` in its distribution's metadata:

    [project.entry-points.river_core]
    mybackend = "my_package.plugin"

Each hook returns a mapping of names to entries; names must be unique across plugins. The core's
own policies, predictor, KV strategies and draft sources come through the same hooks (builtins.py).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import attrs
import pluggy

from .backend import Capabilities, ModelShape
from ..settings.config import QuantSpec
from ..settings.options import NoOptions

PROJECT = "river_core"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


def _shape_unknown(model: str | None) -> ModelShape | None:
    return None


@attrs.frozen
class BackendPlugin:
    """An engine. What it can do and the model's shape are known before anything loads, so a
    plan is checked first and a bad setting never waits for a long load."""

    load: Callable[..., Any]
    """load(model, *, device, dtype, quant, progress) -> Backend; model None: the default."""
    capabilities: Capabilities
    shape: Callable[[str | None], ModelShape | None] = _shape_unknown
    """The model's depth and context read cheaply (a config file, a header); None when it
    cannot be read before loading."""
    quant: QuantSpec = QuantSpec()
    """The stand-ins it runs when the user names none: the grid its kernels run fastest."""


@attrs.frozen
class PolicyPlugin:
    make: Callable[[Any, int], Any]
    """make(options, num_layers) -> ExitPolicy."""
    options: type = NoOptions
    """Its options, an attrs class (options.py); `river plugins` lists them."""


@attrs.frozen
class PredictorPlugin:
    make: Callable[[Any, Any, Any], Any]
    """make(options, stand_in_error, prompt_similarity) -> SimilarityPredictor."""
    options: type = NoOptions
    across_tokens: tuple[str, ...] = ()
    """Options that act only across a sequence's tokens: refused by name where the engine
    keeps no state per sequence (`Capabilities.sequences`), since they could do nothing."""


@attrs.frozen
class KVStrategyPlugin:
    make: type
    """A KVStrategy class (kv.py): its class attributes say what it needs of a backend, and it
    is made afresh from its options for every generation."""
    options: type = NoOptions


@attrs.frozen
class DraftSourcePlugin:
    make: Callable[[Any], Any]
    """make(options) -> speculative.DraftSource: where speculative mode's drafts come from."""
    options: type = NoOptions


@hookspec
def river_backends() -> Mapping[str, BackendPlugin]:
    """name -> BackendPlugin."""


@hookspec
def river_exit_policies() -> Mapping[str, PolicyPlugin]:
    """name -> PolicyPlugin."""


@hookspec
def river_predictors() -> Mapping[str, PredictorPlugin]:
    """name -> PredictorPlugin."""


@hookspec
def river_kv_strategies() -> Mapping[str, KVStrategyPlugin]:
    """name -> KVStrategyPlugin."""


@hookspec
def river_draft_sources() -> Mapping[str, DraftSourcePlugin]:
    """name -> DraftSourcePlugin (`--drafts NAME,...`)."""


@hookspec
def river_conformance_backends() -> Mapping[str, Callable]:
    """name -> make(family, seed, bits) returning a Backend over the tiny random model
    `river_conformance.fixtures.tiny.checkpoint(family, seed)`: what the conformance kit (package
    `river_conformance`) runs. `family` is one of river_conformance.fixtures.tiny.FAMILIES; raise
    CapabilityError for one the backend cannot run."""


@hookspec
def river_commands() -> Mapping[str, Callable]:
    """name -> add(parser) for a `river NAME` subcommand: `add` declares the command's
    arguments on its argparse parser and returns run(args) -> exit status (None: 0)."""
