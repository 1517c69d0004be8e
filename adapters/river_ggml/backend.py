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

from river_core.backend import Step
from river_core.errors import CapabilityError
from river_core.footprint import Footprint
from river_core.layer_engine import LayerEngine, NumpyArrays
from river_core.layout import Layout
from river_models.spec import ModelSpec

from . import CAPABILITIES
from .blocks import F16, Layer, frequency_factors, head_graph, rope_mode
from .lib import HostTensors, MappedGGUF, aligned, cpu, default_threads
from .stand_ins import head_name

KEY_BUCKET = 256


def key_bucket(end: int, capacity: int) -> int:
    return min(capacity, -(-end // KEY_BUCKET) * KEY_BUCKET)


class _Step:
    """What every layer of a step shares: positions, slots, masks, rotary factors. Built
    once per step (`GgmlBackend.context`)."""

    def __init__(self, backend: "GgmlBackend", layout: Layout, step: Step) -> None:
        if step.draft_window is not None:
            raise CapabilityError("the ggml engine does not run windowed drafts")
        spec = backend.spec
        self.start, self.end, self.tokens = step.start, step.end, step.tokens
        self.layout = layout
        self.keys = key_bucket(step.end, layout.capacity)
        positions = layout.positions(step.start, step.end)   # [1, tokens]
        self.pos = positions[0].astype(np.int32)
        self.slots = np.arange(step.start, step.end, dtype=np.int64)
        self.factors = {}
        for key, rotary in spec.rotary.items():
            long = rotary.is_long(positions)[0]
            self.factors[key] = frequency_factors(
                rotary.long_inv_freq if long else rotary.inv_freq)
        self.qscale = None if spec.query_scale is None else \
            spec.query_scale.factors(positions[0]).astype(np.float32)
        self._windows = spec.windows
        self._masks: dict = {}

    def mask(self, layer: int) -> np.ndarray:
        """[tokens, keys] float16: 0 where a token attends a slot, -inf elsewhere."""
        window = self._windows[layer]
        key = self.layout.mask_key(window, layer)
        if key not in self._masks:
            attend = self.layout.mask(self.start, self.end, window, layer,
                                      slice(0, self.end))[0]
            mask = np.full((self.tokens, self.keys), -np.inf, np.float16)
            mask[:, :self.end] = np.where(attend, 0, -np.inf)
            self._masks[key] = mask
        return self._masks[key]


class GgmlBackend(NumpyArrays, LayerEngine):
    """Layers as ggml graphs on the CPU backend."""

    name = "ggml"
    floats = np.dtype(np.float16)   # the cache's and attention's: the kit's float16 bounds

    def __init__(self, backbone: MappedGGUF, spec: ModelSpec, tokenizer,
                 stand_ins: MappedGGUF, stand_in_error, threads: int | None = None) -> None:
        self.spec = spec
        self.backbone, self.stand_in_weights = backbone, stand_ins
        self.mode = rope_mode(backbone.metadata["general.architecture"])
        self.threads = threads or default_threads()
        self.num_layers, self.max_positions = spec.num_layers, spec.max_positions
        self.kv_heads, self.head_dim = spec.kv_heads, spec.head_dim
        self.rerun_at = spec.rerun_at
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

    def context(self, layout: Layout, step: Step) -> _Step:
        return _Step(self, layout, step)

    def embed_ids(self, ids: np.ndarray) -> np.ndarray:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        rows = self.backbone.raw("token_embd.weight")[ids.reshape(-1)]
        kind = GGMLQuantizationType[self.backbone.kind("token_embd.weight")]
        h = dequantize(rows, kind).astype(np.float32) * np.float32(self.spec.embed_scale)
        return h.reshape(*ids.shape, self.spec.hidden)

    def run_block(self, i: int, x, idx, stand_in: bool, mids):
        s = self.ctx
        key = (i, stand_in, s.tokens, s.keys)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = self._layers[stand_in][i].graph(s.tokens, s.keys)
        values = dict(x=x[0], pos=s.pos, slots=s.slots, mask=s.mask(i),
                      factors=s.factors[self.spec.rope_keys[i]])
        if s.qscale is not None:
            values["qscale"] = s.qscale
        cpu().set_threads(self.threads)
        out = graph.run(**values)
        shape = (1, s.tokens, self.spec.hidden)
        if mids is not None:
            mids.append(out["mid"].reshape(shape).copy())
        return out["out"].reshape(shape).copy()

    def project_kv(self, i: int, h, rows) -> None:
        s = self.ctx
        key = ("kv", i, s.tokens)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = self._layers[False][i].kv_graph(s.tokens)
        cpu().set_threads(self.threads)
        graph.run(x=h[0], pos=s.pos, slots=s.slots, factors=s.factors[self.spec.rope_keys[i]])

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

