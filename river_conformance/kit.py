"""The backend conformance kit: the contract of river_core/backend.py as property tests.

Enable it in a backend's test suite with one line in a test module:

    from river_conformance.kit import *  # noqa: F401,F403

It then runs against every backend registered under the `river_conformance_backends` hook
(`pytest --river-backend NAME` keeps one), on tiny random models of every family the backend
runs (`river_models.tiny`), checked against the reference backend `hf`. Or point it at one
backend with a fixture of the same name:

    @pytest.fixture(scope="session")
    def conformance_backend():
        return Subject.of("mine", make_my_backend)   # make(family, seed, bits) -> Backend

Tolerances and why (docs/backends.md):
- full depth against the reference: the same greedy tokens, logits within FULL_DEPTH_RTOL;
- stand-in K/V: relative error <= STAND_IN_BOUND_C * eps_j * d at the d-th stand-in layer j of
  a token, eps_j = the backend's own `stand_in_error[j]`;
- exit after the last layer and `propagate` at layer k+1: bit-identical, within the backend;
- speculative mode: greedy, full depth's tokens; sampled, full depth's distribution, by the
  statistical tests of distribution.py at family level 0.001, their power stated.
"""

from __future__ import annotations

import functools
from typing import Callable

import attrs
import numpy as np
import pytest
from hypothesis import given, strategies as st

from river_core.backend import PROMISES, Backend, Step
from river_core.config import ExitConfig, GenerationConfig
from river_core.decode import (decode_step, generate_ids, stand_in_error, start_rows,
                               teacher_force)
from river_core.layer_engine import LayerEngine
from river_core.layout import SINKS
from river_core.errors import CapabilityError, ConfigError
from river_core.kv import Full, Mask, Monotonic, Propagate, Recompute, River
from river_core.model import RiverModel
from river_core.plugins import default_registry
from river_core.predictor import STAND_IN_BOUND_C, relative_error
from river_core.speculative import DraftLength, rounds, speculative_ids
from river_models import tiny

from .distribution import Comparison, Scored, compare, score
from .scripted import forced_logits, scripted_run

# Float32 across frameworks: kernels sum in different orders; measured differences ~1e-5.
FULL_DEPTH_RTOL = 1e-4
# Stand-ins across engines: the same quantized weights (river_models.quant), different
# activation rounding (hf: bfloat16, onnx: int8 blocks). Measured at most 0.014 per stand-in
# layer between hf and onnx (int8 and int4); different weights would differ by eps ~ 0.075.
CROSS_ENGINE_STAND_IN_RTOL = 0.03

LAYERS = tiny.LAYERS
prompts = st.lists(st.integers(3, tiny.VOCAB - 1), min_size=1, max_size=24).map(lambda p: [1] + p)
continuations = st.lists(st.integers(3, tiny.VOCAB - 1), min_size=1, max_size=10)
exit_layers = st.lists(st.one_of(st.none(), st.integers(0, LAYERS - 1)), min_size=10, max_size=10)
# per draft step; -1: the draft runs stand-ins only (the whole model quantized)
draft_exits = st.lists(st.one_of(st.none(), st.integers(-1, LAYERS - 1)), min_size=40,
                       max_size=40)


@functools.cache
def _made(make, family: str, seed: int, bits: int):
    return make(family, seed, bits)


@attrs.frozen
class Subject:
    """A backend under test: make(family, seed, bits) and the tiny families it runs."""

    name: str
    make: Callable
    families: tuple[str, ...]
    refusal: str = ""   # why it runs no family at all

    @classmethod
    def of(cls, name: str, make: Callable) -> "Subject":
        runs, refusals = [], []
        for family in tiny.FAMILIES:
            try:
                _made(make, family, 0, 8)
                runs.append(family)
            except CapabilityError as e:
                refusals.append(str(e))
        return cls(name, make, tuple(runs), "; ".join(sorted(set(refusals))) if not runs else "")

    @classmethod
    def registered(cls, name: str) -> "Subject":
        return cls.of(name, default_registry().get("conformance backend", name))

    def _require_families(self) -> None:
        if not self.families:
            pytest.skip(f"{self.name} runs none of the tiny families: {self.refusal}")

    def backend(self, family: str | None = None, seed: int = 0, bits: int = 8):
        self._require_families()
        return _made(self.make, family or self.families[0], seed, bits)

    def family(self, data) -> str:
        """A family drawn by hypothesis among those the backend runs."""
        self._require_families()
        return data.draw(st.sampled_from(self.families), label="family")


