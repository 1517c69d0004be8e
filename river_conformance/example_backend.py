"""A minimal third-party backend in plain numpy: what an author writes to plug into River,
and the template a new engine starts from (docs/architecture.md walks through it).

Everything a backend computes is here, for the plain block (no per-head norms, no sandwich
norms, SiLU, the whole head rotated, no query scale): the core's
`LayerEngine` keeps the cache's bookkeeping (positions, prefill, verification, row selection,
absent entries) and `NumpyArrays` the array glue, so
this file holds only numerics: `allocate`, `make_pass` (the step's rotary tables beside the
core's slots and masks), `embed_ids`, `run_block` over the step's `Pass`, `head`, and
`project_kv` for the `propagate` strategy; the layer itself is the model package's
`skeleton.decoder_layer` over this engine's primitives (`NumpyLayer`). It reads the model from the model package
(`river_models`) and takes padding, positions, slots and masks from the core's
`Layout.view`. Its stand-ins run the model package's quantized weights, dequantized: correct,
not fast. The conformance kit runs it like any other backend (tests/test_example_backend.py).

Registered in the author's pyproject.toml:

    [project.entry-points.river_core]
    example = "my_package.example_backend"
"""

from __future__ import annotations


import numpy as np

from river_core.contract.backend import Capabilities, Pass
from river_core.settings.errors import CapabilityError
from river_core.contract.footprint import Footprint
from river_core.contract.layer_engine import LayerEngine, NumpyArrays
from river_core.contract.layout import View
from river_core.contract.hookspecs import hookimpl
from river_compute.skeleton import BoundLayer, Primitives, decoder_layer, keys_values
from river_conformance.fixtures import tiny
from river_models import Checkpoint, StandInWeights
from river_models.spec import FUSED, LayerWeights


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
        # each layer bound once: its norms and, by fused name, each part's (weight, bias)
        self.blocks = [bind(layer, layer.projections) for layer in self.w.layers]
        self.stand_in_blocks = [bind(layer, weights) for layer, weights
                                in zip(self.w.layers, self.stand_in_weights)]
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
        block = (self.stand_in_blocks if stand_in else self.blocks)[i]
        out, mid = decoder_layer(x, NumpyLayer(self, p, i, idx, block))
        if mids is not None:
            mids.append(mid)
        return out

    def head(self, x, stand_in: bool = False) -> np.ndarray:
        weight = self.stand_in_head if stand_in else self.w.head
        return rms_norm(x, self.w.final_norm, self.spec.norm_eps) @ weight.T

    # -- the contract beyond the base -------------------------------------------------------

    def project_kv(self, p: Pass, i: int, h, rows) -> None:
        idx = None if rows is None else p.index(rows, self.make_index)
        keys_values(h if idx is None else h[idx],
                    NumpyLayer(self, p, i, idx, self.blocks[i]))

    def footprint(self) -> Footprint:
        layers = self.w.layers
        return Footprint(tuple(l.projection_bytes() for l in layers),
                         tuple(sum(w.nbytes for w in s.values()) for s in self.stand_in_weights),
                         tuple(l.projection_bytes(("k", "v")) for l in layers), self.w.head.nbytes,
                         2 * self.spec.kv_heads * self.spec.head_dim * 4, self.stand_in_head.nbytes)


def bind(layer: LayerWeights, projections) -> BoundLayer:
    """`layer`'s norms and, by fused name, each part's (weight, bias), the weights from
    `projections` (the layer's own or its stand-in's)."""
    return BoundLayer.bind(lambda n: getattr(layer, n), lambda f: {
        part: (projections[part], layer.biases.get(part)) for part in FUSED[f]})


class NumpyLayer(Primitives):
    """The skeleton's primitives in numpy: layer i of pass `p` (its weights `block`, the
    layer's or its stand-in's) on rows `idx` of the batch (None: all). States are [batch,
    tokens, hidden]; queries, keys and values [batch, heads, tokens, head_dim]."""

    def __init__(self, engine: NumpyBackend, p: Pass, i: int, idx, block: BoundLayer) -> None:
        self.engine, self.spec, self.layer, self.p, self.i, self.idx = \
            engine, engine.spec, block, p, i, idx

    def norm(self, h, weight):
        return rms_norm(h, weight, self.spec.norm_eps)

    def project(self, h, name: str, parts=None) -> tuple:
        out = []
        for part in parts or FUSED[name]:
            weight, bias = self.layer.proj[name][part]
            y = h @ weight.T
            y = y if bias is None else y + bias
            if name == "qkv":   # [b, t, count * hd] -> [b, count, t, hd]
                y = y.reshape(*h.shape[:2], -1, self.spec.head_dim).transpose(0, 2, 1, 3)
            out.append(y)
        return tuple(out)

    def rotate(self, q, k) -> tuple:
        cos, sin = self.p.rope[self.i]
        if self.idx is not None:
            cos, sin = cos[self.idx], sin[self.idx]

        def turn(x):
            half = x.shape[-1] // 2
            rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
            return x * cos[:, None] + rotated * sin[:, None]
        return (None if q is None else turn(q)), turn(k)

    def activation(self, gate):
        return silu(gate)

    def write(self, k, v) -> None:
        self.engine.cache.write(self.i, self.idx, k, v, self.p.step.start, self.p.step.end)

    def attend(self, q, k, v):
        spec, i, cache = self.spec, self.i, self.engine.cache
        rows = slice(None) if self.idx is None else self.idx
        self.write(k, v)
        slots = self.p.slots[i]
        keys = np.repeat(cache.k[i][rows][:, :, slots], spec.group, axis=1)
        values = np.repeat(cache.v[i][rows][:, :, slots], spec.group, axis=1)
        scores = q @ keys.transpose(0, 1, 3, 2) * spec.attn_scale
        scores = np.where(self.p.masks[i][rows][:, None], scores, -np.inf)
        e = np.exp(scores - scores.max(-1, keepdims=True))
        a = (e / e.sum(-1, keepdims=True)) @ values
        return a.transpose(0, 2, 1, 3).reshape(*q.shape[:1], q.shape[2], -1)


def make(family: str, seed: int, bits: int) -> NumpyBackend:
    """The example backend over a tiny random model."""
    checkpoint = tiny.checkpoint(family, seed)
    return NumpyBackend(checkpoint, tiny.stand_ins(checkpoint, bits))


@hookimpl
def river_conformance_backends():
    return {"example": make}
