"""The backend conformance kit: the contract of river_core/contract/backend.py as property tests.

Enable it in a backend's test suite with one line in a test module:

    from river_conformance.kit import *  # noqa: F401,F403

It then runs against every backend registered under the `river_conformance_backends` hook
(`pytest --river-backend NAME` keeps one), on tiny random models of every family the backend
runs (`river_conformance.fixtures.tiny`), checked against the reference backend `hf`. Or point it at one
backend with a fixture of the same name:

    @pytest.fixture(scope="session")
    def conformance_backend():
        return Subject.of("mine", make_my_backend)   # make(family, seed, bits) -> Backend

Tolerances and why (docs/backends.md), per the float type the backend computes in
(`Precision`: float32 unless the backend names another in its `floats`):
- full depth against the reference: the same greedy tokens (in float16, up to a near tie of the
  reference, `Precision.keeps_to`), logits within the precision's rtol (float32: FULL_DEPTH_RTOL);
- stand-in K/V: relative error <= STAND_IN_BOUND_C * eps_j * d at the d-th stand-in layer j of
  a token, eps_j = the backend's own `stand_in_error[j]`;
- exit after the last layer and `propagate` at layer k+1: bit-identical, within the backend;
- a verification against the same tokens decoded a step each: bit-identical logits and cache
  (`Verifies.extend`), so speculative mode's greedy output is full depth's tokens exactly;
  sampled, full depth's distribution, by the statistical tests of distribution.py at family
  level 0.001, their power stated.
"""

from __future__ import annotations

import functools
from typing import Callable, Mapping, Sequence

import attrs
import numpy as np
import pytest
from hypothesis import given, strategies as st

from river_core.contract.backend import PROMISES, Backend, Step
from river_core.settings.config import ExitConfig, GenerationConfig
from river_core.loop.decode import (decode_step, generate_ids, start_rows, teacher_force)
from river_core.contract.layer_engine import LayerEngine
from river_core.contract.layout import SINKS
from river_core.settings.errors import CapabilityError, ConfigError
from river_core.method.kv import Full, Mask, Monotonic, Propagate, Recompute, River
from river_core.model import RiverModel
from river_core.plugins import default_registry
from river_core.method.predictor import STAND_IN_BOUND_C, relative_error
from river_core.loop.ngram import NgramOptions, NgramSource
from river_core.method.draft_length import DraftLength
from river_core.loop.speculative import DraftSource, RiverSource, rounds, speculative_ids
from river_conformance.fixtures import tiny

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
    try:
        return make(family, seed, bits)
    except ModuleNotFoundError as e:
        # an optional package a backend needs (gguf, llama-cpp-python, ...) is not installed:
        # it runs no family here, which the kit reports as a skip; a module of River's own
        # missing is a bug, and stays an error
        if (e.name or "").partition(".")[0].startswith("river"):
            raise
        raise CapabilityError(f"it needs the package that provides {e.name!r}, not "
                              f"installed here") from e


@attrs.frozen
class Precision:
    """The kit's bounds for a backend computing in one float type, against the float32
    reference and against its own runs summed in another order (a batch of tokens against one
    at a time, a fused tail against its layers)."""

    name: str
    rtol: float          # logits and K/V against the reference, relative error
    own_rtol: float      # logits and K/V against the backend's own runs in another order
    fused_rtol: float    # a fused stand-in tail against its layers run one by one
    cosine_atol: float   # the sub-block cosines against the reference
    near_ties: bool      # greedy tokens may part where the reference's top two logits tie

    def keeps_to(self, got: Sequence[int], want: Sequence[int],
                 want_logits: Callable[[], list[np.ndarray]], rtol: float) -> bool:
        """Whether greedy tokens `got` keep to `want`, where `got`'s logits are within `rtol`
        of `want`'s: the same tokens, or the same up to a near tie (`agreement`)."""
        return self.agreement(got, want, want_logits, rtol) != PARTED

    def agreement(self, got: Sequence[int], want: Sequence[int],
                  want_logits: Callable[[], list[np.ndarray]], rtol: float) -> str:
        """SAME: the same tokens. NEAR_TIE: where near ties may part them, the same up to a
        first difference at which `want`'s logits (`want_logits()[i]` chose want[i], read only
        then) had their top two within sqrt(2) * rtol * ||logits|| of each other, the most
        that logits within rtol of them can move the two's gap. PARTED: otherwise."""
        got, want = list(got), list(want)
        if got == want:
            return SAME
        first = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), None)
        if not self.near_ties or first is None:
            return PARTED
        logits = np.asarray(want_logits()[first], np.float64).reshape(-1)
        top, second = np.sort(logits)[-2:][::-1]
        return NEAR_TIE if top - second <= np.sqrt(2) * rtol * np.linalg.norm(logits) \
            else PARTED