def _reference(family: str):
    try:
        make = default_registry().get("conformance backend", "hf")
    except ConfigError:
        pytest.skip("the reference backend hf is not installed (pip install 'river-llm[hf]')")
    return _made(make, family, 0, 8)


def _needs(backend, capability: str) -> None:
    if not getattr(backend.capabilities, capability):
        pytest.skip(f"{backend.name} does not declare {capability}")


def _kv_after(backend, prompt, cont, strategy, exits=()):
    forced_logits(backend, prompt, cont, strategy, exits)
    return [backend.read_kv(i) for i in range(backend.num_layers)]


def _greedy(backend, prompt, n, strategy=Full(), exits=()):
    return generate_ids(backend, [prompt], GenerationConfig(max_new_tokens=n),
                        scripted_run(strategy, exits))


@given(prompt=prompts, n=st.integers(1, 12), data=st.data())
def test_full_depth_matches_the_reference_backend(conformance_backend, prompt, n, data):
    family = conformance_backend.family(data)
    b, ref = conformance_backend.backend(family), _reference(family)
    assert _greedy(b, prompt, n).tokens == _greedy(ref, prompt, n).tokens
    cont = _greedy(ref, prompt, n).tokens[0]
    for got, want in zip(forced_logits(b, prompt, cont, Full()),
                         forced_logits(ref, prompt, cont, Full())):
        assert relative_error(got, want) <= FULL_DEPTH_RTOL


@given(prompt=prompts, cont=continuations, exits=exit_layers, data=st.data(),
       strategy=st.sampled_from([Propagate(), Mask(), Monotonic(), Recompute()]))
def test_unquantized_strategies_match_the_reference_backend(conformance_backend, prompt, cont,
                                                            exits, strategy, data):
    """propagate, mask, monotonic and recompute involve no stand-in weights: any two backends
    must agree."""
    family = conformance_backend.family(data)
    b, ref = conformance_backend.backend(family), _reference(family)
    _needs(b, "exits")
    if strategy.requires:
        _needs(b, strategy.requires)
    got = forced_logits(b, prompt, cont, type(strategy)(), exits)
    want = forced_logits(ref, prompt, cont, type(strategy)(), exits)
    for g, w in zip(got, want):
        assert relative_error(g, w) <= FULL_DEPTH_RTOL


@given(prompt=prompts, cont=continuations, exits=exit_layers,
       strategy=st.sampled_from([River(), Propagate()]), data=st.data())
def test_every_layer_holds_every_position_after_any_exits(conformance_backend, prompt, cont,
                                                          exits, strategy, data):
    b = conformance_backend.backend(conformance_backend.family(data))
    _needs(b, "exits")
    _needs(b, strategy.requires)
    for k, v in _kv_after(b, prompt, cont, strategy, exits):
        assert k.shape[2] == v.shape[2] == len(prompt) + len(cont) == b.offset
        assert np.isfinite(k).all() and np.isfinite(v).all()


@given(prompt=prompts, cont=continuations, data=st.data())
def test_exit_after_last_layer_is_bit_identical_to_full_depth(conformance_backend, prompt, cont,
                                                              data):
    b = conformance_backend.backend(conformance_backend.family(data))
    _needs(b, "exits")
    full_logits = forced_logits(b, prompt, cont, Full())
    full_kv = [b.read_kv(i) for i in range(b.num_layers)]
    last = forced_logits(b, prompt, cont, River(), [b.num_layers - 1] * len(cont))
    for a, e in zip(last, full_logits):
        assert np.array_equal(a, e)
    for (k, v), (fk, fv) in zip((b.read_kv(i) for i in range(b.num_layers)), full_kv):
        assert np.array_equal(k, fk) and np.array_equal(v, fv)


