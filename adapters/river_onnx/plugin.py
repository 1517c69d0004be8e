"""Registers the `onnx` backend with River (entry point `onnx` in group `river_core`)."""

from __future__ import annotations

from river_core.config import RiverSpec
from river_core.errors import ConfigError
from river_core.hookspecs import hookimpl


def load(model: str | None = None, *, device: str = "cpu", dtype: str = "float32",
         river: RiverSpec = RiverSpec(), progress: bool = False):
    """ONNX Runtime (CPU; CUDA with the onnx-gpu extra): exported per-layer graphs."""
    from transformers import AutoTokenizer

    from river_hf.backend import HFTokenizer

    from .backend import PROVIDERS, OnnxBackend, sessions_for
    from .export import Manifest, exported

    if dtype != "float32":
        raise ConfigError(f"the onnx backend runs float32 only, not {dtype}")
    if device not in PROVIDERS:
        raise ConfigError(f"unknown device {device!r} for the onnx backend; use cpu or cuda")
    sessions_for(device)   # fail before a long export when the provider is missing
    folder = exported(model, river, progress)
    manifest = Manifest.read(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer", local_files_only=True)
    return OnnxBackend(folder, manifest, HFTokenizer(tokenizer, manifest.eos_ids), device)


@hookimpl
def river_backends():
    return {"onnx": load}


def tiny_backend(family: str, seed: int, bits: int):
    """The onnx backend over a tiny random model, exported on the fly."""
    from .tiny import backend

    return backend(family, seed, bits)


@hookimpl
def river_conformance_backends():
    return {"onnx": tiny_backend}
