"""Weight-only quantization of the stand-in layers, in one engine-neutral form. No data needed.

A `QuantWeight` keeps one integer code per weight and, per group of input columns of each
output row, a float scale and a float zero point: w ~ (code - zero) * scale. Every backend
converts this one form into its own kernel layout, so all engines run the same stand-ins.

- 8 bits: symmetric, one scale per output row (zero point 128).
- 4 bits: asymmetric, one scale and zero point per group of `group_size` columns, by
  - `rtn`: round to nearest over the group's min..max;
  - `hqq`: Half-Quadratic Quantization (Badri and Shaji, 2023), the paper's default: from the
    same start, a few proximal steps move each group's zero point to minimise an l_p (p < 1)
    norm of the weight error, which spends fewer codes on outliers. Same settings and early
    stop as the `hqq` package's `optimize_weights_proximal_legacy` (tested against it).
  - `sym`: symmetric, the zero point fixed at 8 (codes -8..7 about it), the grid ggml's Q4_0
    blocks run, repacked 1.5x faster than its Q4_1 on an AVX2 CPU (docs/backends.md): each
    group's scale the least-squares best of a grid of candidates (llama.cpp's
    `make_qx_quants` idea), then refitted by least squares to the codes it gives.

`weight_error` is the one definition of a stand-in's relative weight error
||Q(W) - W|| / ||W|| over a layer's projections, which the predictor and the K/V bound use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import attrs
import numpy as np

from river_core.settings.config import QuantSpec
from river_core.settings.errors import ConfigError

from .cache import cache_root, cached, digest
from .spec import PROJECTIONS, Checkpoint, LayerWeights

FORMAT = 4   # bump when the quantizers change: old cached stand-ins are then ignored
GROUPS = (256, 128, 64, 32)
HQQ = {"lp_norm": 0.7, "beta": 10.0, "iters": 20}
# The head's stand-in picks a draft's token among the whole vocabulary; at 4 bits it cost
# the embedded model draft acceptance that 8 bits keep, for a little more time
# (docs/results/levers.md, "draft_head").
HEAD = QuantSpec(bits=8)


@attrs.frozen(eq=False)
class QuantWeight:
    codes: np.ndarray   # uint8 [rows, columns]
    scale: np.ndarray   # float32 [rows, groups]
    zero: np.ndarray    # float32 [rows, groups]
    bits: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape

    @property
    def group(self) -> int:
        """Input columns per scale."""
        return self.codes.shape[1] // self.scale.shape[1]

    @classmethod
    def stack(cls, parts: "list[QuantWeight]") -> "QuantWeight":
        """The weights of several projections of the same input, as one (rows concatenated):
        what a fused Q/K/V or gate/up matmul runs."""
        return cls(*(np.concatenate([getattr(p, f) for p in parts])
                     for f in ("codes", "scale", "zero")), parts[0].bits)

    def dequantize(self) -> np.ndarray:
        rows, columns = self.shape
        codes = self.codes.reshape(rows, -1, self.group).astype(np.float32)
        return ((codes - self.zero[..., None]) * self.scale[..., None]).reshape(rows, columns)


def group_size(requested: int, columns: int) -> int:
    """The requested group, or the largest supported one dividing the layer's width."""
    for g in (requested, *GROUPS):
        if g <= columns and columns % g == 0:
            return g
    raise ConfigError(f"a 4-bit stand-in needs layer widths divisible by 32, got {columns}")


def _shrink(x: np.ndarray, beta: float, p: float) -> np.ndarray:
    """The l_p proximal operator of HQQ: soft-thresholding by |x|^(p-1) / beta."""
    ax = np.abs(x)
    return np.sign(x) * np.maximum(ax - np.power(ax, p - 1) / beta, 0)


def hqq_zero(w: np.ndarray, inverse_scale: np.ndarray, zero: np.ndarray, top: int) -> np.ndarray:
    """HQQ's proximal steps on the zero points of groups w [..., g] (HQQ's convention:
    code = w * inverse_scale + zero), stopping when the mean absolute error stops falling."""
    p, beta = HQQ["lp_norm"], HQQ["beta"]
    inv, z = inverse_scale[..., None], zero[..., None]
    best = np.inf
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(HQQ["iters"]):
            q = np.clip(np.round(w * inv + z), 0, top)
            restored = (q - z) / inv
            z = np.mean(q - (w - _shrink(w - restored, beta, p)) * inv, axis=-1, keepdims=True)
            error = np.abs(w - restored).mean()
            if not error < best:
                break
            best = error
    return z[..., 0]


