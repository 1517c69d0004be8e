"""Reliability on the embedded model, what takes minutes (tests/test_reliability.py and
tests/test_cache.py cover the same on tiny models in seconds): interrupted and racing builds,
the cache's entries and what checking them costs, a long generation, memory over many
generations. Marked `reliability`, which the suite deselects; run them with

    python -m pytest -m reliability tests/test_embedded_reliability.py -s

(`-s` shows the figures each test prints; docs/benchmarks.md, "Reliability", quotes them)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from river_core import ExitConfig, GenerationConfig, RiverModel
from river_core.method.predictor import STAND_IN_BOUND_C, relative_error
from river_models.cache import entries, problem

from river_bench.library import gsm8k
from river_bench.library.prompts import GSM8K_TRAIN

pytestmark = pytest.mark.reliability

KINDS = {"converted": "hf", "stand-ins": "hf", "onnx": "onnx",   # what each build is for
         "onnx-optimized": "onnx"}
LONG_TOKENS = 2048
GENERATIONS = 200
GROWTH_MB = 32   # resident memory the last tenth of the generations may add to the first's


def river_generate(cache: Path, backend: str) -> subprocess.Popen:
    """`river generate` on the embedded model in `cache`, as a user runs it."""
    # Ctrl-C as at a terminal, even where the tests run with SIGINT ignored
    default_ctrl_c = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)
    return subprocess.Popen([sys.executable, "-m", "river_cli.main", "generate", "2 + 2 =",
                             "--backend", backend, "--max-new-tokens", "2"],
                            env={**os.environ, "RIVER_CACHE": str(cache)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_ctrl_c)


def wait_for_partial(cache: Path, kind: str, process, timeout: float = 600) -> bool:
    end = time.time() + timeout
    while time.time() < end and process.poll() is None:
        if list((cache / kind).glob(".partial-*")):
            return True
        time.sleep(0.05)
    return False


def states(cache: Path, monkeypatch) -> dict[str, str]:
    """Each entry of `cache` and its state after a full check ("ok" or the problem)."""
    monkeypatch.setenv("RIVER_CACHE", str(cache))
    return {f"{e.kind}/{e.path.name}": e.problem or "ok" for e in entries(checksums=True)}


def check_seconds(cache: Path, monkeypatch, checksums: bool) -> dict[str, tuple[float, float]]:
    """Per entry, its size in MB and the seconds one check takes: before use (the manifest's
    seal and every size), or with `checksums` every file's SHA-256."""
    monkeypatch.setenv("RIVER_CACHE", str(cache))
    out = {}
    for e in entries():
        start = time.perf_counter()
        problem(e.path, checksums=checksums)
        out[e.kind] = (e.size / 2 ** 20, time.perf_counter() - start)
    return out


@pytest.fixture(scope="module")
def interrupted_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("interrupted")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
@pytest.mark.parametrize("kind", list(KINDS))
def test_an_interrupted_build_is_cleaned_and_rebuilt(kind, sig, interrupted_cache, monkeypatch):
    """Stopped inside a build: Ctrl-C leaves nothing behind; a kill leaves a partial build,
    which the next run removes, saying so, before building again; every entry afterwards
    passes its checksums."""
    cache = interrupted_cache
    shutil.rmtree(cache / kind, ignore_errors=True)   # so this build runs again
    process = river_generate(cache, KINDS[kind])
    assert wait_for_partial(cache, kind, process), "the run never started the build"
    time.sleep(1.0)   # well inside the build
    process.send_signal(sig)
    process.wait(120)
    left = list((cache / kind).glob(".partial-*"))
    again = river_generate(cache, KINDS[kind])
    _, err = again.communicate(timeout=1800)
    assert again.returncode == 0, err
    if sig == signal.SIGINT:
        assert not left
    else:
        assert left and "removing an incomplete build" in err
    assert set(states(cache, monkeypatch).values()) == {"ok"}


def test_two_processes_building_at_once_build_each_entry_once(tmp_path, monkeypatch):
    processes = [river_generate(tmp_path, "onnx") for _ in range(2)]
    errs = [p.communicate(timeout=3600)[1] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], errs
    assert sum("waiting for another process" in e for e in errs) >= 1
    assert sum(e.count("converting ") for e in errs) == 1
    assert set(states(tmp_path, monkeypatch).values()) == {"ok"}


