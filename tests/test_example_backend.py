"""A third-party backend runs the conformance kit: import it, then point its fixture at yours."""

import pytest

from river_conformance.kit import *  # noqa: F401,F403
from river_conformance.kit import Subject

from river_conformance import example_backend


@pytest.fixture(scope="session")
def conformance_backend():
    return Subject.of("example", example_backend.make)


def test_the_example_runs_the_families_it_says(conformance_backend):
    assert conformance_backend.families == ("llama", "mistral", "qwen2", "llama3")


def test_the_core_drives_the_backend_only_through_the_contract(conformance_backend):
    from collections import Counter

    from river_core import RiverModel

    b, calls, steps = conformance_backend.backend(), Counter(), []
    for name in ("prefill", "decode", "layer"):
        method = getattr(b, name)
        setattr(b, name, lambda *a, _method=method, _name=name, **k:
                (calls.update([_name]), _method(*a, **k))[1])
    begin = b.begin
    b.begin = lambda tokens, step: (steps.append(step), begin(tokens, step))[1]
    model = RiverModel(b)
    prompt = model.encode("ab", chat=False)[0]
    model.generate("ab", chat=False, max_new_tokens=3, kv="full")
    # two decode steps at the two slots after the prompt's, each the engine's one full-depth
    # call (no row can leave, so the walk does not go layer by layer)
    assert calls["prefill"] == 1 and calls["decode"] == 2 and calls["layer"] == 0
    assert [s.start for s in steps] == [len(prompt), len(prompt) + 1]
