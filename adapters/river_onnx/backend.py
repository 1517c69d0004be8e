"""The ONNX Runtime backend: per-layer sessions over a KV cache on the sessions' device, owned
by the backend.

Hidden states are numpy arrays [batch, tokens, hidden] on the host. Each step builds its rotary
tables and attention biases once; every layer call binds its layer's cache OrtValues
(`device_kv.OrtLayers`) as both the graph's past and present K/V (IOBinding, no copy), so the
graph's GroupQueryAttention writes the new tokens' K/V where they stay and reads only the slots
written so far.
"""

from __future__ import annotations

import functools
from pathlib import Path

import attrs
import numpy as np
import onnxruntime as ort

from river_core.contract.backend import Capabilities
from river_core.settings.errors import CapabilityError
from river_core.contract.footprint import Footprint
from river_core.contract.layer_engine import LayerEngine, NumpyArrays
from river_core.contract.layout import View

from . import allocator
from .activations import check_float16
from .device_kv import OrtLayers
from .export import Manifest
from .feeds import OnnxPass, attention_mask, layer_feeds, step_pass
from .half import HALVES
from .sessions import session_options
from .states import DeviceArrays, DeviceOps, States, bind_inputs
from .weights import weight_bytes
from . import CAPABILITIES, sessions

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def sessions_for(device: str):
    """A session factory for `device` that refuses to run anywhere else."""
    provider = PROVIDERS[device]
    if provider not in ort.get_available_providers():
        raise CapabilityError(f"onnxruntime here has no {provider} (installed providers: "
                              f"{', '.join(ort.get_available_providers())}); CUDA needs the "
                              f"onnx-gpu extra instead of onnx")
    if provider == allocator.PROVIDER:
        allocator.shared_device_allocator()

    def make(path: Path, options: ort.SessionOptions | None = None) -> ort.InferenceSession:
        try:
            # enable_fallback=0: ONNX Runtime's Python wrapper would otherwise answer a
            # provider's failure at run time by moving the session to the CPU for good,
            # saying so only on stdout
            sess = ort.InferenceSession(str(path), options or session_options(device),
                                        providers=[provider], enable_fallback=0)
        except Exception as e:
            if "fallback to CPU EP has been explicitly disabled" not in str(e):
                raise
            raise CapabilityError(
                f"{path.name} has a node {provider} cannot run, and River refuses to run it "
                f"on the CPU behind the device's back (ONNX Runtime's verbose log, "
                f"log_severity_level 0, lists the nodes placed on the CPU)") from None
        if provider not in sess.get_providers():
            raise CapabilityError(f"onnxruntime runs {path.name} on "
                                  f"{', '.join(sess.get_providers())}, not {provider}; "
                                  f"refusing to report it as {device}")
        return sess
    return make


def tail_sessions(manifest: Manifest, device: str) -> tuple[int, ...]:
    """The tails to build a session for: none off the CPU. Each tail session holds its own
    copy of the stand-ins' weights: ORT shares initializers between sessions only as OrtValues
    given to SessionOptions.add_initializer, and then still prepacks MatMulNBits' weights per
    session (the embedded model's stand-in and tail sessions on the CPU: 590 MB each with its
    own copy, 728 MB sharing, 244 MB sharing with prepacking off; docs/backends.md); on a GPU
    that would be about 7 copies of the stand-ins for 32 layers. Without its tail a token's exit
    river runs stand-in by stand-in: the same weights and math (the kit checks it)."""
    return manifest.tails if device == "cpu" else ()


def capabilities(device: str) -> Capabilities:
    """What the engine promises on `device`. Off the CPU no windowed drafts: a draft window's
    step runs on a copy of the window's slots, read and written back through the host a whole
    layer at a time, which on a GPU would move each layer's cache over PCIe for every draft
    token (issue 43); there lossless mode's drafts read the whole context, as the plan's
    default then gives them, and a draft_window is refused in one line."""
    return CAPABILITIES if device == "cpu" else attrs.evolve(CAPABILITIES, windowed_drafts=False)