@given(prompt=prompts, cont=continuations, data=st.data())
def test_propagate_writes_exact_kv_one_layer_past_the_exit(conformance_backend, prompt, cont,
                                                           data):
    b = conformance_backend.backend(conformance_backend.family(data))
    _needs(b, "exits")
    _needs(b, "propagate")
    step = data.draw(st.integers(0, len(cont) - 1))
    k = data.draw(st.integers(0, b.num_layers - 2))
    full = _kv_after(b, prompt, cont, Full())
    exits = [None] * len(cont)
    exits[step] = k
    got = _kv_after(b, prompt, cont, Propagate(), exits)
    pos = len(prompt) + step
    for layer in range(k + 2):
        for w in (0, 1):
            assert np.array_equal(got[layer][w][:, :, pos], full[layer][w][:, :, pos])


@given(prompt=prompts, cont=continuations, exits=exit_layers, data=st.data())
def test_recompute_catches_up_to_full_depth_whenever_a_token_runs_full_depth(
        conformance_backend, prompt, cont, exits, data):
    """A full-depth token first brings every waiting token's deep K/V up to date, so it sees
    (and leaves) the full-depth cache: its logits and the whole cache match full depth."""
    b = conformance_backend.backend(conformance_backend.family(data))
    _needs(b, "exits")
    _needs(b, "recompute")
    exits = exits[:len(cont) - 1] + [None]
    full_logits = forced_logits(b, prompt, cont, Full())
    full_kv = [b.read_kv(i) for i in range(b.num_layers)]
    got = forced_logits(b, prompt, cont, Recompute(), exits)
    for step, k in enumerate(exits):
        if k is None or k >= b.num_layers - 1:
            assert relative_error(got[step + 1], full_logits[step + 1]) <= FULL_DEPTH_RTOL
    for i, (fk, fv) in enumerate(full_kv):
        k, v = b.read_kv(i)
        assert relative_error(k, fk) <= FULL_DEPTH_RTOL
        assert relative_error(v, fv) <= FULL_DEPTH_RTOL


@given(bits=st.sampled_from([8, 4]), seed=st.integers(0, 2), prompt=prompts,
       cont=continuations, exits=exit_layers, data=st.data())
def test_stand_in_kv_stays_within_the_documented_bound(conformance_backend, bits, seed, prompt,
                                                       cont, exits, data):
    b = conformance_backend.backend(conformance_backend.family(data), seed, bits)
    _needs(b, "exits")
    _needs(b, "stand_in")
    full = _kv_after(b, prompt, cont, Full())
    got = _kv_after(b, prompt, cont, River(), exits)
    for step, k in enumerate(exits[:len(cont)]):
        pos = len(prompt) + step
        for j in range(b.num_layers if k is None else k + 1, b.num_layers):
            bound = STAND_IN_BOUND_C * b.stand_in_error[j] * (j - k)
            for w in (0, 1):
                assert relative_error(got[j][w][:, :, pos], full[j][w][:, :, pos]) <= bound


@given(bits=st.sampled_from([8, 4]), prompt=prompts, cont=continuations, exits=exit_layers,
       data=st.data())
def test_stand_in_kv_agrees_with_the_reference_backend(conformance_backend, bits, prompt, cont,
                                                       exits, data):
    """Every engine runs the model package's stand-in weights: the K/V they write differ from
    the reference's only by activation rounding."""
    family = conformance_backend.family(data)
    b = conformance_backend.backend(family, 0, bits)
    _needs(b, "exits")
    _needs(b, "stand_in")
    ref = _made(default_registry().get("conformance backend", "hf"), family, 0, bits)
    assert list(b.stand_in_error) == list(ref.stand_in_error)
    got, want = _kv_after(b, prompt, cont, River(), exits), _kv_after(ref, prompt, cont, River(),
                                                                     exits)
    for step, k in enumerate(exits[:len(cont)]):
        pos = len(prompt) + step
        for j in range(b.num_layers if k is None else k + 1, b.num_layers):
            for w in (0, 1):
                assert relative_error(got[j][w][:, :, pos], want[j][w][:, :, pos]) <= \
                    CROSS_ENGINE_STAND_IN_RTOL * (j - k)


