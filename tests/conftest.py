import functools
import os

import pytest
from hypothesis import HealthCheck, settings

# Derandomized: CI reruns the same examples; a failure is a finding, never a flake.
settings.register_profile("river", deadline=None, derandomize=True, max_examples=12,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("river")


from river_torch.plugin import TEST_DEVICE as VARIABLE

TEST_DEVICE = os.environ.get(VARIABLE, "cpu")
"""The device the engines' tests and the conformance kit build River's torch engine on:
RIVER_TEST_DEVICE=cuda points them at a GPU (`river bench gpu` runs them so)."""


@pytest.fixture(scope="session")
def test_device() -> str:
    """RIVER_TEST_DEVICE (default cpu); a device torch cannot reach fails the run, never
    skips it."""
    if TEST_DEVICE != "cpu":
        import torch

        assert torch.device(TEST_DEVICE).type == "cuda" and torch.cuda.is_available(), \
            f"RIVER_TEST_DEVICE={TEST_DEVICE}, but torch sees no such device"
    return TEST_DEVICE


@pytest.fixture(scope="session")
def scratch_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("river-cache")


@pytest.fixture(autouse=True)
def test_cache(request, scratch_cache, monkeypatch):
    """Every test builds into the test session's own cache, never the user's: the embedded
    model is converted and exported once a session. RIVER_TEST_CACHE names a cache the
    embedded-model tests (marked slow) use instead, to keep those builds between runs (the
    user's own, say)."""
    kept = os.environ.get("RIVER_TEST_CACHE")
    use = kept if kept and "slow" in request.keywords else str(scratch_cache)
    monkeypatch.setenv("RIVER_CACHE", use)


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """family -> a tiny random model saved as a Hugging Face folder (made once per session)."""
    from river_conformance.fixtures import tiny

    @functools.cache
    def save(family: str) -> str:
        path = tmp_path_factory.mktemp(f"tiny-{family}")
        tiny.model(family).save_pretrained(path)
        tiny.tokenizer().save_pretrained(path)
        return str(path)
    return save


@pytest.fixture(scope="session")
def fastest_tiny_backend():
    """tiny_backend(family, seed, bits) of the fastest engine installed: ggml's, else the
    reference (hf). For tests of what the core does over any engine's logits."""
    from river_core import CapabilityError
    from river_torch.plugin import tiny_backend as reference

    def make(family: str, seed: int, bits: int):
        try:
            from river_ggml.plugin import tiny_backend
            return tiny_backend(family, seed, bits)
        except (ImportError, CapabilityError):
            return reference(family, seed, bits)
    return make


@pytest.fixture
def ctrl_c_at_step(monkeypatch):
    """ctrl_c_at_step(n): Ctrl-C arrives as the hf backend's n-th decode step begins."""
    from river_torch.backend import TorchBackend

    def arm(n: int) -> None:
        calls, begin = {"n": 0}, TorchBackend.begin

        def interrupted(self, tokens, step):
            calls["n"] += 1
            if calls["n"] == n:
                raise KeyboardInterrupt
            return begin(self, tokens, step)
        monkeypatch.setattr(TorchBackend, "begin", interrupted)
    return arm


# The kit's sampled comparisons (seconds to half a minute each) run by default on ggml, the
# CPU's default engine; on every other engine under `-m reliability`. Those engines' speculative
# sampling is the same rule over logits the kit's exact test proves bitwise their steps'
# (`Verifies.extend`), so what the comparison adds there is the rule, which ggml's runs test.
SAMPLED = {"test_speculative_sampling_draws_full_depths_distribution",
           "test_speculative_sampling_with_ngram_drafts_draws_full_depths_distribution"}


# The suite's budget (15 minutes on 2 cores, an AVX2 AMD EPYC the slowest machine it meets):
# tests of half a minute and more whose subject another default test covers more cheaply, or
# that matter before a lent GPU session rather than on every commit, run under
# `-m reliability` (docs/architecture.md, "Tests").
LONG = {
    # two vLLM ranks in two processes (83 s); one rank's River walk is test_vllm's default
    "tests/test_vllm.py::test_river_runs_under_tensor_parallelism_across_two_ranks",
    # a sampled comparison (34 s); the served one (test_served_lossless_sampling_...) stays
    "tests/test_vllm.py::test_sampled_lossless_inside_vllm_draws_vllm_plains_distribution",
    # the lent GPU's image simulated (54 s) and the gpu benchmark's tiny run (31 s): run
    # before a GPU session (docs/gpu.md)
    "tests/test_gpu_image.py::test_river_installs_and_runs_on_the_lent_gpus_image",
    "tests/test_benchmarks.py::test_each_benchmark_runs_at_a_tiny_size[gpu]",
    # two thousand steps a strategy (35 s); the kit's bounds hold at every step it draws
    "tests/test_reliability.py::test_two_thousand_steps_with_exits_stay_finite_and_bounded",
    # transformers' generate on Phi-3, Ministral 3 and Mistral (8-13 s each): their
    # transformers comparisons stay in the default suite in test_models (Phi-3's switch,
    # Ministral 3's wrapper) and Gemma 3's windows in this test's default families
    *(f"tests/test_invariants.py::test_full_depth_matches_transformers_generate[{family}]"
      for family in ("phi3", "ministral3", "mistral")),
    # the embedded model's ONNX export and answer (35-70 s); the onnx engine runs the kit on
    # every tiny family's export by default, and the export's interrupted builds run here too
    "tests/test_embedded_model.py::test_onnx_backend_generates_on_the_default_model",
    # the kit's power checks (a rule that keeps drafts without the ratio test is caught) at
    # a second setting and with n-gram drafts (20-45 s); at temperature 1.0 with the river's
    # drafts it stays, and the n-gram drafts' sampled comparison itself runs on ggml
    "tests/test_speculative.py::test_the_kits_sampled_test_catches_drafts_kept_without_the_"
    "ratio_test[temperature 0.7, top-p 0.9]",
    "tests/test_ngram.py::test_the_kits_sampled_test_catches_ngram_drafts_kept_without_the_"
    "ratio_test",
    # benchmarks' tiny runs of 3-16 s whose subjects the tests run (ggml's cost and overhead,
    # the first call, the levers, the walk, the quantizers, first contact, n-gram drafts, the
    # real files' matrix, the river's K/V error, prefill exit, the kit's margins, vLLM plain
    # against River inside it; not the oracle, whose profiles the scaling run reads)
    *(f"tests/test_benchmarks.py::test_each_benchmark_runs_at_a_tiny_size[{name}]"
      for name in ("ggml_cost", "ggml_overhead", "first_call", "levers", "walk",
                   "quantizers", "first_contact", "ngram", "real_files", "river_kv_error",
                   "prefill_exit", "kit_margins", "vllm")),
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        sampled = item.originalname in SAMPLED and "[ggml" not in item.name
        if sampled or item.nodeid in LONG or item.nodeid.split("[")[0] in LONG:
            item.add_marker(pytest.mark.reliability)