def test_the_cache_is_built_once_and_checked_cheaply_before_use(tmp_path, monkeypatch):
    """From an empty cache: the first run on hf (conversion and quantization), the first on
    onnx (the export), a warm run; checking an entry before use costs a small part of its full
    checksum. Prints the times and sizes docs/benchmarks.md quotes."""
    first = {}
    for backend in ("hf", "onnx"):
        start = time.perf_counter()
        _, err = river_generate(tmp_path, backend).communicate(timeout=3600)
        first[backend] = time.perf_counter() - start
    start = time.perf_counter()
    river_generate(tmp_path, "hf").communicate(timeout=600)
    warm = time.perf_counter() - start
    before_use = check_seconds(tmp_path, monkeypatch, checksums=False)
    full = check_seconds(tmp_path, monkeypatch, checksums=True)
    print(f"\nfirst run: hf {first['hf']:.0f} s, onnx {first['onnx']:.0f} s more; warm run "
          f"{warm:.0f} s; entries {sum(mb for mb, _ in before_use.values()):.0f} MB")
    for kind, (mb, seconds) in before_use.items():
        print(f"{kind}: {mb:.0f} MB, check before use {seconds * 1e3:.1f} ms, full checksum "
              f"{full[kind][1]:.2f} s")
    assert set(before_use) == set(KINDS)
    assert warm < first["hf"]
    for kind, (_, seconds) in before_use.items():
        assert seconds < full[kind][1] / 10, kind


@pytest.fixture(scope="module")
def embedded(scratch_cache) -> RiverModel:
    # a module's fixture loads before conftest's per-test cache choice: make the same choice
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RIVER_CACHE", os.environ.get("RIVER_TEST_CACHE") or str(scratch_cache))
        return RiverModel.from_pretrained(None, backend="onnx")


def test_a_long_generation_stays_finite_within_the_bound_without_drift(embedded):
    """2,048 teacher-forced tokens through River (the paper's rule) against full depth: every
    logit and K/V finite; river K/V error within the documented bound C * eps_j * d (d from
    the earliest exit) in every layer, and no growth along the positions (the last quarter's
    error at most twice the first's)."""
    b, n = embedded.backend, embedded.backend.num_layers
    text = "".join(f"Question: {p.question}\nAnswer: {p.solution}\n\n"
                   for p in gsm8k.load(str(GSM8K_TRAIN), limit=60))
    ids = b.tokenizer.encode(text)
    prompt, continuation = ids[:64], ids[64:64 + LONG_TOKENS]
    [river] = embedded.teacher_force([prompt], [continuation], ExitConfig())
    got = [b.read_kv(i) for i in range(n)]
    embedded.teacher_force([prompt], [continuation], ExitConfig(kv="full"))
    quarters = np.array_split(np.arange(len(prompt), len(prompt) + len(continuation)), 4)
    errors = [[max(relative_error(g[:, :, q], w[:, :, q]) for g, w in zip(got[i], b.read_kv(i)))
               for q in quarters] for i in range(n)]
    assert all(np.isfinite(l).all() for l in river.logits)
    assert all(np.isfinite(k).all() and np.isfinite(v).all() for k, v in got)
    first = min(river.exit_layers)
    of_bound = max(max(errors[j]) / (STAND_IN_BOUND_C * b.stand_in_error[j] * (j - first))
                   for j in range(first + 1, n))
    growth = max(e[-1] / max(e[0], 1e-12) for e in errors if max(e) > 0)
    print(f"\nlargest error per quarter {np.array(errors).max(0).round(3).tolist()}, growth "
          f"{growth:.2f}x, {of_bound:.2f} of the bound, earliest exit {first}")
    assert of_bound <= 1
    assert growth <= 2


def test_memory_stays_flat_over_many_generations(embedded):
    """GENERATIONS generations in one process, River and lossless mode alternating: the
    resident memory's peak over the last tenth within GROWTH_MB of the first tenth's."""
    questions = [p.question for p in gsm8k.load(str(GSM8K_TRAIN), limit=50)]
    configs = [ExitConfig(), ExitConfig(mode="speculative", policy="fixed",
                                        options={"layer": -1})]
    rss = []
    for g in range(GENERATIONS):
        embedded.generate(questions[g % len(questions)], exit_config=configs[g % 2],
                          generation_config=GenerationConfig(max_new_tokens=24))
        rss.append(resident_mb())
    tenth = GENERATIONS // 10
    print(f"\nRSS peak: first tenth {max(rss[:tenth]):.0f} MB, last tenth "
          f"{max(rss[-tenth:]):.0f} MB")
    assert max(rss[-tenth:]) <= max(rss[:tenth]) + GROWTH_MB


def resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