@given(prompt=prompts, cont=continuations, data=st.data())
def test_sub_block_similarities_match_the_reference_backend(conformance_backend, prompt, cont,
                                                            data):
    """What the paper's exit rule reads: the attention and MLP sub-blocks' input/output
    cosines of the last token, after each backbone layer."""
    family = conformance_backend.family(data)
    b, ref = conformance_backend.backend(family), _reference(family)
    _needs(b, "sub_blocks")
    got, want = [], []
    for backend, out in ((b, got), (ref, want)):
        backend.prefill([prompt + cont], len(prompt) + len(cont) + 1)
        h = backend.embed([cont[-1]], Step(len(prompt) + len(cont)))
        for i in range(backend.num_layers):
            h, cosines = backend.layer(i, h, None, sub_blocks=True)
            out.append(cosines[0])
    assert np.allclose(got, want, atol=1e-4)
    assert all(-1 - 1e-6 <= c <= 1 + 1e-6 for pair in got for c in pair)


def test_the_settled_policy_exits_where_both_sub_blocks_settle(conformance_backend):
    b = conformance_backend.backend()
    _needs(b, "exits")
    _needs(b, "stand_in")
    model = RiverModel(b)
    if not b.capabilities.sub_blocks:
        with pytest.raises(CapabilityError, match="sub-block"):
            model.generate_ids([[1, 20, 21]], ExitConfig(policy="settled"),
                               GenerationConfig(max_new_tokens=2))
        return
    run = lambda tau: model.generate_ids([[1, 20, 21, 22]], ExitConfig(
        policy="settled", options={"tau": tau, "min_layer": 2}), GenerationConfig(
        max_new_tokens=4)).exit_layers[0]
    assert set(run(-1.0)) == {2}                      # every cosine exceeds -1
    assert set(run(1.0)) == {b.num_layers - 1}        # no cosine exceeds 1: full depth


@given(prompt=prompts, cont=continuations, exits=exit_layers, data=st.data())
def test_monotonic_exits_never_rise_and_read_only_written_entries(conformance_backend, prompt,
                                                                  cont, exits, data):
    b = conformance_backend.backend(conformance_backend.family(data))
    _needs(b, "exits")
    out = _greedy(b, prompt, len(cont) + 1, Monotonic(), exits)
    ran = out.exit_layers[0]
    assert all(later <= earlier for earlier, later in zip(ran, ran[1:]))
    # skipped layers write nothing; a read of such a slot would be NaN (hf) or wrong
    for logits in forced_logits(b, prompt, cont, Monotonic(), exits):
        assert np.isfinite(logits).all()


def test_exit_before_the_first_layer_runs_the_whole_model_quantized(conformance_backend):
    b = conformance_backend.backend()
    _needs(b, "exits")
    _needs(b, "stand_in")
    model = RiverModel(b)
    out = model.generate_ids([[1, 20, 21, 22]],
                             ExitConfig(kv="river", policy="fixed", options={"layer": -1}),
                             GenerationConfig(max_new_tokens=4))
    assert out.exit_layers[0] == [-1] * len(out.exit_layers[0])
    assert out.skipped_share == 1.0 and out.layers_run_histogram()[0] == len(out.exit_layers[0])


@pytest.mark.parametrize("strategy", [River(), Propagate()])
def test_batched_rows_exit_on_their_own_and_match_single_runs(conformance_backend, strategy):
    b = conformance_backend.backend()
    _needs(b, "batch")
    _needs(b, "exits")
    _needs(b, strategy.requires)
    rows = [[1, 40, 41, 42, 43, 44, 45, 46, 47], [1, 7, 8], [1, 60, 61, 62, 63]]
    exits = [2, None, 0, 4, 1, 3]
    batched = generate_ids(b, rows, GenerationConfig(max_new_tokens=6),
                           scripted_run(strategy, exits))
    for r, prompt in enumerate(rows):
        alone = _greedy(b, prompt, 6, strategy, exits)
        assert batched.tokens[r] == alone.tokens[0]


def test_every_promise_is_kept_by_what_the_backend_implements(conformance_backend):
    """Each capability a backend declares before loading, the loaded backend implements (the
    sub-protocol of backend.py that keeps it)."""
    b = conformance_backend.backend()
    assert isinstance(b, Backend)
    for flag, protocol in PROMISES.items():
        if getattr(b.capabilities, flag):
            assert isinstance(b, protocol), f"{b.name} declares {flag} but is no {protocol.__name__}"


