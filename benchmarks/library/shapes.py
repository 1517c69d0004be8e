"""The models a speed benchmark runs: a real one (a Hugging Face folder, a GGUF, or the
embedded SmolLM2-135M-Instruct) or a random-weight model of a known shape, built in code, for
speed alone (no download, no files carried to a lent machine).

Random shapes decode token ids, never text. Their layers share one random draw per projection
and their stand-ins one quantization (each layer still holds its own copy on the device, so
bytes and kernels are a real model's), quantized by RTN: HQQ changes only the zero points, so
the kernels and bytes are the same, and HQQ in NumPy takes minutes per billion weights.
"""

from __future__ import annotations

import attrs
import numpy as np

from river_core import QuantSpec, RiverModel


@attrs.frozen
class Shape:
    """A Llama-family decoder's dimensions (as its config.json gives them), and the bytes
    they make."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    hub: str = ""   # the model it stands for

    def projection_params(self) -> int:
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return self.layers * (attn + 3 * self.hidden * self.intermediate)

    def params(self) -> int:
        norms = (2 * self.layers + 1) * self.hidden
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.projection_params() + norms + embed

    def stand_in_bytes(self, bits: int = 4, group: int = 64) -> int:
        """Every layer's seven projections at `bits` with a bfloat16 scale and zero point a
        group, and the LM head's 8-bit stand-in (a bfloat16 scale a row)."""
        layers = self.projection_params() * (bits / 8 + 2 * 2 / group)
        head = self.vocab * self.hidden + 2 * self.vocab
        return int(layers + head)

    def cache_bytes_per_position(self, element: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * element


# the paper's models, from each one's config.json on the Hugging Face hub (transcribed:
# nothing is downloaded; Ministral 3: its text_config)
SHAPES = {
    "tiny": Shape(4, 64, 128, 4, 2, 16, 256, True),   # the suite's
    "llama-1b": Shape(16, 2048, 8192, 32, 8, 64, 128256, True, "meta-llama/Llama-3.2-1B"),
    "llama-8b": Shape(32, 4096, 14336, 32, 8, 128, 128256, False, "meta-llama/Llama-3.1-8B"),
    "phi-4-mini": Shape(32, 3072, 8192, 24, 8, 128, 200064, True,
                        "microsoft/Phi-4-mini-instruct"),
    "ministral-3-8b": Shape(34, 4096, 14336, 32, 8, 128, 131072, False,
                            "mistralai/Ministral-3-8B-Instruct-2512"),
}
PAPER = ("llama-1b", "llama-8b", "phi-4-mini", "ministral-3-8b")
REAL = "default"   # the embedded model, or --model


class NoText:
    """A random model has no vocabulary: it decodes token ids, never text."""

    eos_ids: frozenset = frozenset()


def random_checkpoint(name: str, max_positions: int, seed: int = 0):
    from river_models.spec import Checkpoint, LayerWeights, ModelSpec, Rotary, Weights

    s = SHAPES[name]
    rng = np.random.default_rng(seed)
    w = lambda rows, cols: rng.standard_normal((rows, cols), np.float32) * 0.02
    qd, kvd = s.heads * s.head_dim, s.kv_heads * s.head_dim
    projections = {"q": w(qd, s.hidden), "k": w(kvd, s.hidden), "v": w(kvd, s.hidden),
                   "o": w(s.hidden, qd), "gate": w(s.intermediate, s.hidden),
                   "up": w(s.intermediate, s.hidden), "down": w(s.hidden, s.intermediate)}
    ones = np.ones(s.hidden, np.float32)
    layer = LayerWeights(input_norm=ones, pre_mlp_norm=ones, projections=projections)
    embed = w(s.vocab, s.hidden)
    head = embed if s.tied else embed.copy()
    hd = s.head_dim
    inv_freq = tuple(float(f) for f in 1.0 / 500000.0 ** (np.arange(0, hd, 2) / hd))
    spec = ModelSpec(family="llama", num_layers=s.layers, hidden=s.hidden,
                     intermediate=s.intermediate, heads=s.heads, kv_heads=s.kv_heads,
                     head_dim=hd, vocab=s.vocab, max_positions=max_positions, eos_ids=(),
                     windows=(None,) * s.layers, rope_keys=("",) * s.layers,
                     rotary={"": Rotary(inv_freq)}, norm_eps=1e-5, attn_scale=hd ** -0.5)
    return Checkpoint(name, f"random{seed}", spec,
                      Weights(embed, ones, head, (layer,) * s.layers), NoText())


def shared_stand_ins(checkpoint, quant: QuantSpec):
    """The stand-ins of a random shape: its one layer quantized once (RTN where HQQ is asked),
    for every layer."""
    from river_models import StandInWeights
    from river_models.quant import HEAD, quantize, weight_error
    from river_models.spec import PROJECTIONS

    spec = attrs.evolve(quant, method=quant.method.replace("hqq", "rtn"))
    layer = checkpoint.weights.layers[0]
    q = {name: quantize(layer.projections[name], spec) for name in PROJECTIONS}
    n = checkpoint.spec.num_layers
    return StandInWeights(spec, (q,) * n, (weight_error(layer, q),) * n,
                    quantize(checkpoint.weights.head, HEAD))


def load(engine: str, shape: str, model: str | None, device: str, quant: QuantSpec,
         max_positions: int) -> RiverModel:
    """River's `engine` (BACKEND[:DTYPE], e.g. hf:bfloat16, onnx:int8) on `shape`: REAL (the
    model `model` names) or a random shape of SHAPES."""
    backend, _, dtype = engine.partition(":")
    dtype = dtype or "float32"
    if shape == REAL:
        return RiverModel.from_pretrained(model, backend=backend, device=device, dtype=dtype,
                                          quant=quant, progress=True)
    checkpoint = random_checkpoint(shape, max_positions)
    quantized = shared_stand_ins(checkpoint, quant)
    if backend == "hf":
        import torch

        from river_hf.backend import HFBackend

        return RiverModel(HFBackend(checkpoint, quantized, getattr(torch, dtype), device))
    if backend == "onnx":
        if dtype != "float32":
            raise SystemExit(f"random shapes run on onnx in float32, not {dtype}")
        import tempfile
        from pathlib import Path

        from river_onnx.backend import OnnxBackend
        from river_onnx.export import export_model

        folder = Path(tempfile.mkdtemp(prefix=f"river-{shape}-"))
        manifest = export_model(checkpoint, quantized, folder, progress=True)
        return RiverModel(OnnxBackend(folder, manifest, checkpoint.tokenizer, device))
    raise SystemExit(f"random shapes run on River's hf and onnx engines, not {backend!r}")
