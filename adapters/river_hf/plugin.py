"""Registers the `hf` backend with River (entry point `hf` in group `river_core`)."""

from river_core.hookspecs import hookimpl

from .loader import load


@hookimpl
def river_backends():
    return {"hf": load}
