"""Export a model package `Checkpoint` into per-layer ONNX graphs, cached on disk.

One folder per (model files, stand-in quantization, export format), under the user cache's
`onnx/`: `embed`, `head`, and per layer `layer_i` (the block), `stand_in_i` (its quantized copy)
and `kv_i` (its K/V projection, for `propagate`), each an .onnx file with its weights beside
it, plus `manifest.json` (the ModelSpec and the stand-ins' weight errors) and the tokenizer.
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
from river_models.source import locate, open_model

from . import graphs

FORMAT = 5   # bump when the graphs change: old exports are then ignored


@attrs.frozen
class Manifest:
    spec: ModelSpec
    stand_in_error: tuple[float, ...]

    def save(self, folder: Path) -> None:
        (folder / "manifest.json").write_text(json.dumps(
            {"spec": self.spec.to_json(), "stand_in_error": list(self.stand_in_error)}))

    @classmethod
    def read(cls, folder: Path) -> "Manifest":
        d = json.loads((folder / "manifest.json").read_text())
        return cls(ModelSpec.from_json(d["spec"]), tuple(d["stand_in_error"]))


def _save(model: onnx.ModelProto, folder: Path, name: str) -> None:
    onnx.save_model(model, folder / f"{name}.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location=f"{name}.data")


def export_model(checkpoint: Checkpoint, stand_ins: StandIns, folder: Path,
                 progress: bool = False) -> Manifest:
    """Write every graph of `checkpoint` into `folder`."""
    spec, w = checkpoint.spec, checkpoint.weights
    layers = tqdm(list(enumerate(w.layers)), desc="exporting layers to ONNX",
                  disable=not progress, unit="layer")
    for i, layer in layers:
        full = graphs.BlockWeights.of(layer, spec)
        _save(graphs.block(full), folder, f"layer_{i}")
        _save(graphs.block(graphs.BlockWeights.of(layer, spec, stand_ins.layers[i])), folder,
              f"stand_in_{i}")
        _save(graphs.kv_projection(full), folder, f"kv_{i}")
    _save(graphs.embedding(w.embed, spec.embed_scale), folder, "embed")
    _save(graphs.head(graphs.Norm.of(w.final_norm, spec), w.head, spec.final_softcap), folder,
          "head")
    checkpoint.tokenizer.hf.save_pretrained(folder / "tokenizer")
    manifest = Manifest(spec, stand_ins.errors)
    manifest.save(folder)
    return manifest


def exported(model: str | None, quant: QuantSpec, progress: bool) -> Path:
    """The cached export folder for `model`, exporting it on first use."""
    source = locate(model, progress)
    target = cache_root() / "onnx" / \
        f"{source.name}-{digest(files_key(source), FORMAT, quant.bits, quant.group_size)}"

    def build(folder: Path) -> None:
        checkpoint = open_model(str(source), progress)
        export_model(checkpoint, stand_ins(checkpoint, quant, progress), folder, progress)
    return cached(target, "manifest.json", build)