def symmetric_scale(wg: np.ndarray, top: int) -> np.ndarray:
    """Each group's scale for codes round(w / scale) clipped to -(top + 1) / 2 .. top // 2
    (the zero point fixed at (top + 1) / 2): the candidate of least squared error among
    -extreme / k for k over a grid about the largest code, each refitted to its own codes.
    The scale takes the sign that puts the group's extreme on the wider, negative side of the
    grid (ggml's Q4_0 does the same), so it may be negative. Codes in float32 in place, each
    candidate's error from three per-group sums in float64 (||w||^2 - 2 s w.c + s^2 c.c): 4x
    faster than a pass per term, the most of a first call's stand-ins (issue 52)."""
    half = (top + 1) // 2
    wg = np.asarray(wg, np.float32)
    signed = np.take_along_axis(wg, np.abs(wg).argmax(-1)[..., None], -1).astype(np.float64)
    dot = lambda a, b: np.einsum("...i,...i->...", a, b, dtype=np.float64)[..., None]
    energy = dot(wg, wg)
    best_error, best_scale = np.full(energy.shape, np.inf), np.zeros(energy.shape)
    codes = np.empty_like(wg)

    def keep(scale: np.ndarray) -> np.ndarray:
        """Keeps `scale` where its codes fit better; returns the scale refitted to them."""
        nonlocal best_error, best_scale
        np.divide(wg, scale.astype(np.float32), out=codes)
        np.clip(np.round(codes, out=codes), -half, half - 1, out=codes)
        # codes are small integers: their squares' sums are exact in float32 (under 2^24),
        # so float64's result at float32's speed (a fifth of the quantizer's time)
        cross = dot(wg, codes)
        square = np.einsum("...i,...i->...", codes, codes)[..., None].astype(np.float64)
        error = energy - 2 * scale * cross + scale * scale * square
        better = np.isfinite(error) & (error < best_error)
        best_error = np.where(better, error, best_error)
        best_scale = np.where(better, scale, best_scale)
        return cross / square

    with np.errstate(divide="ignore", invalid="ignore"):
        for k in np.linspace(half - 1.5, half + 0.5, 9):
            # the extreme on -k (its sign kept): the wider side of the grid; k = half is
            # ggml's own Q4_0 scale
            keep(keep(-signed / k))
    # an all-zero group: any scale, codes at the zero point
    return np.where(np.isfinite(best_scale) & (best_scale != 0), best_scale, 1.0)[..., 0]


