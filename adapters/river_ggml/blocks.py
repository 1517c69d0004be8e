"""A decoder block and the head as ggml graphs over a GGUF's tensors, llama.cpp's way.

A block's graph takes one step's states x [rows * tokens, hidden] of `rows` sequences and its
per-step inputs (each token's position, the slots it writes (the same for every row: the
layout left-pads), each row's attention mask over the first `keys` slots, the rotary frequency
factors, the query scale where the model has one), writes the step's K/V into the F16 cache it
is given (`cache`: K and V [head_dim, capacity, kv_heads, rows], the whole batch's or one
row's) with `set_rows` (slots are an input, so one graph serves every step of its shape) and
attends the first `keys` slots with `flash_attn_ext`, rows as its batch dimension. Its outputs
are the block's output and the state between attention and MLP (what the paper's exit rule
compares).

Exactness: a verification (`verification`: a span of one sequence and at most EXACT_WIDTH
tokens, with logits of every token) computes each token bitwise as a decode step of it alone,
as lossless mode needs (`Verifies.extend`). Its products run each column as a plane of its
own (x reshaped to [d, 1, columns]): a one-column plane is what llamafile's sgemm leaves to
ggml's dot product (or a repacked type's gemv), the kernel of a one-token step, where several
columns together would take the sgemm's other summation order. Its attention reads a query at a time over every key
in order (ggml's tiling starts at 64 queries), but a lone query over SPLIT_KEYS keys or more
would have its keys split among threads: such a step runs on ggml's reference kernels
(`reference`, `Cpu.compute`). Prefill chunks keep the sgemm and the tiled attention: both
modes share them. What each way costs: docs/backends.md, "Exact verification".

Rotary: every table of the ModelSpec is given to ggml as frequency factors over a fixed base
(factor_i = BASE^(-2i/d) / inv_freq_i), so one path runs plain, llama3-scaled, LongRoPE and
per-layer tables alike. Heads rotate as the GGUF stores them, each architecture the way its
family's record says (`Gguf.neox`): the normal rotation's Q/K rows permuted by llama.cpp's
converter, the others' NeoX.
"""

from __future__ import annotations

import numpy as np

from river_core.errors import ModelError
from river_models.families import BY_ARCH
from river_models.skeleton import decoder_layer, norms_of
from river_models.spec import ModelSpec

from .lib import Graph, MappedGGUF, g

BASE = 10000.0
F32, F16, I32, I64 = g.GGML_TYPE_F32, g.GGML_TYPE_F16, g.GGML_TYPE_I32, g.GGML_TYPE_I64
EXACT_WIDTH = 32   # the most tokens of one sequence a graph computes as steps of one token
SPLIT_KEYS = 512   # from here ggml's flash attention splits a lone query's keys among threads


def verification(rows: int, tokens: int, head: "tuple[Head, str] | None") -> bool:
    """Whether a span graph is a verification, which computes each token as a graph of it
    alone does (module docstring): one sequence, 2 to EXACT_WIDTH tokens, logits of every
    token. A prefill chunk is not one: it keeps the sgemm, as full depth's own prefill."""
    return rows == 1 and 1 < tokens <= EXACT_WIDTH and head is not None and head[1] == "all"


def reference(rows: int, tokens: int, keys: int) -> bool:
    """Whether a graph runs on ggml's reference kernels: a one-token step of one sequence over
    SPLIT_KEYS keys or more, whose attention would otherwise sum in another order than a
    verification's row (module docstring). Only there: elsewhere they cost a step 7% on the
    embedded model (docs/backends.md, "Exact verification")."""
    return rows == 1 and tokens == 1 and keys >= SPLIT_KEYS


def product(ctx, w, x, columns: bool):
    """w x for states x [d, columns]: [rows of w, columns]; with `columns`, each column by the
    kernel of a one-column product (module docstring)."""
    if not columns or x.contents.ne[1] == 1:
        return g.ggml_mul_mat(ctx, w, x)
    d, n = x.contents.ne[0], x.contents.ne[1]
    y = g.ggml_mul_mat(ctx, w, g.ggml_reshape_3d(ctx, x, d, 1, n))
    return g.ggml_reshape_2d(ctx, y, y.contents.ne[0], n)


