"""The ONNX Runtime backend: per-layer sessions over a numpy KV cache owned by the backend.

Hidden states are numpy arrays [batch, tokens, hidden]. Each step builds its rotary tables and
additive masks once; every layer call feeds its layer's whole cache (no copy) and writes the
new tokens' K/V it returns into the cache by index.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnxruntime as ort

from river_core.footprint import Footprint
from river_core.engine import KVCache, LayerEngine
from river_core.errors import CapabilityError

from .export import Manifest, weight_bytes
from . import CAPABILITIES

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


@functools.cache
def _shared_threads() -> bool:
    """One process-wide thread pool for the hundred-odd small sessions, when ORT still allows
    it (it must be set before the first session of the process)."""
    try:
        ort.set_global_thread_pool_sizes(0, 1)
        return True
    except Exception:   # an environment already exists: fall back to per-session pools
        return False


def sessions_for(device: str):
    """A session factory for `device` that refuses to run anywhere else."""
    provider = PROVIDERS[device]
    if provider not in ort.get_available_providers():
        raise CapabilityError(f"onnxruntime here has no {provider} (installed providers: "
                              f"{', '.join(ort.get_available_providers())}); CUDA needs the "
                              f"onnx-gpu extra instead of onnx")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # each session's CPU arena keeps the largest buffers it ever served, so after one long
    # prefill the ~150 sessions of a model together held gigabytes (docs/benchmarks.md)
    options.enable_cpu_mem_arena = False
    if device == "cpu" and _shared_threads():
        options.use_per_session_threads = False
    else:
        options.intra_op_num_threads = 1

    def make(path: Path) -> ort.InferenceSession:
        sess = ort.InferenceSession(str(path), options, providers=[provider])
        if sess.get_providers()[0] != provider:
            raise CapabilityError(f"onnxruntime fell back to {sess.get_providers()[0]} for "
                                  f"{path.name}; refusing to report it as {device}")
        return sess
    return make


class _Sessions:
    """A model's sessions of one kind (`pattern` formatted with the key), each made on first
    use: what a run never reaches (backbone layers past every exit, exit rivers it never
    starts) takes no memory, and loading a model is immediate."""

    def __init__(self, make, folder: Path, pattern: str, keys) -> None:
        self._make, self._made = make, {}
        self._paths = {key: folder / pattern.format(key) for key in keys}
        missing = [p.name for p in self._paths.values() if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"{folder} lacks {', '.join(missing)}: a damaged export")

    def __contains__(self, key) -> bool:
        return key in self._paths

    def __getitem__(self, key) -> ort.InferenceSession:
        if key not in self._made:
            self._made[key] = self._make(self._paths[key])
        return self._made[key]


class _Step:
    """Rotary tables and additive masks of cache slots start..end-1, shared by all layers."""

    def __init__(self, backend: "OnnxBackend", start: int, end: int) -> None:
        self.start, self.end = start, end
        self._b = backend
        positions = backend.layout.positions(start, end)
        self.rope = {}
        for key, rotary in backend.spec.rotary.items():
            cos, sin = rotary.angles(positions)
            self.rope[key] = (cos[:, None], sin[:, None])
        self._masks: dict = {}

    def masks(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(past [B, 1, G*T, capacity], new [B, 1, G*T, T]) additive masks of `layer`."""
        layout, window = self._b.layout, self._b.spec.windows[layer]
        key = layout.mask_key(window, layer)
        if key not in self._masks:
            lo = layout.first_key(self.start, self.end, window)
            attend = np.zeros((layout.batch, self.end - self.start, layout.capacity), bool)
            attend[:, :, lo:self.end] = layout.mask(self.start, self.end, window, layer)
            past = attend.copy()
            past[:, :, self.start:] = False
            group = self._b.spec.group
            self._masks[key] = tuple(
                np.tile(np.where(m, 0, -np.inf).astype(np.float32)[:, None], (1, 1, group, 1))
                for m in (past, attend[:, :, self.start:self.end]))
        return self._masks[key]


