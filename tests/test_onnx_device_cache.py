"""The onnx backend's cache as it lives on a GPU, run on the CPU: ONNX Runtime is made to copy
between numpy and OrtValues, as it must off the CPU (on the CPU the two share memory), so a
write that never reaches the device's copy, or a read of a stale host copy, shows.

Under that, the whole conformance kit runs on the onnx engine as it runs off the CPU (hidden
states on the device too), and a step over every row is shown to move no byte of the cache to
the host, while a subset of rows goes through it.
"""

import functools

import numpy as np
import onnxruntime as ort
import pytest

from river_core.contract.backend import Step
from river_conformance.kit import *  # noqa: F401,F403
from river_conformance.kit import Subject


@pytest.fixture(scope="module", autouse=True)
def host_copies():
    """numpy read from an OrtValue and OrtValues made from numpy are copies, as on CUDA."""
    numpy, from_numpy = ort.OrtValue.numpy, ort.OrtValue.ortvalue_from_numpy
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ort.OrtValue, "numpy", lambda self: numpy(self).copy())
        patch.setattr(ort.OrtValue, "ortvalue_from_numpy",
                      staticmethod(lambda array, *device: from_numpy(np.array(array), *device)))
        yield


@pytest.fixture(scope="module")
def conformance_backend():
    """The engine as it runs off the CPU (`OnnxDeviceBackend`: hidden states kept as
    OrtValues between layers); the CPU's engine, whose states are host arrays, runs the kit in
    tests/test_conformance.py."""
    from river_onnx.plugin import tiny_backend
    return Subject.of("onnx-device-states", functools.partial(tiny_backend,
                                                              states_on_device=True))


class Transfers:
    """Every read (`numpy`) and write (`update_inplace`) of an OrtValue and every copy of host
    data to the device (`ortvalue_from_numpy`) from now on, told apart by the backend's cache:
    `of(backend)` lists them as (call, "k" or "v", layer), a copy as (call, "", -1), and
    leaves out reads of values not in the cache (a graph's output states)."""

    def __init__(self, monkeypatch) -> None:
        self.calls = []
        for name in ("numpy", "update_inplace"):
            self._spy(monkeypatch, name)
        from_numpy = ort.OrtValue.ortvalue_from_numpy

        def copied(*args):
            self.calls.append(("ortvalue_from_numpy", None))
            return from_numpy(*args)
        monkeypatch.setattr(ort.OrtValue, "ortvalue_from_numpy", staticmethod(copied))

    def _spy(self, monkeypatch, name: str) -> None:
        method = getattr(ort.OrtValue, name)

        def call(value, *args):
            self.calls.append((name, value))
            return method(value, *args)
        monkeypatch.setattr(ort.OrtValue, name, call)

    def of(self, backend) -> list[tuple[str, str, int]]:
        layers = {id(value): (kv, i) for kv, half in (("k", backend.cache.k),
                                                       ("v", backend.cache.v))
                  for i, value in enumerate(half.values)}
        return [(name, "", -1) if value is None else (name, *layers[id(value)])
                for name, value in self.calls if value is None or id(value) in layers]


PROMPTS = [[1, 5, 6, 7], [1, 8]]


def test_prefill_writes_the_cache_from_the_host_only_to_allocate_it(conformance_backend,
                                                                     monkeypatch):
    b = conformance_backend.backend()
    transfers = Transfers(monkeypatch)
    b.prefill(PROMPTS, 16)
    assert sorted(transfers.of(b)) == [("update_inplace", kv, i) for kv in "kv"
                                       for i in range(b.num_layers)]


@pytest.mark.parametrize("batch", [1, 2])
def test_a_decode_step_over_every_row_moves_no_cache_byte_to_the_host(conformance_backend,
                                                                      monkeypatch, batch):
    b = conformance_backend.backend()
    b.prefill(PROMPTS[:batch], 16)
    transfers = Transfers(monkeypatch)
    b.decode([9] * batch, Step(b.offset, 1))
    assert transfers.of(b) == []


def test_a_verification_step_moves_no_cache_byte_to_the_host(conformance_backend, monkeypatch):
    b = conformance_backend.backend()
    b.prefill(PROMPTS[:1], 16)
    transfers = Transfers(monkeypatch)
    b.extend([9, 10, 11], b.offset)
    assert transfers.of(b) == []


def test_a_subset_of_rows_round_trips_only_its_layer_through_the_host(conformance_backend,
                                                                      monkeypatch):
    b = conformance_backend.backend()
    b.prefill(PROMPTS, 16)
    p = b.begin([9, 9], Step(b.offset, 1))
    h = b.embed(p)
    transfers = Transfers(monkeypatch)
    b.layer(p, 2, h, [1])
    assert sorted(set(transfers.of(b))) == [
        ("numpy", "k", 2), ("numpy", "v", 2), ("ortvalue_from_numpy", "", -1),
        ("update_inplace", "k", 2), ("update_inplace", "v", 2)]


@pytest.mark.parametrize("on_device", [False, True], ids=["host states", "device states"])
def test_off_the_cpu_a_decode_step_keeps_hidden_states_on_the_device(monkeypatch, on_device):
    """Issue 43: off the CPU the engine keeps hidden states as OrtValues from layer to layer,
    so a full-depth decode step sends the device no state and reads back only the logits;
    host states (the CPU's, where that copies nothing) send every layer its input."""
    from river_onnx.plugin import tiny_backend

    b = tiny_backend("llama", 0, 8, states_on_device=on_device)
    b.prefill(PROMPTS[:1], 16)
    sent, read = [], []
    bind, numpy = ort.IOBinding.bind_cpu_input, ort.OrtValue.numpy
    monkeypatch.setattr(ort.IOBinding, "bind_cpu_input",
                        lambda self, name, value: sent.append(name) or bind(self, name, value))
    monkeypatch.setattr(ort.OrtValue, "numpy",
                        lambda self: read.append(tuple(self.shape())) or numpy(self))
    b.decode([9], Step(b.offset, 1))
    vocab = b.spec.vocab
    if on_device:
        assert "h" not in sent and read == [(1, vocab)]
    else:
        # the head's input too; read: the embedding, each layer's output and mid state, logits
        assert sent.count("h") == 1 + b.num_layers and len(read) == 2 * b.num_layers + 2


@pytest.mark.parametrize("mode", ["full", "exit", "speculative"])
def test_the_float16_engine_as_cuda_runs_it_decodes_what_the_cpus_does(mode):
    """The configuration CUDA runs, on the CPU: the float16 graphs with their causal attention
    branch and the hidden states kept as OrtValues, against the same graphs with host
    states: the same tokens in every mode, and the same exits (speculative mode's draft
    lengths follow the measured step times, so only its tokens are compared)."""
    from river_core import ExitConfig, GenerationConfig, RiverModel
    from river_onnx.plugin import tiny_backend

    config = {"full": ExitConfig(kv="full"), "exit": ExitConfig(),
              "speculative": ExitConfig(mode="speculative")}[mode]
    prompts = [[1, 20, 21, 22]] if mode == "speculative" else [[1, 20, 21, 22], [1, 30]]
    outputs = [RiverModel(tiny_backend("qwen3", 0, 4, "float16", states_on_device=on))
               .generate_ids(prompts, config,
                             GenerationConfig(max_new_tokens=8))
               for on in (False, True)]
    host, device = outputs
    assert host.tokens == device.tokens
    if mode != "speculative":
        assert host.exit_layers == device.exit_layers
