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

from river_core.settings.errors import ModelError
from river_models.families import BY_ARCH
from river_compute.skeleton import BoundLayer, Primitives, decoder_layer, keys_values
from river_models.spec import GGUF_NORMS, ModelSpec

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
    """One layer's tensors (the backbone's or its stand-in's, `weights`; norms and biases from
    `norms`) and its fixed settings. Its projections are the GGUF's tensors as they are: q, k
    and v one tensor or three, gate and up one (gate None in `proj`) or two."""

    def __init__(self, weights: MappedGGUF, norms: MappedGGUF, i: int, spec: ModelSpec,
                 mode: int) -> None:
        def w(source: MappedGGUF, name: str, required: bool = True):
            t = source.get(f"blk.{i}.{name}")
            if t is None and required:
                raise ModelError(f"{source.path.name} lacks blk.{i}.{name}")
            return t

        def projections(fused: str) -> tuple:
            if fused == "qkv":
                one = w(weights, "attn_qkv.weight", False)
                return (one,) if one is not None else \
                    tuple(w(weights, f"attn_{n}.weight") for n in "qkv")
            if fused == "gate_up":   # a fused ffn_up holds the gate too
                return w(weights, "ffn_gate.weight", False), w(weights, "ffn_up.weight")
            return (w(weights, "attn_output.weight" if fused == "o" else "ffn_down.weight"),)

        self.spec, self.i, self.mode = spec, i, mode
        self.weights = BoundLayer.bind(
            lambda n: w(norms, f"{GGUF_NORMS[n]}.weight", n in ("input_norm", "pre_mlp_norm")),
            projections)
        self.qkv_bias = [w(norms, f"attn_{n}.bias", False) for n in "qkv"]

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
        def build(ctx, t):
            ops = GgmlLayer(self, ctx, t, tokens, None, cache, False)
            keys_values(t["x"], ops)
            return dict(zip("kv", ops.written))
        return Graph(self._inputs(tokens, None, rows_of(cache)), build)

    def block(self, ctx, t: dict, tokens: int, keys: int, cache, columns: bool) -> dict:
        """The block's ops in a graph being built (`graph`, `span_graph`), from inputs `t`."""
        out, mid = decoder_layer(t["x"], GgmlLayer(self, ctx, t, tokens, keys, cache, columns))
        return {"out": out, "mid": mid}


class GgmlLayer(Primitives):
    """The skeleton's primitives as ggml ops of a graph being built: `layer` over the graph's
    inputs `t` for `tokens` tokens of each row of `cache`, attending its first `keys` slots;
    with `columns`, each product column by column (module docstring). States are
    [hidden, rows * tokens]; queries, keys and values [head_dim, heads, rows * tokens]."""

    def __init__(self, layer: Layer, ctx, t: dict, tokens: int, keys: int | None, cache,
                 columns: bool) -> None:
        self.block, self.layer, self.spec = layer, layer.weights, layer.spec
        self.ctx, self.t, self.tokens, self.keys, self.cache = ctx, t, tokens, keys, cache
        self.columns, self.rows = columns, rows_of(cache)
        self.query_scale = t.get("qscale")
        self.written = None

    def norm(self, h, weight):
        return g.ggml_mul(self.ctx, g.ggml_rms_norm(self.ctx, h, self.spec.norm_eps), weight)

    def project(self, h, name: str, parts=None) -> tuple:
        ctx, s, hd = self.ctx, self.spec, self.spec.head_dim
        weights, n = self.layer.proj[name], self.tokens * self.rows
        if name == "qkv":
            parts = parts or ("q", "k", "v")
            sizes = {"q": s.heads * hd, "k": s.kv_heads * hd, "v": s.kv_heads * hd}
            if len(weights) == 1:
                out = self._split(self._product(weights[0], h), sizes.values(), n)
            else:   # the queries' product only where they are asked for
                out = [self._product(m, h) if p in parts else None
                       for m, p in zip(weights, "qkv")]
            out = [a if b is None or a is None else g.ggml_add(ctx, a, b)
                   for a, b in zip(out, self.block.qkv_bias)]
            return tuple(g.ggml_reshape_3d(ctx, out["qkv".index(p)], hd, sizes[p] // hd, n)
                         for p in parts)
        if name == "gate_up":
            gate, up = weights
            if gate is None:
                return tuple(self._split(self._product(up, h), [s.intermediate] * 2, n))
            return self._product(gate, h), self._product(up, h)
        return (self._product(weights[0], h),)

    def _product(self, w, x):
        return product(self.ctx, w, x, self.columns)

    def _split(self, a, sizes, n) -> list:
        """Consecutive row blocks of `sizes` of a [sum(sizes), n] product, each its own
        tensor."""
        offsets = np.cumsum([0, *sizes])
        return [g.ggml_cont(self.ctx, g.ggml_view_2d(self.ctx, a, int(m), n, a.contents.nb[1],
                                                    int(o) * 4))
                for m, o in zip(sizes, offsets)]

    def rotate(self, q, k) -> tuple:
        rotary = self.spec.rotary[self.spec.rope_keys[self.block.i]]
        rope = lambda a: g.ggml_rope_ext(self.ctx, a, self.t["pos"], self.t["factors"],
                                         2 * self.block._rotary_pairs(), self.block.mode, 0, BASE,
                                         1.0, 0.0, rotary.scaling, 32.0, 1.0)
        return (None if q is None else rope(q)), rope(k)

    def mul(self, a, b):
        return g.ggml_mul(self.ctx, a, b)

    def add(self, a, b):
        return g.ggml_add(self.ctx, a, b)

    def activation(self, gate):
        return (g.ggml_silu if self.spec.activation == "silu" else g.ggml_gelu)(self.ctx, gate)

    def write(self, k, v) -> None:
        # the step's K/V into its slots of the cache [hd, capacity, kv_heads, rows]
        self.written = tuple(g.ggml_set_rows(self.ctx, c, by_row(self.ctx, a, self.tokens,
                                                                  self.rows), self.t["slots"])
                             for c, a in zip(self.cache, (k, v)))

    def attend(self, q, k, v):
        ctx, s, hd = self.ctx, self.spec, self.spec.head_dim
        self.write(k, v)
        c = self.cache[0].contents
        kv = [g.ggml_view_4d(ctx, a, hd, self.keys, s.kv_heads, self.rows, c.nb[1], c.nb[2],
                             c.nb[3], 0) for a in self.written]
        # [hd, heads, tokens, rows] out: each row's tokens in turn, as x holds them
        attn = g.ggml_flash_attn_ext(ctx, by_row(ctx, q, self.tokens, self.rows), kv[0], kv[1],
                                     self.t["mask"], s.attn_scale, 0.0, 0.0)
        g.ggml_flash_attn_ext_set_prec(attn, g.GGML_PREC_F32)
        return g.ggml_reshape_2d(ctx, attn, hd * s.heads, self.tokens * self.rows)


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
