"""Registers the `hf` backend with River (entry point `hf` in group `river_core`)."""

from __future__ import annotations

import os

from river_core.settings.config import QuantSpec
from river_core.settings.errors import CapabilityError, ConfigError
from river_core.contract.hookspecs import BackendPlugin, hookimpl
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


def load(model: str | None = None, *, device: str = "cpu", dtype: str | None = None,
         quant: QuantSpec = QuantSpec(), progress: bool = False):
    """PyTorch (CPU, CUDA): the reference backend. dtype None: float32 on the CPU, bfloat16
    on CUDA (`river_torch.backend.default_dtype`)."""
    import torch

    from river_models import open_model, stand_ins

    from .backend import TorchBackend

    if dtype is not None and dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    _torch_device(device)
    checkpoint = open_model(model, progress)
    return TorchBackend(checkpoint, stand_ins(checkpoint, quant, progress),
                     None if dtype is None else getattr(torch, dtype), device)


TEST_DEVICE = "RIVER_TEST_DEVICE"
"""Where the conformance kit and the engines' tests run the hf backend (default: cpu)."""


def tiny_backend(family: str, seed: int, bits: int, dtype: str = "float32",
                 device: str | None = None):
    """The hf backend over a tiny random model: the conformance kit's reference, on `device`
    (default: $RIVER_TEST_DEVICE, else the CPU; `river bench gpu` points it at a GPU)."""
    import torch

    from river_conformance.fixtures import tiny

    from .backend import TorchBackend

    checkpoint = tiny.checkpoint(family, seed, dtype)
    return TorchBackend(checkpoint, tiny.stand_ins(checkpoint, bits), getattr(torch, dtype),
                     _torch_device(device or os.environ.get(TEST_DEVICE, "cpu")))


@hookimpl
def river_backends():
    return {"hf": BackendPlugin(load, CAPABILITIES, model_shape)}


@hookimpl
def river_conformance_backends():
    return {"hf": tiny_backend}
