"""Registers the `hf` backend with River (entry point `hf` in group `river_core`)."""

from __future__ import annotations

from river_core.config import QuantSpec
from river_core.errors import CapabilityError, ConfigError
from river_core.hookspecs import BackendPlugin, hookimpl
from river_models.source import model_shape

from . import CAPABILITIES

DTYPES = ("float32", "bfloat16", "float16")


def _torch_device(device: str):
    import torch

    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ConfigError(f"unknown device {device!r}; use cpu or cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CapabilityError("CUDA was asked for but torch sees no CUDA device")
    return device


def load(model: str | None = None, *, device: str = "cpu", dtype: str = "float32",
         quant: QuantSpec = QuantSpec(), progress: bool = False):
    """PyTorch (CPU, CUDA): the reference backend."""
    import torch

    from river_models import open_model, stand_ins

    from .backend import HFBackend

    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    _torch_device(device)
    checkpoint = open_model(model, progress)
    return HFBackend(checkpoint, stand_ins(checkpoint, quant, progress), getattr(torch, dtype),
                     device)



def tiny_backend(family: str, seed: int, bits: int, dtype: str = "float32",
                 device: str | None = None):
    """The hf backend over a tiny random model: the conformance kit's reference, on `device`
    (default: $RIVER_TEST_DEVICE, else the CPU; `river bench gpu` points it at a GPU)."""
    import os

    import torch

    from river_models import tiny

    from .backend import HFBackend

    checkpoint = tiny.checkpoint(family, seed, dtype)
    return HFBackend(checkpoint, tiny.stand_ins(checkpoint, bits), getattr(torch, dtype),
                     device or os.environ.get("RIVER_TEST_DEVICE", "cpu"))


@hookimpl
def river_backends():
    return {"hf": BackendPlugin(load, CAPABILITIES, model_shape)}


@hookimpl
def river_conformance_backends():
    return {"hf": tiny_backend}