class OnnxBackend(NumpyArrays, LayerEngine):
    """Runs exported per-layer graphs with ONNX Runtime: float32 activations with backbone
    weights float32 or int8, or everything float16 (the export's dtype)."""

    name = "onnx"
    windowed_reads = False   # the graphs read every slot bound; the bias keeps the window
    # hidden states between layers: host arrays here, OrtValues on the device in
    # `OnnxDeviceBackend`
    states_on_device = False

    def __init__(self, folder: Path, manifest: Manifest, tokenizer, device: str = "cpu",
                 optimized: tuple[Path, str] | None = None) -> None:
        """`optimized`: the cache entry of the export's optimized graphs and its key
        (sessions.optimized_entry; None: graphs optimized in memory on every load)."""
        self.spec = spec = manifest.spec
        self.floats = np.dtype(manifest.floats)   # of hidden states, the cache, the tables
        self._causal_branch = manifest.floats in HALVES   # export.export_model's graphs
        self._folder = folder
        self.model_name = folder.name   # the export, named after the model
        if manifest.floats == "float16":
            check_float16(manifest.activations, self.model_name)
        self._device = device
        layers = range(spec.num_layers)
        kinds = {"layer": layers, "stand_in": layers, "kv": layers,
                 "tail": tail_sessions(manifest, device)}
        built = sessions.build(sessions_for(device), functools.partial(session_options, device),
                               folder, ["embed", "head", "stand_in_head"] + [
            f"{kind}_{key}" for kind, keys in kinds.items() for key in keys], optimized)
        self._embed, self._head, self._stand_in_head = (
            built[name] for name in ("embed", "head", "stand_in_head"))
        self._layers, self._stand_ins, self._kv_proj, self._tails = (
            {key: built[f"{kind}_{key}"] for key in keys} for kind, keys in kinds.items())
        self.runs_on = tuple(self._head.get_providers())
        self.num_layers, self.max_positions = spec.num_layers, spec.max_positions
        self.switch_at = spec.switch_at
        self.stand_in_error = list(manifest.stand_in_error)
        self.kv_heads, self.head_dim, self.windows = spec.kv_heads, spec.head_dim, spec.windows
        self.capabilities = capabilities(device)
        self.tokenizer = tokenizer
        if self.states_on_device:
            self._ops = DeviceOps(device, functools.partial(
                ort.InferenceSession, sess_options=session_options(device),
                providers=[PROVIDERS[device]], enable_fallback=0))

    # -- numerics for the engine base -------------------------------------------------------

    def allocate(self, shape):
        """Unwritten slots hold 0, not NaN: attention reads every slot before the step's end
        under an additive bias (a padded row's empty slots too), and NaN * 0 would poison the
        row."""
        return (OrtLayers(shape, self.floats, self._device),
                OrtLayers(shape, self.floats, self._device))

    def make_pass(self, view: View, ids) -> OnnxPass:
        return step_pass(self.spec, self.floats, view, ids, self._causal_branch)

    def embed_ids(self, ids: np.ndarray):
        return self._run(self._embed, {"ids": ids}, ["h_out"])[0]

    def run_block(self, p: OnnxPass, i: int, x, idx, stand_in: bool, mids):
        sess = (self._stand_ins if stand_in else self._layers)[i]
        out, mid = self._run_in_place(sess, layer_feeds(p, i, x, idx), {"": i}, idx,
                                      ["h_out", "mid"], p)
        if mids is not None:
            mids.append(mid)
        return out

    def head(self, x, stand_in: bool = False):
        sess = self._stand_in_head if stand_in else self._head
        out, = self._run(sess, {"h": x.reshape(1, -1, x.shape[-1])}, ["logits"])
        return out.reshape(*x.shape[:-1], out.shape[-1])

    # -- what the ONNX engine does beyond the base ------------------------------------------

    def _bind(self, binding: ort.IOBinding, feeds: dict, outputs: list[str],
              on_host: bool) -> None:
        """Binds `feeds` (host arrays, or `States` already on the device) and `outputs`,
        which stay on the device where the engine keeps its states there (`on_host`: read
        them on the host anyway)."""
        bind_inputs(binding, feeds)
        for name in outputs:
            if self.states_on_device and not on_host:
                binding.bind_output(name, self._device)
            else:
                binding.bind_output(name)

    def _results(self, binding: ort.IOBinding, count: int, on_host: bool) -> list:
        values = binding.get_outputs()[:count]
        if self.states_on_device and not on_host:
            return [States(value, self._ops) for value in values]
        return [value.numpy() for value in values]

    def _run(self, sess, feeds: dict, outputs: list[str], on_host: bool = False) -> list:
        binding = sess.io_binding()
        self._bind(binding, feeds, outputs, on_host)
        sess.run_with_iobinding(binding)
        return self._results(binding, len(outputs), on_host)

    def _run_in_place(self, sess, feeds: dict, layers: dict[str, int], idx,
                      outputs: list[str], p: OnnxPass) -> list[np.ndarray]:
        """Runs `sess` with each layer's cache (by the suffix of its inputs) bound as both past
        and present K/V, so the graph writes the new tokens' K/V into the cache itself, on its
        device. Rows `idx`, or a draft window's slots, run on a copy made through the host,
        whose new slots go back through the host."""
        binding = sess.io_binding()
        self._bind(binding, feeds, outputs, on_host=False)
        copies = []
        for suffix, i in layers.items():
            for kv, cache in (("k", self.cache.k), ("v", self.cache.v)):
                if idx is None and p.read is None:
                    value = cache.values[i]
                else:
                    value = cache.scratch(_bound(cache[i], idx, p.read))
                    copies.append((cache, i, value))
                binding.bind_ortvalue_input(f"past_{kv}{suffix}", value)
                binding.bind_ortvalue_output(f"present_{kv}{suffix}", value)
        sess.run_with_iobinding(binding)
        for cache, i, value in copies:
            _write_back(cache, i, value.numpy(), idx, p)
        return self._results(binding, len(outputs), on_host=False)

    def stand_in_tail(self, p: OnnxPass, start: int, h, rows):
        if start not in self._tails:
            return super().stand_in_tail(p, start, h, rows)
        idx = None if rows is None else p.index(rows, self.make_index)
        feeds = {"h": h, "positions": p.positions, "seqlens": p.seqlens}
        if p.query_scale is not None:
            feeds["qscale"] = p.query_scale
        layers = dict(enumerate(range(start, self.num_layers)))
        feeds.update({f"bias_{j}": p.masks[i] for j, i in layers.items()
                      if p.masks[i] is not None})
        if idx is not None:
            feeds = {name: value[idx] for name, value in feeds.items()}
        feeds["total"] = p.total
        for j, i in layers.items():
            feeds.update(attention_mask(p, i, f"_{j}"))
        for i in layers.values():
            key = self.spec.rope_keys[i]
            feeds.update({f"cos{key}": p.rope[i][0], f"sin{key}": p.rope[i][1]})
        out, = self._run_in_place(self._tails[start], feeds,
                                  {f"_{j}": i for j, i in layers.items()}, idx, ["h_out"], p)
        return out if idx is None else self.scatter(h, idx, out)

    def project_kv(self, p: OnnxPass, i: int, h, rows) -> None:
        idx = None if rows is None else p.index(rows, self.make_index)
        x = h if idx is None else h[idx]
        k, v = self._run(self._kv_proj[i], layer_feeds(p, i, x, idx, attention=False),
                         ["k", "v"], on_host=True)
        self.cache.write(i, idx, k, v, p.step.start, p.step.end)

    def footprint(self) -> Footprint:
        """Weight files as stored; a step's attention reads the K/V slots written so far."""
        def size(name: str) -> int:
            return weight_bytes(self._folder / f"{name}.onnx")

        layers = range(self.num_layers)
        return Footprint(tuple(size(f"layer_{i}") for i in layers),
                         tuple(size(f"stand_in_{i}") for i in layers),
                         tuple(size(f"kv_{i}") for i in layers), size("head"),
                         2 * self.spec.kv_heads * self.spec.head_dim * self.floats.itemsize,
                         size("stand_in_head"))


