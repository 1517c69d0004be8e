"""The K or the V half of the onnx backend's cache: one OrtValue per layer, allocated on the
sessions' device, which the layer graphs bind as both past and present. A step over every row
and every slot (batch-1 decoding, prefill, verification) thus writes its tokens' K/V where they
stay, and no byte of the cache crosses to the host.

Everything else reaches the cache through the host, a whole layer at a time: indexing reads a
layer (`OrtValue.numpy`: a copy off the CPU; on the CPU ONNX Runtime hands out the value's own
memory) and index assignment writes into that read and pushes it back (`update_inplace`) when
it was a copy. The backend does so only on its rarer paths: a subset of rows, a draft window's
slots (`OnnxBackend._run_in_place`), `project_kv`, `mark_absent` and `read_kv`.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

DEVICE_ID = 0   # the sessions' providers run on their default device


class OrtLayers:
    """[layers, batch, kv_heads, capacity, head_dim] as one OrtValue per layer on `device`,
    indexed like the numpy array it stands for (the first index picks the layer). Unwritten
    slots hold 0 (`OnnxBackend.allocate` says why)."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, device: str) -> None:
        self.device = device
        zeros = np.zeros(shape[1:], dtype)
        self.values = []
        for _ in range(shape[0]):
            value = ort.OrtValue.ortvalue_from_shape_and_type(shape[1:], dtype, device,
                                                              DEVICE_ID)
            value.update_inplace(zeros)   # the device's fresh memory holds anything
            self.values.append(value)

    def scratch(self, host: np.ndarray) -> ort.OrtValue:
        """A copy of `host` (part of a layer) on the device, for a graph to read and write."""
        return ort.OrtValue.ortvalue_from_numpy(host, self.device, DEVICE_ID)

    def __getitem__(self, key) -> np.ndarray:
        i, rest = _layer(key)
        return self.values[i].numpy()[rest]   # through the host

    def __setitem__(self, key, value) -> None:
        i, rest = _layer(key)
        host = self.values[i].numpy()   # through the host
        host[rest] = value
        if host.ctypes.data != self.values[i].data_ptr():   # a copy: the write is not there yet
            self.values[i].update_inplace(host)


def _layer(key) -> tuple[int, tuple]:
    """A numpy index into all layers as (layer, the index into that layer)."""
    return (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
