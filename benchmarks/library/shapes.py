"""The models a speed benchmark runs: a real one (a Hugging Face folder, a GGUF, or the
embedded SmolLM2-135M-Instruct) or a random-weight model of a known shape, built in code, for
speed alone (no download, no files carried to a lent machine).

Random shapes decode token ids, never text. Their layers share one random draw per projection
and their stand-ins one quantization (each layer still holds its own copy on the device, so
bytes and kernels are a real model's), quantized by RTN: HQQ changes only the zero points, so
the kernels and bytes are the same, and HQQ in NumPy takes minutes per billion weights.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

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
ROPE_BASE = 500000.0   # Llama 3's


class NoText:
    """A random model has no vocabulary: it decodes token ids, never text."""

    eos_ids: frozenset = frozenset()


@functools.lru_cache(maxsize=1)   # the last draw: `river bench gpu`'s transformers copy of
def random_checkpoint(name: str, max_positions: int, seed: int = 0):   # it (8B: 24 s a draw)
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
    inv_freq = tuple(float(f) for f in 1.0 / ROPE_BASE ** (np.arange(0, hd, 2) / hd))
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


GGUF_FORMAT = 1   # bump when random_gguf's file changes


def random_gguf(name: str, kind: str, anchors_python=None):
    """Random shape `name` as a llama GGUF of `kind`, made once into the benchmark cache: F16
    written here as llama.cpp's converter writes a Llama (Q and K rows permuted, norms F32);
    Q4_0 made from it by llama.cpp's own quantizer (`llama_model_quantize`, what
    llama-quantize runs) in the anchors' environment `anchors_python`. The vocabulary is
    placeholder pieces: a random model decodes ids."""
    from river_models.cache import cache_root

    folder = cache_root() / "bench"
    target = folder / f"random-{name}-{kind}-{GGUF_FORMAT}.gguf"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    if kind == "F16":
        _write_f16(name, partial)
    elif kind == "Q4_0":
        source = random_gguf(name, "F16")
        quantize = ("import sys, llama_cpp as l; p = l.llama_model_quantize_default_params(); "
                    "p.ftype = l.LLAMA_FTYPE_MOSTLY_Q4_0; p.nthread = 0; "
                    "sys.exit(l.llama_model_quantize(sys.argv[1].encode(), "
                    "sys.argv[2].encode(), p))")
        subprocess.run([str(anchors_python), "-c", quantize, str(source), str(partial)],
                       check=True)
    else:
        raise SystemExit(f"random shapes are written as F16 or Q4_0 GGUFs, not {kind}")
    partial.rename(target)
    return target


def _write_f16(name: str, path) -> None:
    import gguf

    from river_conformance.fixtures.tiny_gguf import add_shape, projections

    checkpoint = random_checkpoint(name, 4096)
    spec, weights, s = checkpoint.spec, checkpoint.weights, SHAPES[name]
    print(f"writing {name} as an F16 GGUF ({s.params() * 2 / 1e9:.1f} GB)", file=sys.stderr,
          flush=True)
    w = gguf.GGUFWriter(path, "llama")
    add_shape(w, spec, 131072, [f"<{i}>".encode() for i in range(s.vocab)],
              gguf.LlamaFileType.MOSTLY_F16)
    w.add_rope_dimension_count(s.head_dim)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_eos_token_id(2)
    half = lambda a: a.astype(np.float16)
    w.add_tensor("token_embd.weight", half(weights.embed))
    w.add_tensor("output_norm.weight", weights.final_norm)
    if not s.tied:
        w.add_tensor("output.weight", half(weights.head))
    layer = weights.layers[0]   # every layer the same draw, each stored whole
    tensors = {**{k: half(v) for k, v in projections("llama3", spec, layer.projections).items()},
               "attn_norm.weight": layer.input_norm, "ffn_norm.weight": layer.pre_mlp_norm}
    for i in range(s.layers):
        for tensor, value in tensors.items():
            w.add_tensor(f"blk.{i}.{tensor}", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=True)
    w.close()


def ggml_backend(name: str, checkpoint, quant: QuantSpec):
    """The ggml engine on random shape `name`: its F16 GGUF, and the shared stand-ins as the
    engine's blocks under the GGUF's names (Q and K permuted as the GGUF stores them)."""
    from river_ggml.backend import GgmlBackend
    from river_ggml.lib import MappedGGUF
    from river_ggml.stand_ins import Quantized, StandIns, blocks_kind, mapped
    from river_models import QuantWeight
    from river_conformance.fixtures.tiny_gguf import permuted, projections

    def permute(q: QuantWeight, heads: int) -> QuantWeight:
        return QuantWeight(*(permuted(a, heads) for a in (q.codes, q.scale, q.zero)), q.bits)

    quantized = shared_stand_ins(checkpoint, quant)
    spec = checkpoint.spec
    layer = projections("llama3", spec, quantized.layers[0], permute)
    weights, errors = mapped(Quantized(
        tuple({f"blk.{i}.{n}": q for n, q in layer.items()} for i in range(spec.num_layers)),
        quantized.errors, quantized.head))
    backbone = MappedGGUF(random_gguf(name, "F16"))
    return GgmlBackend(backbone, spec, NoText(),
                       StandIns.made(weights, errors, blocks_kind(quant), backbone))


def engine_quant(engine: str, args) -> QuantSpec:
    """The stand-ins `engine` (BACKEND[:DTYPE]) runs: its own (`BackendPlugin.quant`) with
    what the arguments' --bits, --group-size and --quantizer set."""
    from river_core import default_registry
    from river_core.arguments import quant_spec

    return quant_spec(args, default_registry().backend(engine.partition(":")[0]).quant)


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

        from river_torch.backend import TorchBackend

        return RiverModel(TorchBackend(checkpoint, quantized, getattr(torch, dtype), device))
    if backend == "onnx":
        if dtype != "float32":
            raise SystemExit(f"random shapes run on onnx in float32, not {dtype}")
        import tempfile

        from river_onnx.backend import OnnxBackend
        from river_onnx.export import export_model

        folder = Path(tempfile.mkdtemp(prefix=f"river-{shape}-"))
        manifest = export_model(checkpoint, quantized, folder, progress=True)
        return RiverModel(OnnxBackend(folder, manifest, checkpoint.tokenizer, device))
    if backend == "ggml":
        return RiverModel(ggml_backend(shape, checkpoint, quant))
    raise SystemExit(f"random shapes run on River's hf, onnx and ggml engines, not {backend!r}")


def made_once(path: Path, what: str, write) -> Path:
    """`path` in the benchmark cache, written once by `write(partial)` (`what` said while it
    works) into a partial file renamed when whole, so a run cut short leaves nothing to
    trust."""
    if not path.is_file():
        print(what, file=sys.stderr, flush=True)
        partial = path.with_suffix(".partial")
        write(partial)
        partial.rename(path)
    return path