class OnnxDeviceBackend(DeviceArrays, OnnxBackend):
    """The engine off the CPU: hidden states stay on the sessions' device between layers
    (`states.States`), so a step sends the device token ids and its small tables and reads
    back only logits and the cosines an exit policy needs."""

    states_on_device = True


def backend_class(device: str, states_on_device: bool | None = None) -> type[OnnxBackend]:
    """The engine for `device`: hidden states on the device off the CPU, unless
    `states_on_device` says otherwise."""
    on_device = device != "cpu" if states_on_device is None else states_on_device
    return OnnxDeviceBackend if on_device else OnnxBackend


def _bound(layer: np.ndarray, idx, slots: np.ndarray | None) -> np.ndarray:
    """What a graph reads and writes of one layer's cache [B, heads, capacity, dim] (read on
    the host) when it runs on rows `idx` or a draft window's `slots`."""
    rows = layer if idx is None else layer[idx]
    return np.ascontiguousarray(rows if slots is None else rows[:, :, slots])


def _write_back(cache: OrtLayers, i: int, array: np.ndarray, idx, p: OnnxPass) -> None:
    """Layer i's slots a graph wrote in `array`, the copy `_bound` made, back into `cache`."""
    rows = slice(None) if idx is None else idx
    if p.read is None:
        cache[i, rows] = array
    else:   # a windowed step wrote its one token in the copy's last slot
        cache[i, rows, :, p.step.end - 1] = array[:, :, -1]
