"""Plugin hooks. One project name serves as pluggy marker, plugin name and entry-point group.

A plugin is any module or object with `@hookimpl` functions, listed under the entry-point group
`river_core` in its distribution's metadata:

    [project.entry-points.river_core]
    mybackend = "my_package.plugin"

Each hook returns a mapping of names to factories; names must be unique across plugins. A
policy, predictor or KV strategy factory takes its options first: an instance of its `Options`
attribute (an attrs class, see options.py), or of `NoOptions` when it declares none.
"""

from __future__ import annotations

from typing import Callable, Mapping

import pluggy

PROJECT = "river_core"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def river_backends() -> Mapping[str, Callable]:
    """name -> load(model, *, device, dtype, quant, progress) returning a Backend."""


@hookspec
def river_exit_policies() -> Mapping[str, Callable]:
    """name -> make(options, num_layers) returning an ExitPolicy."""


@hookspec
def river_predictors() -> Mapping[str, Callable]:
    """name -> make(options, stand_in_error, prompt_similarity) returning a
    SimilarityPredictor."""


@hookspec
def river_kv_strategies() -> Mapping[str, Callable]:
    """name -> make(options) returning a KVStrategy."""


@hookspec
def river_conformance_backends() -> Mapping[str, Callable]:
    """name -> make(family, seed, bits) returning a Backend over the tiny random model
    `river_models.tiny.checkpoint(family, seed)`: what the conformance kit (package
    `river_conformance`) runs. `family` is one of river_models.tiny.FAMILIES; raise
    CapabilityError for one the backend cannot run."""


@hookspec
def river_commands() -> Mapping[str, Callable]:
    """name -> add(parser) for a `river NAME` subcommand: `add` declares the command's
    arguments on its argparse parser and returns run(args) -> exit status (None: 0)."""