SAME, NEAR_TIE, PARTED = "same", "near tie", "parted"   # Precision.agreement's answers
FLOAT32 = Precision("float32", FULL_DEPTH_RTOL, FULL_DEPTH_RTOL, FULL_DEPTH_RTOL, 1e-4,
                    near_ties=False)
# Float16 (every weight, activation and cache entry): rounding at eps 2^-11 through every layer.
# Measured on the onnx float16 export, 40 prompts and continuations per tiny family
# (docs/backends.md): logits within 1.6e-2 of the float32 reference (torch's own float16 run of
# the same models: 2.4e-2), K/V 7e-3, cosines 1.4e-3; against its own one-token-at-a-time run,
# a multi-token extend's logits within 1.7e-3, K/V 6.4e-4. A fused stand-in tail against its
# layers one by one: logits within 4.6e-2, K/V 1.9e-2 (10 prompts, every start, int8 and int4),
# where float32 is bit-identical: ONNX Runtime's CPU provider runs some float16 nodes in float32
# between Casts (9 in an optimized tiny stand-in graph) and drops some of them between the
# layers of one graph (33 in a six-layer tail, not 54), so the two round at different places.
FLOAT16 = Precision("float16", 3e-2, 5e-3, 1e-1, 3e-3, near_ties=True)
PRECISIONS = {p.name: p for p in (FLOAT32, FLOAT16)}
# Bfloat16 (River's torch engine on CUDA; no kit subject computes in it): against another
# engine's bfloat16 run of the same weights (transformers' generate(), tests/test_invariants.py)
# logits within 0.25: on the CPU the two agree to 5e-3 and either lands up to 0.13 from
# float32's, and CUDA's kernels may round at other places, so up to twice that apart. Against
# its own runs in another order, 4e-2 (float16's 5e-3 at bfloat16's 8x coarser rounding, 2^-8):
# measured at most 0.023 on the CPU, a verification of 4 tokens against one token a step
# (every tiny family, 5 prompts each).
BFLOAT16 = attrs.evolve(FLOAT16, name="bfloat16", rtol=0.25, own_rtol=4e-2)


@attrs.frozen
class Subject:
    """A backend under test: make(family, seed, bits), the tiny families it runs and the
    bounds of the float type it computes in."""

    name: str
    make: Callable
    families: tuple[str, ...]
    refusal: str = ""   # why it runs no family at all
    precision: Precision = FLOAT32

    @classmethod
    def of(cls, name: str, make: Callable) -> "Subject":
        runs, refusals, floats = [], [], set()
        for family in tiny.FAMILIES:
            try:
                floats.add(_floats(_made(make, family, 0, 8)))
                runs.append(family)
            except CapabilityError as e:
                refusals.append(str(e))
        if len(floats) > 1:
            raise ConfigError(f"{name} computes in {sorted(floats)} across the tiny families; "
                              f"the kit bounds one float type per subject")
        return cls(name, make, tuple(runs), "; ".join(sorted(set(refusals))) if not runs else "",
                   PRECISIONS[floats.pop()] if floats else FLOAT32)

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


def _floats(backend) -> str:
    """The float type `backend` computes in: its `floats` (a numpy dtype or its name), which a
    backend below float32 declares; float32 otherwise."""
    name = np.dtype(getattr(backend, "floats", np.float32)).name
    if name not in PRECISIONS:
        raise ConfigError(f"{backend.name} computes in {name}; the kit has bounds for "
                          f"{', '.join(PRECISIONS)} only")
    return name


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
    family, precision = conformance_backend.family(data), conformance_backend.precision
    b, ref = conformance_backend.backend(family), _reference(family)
    cont = _greedy(ref, prompt, n).tokens[0]
    want = forced_logits(ref, prompt, cont, Full())
    assert precision.keeps_to(_greedy(b, prompt, n).tokens[0], cont, lambda: want,
                              precision.rtol)
    for got, w in zip(forced_logits(b, prompt, cont, Full()), want):
        assert relative_error(got, w) <= precision.rtol


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
        assert relative_error(g, w) <= conformance_backend.precision.rtol


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
    rtol = conformance_backend.precision.own_rtol
    for step, k in enumerate(exits):
        if k is None or k >= b.num_layers - 1:
            assert relative_error(got[step + 1], full_logits[step + 1]) <= rtol
    for i, (fk, fv) in enumerate(full_kv):
        k, v = b.read_kv(i)
        assert relative_error(k, fk) <= rtol
        assert relative_error(v, fv) <= rtol


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
        p = backend.begin([cont[-1]], Step(len(prompt) + len(cont)))
        h = backend.embed(p)
        for i in range(backend.num_layers):
            h, cosines = backend.layer(p, i, h, None, sub_blocks=True)
            out.append(cosines[0])
    assert np.allclose(got, want, atol=conformance_backend.precision.cosine_atol)
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


