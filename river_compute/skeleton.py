"""A decoder layer written once for every engine, as llama.cpp's `build_*` helpers: the
residual structure, attention and MLP over the primitives each engine supplies over its own
tensors (`Primitives`), and one record of a layer's weights as an engine holds them
(`BoundLayer`). What a family changes in the block is decided here, each in one place: the
sandwich norms (`decoder_layer`), the per-head q/k norms and the query scale (`attention`); its
biases and partial rotary are in the weights and tables the primitives carry."""

from __future__ import annotations

from typing import Any, Callable, Generic, Mapping, TypeVar

import attrs

from river_models.spec import FUSED, NORMS

N, P = TypeVar("N"), TypeVar("P")


@attrs.frozen(eq=False)
class BoundLayer(Generic[N, P]):
    """One layer's weights in an engine's own form, bound once: each of `NORMS` (None where
    the family has none) and each projection of `FUSED` (q, k and v of one input as one
    product; gate and up likewise)."""

    norms: Mapping[str, N | None]
    proj: Mapping[str, P]

    @classmethod
    def bind(cls, norm: Callable[[str], N | None], project: Callable[[str], P]) -> BoundLayer:
        """The layer from the engine's reading of each norm and each fused projection."""
        return cls({n: norm(n) for n in NORMS}, {f: project(f) for f in FUSED})


class Primitives:
    """What an engine supplies to run one layer of one step over its tensors: `layer`, the
    step's `query_scale` (per-token factors, None where the model has none) and the
    operations below. Each keeps its own layout: what `project` gives, `attend` takes."""

    layer: BoundLayer
    query_scale: Any = None

    def norm(self, h, weight):
        """RMSNorm of the states h by a norm of `layer.norms`."""
        raise NotImplementedError

    def head_norm(self, a, weight, part: str):
        """The per-head norm of queries or keys (`part` "q" or "k") as `project` gave them."""
        return self.norm(a, weight)

    def project(self, h, name: str, parts: tuple[str, ...] | None = None) -> tuple:
        """The projection `name` of FUSED on h, biases added, one output a part (all of
        FUSED[name], or those `parts`)."""
        raise NotImplementedError

    def rotate(self, q, k) -> tuple:
        """Queries and keys rotated for the step's positions (q None: keys alone)."""
        raise NotImplementedError

    def attend(self, q, k, v):
        """The step's keys and values written into the cache, and the queries' attention over
        the slots they read: the heads' outputs, as the output projection takes them."""
        raise NotImplementedError

    def write(self, k, v) -> None:
        """The step's keys and values written into the cache, nothing attended."""
        raise NotImplementedError

    def activation(self, gate):
        raise NotImplementedError

    def mul(self, a, b):
        return a * b

    def add(self, a, b):
        return a + b


def decoder_layer(x, ops: Primitives, feed_forward=None):
    """(out, mid) of the layer `ops` runs on the states x, mid the state between attention and
    MLP (what the exit rule reads): the input norm, `attention`, the post-attention norm where
    the family has sandwich norms, the residual add, the pre-MLP norm, the MLP (`mlp`, or the
    engine's own `feed_forward` of a normed state) and its post-norm."""
    norms = ops.layer.norms
    a = attention(ops.norm(x, norms["input_norm"]), ops)
    if norms["post_attn_norm"] is not None:
        a = ops.norm(a, norms["post_attn_norm"])
    mid = ops.add(x, a)
    h = ops.norm(mid, norms["pre_mlp_norm"])
    m = mlp(h, ops) if feed_forward is None else feed_forward(h)
    if norms["post_mlp_norm"] is not None:
        m = ops.norm(m, norms["post_mlp_norm"])
    return ops.add(mid, m), mid


def _head_norms(ops: Primitives, q, k):
    """The per-head norms of q and k (q None: keys alone)."""
    norms = ops.layer.norms
    if norms["k_norm"] is None:
        return q, k
    return (None if q is None else ops.head_norm(q, norms["q_norm"], "q"),
            ops.head_norm(k, norms["k_norm"], "k"))


def attention(h, ops: Primitives):
    """The attention sub-block on the normed states h: its output before any post-norm."""
    q, k, v = ops.project(h, "qkv")
    q, k = ops.rotate(*_head_norms(ops, q, k))
    if ops.query_scale is not None:   # after the rotary, as transformers
        q = ops.mul(q, ops.query_scale)
    return ops.project(ops.attend(q, k, v), "o")[0]


def keys_values(h, ops: Primitives) -> None:
    """The layer's K/V of the states h (before its input norm) written, the layer not run."""
    k, v = ops.project(ops.norm(h, ops.layer.norms["input_norm"]), "qkv", ("k", "v"))
    ops.write(ops.rotate(*_head_norms(ops, None, k))[1], v)


def mlp(h, ops: Primitives):
    """The gated MLP on the normed states h: its output before any post-norm."""
    gate, up = ops.project(h, "gate_up")
    return ops.project(ops.mul(ops.activation(gate), up), "down")[0]
