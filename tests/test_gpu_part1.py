"""Part 1 of `river bench gpu` (the suite's device tests, RIVER_TEST_DEVICE=cuda) green on a
lent GPU's image by construction (issue 53): what the image lacks is a skip, never an error."""

import sys

import pytest

from river_core import CapabilityError
from river_conformance.kit import Subject


def _needs(package: str):
    def make(family, seed, bits):
        raise ModuleNotFoundError(f"No module named {package!r}", name=package)
    return make


def test_a_backend_missing_an_optional_package_runs_no_family_and_says_which():
    subject = Subject.of("needs-gguf", _needs("gguf"))
    assert subject.families == () and "'gguf'" in subject.refusal
    with pytest.raises(ModuleNotFoundError):   # one of River's own: a bug, not a skip
        Subject.of("broken", _needs("river_models.gone"))


def test_the_llamacpp_subject_is_refused_where_gguf_and_llama_cpp_are_absent(monkeypatch):
    """The image has neither: the factory says so as a CapabilityError (the kit's skip), before
    the tiny GGUF's writer imports gguf."""
    from river_llamacpp.plugin import tiny_backend

    for name in ("gguf", "llama_cpp"):
        monkeypatch.setitem(sys.modules, name, None)   # `import` raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "river_conformance.fixtures.tiny_gguf", raising=False)
    with pytest.raises(CapabilityError, match="llama-cpp-python"):
        tiny_backend("llama", 0, 8)


def test_the_kits_sampled_comparison_skips_without_scipy(monkeypatch):
    from river_conformance.kit import lossless_against_plain

    monkeypatch.setitem(sys.modules, "scipy", None)
    with pytest.raises(pytest.skip.Exception, match="scipy"):
        lossless_against_plain(None)