def quantize(w: np.ndarray, spec: QuantSpec) -> QuantWeight:
    """w: float [rows, columns] (y = x w^T)."""
    w = np.asarray(w, dtype=np.float32)
    rows, columns = w.shape
    if spec.bits == 8:   # one scale per row; with `sym` per group (ggml's Q8_0 at 32)
        width = group_size(spec.group_size, columns) if spec.method == "sym" else columns
        wg = w.reshape(rows, columns // width, width)
        scale = np.maximum(np.abs(wg).max(-1) / 127, 1e-12).astype(np.float32)
        codes = np.clip(np.round(wg / scale[..., None]) + 128, 1, 255).astype(np.uint8)
        return QuantWeight(codes.reshape(rows, columns), scale,
                           np.full_like(scale, 128), 8)
    g = group_size(spec.group_size, columns)
    wg = w.reshape(rows, columns // g, g)
    top = 2 ** spec.bits - 1
    if spec.method == "sym":
        scale = symmetric_scale(wg, top).astype(np.float32)
        zero = np.full_like(scale, (top + 1) // 2)
        codes = np.clip(np.round(wg / scale[..., None]) + zero[..., None], 0, top)
        return QuantWeight(codes.reshape(rows, columns).astype(np.uint8), scale, zero, spec.bits)
    lo, hi = wg.min(-1), wg.max(-1)
    inverse = (top / np.maximum(hi - lo, 1e-8)).astype(np.float32)
    zero = -lo * inverse
    if spec.method.startswith("hqq"):
        zero = hqq_zero(wg, inverse, zero, top)
    if spec.method.endswith("-int"):
        zero = np.clip(np.round(zero), 0, top)
    codes = np.clip(np.round(wg * inverse[..., None] + zero[..., None]), 0, top)
    return QuantWeight(codes.reshape(rows, columns).astype(np.uint8),
                       (1 / inverse).astype(np.float32), zero.astype(np.float32), spec.bits)


def weight_error(layer: LayerWeights, quantized: Mapping[str, QuantWeight]) -> float:
    """||Q(W) - W|| / ||W|| over all of a layer's quantized projections together."""
    err = norm = 0.0
    for name, q in quantized.items():
        w = layer.projections[name].astype(np.float64)
        err += float(((q.dequantize() - w) ** 2).sum())
        norm += float((w ** 2).sum())
    return (err / norm) ** 0.5 if norm else 0.0


@attrs.frozen(eq=False)
class StandInWeights:
    """The quantized projections of every layer's stand-in, and each layer's weight error:
    the weights an engine builds its stand-ins from (the core's `StandIns` is the protocol of
    an engine that runs them)."""

    spec: QuantSpec
    layers: tuple[Mapping[str, QuantWeight], ...]
    errors: tuple[float, ...]
    head: QuantWeight   # the LM head's stand-in: drafts only pick a token the backbone checks

    def save(self, path: Path) -> None:
        arrays = {"errors": np.asarray(self.errors), "head.codes": self.head.codes,
                  "head.scale": self.head.scale, "head.zero": self.head.zero}
        for i, layer in enumerate(self.layers):
            for name, q in layer.items():
                arrays.update({f"{i}.{name}.codes": q.codes, f"{i}.{name}.scale": q.scale,
                               f"{i}.{name}.zero": q.zero})
        np.savez(path, **arrays)

    @classmethod
    def load(cls, path: Path, spec: QuantSpec) -> "StandInWeights":
        with np.load(path) as f:
            errors = tuple(float(e) for e in f["errors"])
            layers = tuple({name: QuantWeight(f[f"{i}.{name}.codes"], f[f"{i}.{name}.scale"],
                                              f[f"{i}.{name}.zero"], spec.bits)
                            for name in PROJECTIONS} for i in range(len(errors)))
            head = QuantWeight(f["head.codes"], f["head.scale"], f["head.zero"], HEAD.bits)
        return cls(spec, layers, errors, head)


def build_stand_ins(checkpoint: Checkpoint, spec: QuantSpec,
                    progress: bool = False) -> StandInWeights:
    layers, errors = [], []
    from tqdm import tqdm   # here: its import (0.07 s) is paid only where a bar runs

    for layer in tqdm(checkpoint.weights.layers, desc=f"quantizing stand-ins ({spec.label})",
                      unit="layer", disable=not progress):
        q = {name: quantize(layer.projections[name], spec) for name in PROJECTIONS}
        layers.append(q)
        errors.append(weight_error(layer, q))
    head = quantize(checkpoint.weights.head, HEAD)
    return StandInWeights(spec, tuple(layers), tuple(errors), head)


def stand_ins_entry(name: str, model_key: str, spec: QuantSpec) -> tuple[Path, str]:
    """Where the stand-ins at `spec` of a model (its checkpoint's name and content key) live
    in the cache, and the key of their inputs."""
    key = f"{model_key}-{digest(FORMAT, spec.bits, spec.group_size, spec.method)}"
    return cache_root() / "stand-ins" / f"{name}-{key}", key


def stand_ins(checkpoint: Checkpoint, spec: QuantSpec, progress: bool = False,
              cache: bool = True) -> StandInWeights:
    """The checkpoint's stand-ins at `spec`, quantized once and cached in the user cache."""
    if not cache:
        return build_stand_ins(checkpoint, spec, progress)
    target, key = stand_ins_entry(checkpoint.name, checkpoint.key, spec)
    cached(target,
           lambda tmp: build_stand_ins(checkpoint, spec, progress).save(tmp / "stand-ins.npz"),
           key, source=checkpoint.source)
    return StandInWeights.load(target / "stand-ins.npz", spec)
