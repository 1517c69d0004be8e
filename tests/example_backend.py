"""A minimal third-party backend in plain numpy: what an author writes to plug into River.

Everything a backend computes is here, for the Llama, Mistral and Qwen2 families (no per-head
norms, no sandwich norms): the core's `LayerEngine` keeps the cache's bookkeeping (positions,
prefill, verification, rewinds, absent entries), so this file holds only numerics. It reads
the model from the model package (`river_models`) and takes padding, positions and masks from
the core's `Layout`. Its stand-ins run the model package's quantized weights, dequantized:
correct, not fast. The conformance kit runs it like any other backend
(test_example_backend.py).

Registered in the author's pyproject.toml:

    [project.entry-points.river_core]
    example = "example_backend"
"""

from __future__ import annotations


import numpy as np

from river_core.backend import Capabilities
from river_core.cache import KVCache
from river_core.errors import CapabilityError
from river_core.footprint import Footprint
from river_core.layer_engine import LayerEngine
from river_core.layout import Layout
from river_core.hookspecs import hookimpl
from river_models import Checkpoint, StandIns, tiny


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1 + np.exp(-x))


def cosine(a, b):
    return (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1),
                                         1e-30)


class NumpyBackend(LayerEngine):
    name = "example"

    def __init__(self, checkpoint: Checkpoint, quantized: StandIns) -> None:
        spec = checkpoint.spec
        partial = any(2 * len(r.inv_freq) != spec.head_dim for r in spec.rotary.values())
        if spec.qk_norm or spec.sandwich or spec.activation != "silu" or partial or \
                spec.query_scale is not None:
            raise CapabilityError("the example backend runs the Llama, Mistral and Qwen2 families")
        self.spec, self.w = spec, checkpoint.weights
        # a stand-in is its layer with every projection replaced by its quantized copy
        self.stand_in_weights = [{n: q.dequantize() for n, q in layer.items()}
                                 for layer in quantized.layers]
        self.stand_in_error = list(quantized.errors)
        self.stand_in_head = quantized.head.dequantize()
        self.num_layers, self.max_positions = spec.num_layers, spec.max_positions
        self.capabilities = Capabilities(exits=True, stand_in=True, propagate=True, mask=True,
                                         recompute=True, sub_blocks=True, verify=True,
                                         batch=True)
        self.runs_on = ("cpu",)
        self.tokenizer = checkpoint.tokenizer

    # -- what the engine base asks for ------------------------------------------------------

    def new_cache(self, layout: Layout) -> KVCache:
        shape = (self.num_layers, layout.batch, self.spec.kv_heads, layout.capacity,
                 self.spec.head_dim)
        return KVCache(np.full(shape, np.nan, np.float32), np.full(shape, np.nan, np.float32),
                       layout)

    def begin(self, start: int, end: int) -> None:
        """Nothing to prepare: rotary angles and masks are computed per layer (slow, plain)."""

    def embed_ids(self, ids: np.ndarray) -> np.ndarray:
        return self.w.embed[ids] * self.spec.embed_scale

    def token_similarity(self, before, after) -> np.ndarray:
        return cosine(before, after)

    def position_logits(self, h) -> np.ndarray:
        return self._head(h[0])

    def to_numpy(self, array) -> np.ndarray:
        return array.copy()

    def _rope(self, x, rows, start, end):
        positions = self.cache.layout.positions(start, end)[rows]
        cos, sin = self.spec.rotary[""].angles(positions)
        half = x.shape[-1] // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos[:, None] + rotated * sin[:, None]

    # -- the layer --------------------------------------------------------------------------

    def _heads(self, y, count):
        """[b, t, count * hd] -> [b, count, t, hd]"""
        b, t, _ = y.shape
        return y.reshape(b, t, count, self.spec.head_dim).transpose(0, 2, 1, 3)

    def _linear(self, i, name, x, proj):
        y = x @ proj[name].T
        bias = self.w.layers[i].biases.get(name)
        return y if bias is None else y + bias

    def _write_kv(self, i, xn, rows, proj, start, end):
        """This layer's K/V of the normalised inputs `xn` of `rows`, into the cache."""
        k = self._rope(self._heads(self._linear(i, "k", xn, proj), self.spec.kv_heads), rows,
                       start, end)
        v = self._heads(self._linear(i, "v", xn, proj), self.spec.kv_heads)
        self.cache.write(i, rows, k, v, start, end)

    def _block(self, i, h, rows, proj, start=None):
        """Layer i (backbone or stand-in weights `proj`) for `rows`, queries start..end-1:
        the new state of the batch, and the rows' state between attention and MLP."""
        layout = self.cache.layout
        start, end = self.cache.start if start is None else start, self.cache.end
        rows = list(range(h.shape[0])) if rows is None else list(rows)
        layer, spec = self.w.layers[i], self.spec
        x = h[rows]
        xn = rms_norm(x, layer.input_norm, spec.norm_eps)
        q = self._rope(self._heads(self._linear(i, "q", xn, proj), spec.heads), rows, start, end)
        self._write_kv(i, xn, rows, proj, start, end)
        window = spec.windows[i]
        lo = layout.first_key(start, end, window)
        keys = np.repeat(self.cache.k[i, rows, :, lo:end], spec.group, axis=1)
        values = np.repeat(self.cache.v[i, rows, :, lo:end], spec.group, axis=1)
        scores = q @ keys.transpose(0, 1, 3, 2) * spec.attn_scale
        scores = np.where(layout.mask(start, end, window, i)[rows][:, None], scores, -np.inf)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        a = (p / p.sum(-1, keepdims=True)) @ values
        x = x + self._linear(i, "o", a.transpose(0, 2, 1, 3).reshape(*x.shape[:2], -1), proj)
        xn = rms_norm(x, layer.pre_mlp_norm, spec.norm_eps)
        m = silu(self._linear(i, "gate", xn, proj)) * self._linear(i, "up", xn, proj)
        out = h.copy()
        out[rows] = x + self._linear(i, "down", m, proj)
        return out, x

    # -- the contract -----------------------------------------------------------------------

    def layer(self, i: int, h, rows, sub_blocks: bool = False):
        out, mid = self._block(i, h, rows, self.w.layers[i].projections)
        if not sub_blocks:
            return out, None
        rows = list(range(h.shape[0])) if rows is None else list(rows)
        before, mid, after = h[rows, -1], mid[:, -1], out[rows, -1]
        return out, np.stack([cosine(before, mid), cosine(mid, after)], -1)

    def stand_in_layer(self, i: int, h, rows):
        return self._block(i, h, rows, self.stand_in_weights[i])[0]

    def project_kv(self, i: int, h, rows) -> None:
        rows = list(range(h.shape[0])) if rows is None else list(rows)
        xn = rms_norm(h[rows], self.w.layers[i].input_norm, self.spec.norm_eps)
        self._write_kv(i, xn, rows, self.w.layers[i].projections, self.cache.start,
                       self.cache.end)

    def layer_span(self, i: int, states, start: int):
        out, _ = self._block(i, np.concatenate(states, axis=1), None,
                             self.w.layers[i].projections, start)
        return np.split(out, out.shape[1], axis=1)

    def similarity(self, before, after, rows) -> list[float]:
        cos = cosine(before[:, -1], after[:, -1])
        return (cos if rows is None else cos[list(rows)]).tolist()

    def logits(self, h) -> np.ndarray:
        return self._head(h[:, -1])

    def stand_in_logits(self, h) -> np.ndarray:
        return self._head(h[:, -1], self.stand_in_head)

    def _head(self, x, weight=None):
        weight = self.w.head if weight is None else weight
        return rms_norm(x, self.w.final_norm, self.spec.norm_eps) @ weight.T

    def footprint(self) -> Footprint:
        layers = self.w.layers
        return Footprint(tuple(l.projection_bytes() for l in layers),
                         tuple(sum(w.nbytes for w in s.values()) for s in self.stand_in_weights),
                         tuple(l.projection_bytes(("k", "v")) for l in layers), self.w.head.nbytes,
                         2 * self.spec.kv_heads * self.spec.head_dim * 4, self.stand_in_head.nbytes)


def make(family: str, seed: int, bits: int) -> NumpyBackend:
    """The example backend over a tiny random model."""
    checkpoint = tiny.checkpoint(family, seed)
    return NumpyBackend(checkpoint, tiny.stand_ins(checkpoint, bits))


@hookimpl
def river_conformance_backends():
    return {"example": make}