def rope_mode(arch: str) -> int:
    """llama.cpp's rotation for a GGUF architecture (src/llama-model.cpp,
    llama_model_rope_type), checked against transformers on each family's tiny GGUF
    (tests/test_ggml.py)."""
    if arch not in BY_ARCH:
        raise ModelError(f"the ggml engine runs GGUF architectures {', '.join(BY_ARCH)}, "
                         f"not {arch}")
    return g.GGML_ROPE_TYPE_NEOX if BY_ARCH[arch].gguf.neox else 0


def frequency_factors(inv_freq) -> np.ndarray:
    """ggml's divisors of BASE's frequencies that give `inv_freq`."""
    inv_freq = np.asarray(inv_freq, np.float64)
    plain = BASE ** (-np.arange(len(inv_freq)) * 2 / (2 * len(inv_freq)))
    return (plain / inv_freq).astype(np.float32)


class Layer:
    """One layer's tensors (the backbone's or its stand-in's) and its fixed settings."""

    def __init__(self, weights: MappedGGUF, norms: MappedGGUF, i: int, spec: ModelSpec,
                 mode: int) -> None:
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
        self.gate = w(weights, "ffn_gate.weight", False)   # None: fused into ffn_up
        self.up, self.down = w(weights, "ffn_up.weight"), w(weights, "ffn_down.weight")
        self.input_norm, self.pre_mlp_norm = w(norms, "attn_norm.weight"), \
            w(norms, "ffn_norm.weight")
        self.q_norm, self.k_norm = w(norms, "attn_q_norm.weight", False), \
            w(norms, "attn_k_norm.weight", False)
        self.post_attn_norm = w(norms, "post_attention_norm.weight", False)
        self.post_mlp_norm = w(norms, "post_ffw_norm.weight", False)

    def _inputs(self, tokens: int, keys: int | None, rows: int) -> dict:
        """A graph's inputs; with `keys` (attention over that many slots) the mask and the
        query scale too."""
        s, n = self.spec, tokens * rows
        inputs = {"x": (F32, [s.hidden, n]), "pos": (I32, [n]),
                  "slots": (I64, [tokens]), "factors": (F32, [self._rotary_pairs()])}
        if keys is not None:
            inputs["mask"] = (F16, [keys, tokens, 1, rows])
            if s.query_scale is not None:
                inputs["qscale"] = (F32, [1, 1, n])
        return inputs

    def _rotary_pairs(self) -> int:
        return len(self.spec.rotary[self.spec.rope_keys[self.i]].inv_freq)

    def graph(self, tokens: int, keys: int, cache) -> Graph:
        """The block: outputs `out` and `mid` [rows * tokens, hidden]."""
        return Graph(self._inputs(tokens, keys, rows_of(cache)),
                     lambda ctx, t: self.block(ctx, t, tokens, keys, cache, False),
                     reference=reference(rows_of(cache), tokens, keys))

    def kv_graph(self, tokens: int, cache) -> Graph:
        """The step's K/V of this layer written from x without running it (`propagate`)."""
        return Graph(self._inputs(tokens, None, rows_of(cache)), lambda ctx, t: dict(zip(
            "kv", self._kv(ctx, t, self._norm(ctx, t["x"], self.input_norm), tokens, False,
                           cache)[1:])))

    def _norm(self, ctx, a, weight):
        return g.ggml_mul(ctx, g.ggml_rms_norm(ctx, a, self.spec.norm_eps), weight)

    def _kv(self, ctx, t, h, tokens: int, queries: bool, cache, columns: bool = False):
        """(q [head_dim, tokens, heads, rows] or None, K and V as written into the cache):
        the projections of the normed input h, rotated, the step's K/V stored in its slots."""
        s, hd, rows = self.spec, self.spec.head_dim, rows_of(cache)
        n = tokens * rows
        if self.fused_qkv is not None:
            qkv = product(ctx, self.fused_qkv, h, columns)
            sizes = [s.heads * hd, s.kv_heads * hd, s.kv_heads * hd]
            offsets = np.cumsum([0] + sizes[:-1])
            q, k, v = (g.ggml_cont(ctx, g.ggml_view_2d(ctx, qkv, m, n, qkv.contents.nb[1],
                                                        int(o) * 4))
                       for m, o in zip(sizes, offsets))
        else:
            q = product(ctx, self.q, h, columns) if queries else None
            k, v = (product(ctx, m, h, columns) for m in (self.k, self.v))
        q, k, v = (a if a is None or b is None else g.ggml_add(ctx, a, b)
                   for a, b in zip((q, k, v), self.qkv_bias))
        k = g.ggml_reshape_3d(ctx, k, hd, s.kv_heads, n)
        v = g.ggml_reshape_3d(ctx, v, hd, s.kv_heads, n)
        if self.k_norm is not None:
            k = self._norm(ctx, k, self.k_norm)
        k = self._rope(ctx, t, k)
        if queries:
            q = g.ggml_reshape_3d(ctx, q, hd, s.heads, n)
            if self.q_norm is not None:
                q = self._norm(ctx, q, self.q_norm)
            q = self._rope(ctx, t, q)
            if "qscale" in t:
                q = g.ggml_mul(ctx, q, t["qscale"])
            q = by_row(ctx, q, tokens, rows)
        # the step's K/V into its slots of the cache [hd, capacity, kv_heads, rows]
        kw, vw = (g.ggml_set_rows(ctx, c, by_row(ctx, a, tokens, rows), t["slots"])
                  for c, a in zip(cache, (k, v)))
        return (q if queries else None), kw, vw

    def _rope(self, ctx, t, a):
        rotary = self.spec.rotary[self.spec.rope_keys[self.i]]
        return g.ggml_rope_ext(ctx, a, t["pos"], t["factors"], 2 * self._rotary_pairs(),
                               self.mode, 0, BASE, 1.0, 0.0, rotary.scaling, 32.0, 1.0)

    def block(self, ctx, t: dict, tokens: int, keys: int, cache, columns: bool) -> dict:
        """The block's ops in a graph being built (`graph`, `span_graph`), from inputs `t`."""
        s, hd, rows = self.spec, self.spec.head_dim, rows_of(cache)
        n = tokens * rows

        def attention(h):
            q, kw, vw = self._kv(ctx, t, h, tokens, True, cache, columns)
            c = cache[0].contents
            kv = [g.ggml_view_4d(ctx, a, hd, keys, s.kv_heads, rows, c.nb[1], c.nb[2], c.nb[3],
                                 0) for a in (kw, vw)]
            # [hd, heads, tokens, rows] out: each row's tokens in turn, as x holds them
            attn = g.ggml_flash_attn_ext(ctx, q, kv[0], kv[1], t["mask"], s.attn_scale, 0.0, 0.0)
            g.ggml_flash_attn_ext_set_prec(attn, g.GGML_PREC_F32)
            return product(ctx, self.o, g.ggml_reshape_2d(ctx, attn, hd * s.heads, n), columns)

        def mlp(h):
            if self.gate is None:
                gate_up, m = product(ctx, self.up, h, columns), s.intermediate
                gate, up = (g.ggml_cont(ctx, g.ggml_view_2d(ctx, gate_up, m, n,
                                                            gate_up.contents.nb[1], o * m * 4))
                            for o in (0, 1))
            else:
                gate, up = product(ctx, self.gate, h, columns), product(ctx, self.up, h, columns)
            act = g.ggml_silu(ctx, gate) if s.activation == "silu" else g.ggml_gelu(ctx, gate)
            return product(ctx, self.down, g.ggml_mul(ctx, act, up), columns)
        out, mid = decoder_layer(t["x"], norms_of(self, lambda a, w: self._norm(ctx, a, w)),
                                 attention, mlp, lambda a, b: g.ggml_add(ctx, a, b))
        return {"out": out, "mid": mid}


