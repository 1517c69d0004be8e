"""Plugin hooks. One project name serves as pluggy marker, plugin name and entry-point group.

A plugin is any module or object with `@hookimpl` functions, listed under the entry-point group
`river_core` in its distribution's metadata:

    [project.entry-points.river_core]
    mybackend = "my_package.plugin"

Each hook returns a mapping of names to factories; names must be unique across plugins.
"""

from __future__ import annotations

from typing import Callable, Mapping

import pluggy

PROJECT = "river_core"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def river_backends() -> Mapping[str, Callable]:
    """name -> load(model, *, device, dtype, river, progress) returning a Backend."""


@hookspec
def river_exit_policies() -> Mapping[str, Callable]:
    """name -> make(config: ExitConfig, num_layers: int) returning an ExitPolicy."""


@hookspec
def river_predictors() -> Mapping[str, Callable]:
    """name -> make(river_error, prompt_similarity) returning a SimilarityPredictor."""


@hookspec
def river_kv_strategies() -> Mapping[str, Callable]:
    """name -> make() returning a KVStrategy."""


@hookspec
def river_conformance_backends() -> Mapping[str, Callable]:
    """name -> make(family, seed, bits) returning a Backend over the tiny random model
    `river_hf.tiny.model(family, seed)`: what the conformance kit (river_core.conformance)
    runs. `family` is one of river_hf.tiny.FAMILIES; raise CapabilityError for one the
    backend cannot run."""