@given(prompt=prompts, other=prompts, cont=continuations, exits=exit_layers,
       before=exit_layers, strategy=st.sampled_from([River(), Propagate(), Mask(), Recompute()]),
       data=st.data())
def test_forcing_again_over_the_kept_prefill_is_bitwise_a_fresh_prefills(
        conformance_backend, prompt, other, cont, exits, before, strategy, data):
    """Calibration teacher-forces every setting it tries over the same prompts on the prefill
    the cache kept (`KeepsPrefill`): whatever ran after that prefill (a generation of as many
    positions, another setting's exits and holes), forcing again computes bitwise what it
    does after a fresh prefill."""
    b = conformance_backend.backend(conformance_backend.family(data))
    _needs(b, "keeps_prefill")
    _needs(b, "exits")
    _needs(b, strategy.requires)
    together = strategy.batch and b.capabilities.batch
    rows, conts = ([prompt, other], [cont, cont[::-1]]) if together else ([prompt], [cont])
    new = len(cont) + 3
    capacity = max(map(len, rows)) + new   # a generation of `new` tokens's

    def force():   # a strategy keeps its rows' state: a new one a run
        return teacher_force(b, rows, conts, scripted_run(type(strategy)(), exits),
                             capacity=capacity)

    b.prefill([[1, 3]], 4)   # nothing of these prompts kept
    fresh = force()
    generate_ids(b, rows, GenerationConfig(max_new_tokens=new),
                 scripted_run(Mask() if b.capabilities.mask else River(), before))
    assert b.kept_prefill(rows, capacity) is not None
    assert b.kept_prefill([prompt + [3]], capacity) is None   # other prompts
    assert b.kept_prefill(rows, capacity + 1) is None         # another cache
    again = force()
    for f, a in zip(fresh, again):
        assert f.exit_layers == a.exit_layers
        for x, y in zip(f.logits, a.logits):
            np.testing.assert_array_equal(x, y)


def test_every_promise_is_kept_by_what_the_backend_implements(conformance_backend):
    """Each capability a backend declares before loading, the loaded backend implements (the
    sub-protocol of backend.py that keeps it)."""
    b = conformance_backend.backend()
    assert isinstance(b, Backend)
    for flag, protocol in PROMISES.items():
        if getattr(b.capabilities, flag):
            assert isinstance(b, protocol), \
                f"{b.name} declares {flag} but is no {protocol.__name__}"


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


def tail_both_ways(b, prompt, start: int) -> list[tuple[np.ndarray, list]]:
    """A decode step after `prompt` whose token runs the stand-ins from layer `start` on, as
    one `stand_in_tail` call and as its layers one by one: (logits, every layer's K/V) each."""
    results = []
    for fused in (True, False):
        b.prefill([prompt], len(prompt) + 1)
        p = b.begin([7], Step(len(prompt)))
        h = b.embed(p)
        if fused:
            h = b.stand_in_tail(p, start, h, None)
        else:
            for i in range(start, b.num_layers):
                h = b.stand_in_layer(p, i, h, None)
        results.append((b.logits(h), [b.read_kv(i) for i in range(b.num_layers)]))
    return results


@given(prompt=prompts, data=st.data())
def test_a_stand_in_tail_equals_its_layers_one_by_one(conformance_backend, prompt, data):
    b = conformance_backend.backend(conformance_backend.family(data))
    _needs(b, "stand_in")
    start = data.draw(st.integers(0, b.num_layers - 1), label="start")
    (fused_logits, fused_kv), (logits, kv) = tail_both_ways(b, prompt, start)
    rtol = conformance_backend.precision.fused_rtol
    assert relative_error(fused_logits, logits) <= rtol
    # layers before `start` hold no entry for this step's slot: nothing ran them
    for (fk, fv), (k, v) in zip(fused_kv[start:], kv[start:]):
        assert relative_error(fk, k) <= rtol and relative_error(fv, v) <= rtol