def rows_of(cache) -> int:
    """The sequences a graph over `cache` (K and V [hd, capacity, kv_heads, rows]) runs."""
    return cache[0].contents.ne[3]


def by_row(ctx, a, tokens: int, rows: int):
    """[hd, heads, rows * tokens] as [hd, tokens, heads, rows]: the cache's and attention's
    order."""
    return g.ggml_permute(ctx, g.ggml_reshape_4d(ctx, a, a.contents.ne[0], a.contents.ne[1],
                                                 tokens, rows), 0, 2, 1, 3)


def span_graph(layers: "list[Layer]", tokens: int, keys: int, caches: list,
               shared: "tuple[tuple[int, int], ...]", cosines: bool = False,
               head: "tuple[Head, str] | None" = None, table=None) -> Graph:
    """`layers` in turn as one graph over their `caches`, `x` in and `out` [rows * tokens,
    hidden] out: the exit river's tail, the whole backbone or a prefill chunk in one compute,
    where no decision reads the host between layers (a graph a layer costs some tens of
    microseconds from Python: docs/backends.md). `shared[j]` names the mask and the
    rotary factors layer j reads (`mask{m}`, `factors{f}`): layers of one attention window
    or one rotary table share one input, so a prefill's mask is written once, not once a
    layer. With `cosines`, `cos{j}` [rows * tokens] is the cosine of layer j's input and
    output (what the exit rule's prior reads of a prompt); with `head` (a Head and "last" or
    "all"), `logits` [rows * (1 or tokens), vocab] are its logits of each row's last token or
    of every token. With the embedding `table`, the input is the token `ids` [rows * tokens]
    (int32), embedded in the graph: a step from ids to logits is one compute."""
    rows = rows_of(caches[0])
    columns = verification(rows, tokens, head)
    first = layers[0]._inputs(tokens, keys, rows)
    inputs = {k: v for k, v in first.items() if k not in ("mask", "factors")}
    if table is not None:
        inputs["ids"] = (I32, [rows * tokens])
        del inputs["x"]
    for layer, (m, f) in zip(layers, shared):
        own = layer._inputs(tokens, keys, rows)
        inputs[f"mask{m}"], inputs[f"factors{f}"] = own["mask"], own["factors"]

    def build(ctx, t):
        x = t["x"] if table is None else embed(ctx, layers[0].spec, table, t["ids"])
        outs = {}
        for j, (layer, cache, (m, f)) in enumerate(zip(layers, caches, shared)):
            out = layer.block(ctx, {**t, "x": x, "mask": t[f"mask{m}"],
                                    "factors": t[f"factors{f}"]}, tokens, keys, cache,
                                columns)["out"]
            if cosines:
                outs[f"cos{j}"] = cosine(ctx, x, out)
            x = out
        outs["out"] = x
        if head is not None:
            last = x if head[1] == "all" or tokens == 1 else g.ggml_view_2d(
                ctx, x, x.contents.ne[0], rows, x.contents.nb[1] * tokens,
                x.contents.nb[1] * (tokens - 1))
            outs["logits"] = head[0].build(ctx, last, columns)
        return outs
    return Graph(inputs, build, layers=len(layers) + (head is not None),
                 reference=reference(rows, tokens, keys))


