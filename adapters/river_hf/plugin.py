"""Registers the `hf` backend with River (entry point `hf` in group `river_core`)."""

from river_core.hookspecs import hookimpl

from .loader import load


@hookimpl
def river_backends():
    return {"hf": load}


def tiny_backend(family: str, seed: int, bits: int):
    """The hf backend over a tiny random model: the conformance kit's reference."""
    from .tiny import backend

    return backend(family, seed, bits)


@hookimpl
def river_conformance_backends():
    return {"hf": tiny_backend}
