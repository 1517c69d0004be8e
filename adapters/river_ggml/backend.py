"""The ggml backend: layers as ggml graphs on llama.cpp's CPU kernels, over the user's GGUF
memory-mapped in its own tensor types, with the K/V cache in F16 as llama.cpp keeps it.
Where no host decision sits between layers, a run of them is one graph: full depth with the
head (a decode step, a verification), a prefill chunk with every layer's cosines, the exit
river's tail; exit mode's walk runs a graph a layer, since the host decides after each.

Hidden states are numpy arrays [batch, tokens, hidden] on the host (a layer's output is a
few kilobytes at decode); the cache is two numpy float16 arrays [layers, batch, kv_heads,
capacity, head_dim] that ggml's graphs write in place (`lib.HostTensors`), so `KVCache`,
masks and measurement index them as numpy. A graph is built once per (tokens, key bucket,
what it runs, rows) and run again with the step's inputs while steps of its shape run (a
prefill chunk's, wider than a verification, is dropped when decoding begins): the keys a
step attends are the first `keys` slots, `keys` rounded up to KEY_BUCKET, the mask hiding
the rest. A batch runs as one graph over every row (the rows the graph's batch
dimension) where the step runs them all with one rotary table; a subset of its rows (rows
that left at different layers) runs row by row, each over its own row of the cache.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

import attrs

from river_core.contract.backend import Pass
from river_core.settings.errors import CapabilityError
from river_core.contract.footprint import Footprint
from river_core.contract.layer_engine import LayerEngine, NumpyArrays
from river_core.contract.layout import View
from river_models.spec import ModelSpec

from . import CAPABILITIES
from .blocks import (EXACT_WIDTH, F16, Head, Layer, embed_graph, frequency_factors, head_graph,
                     rope_mode, span_graph)
from .lib import EMBEDDING, HostTensors, MappedGGUF, aligned, cpu, default_threads
from .stand_ins import StandIns, head_name

KEY_BUCKET = 256
EVERY_ROW = (None,)   # one graph over every row
PREFILL_CHUNK = 512   # a prefill's widest graph: llama.cpp's default micro-batch
KEPT_WIDTH = 16       # the widest graph kept past its step: a verification of 15 drafts


def backbone(i: int) -> bool:
    """A span's layer i runs the backbone (`GgmlBackend._span`'s `stand_in`)."""
    return False


def stand_in(i: int) -> bool:
    """A span's layer i runs its stand-in."""
    return True


