"""A typed facade over the plugin manager: look up backends, policies, predictors, strategies,
draft sources."""

from __future__ import annotations

import functools
from importlib.metadata import version
from typing import Any, Iterable

import attrs
import pluggy

from . import builtins
from .contract import hookspecs
from .settings.errors import ConfigError, unknown
from .contract.hookspecs import (BackendPlugin, DraftSourcePlugin, KVStrategyPlugin, PolicyPlugin,
                                 PredictorPlugin)
from .settings.options import describe

KINDS = {
    "backend": "river_backends",
    "policy": "river_exit_policies",
    "predictor": "river_predictors",
    "kv strategy": "river_kv_strategies",
    "draft source": "river_draft_sources",
    "conformance backend": "river_conformance_backends",
    "command": "river_commands",
}
BUILTIN = "core"   # the core's own plugin, under the name of its entry point


@attrs.frozen
class Entry:
    kind: str
    name: str
    plugin: Any     # what the hook returned: a BackendPlugin, PolicyPlugin, ... or a callable
    provider: str   # "distribution version", or the plugin's own name when not installed

    @property
    def summary(self) -> str:
        made_by = getattr(self.plugin, "make", None) or getattr(self.plugin, "load", None) \
            or self.plugin
        return ((made_by.__doc__ or "").strip().splitlines() or [""])[0]

    @property
    def options(self) -> list[tuple[str, Any, str]]:
        """(name, default, doc) of each option it takes."""
        options = getattr(self.plugin, "options", None)
        return describe(options) if options is not None else []


def _core_provider() -> str:
    try:
        return f"river-llm {version('river-llm')}"
    except Exception:   # a source checkout that is not installed
        return "river-llm (source)"


class Registry:
    """The core's built-ins, every installed plugin and any passed in `extra`."""

    def __init__(self, extra: Iterable[object] = (), entry_points: bool = True) -> None:
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        pm.register(builtins, name=BUILTIN)   # first: entry points of the same name are skipped
        if entry_points:
            pm.load_setuptools_entrypoints(hookspecs.PROJECT)
        for plugin in extra:
            pm.register(plugin)
        dists = {id(p): f"{d.project_name} {d.version}" for p, d in pm.list_plugin_distinfo()}
        dists[id(builtins)] = _core_provider()
        self._entries: dict[str, dict[str, Entry]] = {}
        for kind, hook in KINDS.items():
            table: dict[str, Entry] = {}
            for impl in getattr(pm.hook, hook).get_hookimpls():
                provider = dists.get(id(impl.plugin), impl.plugin_name)
                for name, plugin in impl.function().items():
                    if name in table:
                        raise ConfigError(f"{kind} {name!r} is registered by both "
                                          f"{table[name].provider} and {provider}")
                    table[name] = Entry(kind, name, plugin, provider)
            self._entries[kind] = table

    def entries(self, kind: str) -> dict[str, Entry]:
        return self._entries[kind]

    def get(self, kind: str, name: str) -> Any:
        table = self._entries[kind]
        if name not in table:
            raise unknown(kind, name, table)
        return table[name].plugin

    def backend(self, name: str) -> BackendPlugin:
        return self.get("backend", name)

    def policy(self, name: str) -> PolicyPlugin:
        return self.get("policy", name)

    def predictor(self, name: str) -> PredictorPlugin:
        return self.get("predictor", name)

    def kv_strategy(self, name: str) -> KVStrategyPlugin:
        return self.get("kv strategy", name)

    def draft_source(self, name: str) -> DraftSourcePlugin:
        return self.get("draft source", name)


@functools.cache
def default_registry() -> Registry:
    """The registry of installed plugins, built once per process."""
    return Registry()
