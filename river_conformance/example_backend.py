"""A minimal third-party backend in plain numpy: what an author writes to plug into River,
and the template a new engine starts from (docs/architecture.md walks through it).

Everything a backend computes is here, for the plain block (no per-head norms, no sandwich
norms, SiLU, the whole head rotated, no query scale: Llama's, Mistral's, Qwen2's): the core's
`LayerEngine` keeps the cache's bookkeeping (positions, prefill, verification, row selection,
absent entries) and `NumpyArrays` the array glue, so
this file holds only numerics: `allocate`, `make_pass` (the step's rotary tables beside the
core's slots and masks), `embed_ids`, `run_block` over the step's `Pass`, `head`, and
`project_kv` for the `propagate` strategy. It reads the model from the model package
(`river_models`) and takes padding, positions, slots and masks from the core's
`Layout.view`. Its stand-ins run the model package's quantized weights, dequantized: correct,
not fast. The conformance kit runs it like any other backend (tests/test_example_backend.py).

Registered in the author's pyproject.toml:

    [project.entry-points.river_core]
    example = "my_package.example_backend"
"""

from __future__ import annotations


import numpy as np

from river_core.backend import Capabilities, Pass
from river_core.errors import CapabilityError
from river_core.footprint import Footprint
from river_core.layer_engine import LayerEngine, NumpyArrays
from river_core.layout import View
from river_core.hookspecs import hookimpl
from river_models import Checkpoint, StandInWeights, tiny
from river_models.skeleton import decoder_layer, norms_of


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1 + np.exp(-x))


class NumpyBackend(NumpyArrays, LayerEngine):
    name = "example"

    def __init__(self, checkpoint: Checkpoint, quantized: StandInWeights) -> None:
        spec = checkpoint.spec
        partial = any(2 * len(r.inv_freq) != spec.head_dim for r in spec.rotary.values())
        if spec.qk_norm or spec.sandwich or spec.activation != "silu" or partial or \
                spec.query_scale is not None:
            raise CapabilityError("the example backend runs the plain block: no q/k or sandwich "
                                  "norms, SiLU, the whole head rotated, no query scale")
        self.spec, self.w = spec, checkpoint.weights
        # a stand-in is its layer with every projection replaced by its quantized copy
        self.stand_in_weights = [{n: q.dequantize() for n, q in layer.items()}
                                 for layer in quantized.layers]
        self.stand_in_error = list(quantized.errors)
        self.stand_in_head = quantized.head.dequantize()
        self.num_layers, self.max_positions = spec.num_layers, spec.max_positions
        self.kv_heads, self.head_dim, self.windows = spec.kv_heads, spec.head_dim, spec.windows
        self.capabilities = Capabilities(exits=True, stand_in=True, propagate=True, mask=True,
                                         recompute=True, sub_blocks=True, verify=True,
                                         windowed_drafts=True, batch=True,
                                         keeps_prefill=True)
        self.runs_on = ("cpu",)
        self.tokenizer = checkpoint.tokenizer

    # -- numerics for the engine base -------------------------------------------------------

    def allocate(self, shape):
        return np.full(shape, np.nan, np.float32), np.full(shape, np.nan, np.float32)

    def make_pass(self, view: View, ids) -> Pass:
        """The core's slots and masks as they are; each layer's rotary angles, made once."""
        angles = {key: rotary.angles(view.positions) for key, rotary in self.spec.rotary.items()}
        return Pass(view.step, ids, view.positions, [angles[k] for k in self.spec.rope_keys],
                    None, view.slots, view.masks)

    def embed_ids(self, ids: np.ndarray) -> np.ndarray:
        return self.w.embed[ids] * self.spec.embed_scale

    def run_block(self, p, i, x, idx, stand_in, mids):
        """Layer i (its stand-in's projections with `stand_in`) on the states `x` of rows
        `idx`."""
        proj = self.stand_in_weights[i] if stand_in else self.w.layers[i].projections
        mlp = lambda xn: self._linear(i, "down", silu(self._linear(i, "gate", xn, proj)) *
                                      self._linear(i, "up", xn, proj), proj)
        norms = norms_of(self.w.layers[i], lambda h, w: rms_norm(h, w, self.spec.norm_eps))
        out, mid = decoder_layer(x, norms, lambda xn: self._attention(p, i, xn, idx, proj), mlp)
        if mids is not None:
            mids.append(mid)
        return out

    def head(self, x, stand_in: bool = False) -> np.ndarray:
        weight = self.stand_in_head if stand_in else self.w.head
        return rms_norm(x, self.w.final_norm, self.spec.norm_eps) @ weight.T

    # -- the layer --------------------------------------------------------------------------

    def _rope(self, p: Pass, i, x, idx):
        cos, sin = p.rope[i]
        if idx is not None:
            cos, sin = cos[idx], sin[idx]
        half = x.shape[-1] // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos[:, None] + rotated * sin[:, None]

    def _heads(self, y, count):
        """[b, t, count * hd] -> [b, count, t, hd]"""
        b, t, _ = y.shape
        return y.reshape(b, t, count, self.spec.head_dim).transpose(0, 2, 1, 3)

    def _linear(self, i, name, x, proj):
        y = x @ proj[name].T
        bias = self.w.layers[i].biases.get(name)
        return y if bias is None else y + bias

    def _write_kv(self, p: Pass, i, xn, idx, proj):
        """This layer's K/V of the normalised inputs `xn` of rows `idx`, into the step's
        slots."""
        k = self._rope(p, i, self._heads(self._linear(i, "k", xn, proj), self.spec.kv_heads), idx)
        v = self._heads(self._linear(i, "v", xn, proj), self.spec.kv_heads)
        self.cache.write(i, idx, k, v, p.step.start, p.step.end)

    def _attention(self, p: Pass, i, xn, idx, proj):
        """Layer i's attention sub-block (weights `proj`) on the normalised states `xn` of
        rows `idx`."""
        spec, rows = self.spec, slice(None) if idx is None else idx
        q = self._rope(p, i, self._heads(self._linear(i, "q", xn, proj), spec.heads), idx)
        self._write_kv(p, i, xn, idx, proj)
        slots = p.slots[i]
        keys = np.repeat(self.cache.k[i][rows][:, :, slots], spec.group, axis=1)
        values = np.repeat(self.cache.v[i][rows][:, :, slots], spec.group, axis=1)
        scores = q @ keys.transpose(0, 1, 3, 2) * spec.attn_scale
        scores = np.where(p.masks[i][rows][:, None], scores, -np.inf)
        e = np.exp(scores - scores.max(-1, keepdims=True))
        a = (e / e.sum(-1, keepdims=True)) @ values
        return self._linear(i, "o", a.transpose(0, 2, 1, 3).reshape(*xn.shape[:2], -1), proj)

    # -- the contract beyond the base -------------------------------------------------------

    def project_kv(self, p: Pass, i: int, h, rows) -> None:
        idx = None if rows is None else p.index(rows, self.make_index)
        x = h if idx is None else h[idx]
        xn = rms_norm(x, self.w.layers[i].input_norm, self.spec.norm_eps)
        self._write_kv(p, i, xn, idx, self.w.layers[i].projections)

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