def key_bucket(end: int, capacity: int) -> int:
    """The keys a step ending at slot `end` attends: whole buckets (one graph serves every
    step in a bucket), never past the cache's capacity."""
    return min(capacity, -(-end // KEY_BUCKET) * KEY_BUCKET)


@attrs.frozen(eq=False)
class GgmlPass(Pass):
    """A step's pass as the layer graphs take it: `masks` per layer [batch, tokens, keys]
    float16 (0 where a token attends a slot, -inf elsewhere, and over the key bucket's unused
    slots), `rope` per layer each row's frequency factors [batch, pairs], and beside the
    core's fields the graphs' own inputs: the positions as int32, the slots the step writes,
    the key bucket."""

    pos: np.ndarray | None = None      # [batch, tokens] int32
    writes: np.ndarray | None = None   # [tokens] int64: slots start..end-1, every row's
    keys: int = 0                      # the key bucket every layer's graph reads
    together: bool = True              # every row takes the same rotary tables (LongRoPE
                                       # switches per row): all rows can run as one graph

    def shared(self, layers: range) -> tuple[tuple[int, int], ...]:
        """For each layer of a span, which of the span's distinct masks and frequency factors
        it reads: the layers of one attention window, or of one rotary table, read one
        input (the core hands them one object)."""
        def first(values: Sequence) -> list[int]:
            seen: dict[int, int] = {}
            return [seen.setdefault(id(values[i]), len(seen)) for i in layers]

        return tuple(zip(first(self.masks), first(self.rope)))

    def inputs(self, layers: range | int, row: int | None, attends: bool = True) -> dict:
        """The graph inputs of layer i (`mask`, `factors`) or a span of `layers` (its distinct
        `mask{m}` and `factors{f}`, `shared`) for every row (None) or one; without `attends` (a
        K/V-only graph) no mask or query scale."""
        pick = slice(None) if row is None else slice(row, row + 1)
        values = dict(pos=self.pos[pick].reshape(-1), slots=self.writes)
        if isinstance(layers, range):
            named = [(f"mask{m}", f"factors{f}", i)
                     for (m, f), i in zip(self.shared(layers), layers)]
        else:
            named = [("mask", "factors", layers)]
        for mask, factors, i in named:
            values[factors] = self.rope[i][0 if row is None else row]
            if attends:
                values[mask] = self.masks[i][pick]
        if attends and self.query_scale is not None:
            values["qscale"] = self.query_scale[pick].reshape(-1)
        return values


class GgmlBackend(NumpyArrays, LayerEngine):
    """Layers as ggml graphs on the CPU backend."""

    name = "ggml"
    floats = np.dtype(np.float16)   # the cache's and attention's: the kit's float16 bounds
    windowed_reads = False   # a graph reads its whole key bucket; the mask keeps the window
    prefill_chunk = PREFILL_CHUNK
    exact_width = EXACT_WIDTH   # blocks.py: verifications compute each token as a step

    def __init__(self, backbone: MappedGGUF, spec: ModelSpec, tokenizer, stand_ins: StandIns,
                 threads: int | None = None) -> None:
        self.spec = spec
        self.backbone, self.stand_ins = backbone, stand_ins
        self.mode = rope_mode(backbone.metadata["general.architecture"])
        self.threads = threads or default_threads()
        self.num_layers, self.max_positions = spec.num_layers, spec.max_positions
        self.kv_heads, self.head_dim = spec.kv_heads, spec.head_dim
        self.windows = spec.windows
        self.switch_at = spec.switch_at
        self.capabilities = CAPABILITIES
        self.tokenizer = tokenizer
        self.runs_on = ("cpu",)
        self._head = Head(spec, backbone.get("output_norm.weight"), backbone.head)
        # each rotary table's frequency factors, short and long, made once
        self._factors = {(key, long): frequency_factors(rotary.long_inv_freq if long
                                                        else rotary.inv_freq)
                         for key, rotary in spec.rotary.items()
                         for long in ((False, True) if rotary.long_inv_freq else (False,))}
        self._shape = None
        # graphs by (tokens, key bucket or 0, what they run...): `_evict` keeps those of the
        # step being run and the narrow ones decoding reuses
        self._graphs: dict = {}
        self._made: dict = {}   # (stand_in, layer) -> Layer

    @property
    def stand_in_error(self) -> Sequence[float]:
        return self.stand_ins.errors_when_read(self.num_layers)

    @property
    def stand_ins_at_hand(self) -> bool:
        """Whether asking for the stand-ins (their errors: a profile's key) costs no
        quantization: made, or in the cache."""
        return self.stand_ins.at_hand

    @functools.cached_property
    def _stand_in_head(self) -> Head:
        return Head(self.spec, self.backbone.get("output_norm.weight"),
                    self.stand_ins.weights.get("output.weight"))

    # -- numerics for the engine base -------------------------------------------------------

    def allocate(self, shape):
        """float16, as llama.cpp's cache. Unwritten slots hold 0, not NaN: a graph attends
        all the slots of its key bucket under the mask, and ggml's tiled flash attention (a
        step of many tokens) multiplies a hidden slot's value by a zero weight, so NaN there
        would poison the row."""
        layers, batch, heads, capacity, dim = shape
        if shape != self._shape:   # a new shape: new arrays, and graphs over them
            self._graphs.clear()
            self._shape = shape
            self._k, self._v = (aligned(shape, np.float16) for _ in range(2))
            per, row = self._k[0].nbytes, self._k[0, 0].nbytes
            self._host = [HostTensors(a, layers * (1 + batch)) for a in (self._k, self._v)]
            # per layer, K and V of every row (key None) and of each row alone
            self._caches = [{r: tuple(h.tensor(F16, [dim, capacity, heads, n], i * per + o)
                                      for h in self._host)
                             for r, n, o in [(None, batch, 0)]
                             + [(r, 1, r * row) for r in range(batch)]}
                            for i in range(layers)]
        self._k.fill(0)
        self._v.fill(0)
        return self._k, self._v

    def make_pass(self, view: View, ids) -> GgmlPass:
        step = view.step
        if step.draft_window is not None:
            raise CapabilityError("the ggml engine does not run windowed drafts")
        positions = view.positions   # [batch, tokens]
        factors, together = {}, True
        for key, rotary in self.spec.rotary.items():
            long = rotary.is_long(positions)   # per row
            factors[key] = np.stack([self._factors[key, bool(b)] for b in long])
            together &= bool(long.all() or not long.any())
        keys = key_bucket(step.end, self.cache.layout.capacity)
        self._evict(step.tokens, keys)

        def bias(attend: np.ndarray) -> np.ndarray:
            mask = np.full((len(attend), step.tokens, keys), -np.inf, np.float16)
            mask[:, :, :step.end] = np.where(attend, 0, -np.inf)
            return mask

        masks = view.converted_masks(bias)
        qs = self.spec.query_scale
        return GgmlPass(step, ids, positions, [factors[k] for k in self.spec.rope_keys],
                        None if qs is None else qs.factors(positions).astype(np.float32),
                        view.slots, masks, pos=positions.astype(np.int32),
                        writes=np.arange(step.start, step.end, dtype=np.int64), keys=keys,
                        together=together)

    def _evict(self, tokens: int, keys: int) -> None:
        """Before a step of `tokens` tokens over key bucket `keys`: graphs of another key
        bucket, and graphs wider than KEPT_WIDTH of another width (a prefill chunk's), are
        dropped with their memory. What stays is what decoding runs again: its steps, drafts
        and verifications at the current bucket, and the graphs that read no keys."""
        self._graphs = {key: graph for key, graph in self._graphs.items()
                        if key[1] in (0, keys) and (key[0] <= KEPT_WIDTH or key[0] == tokens)}

    def _graph(self, key: tuple, build):
        """The cached graph `key` (its tokens and key bucket first), made by `build()` on first
        use."""
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = build()
        return graph

    def embed_ids(self, ids: np.ndarray) -> np.ndarray:
        flat = ids.reshape(-1)
        graph = self._graph((len(flat), 0, "embed"),
                            lambda: embed_graph(self.spec, self.backbone.get(EMBEDDING),
                                                len(flat)))
        cpu().set_threads(self.threads)
        return graph.run(ids=flat)["x"].reshape(*ids.shape, self.spec.hidden).copy()

    def _rows(self, p: GgmlPass, idx) -> Sequence[int | None]:
        """The graphs' row keys for rows `idx` (None: all): None for one graph over every row,
        else each row alone."""
        if p.together and (idx is None or len(idx) == len(p.pos)):   # sorted, so all rows
            return EVERY_ROW
        return range(len(p.pos)) if idx is None else idx

    def _run(self, p: GgmlPass, key: tuple, build, layers: range | int, x, idx,
             attends: bool = True, feed: str = "x") -> list[dict]:
        """The graph `key` of layer i or a span of `layers` (made by `build(caches)` on first
        use) run on x [rows, tokens, hidden] (or, with `feed` "ids", the token ids [rows,
        tokens]), all rows at once or row by row: its outputs per run (views of its memory,
        valid until it runs again)."""
        outs = []
        cpu().set_threads(self.threads)
        for j, row in enumerate(self._rows(p, idx)):
            graph = self._graph(key + (row,), lambda: build(
                [self._caches[i][row] for i in
                 (layers if isinstance(layers, range) else [layers])]))
            values = x.reshape(-1, *x.shape[2:]) if row is None else x[j]   # rows * tokens
            outs.append(graph.run(**{feed: values}, **p.inputs(layers, row, attends)))
        return outs

    def _states(self, outs: list[dict], name: str, rows: int, tokens: int) -> np.ndarray:
        return np.concatenate([o[name] for o in outs]).reshape(rows, tokens, -1)

    def run_block(self, p: GgmlPass, i: int, x, idx, stand_in: bool, mids):
        tokens, layer = p.step.tokens, self._layer(stand_in, i)
        outs = self._run(p, (tokens, p.keys, i, stand_in),
                         lambda caches: layer.graph(tokens, p.keys, caches[0]),
                         i, x, idx)
        if mids is not None:
            mids.append(self._states(outs, "mid", len(x), tokens))
        return self._states(outs, "out", len(x), tokens)

    def _layer(self, stand_in: bool, i: int) -> Layer:
        """Layer i's tensors (its stand-in's with `stand_in`), made once."""
        layer = self._made.get((stand_in, i))
        if layer is None:
            weights = self.stand_ins.weights if stand_in else self.backbone
            layer = self._made[(stand_in, i)] = Layer(weights, self.backbone, i, self.spec,
                                                      self.mode)
        return layer

    def _span(self, p: GgmlPass, layers: range, stand_in, x: np.ndarray | None = None,
              idx=None, cosines: bool = False, logits: str | None = None) -> list[dict]:
        """`layers` (each its stand-in where `stand_in(i)`) on x [rows, tokens, hidden] as one
        graph, built once per (tokens, key bucket, layers, which run stand-ins, shared inputs,
        outputs, rows), with each layer's cosines and the backbone's head of the "last" or
        "all" tokens where asked: its outputs per run (`span_graph`). Without x, the span
        starts from the step's token ids, embedded in the same graph."""
        tokens, shared = p.step.tokens, p.shared(layers)
        kinds = tuple(stand_in(i) for i in layers)
        span = [self._layer(k, i) for k, i in zip(kinds, layers)]
        table = self.backbone.get(EMBEDDING) if x is None else None
        key = (tokens, p.keys, "span", layers.start, layers.stop, kinds, shared, cosines,
               logits, x is None)
        return self._run(p, key, lambda caches: span_graph(
            span, tokens, p.keys, caches, shared, cosines,
            None if logits is None else (self._head, logits), table), layers,
            p.ids if x is None else x, idx, feed="ids" if x is None else "x")

    def _full_depth(self, p: GgmlPass) -> np.ndarray:
        return self._states(self._span(p, range(self.num_layers), backbone), "out",
                            len(p.ids), p.step.tokens)

    def _exact_logits(self, tokens, start: int) -> np.ndarray:
        # the engine's own full-depth graph, its head inside, as a decode step runs it (its
        # arrays are the host's: nothing to read back)
        return self.full_depth_logits(self._verify_pass(tokens, start), every_token=True)[0]

    def full_depth_logits(self, p: GgmlPass, every_token: bool) -> np.ndarray:
        """The embedding, the whole backbone and the head as one graph run."""
        tokens = p.step.tokens if every_token else 1
        outs = self._span(p, range(self.num_layers), backbone,
                          logits="all" if every_token else "last")
        logits = self._states(outs, "logits", len(p.ids), tokens)
        return logits if every_token else logits[:, 0]

    def prefill_layers(self, p: GgmlPass, prefill_exit: int | None):
        """A prefill chunk from its ids through every layer (stand-ins past `prefill_exit`)
        as one graph run, each layer's cosines computed in it."""
        outs = self._span(p, range(self.num_layers),
                          lambda i: prefill_exit is not None and i > prefill_exit,
                          cosines=True)
        rows, tokens = len(p.ids), p.step.tokens
        cosines = [self._states(outs, f"cos{j}", rows, tokens) for j in range(self.num_layers)]
        return self._states(outs, "out", rows, tokens), np.concatenate(cosines, -1)

    def stand_in_tail(self, p: GgmlPass, start: int, h, rows):
        if start == self.num_layers:
            return h
        layers = range(start, self.num_layers)
        if rows is None:
            return self._states(self._span(p, layers, stand_in, h), "out", len(h),
                                p.step.tokens)
        idx = p.index(rows, self.make_index)
        part = self._span(p, layers, stand_in, h[idx], idx)
        return self.scatter(h, idx, self._states(part, "out", len(idx), p.step.tokens))

    def project_kv(self, p: GgmlPass, i: int, h, rows) -> None:
        tokens, layer = p.step.tokens, self._layer(False, i)
        idx = None if rows is None else p.index(rows, self.make_index)
        self._run(p, (tokens, 0, "kv", i), lambda caches: layer.kv_graph(tokens, caches[0]),
                  i, h if idx is None else h[idx], idx, attends=False)

    def head(self, x, stand_in: bool = False) -> np.ndarray:
        flat = x.reshape(-1, x.shape[-1])
        graph = self._graph((len(flat), 0, "head", stand_in),
                            lambda: head_graph(self._stand_in_head if stand_in
                                               else self._head, len(flat)))
        cpu().set_threads(self.threads)
        logits = graph.run(x=flat)["logits"]
        return logits.reshape(*x.shape[:-1], self.spec.vocab).copy()

    def read_kv(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys in the model's own dimension order: under llama's rotation (mode 0) the GGUF's
        permuted Q/K rows leave each key's rotary halves interleaved."""
        n = self.cache.offset
        k = self.cache.k[i, :, :, :n].astype(np.float32)
        if self.mode == 0:
            k = k.reshape(*k.shape[:-1], -1, 2).swapaxes(-1, -2).reshape(k.shape)
        return k, self.cache.v[i, :, :, :n].astype(np.float32)

    def footprint(self) -> Footprint:
        def size(source: MappedGGUF, names) -> int:
            return sum(source.raw(n).nbytes for n in names if source.get(n) is not None)

        def layer(source: MappedGGUF, i: int, only=None) -> int:
            names = [n for n in source.tensors if n.startswith(f"blk.{i}.")]
            return size(source, [n for n in names if only is None or any(o in n for o in only)])

        layers = range(self.num_layers)
        return Footprint(tuple(layer(self.backbone, i) for i in layers),
                         tuple(self.stand_ins.layer_bytes(i) for i in layers),
                         tuple(layer(self.backbone, i, ("attn_k.", "attn_v.")) for i in layers),
                         size(self.backbone, ["output_norm.weight", head_name(self.backbone)]),
                         2 * self.kv_heads * self.head_dim * 2, self.stand_ins.head_bytes())

