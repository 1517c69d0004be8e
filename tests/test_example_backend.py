"""A third-party backend runs the conformance kit: import it, then point its fixture at yours."""

import pytest

from river_conformance.kit import *  # noqa: F401,F403
from river_conformance.kit import Subject

import example_backend


@pytest.fixture(scope="session")
def conformance_backend():
    return Subject.of("example", example_backend.make)


def test_the_example_runs_the_families_it_says(conformance_backend):
    assert conformance_backend.families == ("llama", "mistral", "qwen2")


def test_the_core_drives_the_backend_only_through_the_contract(conformance_backend):
    from river_core import RiverModel

    b = conformance_backend.backend()
    b.calls.clear()
    RiverModel(b).generate("ab", chat=False, max_new_tokens=3, kv="full")
    assert b.calls["prefill"] == 1 and b.calls["layer"] == 2 * b.num_layers
    assert b.calls["embed"] == b.calls["commit"] == 2
