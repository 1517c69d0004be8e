"""The conformance kit's pytest plugin (entry point `pytest11`), loaded by every pytest run
where River is installed, so it stays light: the `conformance_backend` fixture and the
`--river-backend` option. The kit's tests come into a suite with one line:
`from river_conformance.kit import *`.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser) -> None:
    parser.getgroup("river").addoption(
        "--river-backend", action="append", default=[], metavar="NAME",
        help="run River's conformance kit on this registered backend only (repeatable)")


@pytest.fixture(scope="session")
def conformance_backend(request):
    """Each backend registered under the river_conformance_backends hook, in turn."""
    from .kit import Subject

    return Subject.registered(request.param)


def pytest_generate_tests(metafunc) -> None:
    """Parametrize the kit over the registered backends, unless a suite overrides the
    fixture with its own backend."""
    defs = metafunc._arg2fixturedefs.get("conformance_backend")
    if not defs or defs[-1].func is not conformance_backend.__wrapped__:
        return
    from river_core.plugins import default_registry

    names = sorted(default_registry().entries("conformance backend"))
    chosen = metafunc.config.getoption("river_backend")
    metafunc.parametrize("conformance_backend", [n for n in names if not chosen or n in chosen],
                         indirect=True, scope="session")
