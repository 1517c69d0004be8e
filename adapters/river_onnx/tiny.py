"""The onnx backend over a tiny random model, for the conformance kit."""

from __future__ import annotations

import tempfile
from pathlib import Path

from river_core.config import RiverSpec
from river_hf import tiny
from river_hf.backend import HFTokenizer

from .backend import OnnxBackend
from .export import export_model


def backend(family: str, seed: int = 0, bits: int = 8) -> OnnxBackend:
    # sessions read every weight when they are made, so the export folder can go right after
    with tempfile.TemporaryDirectory(prefix=f"river-onnx-{family}-") as folder:
        manifest = export_model(tiny.model(family, seed), tiny.tokenizer(), Path(folder),
                                RiverSpec(bits=bits, group_size=32), progress=False)
        return OnnxBackend(Path(folder), manifest, HFTokenizer(tiny.tokenizer(), manifest.eos_ids))
