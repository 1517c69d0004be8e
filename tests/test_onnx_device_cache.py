"""The onnx backend's cache as it lives on a GPU, run on the CPU: ONNX Runtime is made to copy
between numpy and OrtValues, as it must off the CPU (on the CPU the two share memory), so a
write that never reaches the device's copy, or a read of a stale host copy, shows.

Under that, the whole conformance kit runs on the onnx backend, and a step over every row is
shown to move no byte of the cache to the host, while a subset of rows goes through it.
"""

import numpy as np
import onnxruntime as ort
import pytest

from river_core.backend import Step
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
    return Subject.registered("onnx")


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