def test_capability_flags_are_respected(conformance_backend):
    b = conformance_backend.backend()
    model = RiverModel(b)
    ids = [1, 20, 21, 22]
    for kv in ("river", "propagate", "monotonic", "mask", "recompute"):
        strategy = model.registry.kv_strategy(kv).make()
        allowed = b.capabilities.exits and (strategy.requires is None
                                            or getattr(b.capabilities, strategy.requires))
        config = ExitConfig(kv=kv, policy="fixed", options={"layer": 1})
        if allowed:
            out = model.generate_ids([ids], config, GenerationConfig(max_new_tokens=3))
            assert set(out.exit_layers[0]) <= {1}
        else:
            with pytest.raises(CapabilityError):
                model.generate_ids([ids], config, GenerationConfig(max_new_tokens=3))
    if not b.capabilities.batch:
        with pytest.raises(ConfigError):
            model.generate_ids([ids, ids], ExitConfig(kv="full"), GenerationConfig())


def test_bad_input_gets_a_clear_error(conformance_backend):
    model = RiverModel(conformance_backend.backend())
    with pytest.raises(ConfigError, match="empty prompt"):
        model.generate("   ")
    with pytest.raises(ConfigError, match="exceeds the model's context"):
        model.generate_ids([[1] * (model.backend.max_positions + 1)], ExitConfig(kv="full"),
                           GenerationConfig(max_new_tokens=1))
    with pytest.raises(ConfigError):
        GenerationConfig(max_new_tokens=0)


@given(prompt=prompts, cont=continuations, data=st.data())
def test_prefill_exit_runs_the_prompts_deep_layers_as_stand_ins(conformance_backend, prompt,
                                                                cont, data):
    """A prompt that exits after layer k leaves the backbone's K/V in layers 0..k (bit-identical
    to full depth) and stand-in K/V, within the bound, past k."""
    b = conformance_backend.backend(conformance_backend.family(data))
    _needs(b, "exits")
    _needs(b, "stand_in")
    k = data.draw(st.integers(-1, b.num_layers - 1), label="prefill_exit")
    b.prefill([prompt], len(prompt))
    full = [b.read_kv(i) for i in range(b.num_layers)]
    b.prefill([prompt], len(prompt), prefill_exit=k)
    for i in range(b.num_layers):
        for got, want in zip(b.read_kv(i), full[i]):
            if i <= k:
                assert np.array_equal(got, want)
            else:
                assert relative_error(got, want) <= STAND_IN_BOUND_C * b.stand_in_error[i] * (i - k)


@given(prompt=prompts, data=st.data())
def test_a_stand_in_tail_equals_its_layers_one_by_one(conformance_backend, prompt, data):
    b = conformance_backend.backend(conformance_backend.family(data))
    _needs(b, "stand_in")
    start = data.draw(st.integers(0, b.num_layers - 1), label="start")
    results = []
    for fused in (True, False):
        b.prefill([prompt], len(prompt) + 1)
        h = b.embed([7], Step(len(prompt)))
        if fused:
            h = b.stand_in_tail(start, h, None)
        else:
            for i in range(start, b.num_layers):
                h = b.stand_in_layer(i, h, None)
        results.append((b.logits(h), [b.read_kv(i) for i in range(b.num_layers)]))
    (fused_logits, fused_kv), (logits, kv) = results
    assert relative_error(fused_logits, logits) <= FULL_DEPTH_RTOL
    # layers before `start` hold no entry for this step's slot: nothing ran them
    for (fk, fv), (k, v) in zip(fused_kv[start:], kv[start:]):
        assert relative_error(fk, k) <= FULL_DEPTH_RTOL and relative_error(fv, v) <= FULL_DEPTH_RTOL


def _drafting(b, data):
    _needs(b, "verify")
    strategies = [s for s in (River(), Propagate(), Full())
                  if s.requires is None or getattr(b.capabilities, s.requires)]
    return data.draw(st.sampled_from(strategies), label="draft strategy")


