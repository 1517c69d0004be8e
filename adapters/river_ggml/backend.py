"""The ggml backend: each layer one ggml graph on llama.cpp's CPU kernels, over the user's GGUF
memory-mapped in its own tensor types, with the K/V cache in F16 as llama.cpp keeps it.

Hidden states are numpy arrays [batch, tokens, hidden] on the host (a layer's output is a
few kilobytes at decode); the cache is two numpy float16 arrays [layers, batch, kv_heads,
capacity, head_dim] that ggml's graphs write in place (`lib.HostTensors`), so `KVCache`,
masks and measurement index them as numpy. A layer's graph is built once per (layer,
backbone or stand-in, tokens, key bucket) and run again with the step's inputs: the keys a
step attends are the first `keys` slots, `keys` rounded up to KEY_BUCKET, the mask hiding
the rest.
"""

from __future__ import annotations

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


def key_bucket(end: int, capacity: int) -> int:
    return min(capacity, -(-end // KEY_BUCKET) * KEY_BUCKET)


@attrs.frozen(eq=False)
class GgmlPass(Pass):
    """A step's pass as the layer graphs take it: `masks` per layer [tokens, keys] float16
    (0 where a token attends a slot, -inf elsewhere, and over the key bucket's unused slots),
    `rope` per layer its rotary table's frequency factors, and beside the core's fields the
    graphs' own inputs: the positions as int32, the slots the step writes, the key bucket."""

    pos: np.ndarray | None = None      # [tokens] int32
    writes: np.ndarray | None = None   # [tokens] int64: slots start..end-1
    keys: int = 0                      # the key bucket every layer's graph reads


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

    # -- numerics for the engine base -------------------------------------------------------

    def allocate(self, shape):
        """float16, as llama.cpp's cache. Unwritten slots hold 0, not NaN: a graph attends
        all the slots of its key bucket under the mask, and ggml's tiled flash attention (a
        step of many tokens) multiplies a hidden slot's value by a zero weight, so NaN there
        would poison the row."""
        layers, batch, heads, capacity, dim = shape
        if batch != 1:
            raise CapabilityError(f"the ggml engine runs one sequence, not {batch}")
        if shape != self._shape:   # a new shape: new arrays, and graphs over them
            self._graphs.clear()
            self._shape = shape
            self._k, self._v = (aligned(shape, np.float16) for _ in range(2))
            per = self._k[0].nbytes
            self._layers = {}
            host = [HostTensors(a) for a in (self._k, self._v)]
            caches = [[h.tensor(F16, [dim, capacity, heads, batch], i * per) for h in host]
                      for i in range(layers)]
            self._host = host
            for stand_in, weights in ((False, self.backbone), (True, self.stand_in_weights)):
                self._layers[stand_in] = [Layer(weights, self.backbone, i, self.spec,
                                                self.mode, *caches[i]) for i in range(layers)]
        self._k.fill(0)
        self._v.fill(0)
        return self._k, self._v

    def make_pass(self, view: View, ids) -> GgmlPass:
        step = view.step
        if step.draft_window is not None:
            raise CapabilityError("the ggml engine does not run windowed drafts")
        positions = view.positions   # [1, tokens]
        factors = {key: frequency_factors(rotary.long_inv_freq if rotary.is_long(positions)[0]
                                          else rotary.inv_freq)
                   for key, rotary in self.spec.rotary.items()}
        keys = key_bucket(step.end, self.cache.layout.capacity)

        def bias(attend: np.ndarray) -> np.ndarray:
            mask = np.full((step.tokens, keys), -np.inf, np.float16)
            mask[:, :step.end] = np.where(attend[0], 0, -np.inf)
            return mask

        masks = view.converted_masks(bias)
        qs = self.spec.query_scale
        return GgmlPass(step, ids, positions, [factors[k] for k in self.spec.rope_keys],
                        None if qs is None else qs.factors(positions[0]).astype(np.float32),
                        view.slots, masks, pos=positions[0].astype(np.int32),
                        writes=np.arange(step.start, step.end, dtype=np.int64), keys=keys)

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

    def run_block(self, p: GgmlPass, i: int, x, idx, stand_in: bool, mids):
        tokens = p.step.tokens
        key = (i, stand_in, tokens, p.keys)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = self._layers[stand_in][i].graph(tokens, p.keys)
        values = dict(x=x[0], pos=p.pos, slots=p.writes, mask=p.masks[i], factors=p.rope[i])
        if p.query_scale is not None:
            values["qscale"] = p.query_scale
        cpu().set_threads(self.threads)
        out = graph.run(**values)
        shape = (1, tokens, self.spec.hidden)
        if mids is not None:
            mids.append(out["mid"].reshape(shape).copy())
        return out["out"].reshape(shape).copy()

    def _span(self, p: GgmlPass, start: int, stand_in: bool, x: np.ndarray) -> np.ndarray:
        """Layers start..L-1 (their stand-ins with `stand_in`) on x [1, tokens, hidden] as
        one graph, built once per (start, stand_in, tokens, key bucket)."""
        tokens = p.step.tokens
        key = ("span", start, stand_in, tokens, p.keys)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = span_graph(self._layers[stand_in][start:], tokens,
                                                   p.keys)
        values = dict(x=x[0], pos=p.pos, slots=p.writes)
        for j, i in enumerate(range(start, self.num_layers)):
            values[f"mask{j}"], values[f"factors{j}"] = p.masks[i], p.rope[i]
        if p.query_scale is not None:
            values["qscale"] = p.query_scale
        cpu().set_threads(self.threads)
        return graph.run(**values)["out"].reshape(1, tokens, self.spec.hidden).copy()

    def _full_depth(self, p: GgmlPass) -> np.ndarray:
        return self._span(p, 0, False, self.embed_ids(p.ids))

    def stand_in_tail(self, p: GgmlPass, start: int, h, rows):
        if start == self.num_layers:
            return h
        if rows is None:
            return self._span(p, start, True, h)
        idx = p.index(rows, self.make_index)
        return self.scatter(h, idx, self._span(p, start, True, h[idx]))

    def project_kv(self, p: GgmlPass, i: int, h, rows) -> None:
        tokens = p.step.tokens
        key = ("kv", i, tokens)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = self._layers[False][i].kv_graph(tokens)
        cpu().set_threads(self.threads)
        graph.run(x=h[0], pos=p.pos, slots=p.writes, factors=p.rope[i])

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

