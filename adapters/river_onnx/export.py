"""Export a model package `Checkpoint` into per-layer ONNX graphs, cached on disk.

One folder per (model files, stand-in quantization, export format), under the user cache's
`onnx/`: `embed`, `head`, `stand_in_head` (its quantized copy, for drafts), and per layer
`layer_i` (the block), `stand_in_i` (its quantized copy) and `kv_i` (its K/V projection, for
`propagate`); `tail_s` for the first few layers s: the stand-ins of s..L-1 as one graph, so a
token that exits early runs its exit river in one session run (faster than a run per layer:
docs/results/levers.md, "onnx_tail"); plus `manifest.json` (the ModelSpec, the stand-ins' weight
errors, the tail starts) and the tokenizer. Every graph keeps its weights in one shared
`weights.data`, each distinct tensor once: the tails point at the stand-ins' bytes and a K/V
projection at its layer's (before, each graph had its own copy: 1.2 GB for the embedded model).
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
from tqdm import tqdm

from river_core.settings.config import QuantSpec
from river_models import Checkpoint, ModelSpec, StandInWeights, stand_ins
from river_models.cache import cache_root, cached, content_key, digest
from river_models.quant import FORMAT as QUANT_FORMAT
from river_models.source import locate, open_model

from . import graphs
from .activations import Meter
from .half import HALVES
from .weights import SharedWeights

FORMAT = 13   # bump when the graphs change: old exports are then ignored


def tail_starts(num_layers: int) -> tuple[int, ...]:
    """Where tails begin: before the first layer (the whole model quantized) and after each
    of the first sixth of the layers, where the paper's rule sends most tokens."""
    return tuple(range(0, max(2, -(-num_layers // 6)) + 1))


@attrs.frozen
class Manifest:
    spec: ModelSpec
    stand_in_error: tuple[float, ...]
    tails: tuple[int, ...]
    floats: str   # the graphs' float type: float32, float16 or bfloat16 (half.py)
    # each layer's largest activation in float32 (activations.py), measured for the half
    # precision exports; None for float32 ones
    activations: tuple[float, ...] | None = None

    def save(self, folder: Path) -> None:
        (folder / "manifest.json").write_text(json.dumps(
            {"spec": self.spec.to_json(), "stand_in_error": list(self.stand_in_error),
             "tails": list(self.tails), "floats": self.floats,
             "activations": None if self.activations is None else list(self.activations)}))

    @classmethod
    def read(cls, folder: Path) -> "Manifest":
        d = json.loads((folder / "manifest.json").read_text())
        return cls(ModelSpec.from_json(d["spec"]), tuple(d["stand_in_error"]), tuple(d["tails"]),
                   d["floats"], None if d["activations"] is None else tuple(d["activations"]))


# what the engine runs. float16: every float tensor in half precision (half.py), what ONNX
# Runtime's CUDA provider runs; int8: the backbone's layers in 8 bits, float32 activations.
# export_model writes bfloat16 too (every node has a CUDA kernel), which the engine cannot
# bind yet: ONNX Runtime's Python takes no bfloat16 numpy array (only raw 16-bit words through
# OrtValue.ortvalue_from_numpy_with_onnx_type), and every host array the engine binds is one
DTYPES = ("float32", "float16", "int8")


def default_dtype(device: str) -> str:
    """float32 on the CPU; float16 on CUDA, whose provider registers GroupQueryAttention,
    MatMulNBits and RotaryEmbedding for float16 and not float32 (tests/test_onnx_cuda.py)."""
    return "float32" if device == "cpu" else "float16"


def export_model(checkpoint: Checkpoint, stand_ins: StandInWeights, folder: Path,
                 progress: bool = False, backbone: StandInWeights | None = None,
                 floats: str = "float32") -> Manifest:
    """Write every graph of `checkpoint` into `folder`. `backbone`: quantized weights the
    backbone's layers run instead of the float ones (the int8 backbone); the embedding and the
    head stay float. `floats`: the graphs' float type, float32, float16 or bfloat16."""
    spec, w = checkpoint.spec, checkpoint.weights
    weights = SharedWeights(folder, floats)
    # the exports CUDA runs: MatMulNBits in blocks it takes, attention's causal branch
    cuda = floats in HALVES
    layers = tqdm(list(enumerate(w.layers)), desc="exporting layers to ONNX",
                  disable=not progress, unit="layer")
    quantized = []
    meter = Meter(checkpoint) if cuda else None
    for i, layer in layers:
        full = graphs.BlockWeights.of(layer, spec, None if backbone is None else backbone.layers[i])
        quantized.append(graphs.BlockWeights.of(layer, spec, stand_ins.layers[i], cuda))
        block = graphs.block(full, cuda)
        if meter is not None:
            meter.layer(i, block)
        weights.save(block, f"layer_{i}")
        weights.save(graphs.block(quantized[i], cuda), f"stand_in_{i}")
        weights.save(graphs.kv_projection(full), f"kv_{i}")
    tails = tail_starts(spec.num_layers)
    for start in tails:
        weights.save(graphs.tail(quantized[start:], list(spec.rope_keys[start:]), cuda),
                     f"tail_{start}")
    weights.save(graphs.embedding(w.embed, spec.embed_scale), "embed")
    norm = graphs.Norm.of(w.final_norm, spec)
    weights.save(graphs.head(norm, w.head, spec.final_softcap), "head")
    weights.save(graphs.head(norm, graphs.nbits(stand_ins.head, cuda), spec.final_softcap),
                 "stand_in_head")
    weights.close()
    if hasattr(checkpoint.tokenizer, "hf"):   # a model for speed only may have no text
        checkpoint.tokenizer.hf.save_pretrained(folder / "tokenizer")
    manifest = Manifest(spec, stand_ins.errors, tails, floats,
                        None if meter is None else tuple(meter.peaks))
    manifest.save(folder)
    return manifest


def exported(model: str | None, quant: QuantSpec, progress: bool, dtype: str) -> Path:
    """The cached export folder for `model`, exporting it on first use. dtype "float16" or
    "bfloat16": every graph in that half precision; "int8": the backbone's layers in 8 bits
    (symmetric, a scale per output row: the int8 stand-ins' quantizer), which MatMulNBits runs
    on int8 activations."""
    source = locate(model, progress)
    key = digest(content_key(source), FORMAT, QUANT_FORMAT, quant.bits, quant.group_size,
                 quant.method, dtype)
    target = cache_root() / "onnx" / f"{source.name}-{dtype}-{key}"

    def build(folder: Path) -> None:
        checkpoint = open_model(str(source), progress)
        backbone = stand_ins(checkpoint, QuantSpec(bits=8), progress) if dtype == "int8" \
            else None
        export_model(checkpoint, stand_ins(checkpoint, quant, progress), folder, progress,
                     backbone, dtype if dtype in HALVES else "float32")
    return cached(target, build, key, source=source)