class OnnxBackend(LayerEngine):
    """Runs exported per-layer graphs with ONNX Runtime. float32 only."""

    name = "onnx"

    def __init__(self, folder: Path, manifest: Manifest, tokenizer, device: str = "cpu") -> None:
        make = sessions_for(device)
        self.spec = spec = manifest.spec
        self._folder = folder
        self._embed = make(folder / "embed.onnx")
        self._head = make(folder / "head.onnx")
        self._stand_in_head = make(folder / "stand_in_head.onnx")
        layers = range(spec.num_layers)
        self._layers = _Sessions(make, folder, "layer_{}.onnx", layers)
        self._stand_ins = _Sessions(make, folder, "stand_in_{}.onnx", layers)
        self._kv_proj = _Sessions(make, folder, "kv_{}.onnx", layers)
        self._tails = _Sessions(make, folder, "tail_{}.onnx", manifest.tails)
        self.runs_on = tuple(self._head.get_providers())
        self.num_layers, self.max_positions = spec.num_layers, spec.max_positions
        self.stand_in_error = list(manifest.stand_in_error)
        self.capabilities = CAPABILITIES
        self.tokenizer = tokenizer
        self._step: _Step | None = None

    # -- what the engine base asks for ------------------------------------------------------

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        """Unwritten slots hold 0, not NaN: every layer's graph attends over the whole
        capacity under an additive mask, and NaN * 0 would poison every row."""
        shape = (self.num_layers, batch, self.spec.kv_heads, capacity, self.spec.head_dim)
        return KVCache(np.zeros(shape, np.float32), np.zeros(shape, np.float32), unwritten=0.0)

    def begin(self, start: int, end: int) -> None:
        self._step = _Step(self, start, end)

    def embed_ids(self, ids: np.ndarray) -> np.ndarray:
        return self._embed.run(None, {"ids": ids})[0]

    def token_similarity(self, before, after) -> np.ndarray:
        return _cosine(before, after)

    def position_logits(self, h) -> np.ndarray:
        return self._head.run(None, {"h": h})[0][0]

    def to_numpy(self, array) -> np.ndarray:
        return array.copy()

    # -- the contract -----------------------------------------------------------------------

    def _feeds(self, s: _Step, i: int, h: np.ndarray, idx, attention: bool = True) -> dict:
        cos, sin = s.rope[self.spec.rope_keys[i]]
        feeds = {"h": h, "cos": cos, "sin": sin}
        if attention:
            past_mask, self_mask = s.masks(i)
            feeds.update(past_k=self.cache.k[i], past_v=self.cache.v[i], past_mask=past_mask,
                         self_mask=self_mask)
        return feeds if idx is None else {k: v[idx] for k, v in feeds.items()}

    def _write(self, s: _Step, i: int, k: np.ndarray, v: np.ndarray, idx) -> None:
        self.cache.write(i, idx, s.start, s.end, k, v)

    def _run(self, sess, i: int, h: np.ndarray, rows, step: _Step | None = None) -> np.ndarray:
        step = step or self._step
        idx = None if rows is None else np.asarray(rows)
        out, k, v, mid = sess.run(None, self._feeds(step, i, h, idx))
        self._write(step, i, k, v, idx)
        self._sub_blocks = (h, mid, out, rows)
        if idx is None:
            return out
        full = h.copy()
        full[idx] = out
        return full

    def layer(self, i: int, h, rows):
        return self._run(self._layers[i], i, h, rows)

    def sub_block_similarity(self, rows) -> list[tuple[float, float]]:
        before, mid, after, ran = self._sub_blocks   # mid and after: the rows the layer ran
        ran = list(range(before.shape[0])) if ran is None else list(ran)
        wanted = ran if rows is None else list(rows)
        at = [ran.index(r) for r in wanted]
        m = mid[at, -1:]
        attention = _cosine(before[wanted, -1:], m)[:, 0]
        return list(zip(attention.tolist(), _cosine(m, after[at, -1:])[:, 0].tolist()))

    def stand_in_layer(self, i: int, h, rows):
        return self._run(self._stand_ins[i], i, h, rows)

    def layer_span(self, i: int, states, start: int):
        span = _Step(self, start, self._step.end)
        out = self._run(self._layers[i], i, np.concatenate(states, axis=1), None, span)
        return np.split(out, out.shape[1], axis=1)

    def stand_in_tail(self, start: int, h, rows):
        if start not in self._tails:
            for i in range(start, self.num_layers):
                h = self.stand_in_layer(i, h, rows)
            return h
        s, idx = self._step, None if rows is None else np.asarray(rows)
        feeds = {"h": h}
        for j, i in enumerate(range(start, self.num_layers)):
            layer = self._feeds(s, i, h, None)
            key = self.spec.rope_keys[i]
            feeds.update({f"cos{key}": layer["cos"], f"sin{key}": layer["sin"],
                          **{f"{name}_{j}": layer[name] for name in
                             ("past_k", "past_v", "past_mask", "self_mask")}})
        if idx is not None:
            feeds = {name: value[idx] for name, value in feeds.items()}
        *kv, out = self._tails[start].run(None, feeds)
        for j, i in enumerate(range(start, self.num_layers)):
            self._write(s, i, kv[2 * j], kv[2 * j + 1], idx)
        if idx is None:
            return out
        full = h.copy()
        full[idx] = out
        return full

    def project_kv(self, i: int, h, rows) -> None:
        idx = None if rows is None else np.asarray(rows)
        k, v = self._kv_proj[i].run(None, self._feeds(self._step, i, h, idx, attention=False))
        self._write(self._step, i, k, v, idx)

    def similarity(self, before, after, rows) -> list[float]:
        cos = _cosine(before[:, -1:], after[:, -1:])[:, 0]
        return (cos if rows is None else cos[np.asarray(rows)]).tolist()

    def logits(self, h) -> np.ndarray:
        return self._head.run(None, {"h": np.ascontiguousarray(h[:, -1:])})[0][:, 0]

    def stand_in_logits(self, h) -> np.ndarray:
        return self._stand_in_head.run(None, {"h": np.ascontiguousarray(h[:, -1:])})[0][:, 0]

    def footprint(self) -> Footprint:
        """Weight files as stored. Attention reads the whole allocated cache (masked), so a
        step reads capacity, not `positions`, K/V slots: small next to the weights here."""
        def size(name: str) -> int:
            return weight_bytes(self._folder / f"{name}.onnx")

        layers = range(self.num_layers)
        return Footprint(tuple(size(f"layer_{i}") for i in layers),
                         tuple(size(f"stand_in_{i}") for i in layers),
                         tuple(size(f"kv_{i}") for i in layers), size("head"),
                         2 * self.spec.kv_heads * self.spec.head_dim * 4, size("stand_in_head"))


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    num = (a * b).sum(-1)
    return num / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-30)
