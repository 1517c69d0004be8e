"""Registers the `onnx` backend with River (entry point `onnx` in group `river_core`)."""

from __future__ import annotations

import functools

from river_core.settings.config import QuantSpec
from river_core.settings.errors import ConfigError
from river_core.contract.hookspecs import BackendPlugin, hookimpl
from river_core.contract.phases import Phases
from river_models.source import model_shape

from . import CAPABILITIES



def load(model: str | None = None, *, device: str = "cpu", dtype: str | None = None,
         quant: QuantSpec = QuantSpec(), progress: bool = False):
    """ONNX Runtime (CPU; CUDA with the onnx-gpu extra): exported per-layer graphs. `dtype`
    None: float32 on the CPU, float16 on CUDA (`river_onnx.export.default_dtype`). A load
    from the cache imports neither torch nor transformers (tests/test_architecture.py); its
    phases' wall-clock is the backend's `load_seconds`."""
    phases = Phases()
    from river_models.tokenizer import FileTokenizer

    from .backend import PROVIDERS, backend_class, sessions_for
    from .export import DTYPES, Manifest, default_dtype, exported
    from .sessions import optimized_entry
    phases.done("imports")

    dtype = default_dtype(device) if dtype is None else dtype
    if dtype not in DTYPES:
        raise ConfigError(f"the onnx backend runs {' or '.join(DTYPES)} backbones, not {dtype}")
    if device not in PROVIDERS:
        raise ConfigError(f"unknown device {device!r} for the onnx backend; use cpu or cuda")
    if device == "cuda" and dtype != "float16":
        raise ConfigError(f"the onnx backend runs float16 on cuda, not {dtype}: onnxruntime's "
                          f"CUDA provider has no float32 GroupQueryAttention")
    sessions_for(device)   # fail before a long export when the provider is missing
    folder = exported(model, quant, progress, dtype)
    manifest = Manifest.read(folder)
    phases.done("export")   # found in the cache (its manifest, its files' sizes), or made
    tokenizer = FileTokenizer(folder / "tokenizer", manifest.spec.eos_ids)
    phases.done("tokenizer")
    backend = backend_class(device)(folder, manifest, tokenizer, device,
                                    optimized_entry(folder) if device == "cpu" else None)
    phases.done("sessions")   # the weights mapped, the graphs loaded or optimized
    backend.load_seconds = phases.seconds
    return backend


# the conformance kit's device (river_torch.plugin.TEST_DEVICE; the onnx engine does not import
# torch's adapter)
TEST_DEVICE = "RIVER_TEST_DEVICE"


def tiny_backend(family: str, seed: int, bits: int, floats: str = "float32",
                 states_on_device: bool | None = None):
    """The onnx backend over a tiny random model, exported on the fly; the half-precision
    exports on $RIVER_TEST_DEVICE's kind (cpu, or cuda: `river bench gpu`'s kit run), the
    float32 one on the CPU (CUDA has no float32 GroupQueryAttention). `states_on_device`:
    hidden states as OrtValues between layers even on the CPU (None: where the device has
    them, off the CPU), as tests/test_onnx_device_cache.py runs the engine."""
    import os
    import shutil
    import tempfile
    import weakref
    from pathlib import Path

    from river_conformance.fixtures import tiny

    from .backend import backend_class
    from .export import export_model

    checkpoint = tiny.checkpoint(family, seed)
    folder = Path(tempfile.mkdtemp(prefix=f"river-onnx-{family}-"))
    manifest = export_model(checkpoint, tiny.stand_ins(checkpoint, bits), folder,
                            floats=floats)
    device = "cpu" if floats == "float32" else \
        os.environ.get(TEST_DEVICE, "cpu").partition(":")[0]
    backend = backend_class(device, states_on_device)(folder, manifest, checkpoint.tokenizer,
                                                      device)
    # its footprint reads the graphs' files: the export lives as long as its backend
    weakref.finalize(backend, shutil.rmtree, folder, ignore_errors=True)
    return backend


@hookimpl
def river_backends():
    return {"onnx": BackendPlugin(load, CAPABILITIES, model_shape)}


@hookimpl
def river_conformance_backends():
    return {"onnx": tiny_backend, "onnx-float16": functools.partial(tiny_backend,
                                                                     floats="float16")}
