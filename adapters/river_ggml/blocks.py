"""A decoder block and the head as ggml graphs over a GGUF's tensors, llama.cpp's way.

A block's graph takes one step's states x [tokens, hidden] and its per-step inputs (positions,
the slots it writes, the attention mask over the first `keys` slots, the rotary frequency
factors, Ministral 3's query scale), writes the step's K/V into the layer's F16 cache with
`set_rows` (slots are an input, so one graph serves every step of its shape) and attends the
first `keys` slots with `flash_attn_ext`. Its outputs are the block's output and the state
between attention and MLP (what the paper's exit rule compares).

Rotary: every table of the ModelSpec is given to ggml as frequency factors over a fixed base
(factor_i = BASE^(-2i/d) / inv_freq_i), so one path runs plain, llama3-scaled, LongRoPE and
per-layer tables alike. Heads rotate as the GGUF stores them: llama's Q/K rows are permuted
by llama.cpp's converter for ggml's normal rotation, the other families' run NeoX rotation.
"""

from __future__ import annotations

import numpy as np

from river_core.errors import ModelError
from river_models.spec import ModelSpec

from .lib import Graph, MappedGGUF, g

BASE = 10000.0
# llama.cpp's rotation per GGUF architecture (src/llama-model.cpp, llama_model_rope_type), for
# those checked against transformers on a tiny GGUF of each (tests/test_ggml.py)
NEOX = g.GGML_ROPE_TYPE_NEOX
ROPE_MODE = {"llama": 0, "mistral3": 0, "qwen2": NEOX, "qwen3": NEOX, "gemma3": NEOX,
             "phi3": NEOX}
F32, F16, I32, I64 = g.GGML_TYPE_F32, g.GGML_TYPE_F16, g.GGML_TYPE_I32, g.GGML_TYPE_I64


def rope_mode(arch: str) -> int:
    if arch not in ROPE_MODE:
        raise ModelError(f"the ggml engine runs GGUF architectures {', '.join(ROPE_MODE)}, "
                         f"not {arch}")
    return ROPE_MODE[arch]


def frequency_factors(inv_freq) -> np.ndarray:
    """ggml's divisors of BASE's frequencies that give `inv_freq`."""
    inv_freq = np.asarray(inv_freq, np.float64)
    plain = BASE ** (-np.arange(len(inv_freq)) * 2 / (2 * len(inv_freq)))
    return (plain / inv_freq).astype(np.float32)