@given(prompt=prompts, n=st.integers(1, 16), gamma=st.integers(1, 5), exits=draft_exits,
       adaptive=st.booleans(), data=st.data())
def test_speculative_greedy_output_is_full_depths_token_for_token(
        conformance_backend, prompt, n, gamma, exits, adaptive, data):
    b = conformance_backend.backend(conformance_backend.family(data))
    strategy = _drafting(b, data)
    window = data.draw(st.none() | st.integers(1, 8), label="draft window") \
        if b.capabilities.windowed_drafts else None
    want = _greedy(b, prompt, n).tokens
    got = speculative_ids(b, [prompt], GenerationConfig(max_new_tokens=n),
                          attrs.evolve(scripted_run(strategy, exits), draft_window=window),
                          DraftLength(gamma, adaptive))
    assert got.tokens == want
    assert sum(got.accepted) + len(got.accepted) >= len(want[0]) - 1   # every round yields


@given(prompt=prompts, n=st.integers(2, 16), gamma=st.integers(1, 5), exits=draft_exits,
       data=st.data())
def test_no_river_kv_survives_verification(conformance_backend, prompt, n, gamma, exits, data):
    """After every round, every layer's K/V of every position the output stands on is full
    depth's, within the full-depth tolerance: drafts' K/V never outlive their round."""
    b = conformance_backend.backend(conformance_backend.family(data))
    strategy = _drafting(b, data)
    tokens = _greedy(b, prompt, n).tokens[0]
    want = _kv_after(b, prompt, tokens[:-1], Full()) if len(tokens) > 1 else None
    out: list[int] = []
    for r in rounds(b, prompt, GenerationConfig(max_new_tokens=n), scripted_run(strategy, exits),
                    DraftLength(gamma, False)):
        out += r.tokens
        stands = len(prompt) + len(out) - 1   # the newest token is not in the cache yet
        if want is None or stands <= len(prompt):
            continue
        for i in range(b.num_layers):
            for got, full in zip(b.read_kv(i), want[i]):
                assert relative_error(got[:, :, :stands], full[:, :, :stands]) <= FULL_DEPTH_RTOL
    assert out == tokens


windowed_prompts = st.lists(st.integers(3, tiny.VOCAB - 1), min_size=SINKS + 4,
                            max_size=24).map(lambda p: [1] + p)


@given(prompt=windowed_prompts, cont=continuations, window=st.integers(1, 3), data=st.data())
def test_a_draft_window_attends_the_sinks_and_the_last_positions(
        conformance_backend, prompt, cont, window, data):
    """A single-token step under `Step.draft_window` w attends the first SINKS positions and
    the last w only: as if those between were absent (the `mask` strategy's holes, where the
    backend has them); prefill sees everything, and a window covering the context changes
    nothing. Every step still writes its own slot (the first layer's K/V, which attention does
    not touch, are full depth's)."""
    b = conformance_backend.backend(conformance_backend.family(data))
    _needs(b, "windowed_drafts")
    holed = isinstance(b, LayerEngine)   # holes anywhere in the cache: through its layout
    plain = forced_logits(b, prompt, cont, Full())
    first_layer = b.read_kv(0)
    windowed = _windowed_logits(b, prompt, cont, window)
    written = b.read_kv(0)
    first = _first_step(b, prompt, cont[0], window=window)
    holes = range(SINKS, len(prompt) + 1 - window)
    hidden = _first_step(b, prompt, cont[0], holes) if holed else first
    covering = _windowed_logits(b, prompt, cont, len(prompt) + len(cont))
    assert np.array_equal(windowed[0], plain[0])
    assert all(relative_error(w, p) <= FULL_DEPTH_RTOL for w, p in zip(written, first_layer))
    assert relative_error(first, hidden) <= FULL_DEPTH_RTOL
    assert all(relative_error(c, p) <= FULL_DEPTH_RTOL for c, p in zip(covering, plain))
    assert all(relative_error(w, p) > FULL_DEPTH_RTOL for w, p in zip(windowed[1:], plain[1:]))


