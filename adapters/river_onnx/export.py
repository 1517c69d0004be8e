"""Export a model package `Checkpoint` into per-layer ONNX graphs, cached on disk.

One folder per (model files, stand-in quantization, export format), under the user cache's
`onnx/`: `embed`, `head`, `stand_in_head` (its quantized copy, for drafts), and per layer
`layer_i` (the block), `stand_in_i` (its quantized copy) and `kv_i` (its K/V projection, for
`propagate`), each an .onnx file with its weights beside it; `tail_s` for the first few layers
s: the stand-ins of s..L-1 as one graph, so a token that exits early runs its exit river in one
session run (`python -m benchmarks levers`: 6.8 against 8.3 ms for 26 stand-ins; only early
starts, since each tail holds its own copy of the stand-in weights); plus `manifest.json` (the
ModelSpec, the stand-ins' weight errors, the tail starts) and the tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import onnx
from tqdm import tqdm

from river_core.config import QuantSpec
from river_models import Checkpoint, ModelSpec, StandIns, stand_ins
from river_models.cache import cache_root, cached, digest, files_key
from river_models.quant import FORMAT as QUANT_FORMAT
from river_models.source import locate, open_model

from . import graphs

FORMAT = 7   # bump when the graphs change: old exports are then ignored


def tail_starts(num_layers: int) -> tuple[int, ...]:
    """Where tails begin: before the first layer (the whole model quantized) and after each
    of the first sixth of the layers, where the paper's rule sends most tokens."""
    return tuple(range(0, max(2, -(-num_layers // 6)) + 1))


@attrs.frozen
class Manifest:
    spec: ModelSpec
    stand_in_error: tuple[float, ...]
    tails: tuple[int, ...]

    def save(self, folder: Path) -> None:
        (folder / "manifest.json").write_text(json.dumps(
            {"spec": self.spec.to_json(), "stand_in_error": list(self.stand_in_error),
             "tails": list(self.tails)}))

    @classmethod
    def read(cls, folder: Path) -> "Manifest":
        d = json.loads((folder / "manifest.json").read_text())
        return cls(ModelSpec.from_json(d["spec"]), tuple(d["stand_in_error"]), tuple(d["tails"]))


def _save(model: onnx.ModelProto, folder: Path, name: str) -> None:
    onnx.save_model(model, folder / f"{name}.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location=f"{name}.data")


def export_model(checkpoint: Checkpoint, stand_ins: StandIns, folder: Path,
                 progress: bool = False) -> Manifest:
    """Write every graph of `checkpoint` into `folder`."""
    spec, w = checkpoint.spec, checkpoint.weights
    layers = tqdm(list(enumerate(w.layers)), desc="exporting layers to ONNX",
                  disable=not progress, unit="layer")
    quantized = []
    for i, layer in layers:
        full = graphs.BlockWeights.of(layer, spec)
        quantized.append(graphs.BlockWeights.of(layer, spec, stand_ins.layers[i]))
        _save(graphs.block(full), folder, f"layer_{i}")
        _save(graphs.block(quantized[i]), folder, f"stand_in_{i}")
        _save(graphs.kv_projection(full), folder, f"kv_{i}")
    tails = tail_starts(spec.num_layers)
    for start in tails:
        _save(graphs.tail(quantized[start:], list(spec.rope_keys[start:])), folder,
              f"tail_{start}")
    _save(graphs.embedding(w.embed, spec.embed_scale), folder, "embed")
    norm = graphs.Norm.of(w.final_norm, spec)
    _save(graphs.head(norm, w.head, spec.final_softcap), folder, "head")
    _save(graphs.head(norm, graphs.nbits(stand_ins.head), spec.final_softcap), folder,
          "stand_in_head")
    if hasattr(checkpoint.tokenizer, "hf"):   # a model for speed only may have no text
        checkpoint.tokenizer.hf.save_pretrained(folder / "tokenizer")
    manifest = Manifest(spec, stand_ins.errors, tails)
    manifest.save(folder)
    return manifest


def exported(model: str | None, quant: QuantSpec, progress: bool) -> Path:
    """The cached export folder for `model`, exporting it on first use."""
    source = locate(model, progress)
    key = digest(files_key(source), FORMAT, QUANT_FORMAT, quant.bits, quant.group_size,
                 quant.method)
    target = cache_root() / "onnx" / f"{source.name}-{key}"

    def build(folder: Path) -> None:
        checkpoint = open_model(str(source), progress)
        export_model(checkpoint, stand_ins(checkpoint, quant, progress), folder, progress)
    return cached(target, build, key)
