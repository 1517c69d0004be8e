"""Export a transformers model into per-layer ONNX graphs, cached on disk.

One folder per (model files, river settings, export format), under the user cache's `onnx/`:
`embed`, `head`, and per layer `layer_i` (the block), `river_i` (its quantized stand-in) and
`kv_i` (its K/V projection, for `propagate`), each an .onnx file with its weights beside it,
plus `manifest.json` and the tokenizer. The export is written to a temporary folder and renamed
into place, so an interrupted export leaves nothing and a second load does not export again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import attrs
import numpy as np
import onnx
from tqdm import tqdm

from river_core.config import RiverSpec
from river_core.errors import ModelError
from river_hf import compat
from river_hf.blocks import Block
from river_hf.loader import cache_root, hf_model, resolve

from . import graphs
from .quant import quantize

FORMAT = 2   # bump when the graphs change: old exports are then ignored


@attrs.frozen
class Manifest:
    num_layers: int
    max_positions: int
    heads: int
    kv_heads: int
    head_dim: int
    windows: list
    rope_keys: list
    rope: dict            # rope key ("" for the only table) -> [inv_freq, scaling]
    eos_ids: list
    river_error: list
    river_bits: int
    group_size: int

    def save(self, folder: Path) -> None:
        (folder / "manifest.json").write_text(json.dumps(attrs.asdict(self)))

    @classmethod
    def read(cls, folder: Path) -> "Manifest":
        return cls(**json.loads((folder / "manifest.json").read_text()))


def _np(t) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def _linear(module, spec: RiverSpec | None) -> tuple[graphs.Linear, float, float]:
    """(linear, squared weight error, squared weight norm)."""
    w = _np(module.weight)
    bias = None if module.bias is None else _np(module.bias)
    if spec is None:
        return graphs.Linear(w, bias), 0.0, 0.0
    q = quantize(w, spec)
    norm2 = float((w.astype(np.float64) ** 2).sum())
    return graphs.Linear(q, bias), q.error ** 2 * norm2, norm2


def block_weights(block: Block, config, spec: RiverSpec | None) -> tuple[graphs.BlockWeights,
                                                                         float]:
    """The block's weights in numpy (quantized when `spec` is given) and its relative error."""
    def norm(module):
        if module is None:
            return None
        w, eps = compat.norm_scale(module, config)
        return graphs.Norm(_np(w), eps)

    linears = {name: _linear(getattr(block, name), spec)
               for name in ("q", "k", "v", "o", "gate", "up", "down")}
    err2 = sum(e for _, e, _ in linears.values())
    norm2 = sum(n for _, _, n in linears.values())
    act = compat.activation(config)
    if act not in graphs.ACTIVATIONS:
        raise ModelError(f"activation {act!r} is not exported; supported: "
                         f"{', '.join(graphs.ACTIVATIONS)}")
    heads = block.q.weight.shape[0] // block.head_dim
    weights = graphs.BlockWeights(
        input_norm=norm(block.input_norm), pre_mlp_norm=norm(block.pre_mlp_norm),
        post_attn_norm=norm(block.post_attn_norm), post_mlp_norm=norm(block.post_mlp_norm),
        q_norm=norm(block.q_norm), k_norm=norm(block.k_norm),
        **{name: lin for name, (lin, _, _) in linears.items()},
        heads=heads, kv_heads=config.num_key_value_heads, head_dim=block.head_dim,
        scaling=float(block.scaling), activation=act)
    return weights, (err2 / norm2) ** 0.5 if norm2 else 0.0


def _save(model: onnx.ModelProto, folder: Path, name: str) -> None:
    onnx.save_model(model, folder / f"{name}.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location=f"{name}.data")


def export_model(hf, tokenizer, folder: Path, river: RiverSpec, progress: bool) -> Manifest:
    """Write every graph of `hf` (a transformers causal LM) into `folder`."""
    config = hf.config
    compat.check_architecture(config)
    inner = compat.inner(hf)
    sandwich = compat.SUPPORTED[config.model_type]
    windows, keys = compat.layer_windows(config), compat.rope_keys(config)
    rope = {}
    for key in set(keys):
        inv_freq, scaling = compat.rope_frequencies(inner, key)
        rope[key or ""] = [_np(inv_freq).tolist(), scaling]
    errors = []
    layers = tqdm(list(enumerate(inner.layers)), desc="exporting layers to ONNX",
                  disable=not progress, unit="layer")
    for i, layer in layers:
        block = Block.from_hf(layer, sandwich, windows[i], keys[i])
        full, _ = block_weights(block, config, None)
        stand_in, error = block_weights(block, config, river)
        _save(graphs.block(full), folder, f"layer_{i}")
        _save(graphs.block(stand_in), folder, f"river_{i}")
        _save(graphs.kv_projection(full), folder, f"kv_{i}")
        errors.append(error)
    _save(graphs.embedding(_np(inner.embed_tokens.weight), compat.embed_scale(inner.embed_tokens)),
          folder, "embed")
    w, eps = compat.norm_scale(inner.norm, config)
    _save(graphs.head(graphs.Norm(_np(w), eps), _np(hf.lm_head.weight),
                      compat.final_softcap(config)), folder, "head")
    tokenizer.save_pretrained(folder / "tokenizer")
    manifest = Manifest(
        num_layers=len(inner.layers), max_positions=config.max_position_embeddings,
        heads=full.heads, kv_heads=config.num_key_value_heads, head_dim=block.head_dim,
        windows=windows,
        rope_keys=[k or "" for k in keys], rope=rope, eos_ids=sorted(compat.eos_ids(hf, tokenizer)),
        river_error=errors, river_bits=river.bits, group_size=river.group_size)
    manifest.save(folder)
    return manifest


def _key(folder: Path, river: RiverSpec) -> str:
    parts = [str(folder.resolve()), str(FORMAT), str(river.bits), str(river.group_size)]
    for f in sorted(folder.iterdir()):
        if f.is_file():
            st = f.stat()
            parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def exported(model: str | None, river: RiverSpec, progress: bool) -> Path:
    """The cached export folder for `model`, exporting it on first use."""
    folder = resolve(model, progress)
    target = cache_root() / "onnx" / f"{folder.name}-{_key(folder, river)}"
    if (target / "manifest.json").is_file():
        return target
    hf, tokenizer = hf_model(str(folder), progress=progress)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".partial-"))
    try:
        export_model(hf, tokenizer, tmp, river, progress)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