class Layer:
    """One layer's tensors (the backbone's or its stand-in's) and its fixed settings."""

    def __init__(self, weights: MappedGGUF, norms: MappedGGUF, i: int, spec: ModelSpec,
                 mode: int, cache_k, cache_v) -> None:
        def w(source: MappedGGUF, name: str, required: bool = True):
            t = source.get(f"blk.{i}.{name}")
            if t is None and required:
                raise ModelError(f"{source.path.name} lacks blk.{i}.{name}")
            return t

        self.spec, self.i, self.mode = spec, i, mode
        self.fused_qkv = w(weights, "attn_qkv.weight", False)
        if self.fused_qkv is None:
            self.q, self.k, self.v = (w(weights, f"attn_{n}.weight") for n in "qkv")
        self.qkv_bias = [w(norms, f"attn_{n}.bias", False) for n in "qkv"]
        self.o = w(weights, "attn_output.weight")
        self.gate = w(weights, "ffn_gate.weight", False)   # None: fused into ffn_up (Phi-3)
        self.up, self.down = w(weights, "ffn_up.weight"), w(weights, "ffn_down.weight")
        self.attn_norm, self.ffn_norm = w(norms, "attn_norm.weight"), w(norms, "ffn_norm.weight")
        self.q_norm, self.k_norm = w(norms, "attn_q_norm.weight", False), \
            w(norms, "attn_k_norm.weight", False)
        self.post_attn = w(norms, "post_attention_norm.weight", False)
        self.post_ffn = w(norms, "post_ffw_norm.weight", False)
        self.cache_k, self.cache_v = cache_k, cache_v

    def _inputs(self, tokens: int, keys: int | None) -> dict:
        """A graph's inputs; with `keys` (attention over that many slots) the mask and the
        query scale too."""
        s = self.spec
        inputs = {"x": (F32, [s.hidden, tokens]), "pos": (I32, [tokens]),
                  "slots": (I64, [tokens]), "factors": (F32, [self._rotary_pairs()])}
        if keys is not None:
            inputs["mask"] = (F16, [keys, tokens])
            if s.query_scale is not None:
                inputs["qscale"] = (F32, [1, 1, tokens])
        return inputs

    def _rotary_pairs(self) -> int:
        return len(self.spec.rotary[self.spec.rope_keys[self.i]].inv_freq)

    def graph(self, tokens: int, keys: int) -> Graph:
        """The block: outputs `out` and `mid` [tokens, hidden]."""
        return Graph(self._inputs(tokens, keys), lambda ctx, t: self._block(ctx, t, tokens, keys))

    def block(self, ctx, t: dict, tokens: int, keys: int) -> dict:
        """The block's ops in a graph being built (`span_graph`), from inputs `t`."""
        return self._block(ctx, t, tokens, keys)

    def kv_graph(self, tokens: int) -> Graph:
        """The step's K/V of this layer written from x without running it (`propagate`)."""
        return Graph(self._inputs(tokens, None),
                     lambda ctx, t: dict(zip("kv", self._kv(ctx, t, tokens, False)[1:])))

    def _norm(self, ctx, a, weight):
        return g.ggml_mul(ctx, g.ggml_rms_norm(ctx, a, self.spec.norm_eps), weight)

    def _kv(self, ctx, t, tokens: int, queries: bool):
        """(q or None, K and V as written into the cache): the projections of the normed
        input, rotated, the step's K/V stored in its slots."""
        s, hd = self.spec, self.spec.head_dim
        h = self._norm(ctx, t["x"], self.attn_norm)
        if self.fused_qkv is not None:
            qkv = g.ggml_mul_mat(ctx, self.fused_qkv, h)
            sizes = [s.heads * hd, s.kv_heads * hd, s.kv_heads * hd]
            offsets = np.cumsum([0] + sizes[:-1])
            q, k, v = (g.ggml_cont(ctx, g.ggml_view_2d(ctx, qkv, n, tokens, qkv.contents.nb[1],
                                                        int(o) * 4))
                       for n, o in zip(sizes, offsets))
        else:
            q = g.ggml_mul_mat(ctx, self.q, h) if queries else None
            k, v = (g.ggml_mul_mat(ctx, m, h) for m in (self.k, self.v))
        q, k, v = (a if a is None or b is None else g.ggml_add(ctx, a, b)
                   for a, b in zip((q, k, v), self.qkv_bias))
        k = g.ggml_reshape_3d(ctx, k, hd, s.kv_heads, tokens)
        v = g.ggml_reshape_3d(ctx, v, hd, s.kv_heads, tokens)
        if self.k_norm is not None:
            k = self._norm(ctx, k, self.k_norm)
        k = self._rope(ctx, t, k)
        if queries:
            q = g.ggml_reshape_3d(ctx, q, hd, s.heads, tokens)
            if self.q_norm is not None:
                q = self._norm(ctx, q, self.q_norm)
            q = self._rope(ctx, t, q)
            if "qscale" in t:
                q = g.ggml_mul(ctx, q, t["qscale"])
        # the step's K/V into its slots of the layer's cache [hd, capacity, kv_heads]
        kw = g.ggml_set_rows(ctx, self.cache_k, g.ggml_permute(ctx, k, 0, 2, 1, 3), t["slots"])
        vw = g.ggml_set_rows(ctx, self.cache_v, g.ggml_permute(ctx, v, 0, 2, 1, 3), t["slots"])
        return (q if queries else None), kw, vw

    def _rope(self, ctx, t, a):
        rotary = self.spec.rotary[self.spec.rope_keys[self.i]]
        return g.ggml_rope_ext(ctx, a, t["pos"], t["factors"], 2 * self._rotary_pairs(),
                               self.mode, 0, BASE, 1.0, 0.0, rotary.scaling, 32.0, 1.0)

    def _block(self, ctx, t, tokens: int, keys: int) -> dict:
        s, hd = self.spec, self.spec.head_dim
        x = t["x"]
        q, kw, vw = self._kv(ctx, t, tokens, True)
        c = self.cache_k.contents
        kv = [g.ggml_view_3d(ctx, a, hd, keys, s.kv_heads, c.nb[1], c.nb[2], 0) for a in (kw, vw)]
        attn = g.ggml_flash_attn_ext(ctx, g.ggml_permute(ctx, q, 0, 2, 1, 3), kv[0], kv[1],
                                     t["mask"], s.attn_scale, 0.0, 0.0)
        g.ggml_flash_attn_ext_set_prec(attn, g.GGML_PREC_F32)
        attn = g.ggml_mul_mat(ctx, self.o, g.ggml_reshape_2d(ctx, attn, hd * s.heads, tokens))
        if self.post_attn is not None:
            attn = self._norm(ctx, attn, self.post_attn)
        mid = g.ggml_add(ctx, x, attn)
        h = self._norm(ctx, mid, self.ffn_norm)
        if self.gate is None:
            gate_up = g.ggml_mul_mat(ctx, self.up, h)
            n = s.intermediate
            gate, up = (g.ggml_cont(ctx, g.ggml_view_2d(ctx, gate_up, n, tokens,
                                                        gate_up.contents.nb[1], o * n * 4))
                        for o in (0, 1))
        else:
            gate, up = g.ggml_mul_mat(ctx, self.gate, h), g.ggml_mul_mat(ctx, self.up, h)
        act = g.ggml_silu(ctx, gate) if s.activation == "silu" else g.ggml_gelu(ctx, gate)
        down = g.ggml_mul_mat(ctx, self.down, g.ggml_mul(ctx, act, up))
        if self.post_ffn is not None:
            down = self._norm(ctx, down, self.post_ffn)
        return {"out": g.ggml_add(ctx, mid, down), "mid": mid}


