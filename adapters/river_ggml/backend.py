"""The ggml backend: each layer one ggml graph on llama.cpp's CPU kernels, over the user's GGUF
memory-mapped in its own tensor types, with the K/V cache in F16 as llama.cpp keeps it.

Hidden states are numpy arrays [batch, tokens, hidden] on the host (a layer's output is a
few kilobytes at decode); the cache is two numpy float16 arrays [layers, batch, kv_heads,
capacity, head_dim] that ggml's graphs write in place (`lib.HostTensors`), so `KVCache`,
masks and measurement index them as numpy. A layer's graph is built once per (layer,
backbone or stand-in, rows, tokens, key bucket) and run again with the step's inputs: the
keys a step attends are the first `keys` slots, `keys` rounded up to KEY_BUCKET, the mask
hiding the rest. A batch runs as one graph over every row (the rows the graph's batch
dimension) where the step runs them all with one rotary table; a subset of its rows (rows
that left at different layers) runs row by row, each over its own row of the cache.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

import attrs

from river_core.backend import Pass
from river_core.errors import CapabilityError
from river_core.footprint import Footprint
from river_core.layer_engine import LayerEngine, NumpyArrays
from river_core.layout import View
from river_models.spec import ModelSpec

from . import CAPABILITIES
from .blocks import F16, Layer, frequency_factors, head_graph, rope_mode, span_graph
from .lib import HostTensors, MappedGGUF, aligned, cpu, default_threads
from .stand_ins import head_name

KEY_BUCKET = 256
EVERY_ROW = (None,)   # one graph over every row


def key_bucket(end: int, capacity: int) -> int:
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

    def inputs(self, layers: range | int, row: int | None, attends: bool = True) -> dict:
        """The graph inputs of layer i (`mask`, `factors`) or a span of `layers` (`mask{j}`,
        `factors{j}`) for every row (None) or one; without `attends` (a K/V-only graph) no
        mask or query scale."""
        pick = slice(None) if row is None else slice(row, row + 1)
        values = dict(pos=self.pos[pick].reshape(-1), slots=self.writes)
        span = isinstance(layers, range)
        for j, i in enumerate(layers if span else [layers]):
            end = str(j) if span else ""
            values["factors" + end] = self.rope[i][0 if row is None else row]
            if attends:
                values["mask" + end] = self.masks[i][pick]
        if attends and self.query_scale is not None:
            values["qscale"] = self.query_scale[pick].reshape(-1)
        return values


class GgmlBackend(NumpyArrays, LayerEngine):
    """Layers as ggml graphs on the CPU backend."""

    name = "ggml"
    floats = np.dtype(np.float16)   # the cache's and attention's: the kit's float16 bounds
    windowed_reads = False   # a graph reads its whole key bucket; the mask keeps the window

    def __init__(self, backbone: MappedGGUF, spec: ModelSpec, tokenizer,
                 stand_ins: MappedGGUF, stand_in_error, threads: int | None = None) -> None:
        self.spec = spec
        self.backbone, self.stand_in_weights = backbone, stand_ins
        self.mode = rope_mode(backbone.metadata["general.architecture"])
        self.threads = threads or default_threads()
        self.num_layers, self.max_positions = spec.num_layers, spec.max_positions
        self.kv_heads, self.head_dim = spec.kv_heads, spec.head_dim
        self.windows = spec.windows
        self.switch_at = spec.switch_at
        self.stand_in_error = list(stand_in_error)
        self.capabilities = CAPABILITIES
        self.tokenizer = tokenizer
        self.runs_on = ("cpu",)
        self._embed = backbone.get("token_embd.weight")
        self._heads = {False: backbone.get(head_name(backbone)),
                       True: stand_ins.get("output.weight")}
        self._final_norm = backbone.get("output_norm.weight")
        self._shape = None
        self._graphs: dict = {}
        self._made: dict = {}   # (stand_in, layer) -> Layer

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
            factors[key] = np.stack([frequency_factors(rotary.long_inv_freq if b
                                                       else rotary.inv_freq) for b in long])
            together &= bool(long.all() or not long.any())
        keys = key_bucket(step.end, self.cache.layout.capacity)

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

    def embed_ids(self, ids: np.ndarray) -> np.ndarray:
        rows = self.backbone.raw("token_embd.weight")[ids.reshape(-1)]
        kind = self.backbone.kind("token_embd.weight")
        if kind in ("F32", "F16"):   # a view, as ggml reads them
            h = rows.view(np.float32 if kind == "F32" else np.float16).astype(np.float32)
        else:   # gguf-py's dequantizer (its import takes 0.7 s: only for these)
            from gguf import GGMLQuantizationType
            from gguf.quants import dequantize

            h = dequantize(rows, GGMLQuantizationType[kind]).astype(np.float32)
        h = h * np.float32(self.spec.embed_scale)
        return h.reshape(*ids.shape, self.spec.hidden)

    def _rows(self, p: GgmlPass, idx) -> Sequence[int | None]:
        """The graphs' row keys for rows `idx` (None: all): None for one graph over every row,
        else each row alone."""
        if p.together and (idx is None or len(idx) == len(p.pos)):   # sorted, so all rows
            return EVERY_ROW
        return range(len(p.pos)) if idx is None else idx

    def _run(self, p: GgmlPass, key: tuple, build, layers: range | int, x, idx,
             attends: bool = True) -> list[dict]:
        """The graph `key` of layer i or a span of `layers` (made by `build(caches)` on first
        use) run on x [rows, tokens, hidden], all rows at once or row by row: its outputs per
        run."""
        outs = []
        cpu().set_threads(self.threads)
        for j, row in enumerate(self._rows(p, idx)):
            graph = self._graphs.get(key + (row,))
            if graph is None:
                caches = [self._caches[i][row] for i in
                          (layers if isinstance(layers, range) else [layers])]
                graph = self._graphs[key + (row,)] = build(caches)
            states = x.reshape(-1, self.spec.hidden) if row is None else x[j]
            outs.append(graph.run(x=states, **p.inputs(layers, row, attends)))
        return outs

    def _states(self, outs: list[dict], name: str, rows: int, tokens: int) -> np.ndarray:
        return np.concatenate([o[name] for o in outs]).reshape(rows, tokens, self.spec.hidden)

    def run_block(self, p: GgmlPass, i: int, x, idx, stand_in: bool, mids):
        tokens, layer = p.step.tokens, self._layer(stand_in, i)
        outs = self._run(p, (i, stand_in, tokens, p.keys),
                         lambda caches: layer.graph(tokens, p.keys, caches[0]),
                         i, x, idx)
        if mids is not None:
            mids.append(self._states(outs, "mid", len(x), tokens))
        return self._states(outs, "out", len(x), tokens)

    def _layer(self, stand_in: bool, i: int) -> Layer:
        """Layer i's tensors (its stand-in's with `stand_in`), made once."""
        layer = self._made.get((stand_in, i))
        if layer is None:
            weights = self.stand_in_weights if stand_in else self.backbone
            layer = self._made[(stand_in, i)] = Layer(weights, self.backbone, i, self.spec,
                                                      self.mode)
        return layer

    def _span(self, p: GgmlPass, start: int, stand_in: bool, x: np.ndarray,
              idx=None) -> np.ndarray:
        """Layers start..L-1 (their stand-ins with `stand_in`) on x [rows, tokens, hidden] as
        one graph, built once per (start, stand_in, tokens, key bucket, rows)."""
        tokens, layers = p.step.tokens, range(start, self.num_layers)
        span = [self._layer(stand_in, i) for i in layers]
        outs = self._run(p, ("span", start, stand_in, tokens, p.keys),
                         lambda caches: span_graph(span, tokens, p.keys, caches), layers, x, idx)
        return self._states(outs, "out", len(x), tokens)

    def _full_depth(self, p: GgmlPass) -> np.ndarray:
        return self._span(p, 0, False, self.embed_ids(p.ids))

    def stand_in_tail(self, p: GgmlPass, start: int, h, rows):
        if start == self.num_layers:
            return h
        if rows is None:
            return self._span(p, start, True, h)
        idx = p.index(rows, self.make_index)
        return self.scatter(h, idx, self._span(p, start, True, h[idx], idx))

    def project_kv(self, p: GgmlPass, i: int, h, rows) -> None:
        tokens, layer = p.step.tokens, self._layer(False, i)
        idx = None if rows is None else p.index(rows, self.make_index)
        self._run(p, ("kv", i, tokens), lambda caches: layer.kv_graph(tokens, caches[0]),
                  i, h if idx is None else h[idx], idx, attends=False)

    def head(self, x, stand_in: bool = False) -> np.ndarray:
        flat = x.reshape(-1, x.shape[-1])
        key = ("head", stand_in, len(flat))
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = head_graph(self.spec, self._final_norm,
                                                   self._heads[stand_in], len(flat))
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
                         tuple(layer(self.stand_in_weights, i) for i in layers),
                         tuple(layer(self.backbone, i, ("attn_k.", "attn_v.")) for i in layers),
                         size(self.backbone, ["output_norm.weight", head_name(self.backbone)]),
                         2 * self.kv_heads * self.head_dim * 2,
                         size(self.stand_in_weights, ["output.weight"]))