def _drafting(b, data):
    _needs(b, "verify")
    strategies = [s for s in (River(), Propagate(), Full())
                  if s.requires is None or getattr(b.capabilities, s.requires)]
    return data.draw(st.sampled_from(strategies), label="draft strategy")


@given(prompt=prompts, cont=st.lists(st.integers(3, tiny.VOCAB - 1), min_size=2, max_size=17),
       data=st.data())
def test_a_verification_computes_each_token_as_a_step_of_it_does(conformance_backend, prompt,
                                                                  cont, data):
    """`extend` over several tokens gives bitwise the logits of decoding them a step each, and
    leaves bitwise their cache (`Verifies.extend`): what makes lossless mode's greedy output
    full depth's on every run, whatever drafts were tried, not only up to a near tie."""
    b = conformance_backend.backend(conformance_backend.family(data))
    _needs(b, "verify")
    p, capacity = len(prompt), len(prompt) + len(cont)
    b.prefill([prompt], capacity)
    steps = np.stack([b.decode([t], Step(p + j))[0] for j, t in enumerate(cont)])
    stepped = [b.read_kv(i) for i in range(b.num_layers)]
    b.prefill([prompt], capacity)
    together = b.extend(cont, p)
    assert np.array_equal(together, steps)
    for (k, v), (sk, sv) in zip([b.read_kv(i) for i in range(b.num_layers)], stepped):
        assert np.array_equal(k, sk) and np.array_equal(v, sv)


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


# prompts that repeat themselves, so that the context's n-grams propose drafts
repeating_prompts = st.tuples(st.lists(st.integers(3, tiny.VOCAB - 1), min_size=1, max_size=6),
                              st.integers(2, 4)).map(lambda pk: [1] + pk[0] * pk[1])


@given(prompt=repeating_prompts, n=st.integers(1, 16), gamma=st.integers(1, 5),
       exits=draft_exits, adaptive=st.booleans(), shortest=st.integers(1, 3), data=st.data())
def test_speculative_greedy_output_with_ngram_drafts_is_full_depths_token_for_token(
        conformance_backend, prompt, n, gamma, exits, adaptive, shortest, data):
    """Drafts from the context's n-grams, alone or with the river's (either asked first):
    full depth's tokens still, every round drafted by whichever source proposed."""
    b = conformance_backend.backend(conformance_backend.family(data))
    strategy = _drafting(b, data)
    ngram = NgramSource(NgramOptions(ngram_min=shortest, ngram_max=max(shortest, 4),
                                     ngram_tokens=gamma))
    river = RiverSource()
    sources = data.draw(st.sampled_from([{"ngram": ngram}, {"ngram": ngram, "river": river},
                                         {"river": river, "ngram": ngram}]), label="sources")
    want = _greedy(b, prompt, n).tokens
    got = speculative_ids(b, [prompt], GenerationConfig(max_new_tokens=n),
                          scripted_run(strategy, exits),
                          DraftLength({name: gamma for name in sources}, adaptive), sources)
    assert got.tokens == want
    assert sum(got.accepted) + len(got.accepted) >= len(want[0]) - 1   # every round yields
    assert set(got.draft_sources) <= {*sources, "plain"}
    drafted = [d for d, s in zip(got.drafted, got.draft_sources) if s == "ngram"]
    assert all(0 < d <= gamma for d in drafted)


@given(prompt=prompts, n=st.integers(2, 16), gamma=st.integers(1, 5), exits=draft_exits,
       data=st.data())
def test_no_river_kv_survives_verification(conformance_backend, prompt, n, gamma, exits, data):
    """After every round, every layer's K/V of every position the output stands on is
    bitwise full depth's: drafts' K/V never outlive their round."""
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
                assert np.array_equal(got[:, :, :stands], full[:, :, :stands])
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
    rtol = conformance_backend.precision.own_rtol
    assert np.array_equal(windowed[0], plain[0])
    assert all(relative_error(w, p) <= rtol for w, p in zip(written, first_layer))
    assert relative_error(first, hidden) <= rtol
    assert all(relative_error(c, p) <= rtol for c, p in zip(covering, plain))
    assert all(relative_error(w, p) > rtol for w, p in zip(windowed[1:], plain[1:]))


