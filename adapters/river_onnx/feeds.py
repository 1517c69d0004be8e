"""What the onnx engine's graphs take: a step's pass (`OnnxPass`, its tables built once per
step from the layout's view) and each layer's inputs from it. The engine (backend.py) and the
activation meter of the half-precision exports (activations.py) feed the same graphs."""

from __future__ import annotations

import attrs
import numpy as np

from river_core.contract.backend import Pass
from river_core.contract.layout import View
from river_models import ModelSpec


@attrs.frozen(eq=False)
class OnnxPass(Pass):
    """A step's pass as the graphs take it. `positions` index the rows of each layer's rotary
    table, `rope` (one row of cos and of sin per (row, token)), so a subset of rows keeps
    pointing into the whole step's; `masks` are additive biases [B, 1, T, total] (0 where a
    token attends, else -inf); `read` the slots every layer's graph reads (None: 0..end-1; a
    draft window's slots, which the graphs then read from a copy, backend._bound)."""

    read: np.ndarray | None = None
    causal_branch: bool = False   # the graphs': a layer whose mask is causal has none (None)
    seqlens: np.ndarray | None = None   # GroupQueryAttention's: every row reads all the slots
    total: np.ndarray | None = None     # bound (the bias masks what a row may not see) and
                                        # writes the new tokens in the last T of them


def step_pass(spec: ModelSpec, floats: np.dtype, view: View, ids,
              causal_branch: bool) -> OnnxPass:
    """A step's `OnnxPass` from the layout's `view`: the tables every layer's graphs take, in
    the graphs' float type `floats`; with `causal_branch` (graphs.Graph's), no bias for a
    layer whose mask is causal."""
    positions = view.positions
    tables = {}   # per rotary table: one row of cos and of sin per (row, token)
    for key, rotary in spec.rotary.items():
        cos, sin = rotary.angles(positions)
        half = cos.shape[-1] // 2
        tables[key] = tuple(np.ascontiguousarray(t[..., :half].reshape(-1, half),
                                                 floats) for t in (cos, sin))
    qs = spec.query_scale   # the graphs' qscale input
    biases = view.converted_masks(
        lambda m: None if causal_branch and causal(m) else
        np.where(m, 0, -np.inf).astype(floats)[:, None])
    read = view.slots[0]   # the same for every layer (`windowed_reads` False)
    read = None if isinstance(read, slice) else read
    width = view.step.end if read is None else len(read)
    return OnnxPass(view.step, ids,
                    np.arange(positions.size, dtype=np.int64).reshape(positions.shape),
                    [tables[k] for k in spec.rope_keys],
                    None if qs is None else
                    qs.factors(positions)[..., None].astype(floats),
                    view.slots, biases, read=read, causal_branch=causal_branch,
                    seqlens=np.full(positions.shape[0], width - 1, np.int32),
                    total=np.array(width, np.int32))


def layer_feeds(p: OnnxPass, i: int, x: np.ndarray, idx, attention: bool = True) -> dict:
    """Inputs of layer i's graphs for `x`, the states of rows `idx`: per row, all but the
    rotary tables (the rows' positions keep pointing into the whole step's) and the
    step's total."""
    rows = {"positions": p.positions}
    if attention:
        rows["seqlens"] = p.seqlens
        if p.masks[i] is not None:
            rows["bias"] = p.masks[i]
        if p.query_scale is not None:
            rows["qscale"] = p.query_scale
    if idx is not None:
        rows = {k: v[idx] for k, v in rows.items()}
    cos, sin = p.rope[i]
    feeds = {"h": x, **rows, "cos": cos, "sin": sin}
    if attention:
        feeds.update(total=p.total, **attention_mask(p, i))
    return feeds


def causal(mask: np.ndarray) -> bool:
    """Whether `mask` [batch, tokens, keys] is causal attention over all its keys, the
    tokens being the last keys: what GroupQueryAttention does with no bias."""
    _, tokens, keys = mask.shape
    plain = np.arange(keys)[None, :] <= np.arange(keys - tokens, keys)[:, None]
    return bool((mask == plain).all())


# the bias input of a step that needs none: the graph's causal branch never reads it (its
# shape, one slot, is not checked against the step's)
NO_BIAS = {np.dtype(t): np.zeros((1, 1, 1, 1), t) for t in (np.float32, np.float16)}


def attention_mask(p: OnnxPass, i: int, suffix: str = "") -> dict:
    """Layer i's `masked` flag, and its bias input where it needs none (graphs with a causal
    branch)."""
    if not p.causal_branch:
        return {}
    if p.masks[i] is not None:
        return {f"masked{suffix}": np.array(True)}
    return {f"masked{suffix}": np.array(False), f"bias{suffix}": NO_BIAS[p.rope[i][0].dtype]}
