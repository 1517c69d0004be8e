"""How an export's graphs keep their weights: every graph's in one shared data file, each
distinct tensor once (`SharedWeights`: the export writes it, and so do the optimized graphs,
sessions.py), and what a graph reads of them (`weight_bytes`, the engine's footprint)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx
from onnx.external_data_helper import set_external_data

from .half import HALVES, to_half


class SharedWeights:
    """One data file for every graph of an export, each distinct tensor stored once."""

    NAME = "weights.data"
    INLINE = 1024   # smaller tensors stay inside their graph

    def __init__(self, folder: Path, floats: str) -> None:
        self.folder, self._offsets, self._floats = folder, {}, floats
        self._data = (folder / self.NAME).open("wb")

    def save(self, model: onnx.ModelProto, name: str) -> None:
        if self._floats in HALVES:
            model = to_half(model, self._floats)
        for tensor in model.graph.initializer:
            raw = tensor.raw_data
            if len(raw) < self.INLINE:
                continue
            key = (tensor.data_type, tuple(tensor.dims), hashlib.sha256(raw).digest())
            if key not in self._offsets:
                self._offsets[key] = self._data.tell()
                self._data.write(raw)
            set_external_data(tensor, self.NAME, self._offsets[key], len(raw))
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
        onnx.save_model(model, self.folder / f"{name}.onnx")

    def close(self) -> None:
        self._data.close()


def weight_bytes(path: Path) -> int:
    """The bytes of weights a graph reads, wherever they are stored."""
    model = onnx.load(str(path), load_external_data=False)
    total = 0
    for tensor in model.graph.initializer:
        external = {e.key: e.value for e in tensor.external_data}
        total += int(external["length"]) if "length" in external else len(tensor.raw_data)
    return total