def _windowed_logits(b, prompt, cont, window: int) -> list[np.ndarray]:
    """`forced_logits` at full depth with every decode step under draft window `window`."""
    run = scripted_run(Full())
    pre = b.prefill([prompt], len(prompt) + len(cont))
    rows = start_rows(b, run, pre.similarity)
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
    logits, _ = decode_step(b, [token], run, start_rows(b, run,
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
    assert np.array_equal(again, fresh)
    for (k, v), (fk, fv) in zip([b.read_kv(i) for i in range(b.num_layers)], fresh_kv):
        assert np.array_equal(k, fk) and np.array_equal(v, fv)


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


def lossless_samples(backend, prompt, gen: GenerationConfig, n: int,
                     sources: Mapping[str, DraftSource] | None = None) -> list[list[int]]:
    """n continuations of `prompt` in speculative mode (seeds gen.seed * n + 0..n-1), drafting
    as far from the backbone as the backend allows: stand-ins only where it has them, so that
    about half of the drafts are rejected and both branches of the ratio test run; with
    `sources`, from those (None: the river)."""
    strategy, exits = (River(), [-1] * 4 * gen.max_new_tokens) \
        if backend.capabilities.stand_in else (Full(), [])
    length = lambda: DraftLength({name: 4 for name in sources} if sources else 4)
    return [speculative_ids(backend, [prompt], attrs.evolve(gen, seed=gen.seed * n + s),
                            scripted_run(strategy, exits), length(), sources).tokens[0]
            for s in range(n)]


def scored(backend, prompt, continuations, gen: GenerationConfig) -> Scored:
    """Continuations of `prompt` scored under the backend's plain model (distribution.py)."""
    if backend.capabilities.batch:
        forced = teacher_force(backend, [prompt] * len(continuations), continuations,
                               scripted_run(Full()))
    else:   # one sequence at a time, as plain_samples draws them
        forced = [teacher_force(backend, [prompt], [c], scripted_run(Full()))[0]
                  for c in continuations]
    return score(continuations, [f.logits for f in forced], gen.temperature, gen.top_p,
                 gen.top_k)


def lossless_against_plain(backend, n: int = SAMPLES, seed: int = 0,
                           sources: Mapping[str, DraftSource] | None = None,
                           prompt: Sequence[int] = SAMPLED_PROMPT, **sampling) -> Comparison:
    """The sampled-exactness comparison of a backend's speculative mode (`sampling`:
    GenerationConfig's temperature, top_p, top_k; `sources`: the draft sources, None: the
    river)."""
    # its tests (chi-square, power) are scipy's, which River's test extra installs (and a lent
    # GPU's image holds): a suite without scipy skips them, in one line
    pytest.importorskip("scipy", reason="the kit's sampled comparisons need scipy")
    gen = GenerationConfig(max_new_tokens=SAMPLED_TOKENS, **sampling)
    plain = plain_samples(backend, prompt, attrs.evolve(gen, seed=2 * seed), n)
    other = lossless_samples(backend, prompt, attrs.evolve(gen, seed=2 * seed + 1), n, sources)
    return compare(scored(backend, prompt, plain, gen), scored(backend, prompt, other, gen),
                   SAMPLED_POSITIONS)


# N-gram drafts under the sampling rule: a prompt holding every token of the vocabulary once
# (in a fixed shuffled order), and matches of one token on, so that whatever token was
# sampled last occurred before and the n-grams propose in every round (the token that
# followed it; on the tiny models about 1 in 200 is kept, so it is the rejection branch, a
# draw from the target without the draft, that runs in nearly every round); a draft that is
# a function of the context is a point mass, kept with the target's probability of it
# (speculative.verify)
NGRAM_PROMPT = [1, *np.random.default_rng(0).permutation(np.arange(3, tiny.VOCAB)).tolist()]
NGRAM_DRAFTS = {"ngram": NgramSource(NgramOptions(ngram_min=1))}


@pytest.mark.parametrize("sampling", SAMPLED_SETTINGS.values(), ids=SAMPLED_SETTINGS.keys())
def test_speculative_sampling_draws_full_depths_distribution(conformance_backend, sampling):
    b = conformance_backend.backend(bits=4)
    _needs(b, "verify")
    comparison = lossless_against_plain(b, **sampling)
    assert comparison.same, comparison.summary()


def test_speculative_sampling_with_ngram_drafts_draws_full_depths_distribution(
        conformance_backend):
    b = conformance_backend.backend(bits=4)
    _needs(b, "verify")
    comparison = lossless_against_plain(b, sources=NGRAM_DRAFTS, prompt=NGRAM_PROMPT,
                                        temperature=1.0)
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