def cosine(ctx, a, b):
    """The cosine of each column of a and b [hidden, n]: [n], in float32; 0 where a column
    is 0 (a padding token's), as the core's `cosine`."""
    def dot(u, v):
        return g.ggml_sum_rows(ctx, g.ggml_mul(ctx, u, v))

    norms = g.ggml_clamp(ctx, g.ggml_sqrt(ctx, g.ggml_mul(ctx, dot(a, a), dot(b, b))),
                         1e-30, float("inf"))
    return g.ggml_div(ctx, dot(a, b), norms)


class Head:
    """The final norm and the LM head (its weight the backbone's or the stand-in's), for a
    graph of its own or the end of a span's."""

    def __init__(self, spec: ModelSpec, final_norm, weight) -> None:
        self.spec, self.final_norm, self.weight = spec, final_norm, weight

    def build(self, ctx, x, columns: bool = False):
        """Logits [vocab, columns] of states x [hidden, columns] (with `columns`, each column
        as a one-column product)."""
        s = self.spec
        h = g.ggml_mul(ctx, g.ggml_rms_norm(ctx, x, s.norm_eps), self.final_norm)
        logits = product(ctx, self.weight, h, columns)
        if s.final_softcap:
            cap = s.final_softcap
            logits = g.ggml_scale(ctx, g.ggml_tanh(ctx, g.ggml_scale(ctx, logits, 1 / cap)), cap)
        return logits


def head_graph(head: Head, rows: int) -> Graph:
    """Final norm and LM head of `rows` states: logits [rows, vocab]."""
    return Graph({"x": (F32, [head.spec.hidden, rows])},
                 lambda ctx, t: {"logits": head.build(ctx, t["x"])})


def embed(ctx, spec: ModelSpec, table, ids):
    """Token ids (int32) to their rows of the embedding `table` (ggml dequantizes a quantized
    table's rows as it reads them), scaled by the model's embedding scale."""
    h = g.ggml_get_rows(ctx, table, ids)
    return h if spec.embed_scale == 1 else g.ggml_scale(ctx, h, spec.embed_scale)


def embed_graph(spec: ModelSpec, table, tokens: int) -> Graph:
    """The embedding of `tokens` ids as a graph of its own: `ids` in, `x` out."""
    return Graph({"ids": (I32, [tokens])},
                 lambda ctx, t: {"x": embed(ctx, spec, table, t["ids"])})