def span_graph(layers: "list[Layer]", tokens: int, keys: int) -> Graph:
    """`layers` in turn as one graph, `x` in and `out` [tokens, hidden] out: the exit river's
    tail or the whole backbone in one compute, where no decision reads the host between
    layers (a graph a layer costs some tens of microseconds from Python: docs/backends.md).
    Each layer takes its own mask and frequency factors (`mask{j}`, `factors{j}`, j its place
    in the span)."""
    first = layers[0]._inputs(tokens, keys)
    inputs = {k: v for k, v in first.items() if k not in ("mask", "factors")}
    for j, layer in enumerate(layers):
        own = layer._inputs(tokens, keys)
        inputs[f"mask{j}"], inputs[f"factors{j}"] = own["mask"], own["factors"]

    def build(ctx, t):
        x = t["x"]
        for j, layer in enumerate(layers):
            x = layer.block(ctx, {**t, "x": x, "mask": t[f"mask{j}"],
                                  "factors": t[f"factors{j}"]}, tokens, keys)["out"]
        return {"out": x}
    return Graph(inputs, build)


def head_graph(spec: ModelSpec, final_norm, weight, rows: int) -> Graph:
    """Final norm and LM head of `rows` states: logits [rows, vocab]."""
    def build(ctx, t):
        h = g.ggml_mul(ctx, g.ggml_rms_norm(ctx, t["x"], spec.norm_eps), final_norm)
        logits = g.ggml_mul_mat(ctx, weight, h)
        if spec.final_softcap:
            cap = spec.final_softcap
            logits = g.ggml_scale(ctx, g.ggml_tanh(ctx, g.ggml_scale(ctx, logits, 1 / cap)), cap)
        return {"logits": logits}
    return Graph({"x": (F32, [spec.hidden, rows])}, build)