def _windowed_logits(b, prompt, cont, window: int) -> list[np.ndarray]:
    """`forced_logits` at full depth with every decode step under draft window `window`."""
    run = scripted_run(Full())
    pre = b.prefill([prompt], len(prompt) + len(cont))
    rows = start_rows(stand_in_error(b), run, pre.similarity)
    return [pre.logits[0]] + [
        decode_step(b, [t], run, rows, s, Step(len(prompt) + s, draft_window=window))[0][0]
        for s, t in enumerate(cont)]


def _first_step(b, prompt, token, holes=(), window: int | None = None) -> np.ndarray:
    """The logits of decoding `token` after `prompt` at full depth (under draft window
    `window`), the positions `holes` marked absent in every layer (a LayerEngine's layout)."""
    run = scripted_run(Full())
    pre = b.prefill([prompt], len(prompt) + 1)
    for position in holes:
        for i in range(b.num_layers):
            b.cache.layout.skip(i, None, position)
    logits, _ = decode_step(b, [token], run, start_rows(stand_in_error(b), run,
                                                         pre.similarity), 0,
                            Step(len(prompt), draft_window=window))
    return logits


@given(prompt=prompts, cont=continuations, stale=continuations, data=st.data())
def test_a_step_reads_nothing_past_its_end(conformance_backend, prompt, cont, stale, data):
    """Positions, not a cursor: a verification at slot p after drafts that wrote p.. (stale
    K/V, never trimmed away) gives what it gives on a fresh cache, and overwrites them."""
    b = conformance_backend.backend(conformance_backend.family(data))
    _needs(b, "verify")
    p, capacity = len(prompt), len(prompt) + max(len(cont), len(stale))
    b.prefill([prompt], capacity)
    fresh = b.extend(cont, p)
    fresh_kv = [b.read_kv(i) for i in range(b.num_layers)]
    b.prefill([prompt], capacity)
    b.extend(stale, p)
    b.trim(p)
    assert b.offset == p
    again = b.extend(cont, p)
    assert relative_error(again, fresh) <= FULL_DEPTH_RTOL
    for (k, v), (fk, fv) in zip([b.read_kv(i) for i in range(b.num_layers)], fresh_kv):
        assert relative_error(k, fk) <= FULL_DEPTH_RTOL and relative_error(v, fv) <= FULL_DEPTH_RTOL


# Sampled exactness: seeded samples of lossless and plain generation against each other and
# against the plain model's exact distributions (distribution.py, at family level 0.001). With
# 400 a side a run detects, with power 0.9, a total-variation shift of about 0.27 at any of the
# first four tokens, or a log-likelihood shift of 0.14-0.18 nats per token (the failure message
# states it); keeping drafts without the ratio test shifts the likelihood by about 0.2-0.3 nats
# on the tiny models, and is caught (tests/test_speculative.py checks that it is).
SAMPLES = 400
SAMPLED_TOKENS = 6      # a continuation: the prompt's token, four drafts, the backbone's own
SAMPLED_POSITIONS = 4   # the positions whose token frequencies are compared
SAMPLED_PROMPT = [1, 20, 21, 22]
SAMPLED_SETTINGS = {"temperature 1.0": dict(temperature=1.0),
                    "temperature 0.7, top-p 0.9": dict(temperature=0.7, top_p=0.9)}


def plain_samples(backend, prompt, gen: GenerationConfig, n: int) -> list[list[int]]:
    """n continuations of `prompt` sampled at full depth (seeds gen.seed * n + 0..n-1, or one
    batch seeded gen.seed)."""
    if backend.capabilities.batch:
        return generate_ids(backend, [prompt] * n, gen, scripted_run(Full())).tokens
    return [generate_ids(backend, [prompt], attrs.evolve(gen, seed=gen.seed * n + s),
                         scripted_run(Full())).tokens[0] for s in range(n)]


def lossless_samples(backend, prompt, gen: GenerationConfig, n: int) -> list[list[int]]:
    """n continuations of `prompt` in speculative mode (seeds gen.seed * n + 0..n-1), drafting
    as far from the backbone as the backend allows: stand-ins only where it has them, so that
    about half of the drafts are rejected and both branches of the ratio test run."""
    strategy, exits = (River(), [-1] * 4 * gen.max_new_tokens) \
        if backend.capabilities.stand_in else (Full(), [])
    return [speculative_ids(backend, [prompt], attrs.evolve(gen, seed=gen.seed * n + s),
                            scripted_run(strategy, exits), DraftLength(4)).tokens[0]
            for s in range(n)]


