"""Weight-only quantization of the stand-in layers, in one engine-neutral form. No data needed.

A `QuantWeight` keeps one integer code per weight and, per group of input columns of each
output row, a float scale and an integer zero point: w ~ (code - zero) * scale. Every backend
converts this one form into its own kernel layout, so all engines run the same stand-ins.

- 8 bits: symmetric, one scale per output row (zero point 128).
- 4 bits: asymmetric, one scale and zero point per group of `group_size` columns; the group's
  range is widened to include 0 so the zero point is an integer in [0, 15].

`weight_error` is the one definition of a stand-in's relative weight error
||Q(W) - W|| / ||W|| over a layer's projections, which the predictor and the K/V bound use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import attrs
import numpy as np
from tqdm import tqdm

from river_core.config import QuantSpec
from river_core.errors import ConfigError

from .cache import cache_root, cached, digest
from .spec import PROJECTIONS, Checkpoint, LayerWeights

FORMAT = 1   # bump when the quantizers change: old cached stand-ins are then ignored
GROUPS = (256, 128, 64, 32)


@attrs.frozen(eq=False)
class QuantWeight:
    codes: np.ndarray   # uint8 [rows, columns]
    scale: np.ndarray   # float32 [rows, groups]
    zero: np.ndarray    # uint8 [rows, groups]
    bits: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape

    @property
    def group(self) -> int:
        """Input columns per scale."""
        return self.codes.shape[1] // self.scale.shape[1]

    def dequantize(self) -> np.ndarray:
        rows, columns = self.shape
        codes = self.codes.reshape(rows, -1, self.group).astype(np.float32)
        zero = self.zero.astype(np.float32)[..., None]
        return ((codes - zero) * self.scale[..., None]).reshape(rows, columns)


def group_size(requested: int, columns: int) -> int:
    """The requested group, or the largest supported one dividing the layer's width."""
    for g in (requested, *GROUPS):
        if g <= columns and columns % g == 0:
            return g
    raise ConfigError(f"a 4-bit stand-in needs layer widths divisible by 32, got {columns}")


def quantize(w: np.ndarray, spec: QuantSpec) -> QuantWeight:
    """w: float [rows, columns] (y = x w^T)."""
    w = np.asarray(w, dtype=np.float32)
    rows, columns = w.shape
    if spec.bits == 8:
        scale = np.maximum(np.abs(w).max(1, keepdims=True) / 127, 1e-12).astype(np.float32)
        codes = np.clip(np.round(w / scale) + 128, 1, 255).astype(np.uint8)
        return QuantWeight(codes, scale, np.full((rows, 1), 128, np.uint8), 8)
    g = group_size(spec.group_size, columns)
    wg = w.reshape(rows, columns // g, g)
    lo = np.minimum(wg.min(-1), 0)
    hi = np.maximum(wg.max(-1), 0)
    top = 2 ** spec.bits - 1
    scale = np.maximum((hi - lo) / top, 1e-12).astype(np.float32)
    zero = np.clip(np.round(-lo / scale), 0, top)
    codes = np.clip(np.round(wg / scale[..., None]) + zero[..., None], 0, top)
    return QuantWeight(codes.reshape(rows, columns).astype(np.uint8), scale,
                       zero.astype(np.uint8), spec.bits)


def weight_error(layer: LayerWeights, quantized: Mapping[str, QuantWeight]) -> float:
    """||Q(W) - W|| / ||W|| over all of a layer's quantized projections together."""
    err = norm = 0.0
    for name, q in quantized.items():
        w = layer.projections[name].astype(np.float64)
        err += float(((q.dequantize() - w) ** 2).sum())
        norm += float((w ** 2).sum())
    return (err / norm) ** 0.5 if norm else 0.0


@attrs.frozen(eq=False)
class StandIns:
    """The quantized projections of every layer's stand-in, and each layer's weight error."""

    spec: QuantSpec
    layers: tuple[Mapping[str, QuantWeight], ...]
    errors: tuple[float, ...]

    def save(self, path: Path) -> None:
        arrays = {"errors": np.asarray(self.errors)}
        for i, layer in enumerate(self.layers):
            for name, q in layer.items():
                arrays.update({f"{i}.{name}.codes": q.codes, f"{i}.{name}.scale": q.scale,
                               f"{i}.{name}.zero": q.zero})
        np.savez(path, **arrays)

    @classmethod
    def load(cls, path: Path, spec: QuantSpec) -> "StandIns":
        with np.load(path) as f:
            errors = tuple(float(e) for e in f["errors"])
            layers = tuple({name: QuantWeight(f[f"{i}.{name}.codes"], f[f"{i}.{name}.scale"],
                                              f[f"{i}.{name}.zero"], spec.bits)
                            for name in PROJECTIONS} for i in range(len(errors)))
        return cls(spec, layers, errors)


def build_stand_ins(checkpoint: Checkpoint, spec: QuantSpec, progress: bool = False) -> StandIns:
    layers, errors = [], []
    for layer in tqdm(checkpoint.weights.layers, desc=f"quantizing stand-ins ({spec.label})",
                      unit="layer", disable=not progress):
        q = {name: quantize(layer.projections[name], spec) for name in PROJECTIONS}
        layers.append(q)
        errors.append(weight_error(layer, q))
    return StandIns(spec, tuple(layers), tuple(errors))


def stand_ins(checkpoint: Checkpoint, spec: QuantSpec, progress: bool = False,
              cache: bool = True) -> StandIns:
    """The checkpoint's stand-ins at `spec`, quantized once and cached in the user cache."""
    if not cache:
        return build_stand_ins(checkpoint, spec, progress)
    target = cache_root() / "stand-ins" / f"{checkpoint.name}-{checkpoint.key}-" \
        f"{digest(FORMAT, spec.bits, spec.group_size)}"
    cached(target, "stand-ins.npz",
           lambda tmp: build_stand_ins(checkpoint, spec, progress).save(tmp / "stand-ins.npz"))
    return StandIns.load(target / "stand-ins.npz", spec)
