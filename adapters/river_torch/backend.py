"""The PyTorch reference backend, built from a model package `Checkpoint`: River's torch blocks
over River's own preallocated cache, on the CPU or a CUDA device.

Every tensor of a step lives on the model's device; the host is read in one place, `host`:
the sub-block cosines a policy reads (at most one small read per layer it watches) and the
logits a token is chosen from.
"""

from __future__ import annotations

import numpy as np
import torch

from river_core.contract.backend import Pass
from river_core.contract.footprint import Footprint
from river_core.contract.layer_engine import LayerEngine
from river_core.contract.layout import View
from river_models import Checkpoint, StandInWeights
from river_compute.skeleton import decoder_layer, keys_values
from river_compute.torch_blocks import (Block, Dense, Norm, Rotaries, TorchArrays, TorchLayer,
                                        packed, torch_pass, upload)
from . import CAPABILITIES



def default_dtype(device: str) -> torch.dtype:
    """float32 on the CPU (bfloat16 matmuls are slower there); bfloat16 on a GPU, where
    attention takes the flash path and the int4 kernel wants bfloat16 activations."""
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


class TorchBackend(TorchArrays, LayerEngine):
    """Runs a model layer by layer over River's own preallocated cache."""

    name = "hf"

    def __init__(self, checkpoint: Checkpoint, stand_ins: StandInWeights,
                 dtype: torch.dtype | None = None, device: str = "cpu") -> None:
        spec, w = checkpoint.spec, checkpoint.weights
        self.spec = spec
        self.model_name = checkpoint.name
        self.device = dev = torch.device(device)
        self.dtype = dtype = default_dtype(device) if dtype is None else dtype
        self.blocks = [Block.build(layer, spec, dtype, dev) for layer in w.layers]
        self.stand_ins = [Block.build(layer, spec, dtype, dev, q)
                          for layer, q in zip(w.layers, stand_ins.layers)]
        self.stand_in_error = list(stand_ins.errors)
        self._embed = upload(w.embed, dtype, dev)
        self._embed_scale = None if spec.embed_scale == 1.0 else \
            torch.tensor(spec.embed_scale, dtype=dtype, device=dev)
        self._head = Dense(w.head, None, dtype, dev)
        self._stand_in_head = packed(stand_ins.head, None, dtype, dev)
        self._norm = Norm.of(w.final_norm, spec, dtype, dev)
        self._rotaries = Rotaries(spec, dev)
        self.num_layers = spec.num_layers
        self.max_positions, self.switch_at = spec.max_positions, spec.switch_at
        self.kv_heads, self.head_dim, self.windows = spec.kv_heads, spec.head_dim, spec.windows
        self.capabilities = CAPABILITIES
        self.runs_on = (str(self.device),)
        self.tokenizer = checkpoint.tokenizer

    # -- numerics for the engine base -------------------------------------------------------

    def allocate(self, shape):
        return tuple(torch.full(shape, float("nan"), dtype=self.dtype, device=self.device)
                     for _ in "kv")

    def make_pass(self, view: View, ids) -> Pass:
        return torch_pass(view, ids, self._rotaries, self.spec.rope_keys, self.dtype,
                          self.device)

    @torch.inference_mode()
    def embed_ids(self, ids: np.ndarray) -> torch.Tensor:
        h = self._embed[upload(ids, torch.int64, self.device)]
        return h if self._embed_scale is None else h * self._embed_scale

    @torch.inference_mode()
    def run_block(self, p: Pass, i: int, x, idx, stand_in: bool, mids):
        b = (self.stand_ins if stand_in else self.blocks)[i]
        out, mid = decoder_layer(x, TorchLayer(b, p, i, self.cache, idx))
        if mids is not None:
            mids.append(mid)
        return out

    @torch.inference_mode()
    def head(self, x, stand_in: bool = False):
        y = (self._stand_in_head if stand_in else self._head)(self._norm(x))
        cap = self.spec.final_softcap
        return y if cap is None else torch.tanh(y / cap) * cap

    # -- what the torch engine does beyond the base -----------------------------------------

    @torch.inference_mode()
    def project_kv(self, p: Pass, i: int, h, rows) -> None:
        idx = None if rows is None else p.index(rows, self.make_index)
        keys_values(h if idx is None else h[idx], TorchLayer(self.blocks[i], p, i, self.cache, idx))

    def footprint(self) -> Footprint:
        element = torch.empty(0, dtype=self.dtype).element_size()
        return Footprint(tuple(b.weight_bytes() for b in self.blocks),
                         tuple(b.weight_bytes() for b in self.stand_ins),
                         tuple(b.weight_bytes(("k", "v")) for b in self.blocks),
                         self._head.nbytes,
                         2 * self.spec.kv_heads * self.spec.head_dim * element,
                         self._stand_in_head.nbytes)