def scored(backend, prompt, continuations, gen: GenerationConfig) -> Scored:
    """Continuations of `prompt` scored under the backend's plain model (distribution.py)."""
    forced = teacher_force(backend, [prompt] * len(continuations), continuations,
                           scripted_run(Full()))
    return score(continuations, [f.logits for f in forced], gen.temperature, gen.top_p,
                 gen.top_k)


def lossless_against_plain(backend, n: int = SAMPLES, seed: int = 0, **sampling) -> Comparison:
    """The sampled-exactness comparison of a backend's speculative mode (`sampling`:
    GenerationConfig's temperature, top_p, top_k)."""
    gen = GenerationConfig(max_new_tokens=SAMPLED_TOKENS, **sampling)
    plain = plain_samples(backend, SAMPLED_PROMPT, attrs.evolve(gen, seed=2 * seed), n)
    other = lossless_samples(backend, SAMPLED_PROMPT, attrs.evolve(gen, seed=2 * seed + 1), n)
    return compare(scored(backend, SAMPLED_PROMPT, plain, gen),
                   scored(backend, SAMPLED_PROMPT, other, gen), SAMPLED_POSITIONS)


@pytest.mark.parametrize("sampling", SAMPLED_SETTINGS.values(), ids=SAMPLED_SETTINGS.keys())
def test_speculative_sampling_draws_full_depths_distribution(conformance_backend, sampling):
    b = conformance_backend.backend(bits=4)
    _needs(b, "verify")
    comparison = lossless_against_plain(b, **sampling)
    assert comparison.same, comparison.summary()


def test_speculative_mode_refuses_what_would_break_it(conformance_backend):
    b = conformance_backend.backend()
    model = RiverModel(b)
    ids, gen = [1, 20, 21, 22], GenerationConfig(max_new_tokens=3)
    config = lambda **kw: ExitConfig(mode="speculative", policy="fixed", options={"layer": 1},
                                     **kw)
    if not b.capabilities.verify:
        with pytest.raises(CapabilityError, match="verify"):
            model.generate_ids([ids], config(kv="full"), gen)
        return
    for kv in ("mask", "monotonic", "recompute"):
        with pytest.raises(ConfigError, match="cannot draft"):
            model.generate_ids([ids], config(kv=kv), gen)
    with pytest.raises(ConfigError, match="one sequence"):
        model.generate_ids([ids, ids], config(kv="full"), gen)
    if b.capabilities.stand_in:
        with pytest.raises(ConfigError, match="prefill_exit"):
            model.generate_ids([ids], config(prefill_exit=0), gen)


def _policy_settings(name: str) -> dict:
    """Options that make each shipped policy exit somewhere on a tiny model."""
    return {"fixed": {"layer": 1}, "similarity": {"min_layer": 1},
            "confidence": {"threshold": 0.0}, "entropy": {"threshold": 100.0}}.get(name, {})


@pytest.mark.parametrize("policy", sorted(default_registry().entries("policy")))
def test_every_registered_policy_keeps_the_cache_whole(conformance_backend, policy):
    """Each policy loaded by entry point, on the river: tokens exit where the backend allows,
    every layer keeps every position, and no logit is NaN."""
    b = conformance_backend.backend()
    _needs(b, "exits")
    _needs(b, "stand_in")
    model = RiverModel(b)
    config = ExitConfig(policy=policy, options=_policy_settings(policy))
    try:
        out = model.generate_ids([[1, 20, 21, 22]], config, GenerationConfig(max_new_tokens=8))
    except (CapabilityError, ConfigError) as e:   # e.g. the paper's rule without sub-blocks,
        pytest.skip(str(e))                       # or a third party's required option
    assert all(-1 <= k < b.num_layers for k in out.exit_layers[0])
    for i in range(b.num_layers):
        k, v = b.read_kv(i)
        assert k.shape[2] == b.offset and np.isfinite(k).all() and np.isfinite(v).all()
