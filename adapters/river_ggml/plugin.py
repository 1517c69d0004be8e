"""Registers the `ggml` backend with River (entry point `ggml` in group `river_core`)."""

from __future__ import annotations

import shutil
import weakref
from pathlib import Path

import attrs

from river_core.contract.backend import ModelShape
from river_core.settings.config import QuantSpec
from river_core.settings.errors import CapabilityError, ConfigError, ModelError
from river_core.contract.hookspecs import BackendPlugin, hookimpl

from . import CAPABILITIES

# its stand-ins: symmetric 4-bit groups of 32, ggml's Q4_0 blocks (stand_ins.py)
STAND_INS = QuantSpec(group_size=32, method="sym")


def _binding():
    try:
        from . import lib
    except ImportError:
        raise CapabilityError("the ggml backend needs ggml-python: pip install "
                              "'river-llm[ggml]' (it compiles ggml: about a minute)") from None
    return lib


def user_gguf(model: str | None) -> Path:
    """The GGUF file a model argument names: the embedded default's, or the user's."""
    from river_models import default_gguf

    if model is None:
        return default_gguf()
    path = Path(model).expanduser()
    if path.suffix != ".gguf" or not path.is_file():
        raise ModelError(f"the ggml backend runs a .gguf file, not {path}")
    return path


def backbone_gguf(model: str | None, progress: bool = False) -> Path:
    """The GGUF the backbone runs from: the user's file in its own types, or for the embedded
    default (Q4_1) its F16 copy, written once into the user cache as llama.cpp's anchor."""
    from river_models.gguf_write import backbone

    return user_gguf(model) if model is not None else backbone(user_gguf(None), "F16", progress)


def spec_and_tokenizer(model: str | None, progress: bool = False):
    """The model's ModelSpec and tokenizer, read from the GGUF's own header (no conversion, no
    torch or transformers) once into the user cache (`gguf_entry`, `FileTokenizer`)."""
    from river_models.source import gguf_entry
    from river_models.tokenizer import FileTokenizer

    folder, spec = gguf_entry(user_gguf(model), progress)
    return spec, FileTokenizer(folder, spec.eos_ids)


def load(model: str | None = None, *, device: str = "cpu", dtype: str | None = None,
         quant: QuantSpec = STAND_INS, progress: bool = False):
    """llama.cpp's ggml CPU kernels, layer by layer, over the GGUF's own tensor types; K/V in
    float16. The stand-ins' type is chosen below the backbone's (stand_ins.choose); where none
    fits, exit mode is refused in one line and lossless mode and full depth run. Its phases'
    wall-clock is the backend's `load_seconds`."""
    from river_core.contract.phases import Phases

    phases = Phases()
    if device != "cpu":
        raise ConfigError(f"the ggml backend runs on the CPU, not {device}")
    if dtype not in (None, "float32"):
        raise ConfigError(f"the ggml backend computes in float32 over the GGUF's own tensor "
                          f"types, not {dtype}")
    lib = _binding()
    from .backend import GgmlBackend
    from .stand_ins import choose, stand_ins
    phases.done("imports")

    spec, tokenizer = spec_and_tokenizer(model, progress)
    phases.done("tokenizer")
    backbone = lib.MappedGGUF(backbone_gguf(model, progress))
    backbone.self_check()
    phases.done("backbone")   # mapped (its F16 copy made once for the embedded model) and
                              # each way its weights are read checked
    # below the backbone, never beside it: the type from the backbone's (River's own
    # quantizer where the user names one)
    choice = choose(backbone, spec.num_layers) if quant == STAND_INS else None
    # made (or found in the cache) when a mode first runs them, not before
    made = stand_ins(backbone, spec.num_layers, quant, choice.kind if choice else "Q4_0",
                     progress)
    backend = GgmlBackend(backbone, spec, tokenizer, made)
    if choice and choice.refused:
        backend.capabilities = attrs.evolve(backend.capabilities, exit_refused=choice.refused)
    backend.load_seconds = phases.seconds
    return backend


def tiny_backend(family: str, seed: int, bits: int, method: str = "hqq"):
    """The ggml backend over a tiny random model written as a float32 GGUF as llama.cpp's
    converter writes it (river_conformance.fixtures.tiny_gguf), with the very stand-ins the other engines'
    factories run (tiny.stand_ins; `method` "sym": this engine's own, as Q4_0) under the
    GGUF's names, in a temporary folder."""
    lib = _binding()
    from river_conformance.fixtures import tiny
    from river_models import QuantWeight
    from river_conformance.fixtures.tiny_gguf import gguf_file, permuted, projections

    from .backend import GgmlBackend
    from .stand_ins import Quantized, StandIns, blocks_kind, mapped

    def permute(q: QuantWeight, heads: int) -> QuantWeight:
        return QuantWeight(*(permuted(a, heads) for a in (q.codes, q.scale, q.zero)), q.bits)

    checkpoint = tiny.checkpoint(family, seed)
    spec = checkpoint.spec
    quant = tiny.stand_ins(checkpoint, bits, method)
    weights, errors = mapped(Quantized(
        tuple({f"blk.{i}.{name}": q for name, q in
               projections(family, spec, layer, permute, QuantWeight.stack).items()}
              for i, layer in enumerate(quant.layers)), quant.errors, quant.head))
    backbone = lib.MappedGGUF(gguf_file(seed, family))
    backend = GgmlBackend(backbone, spec, checkpoint.tokenizer,
                          StandIns.made(weights, errors, blocks_kind(quant.spec), backbone))
    # the stand-ins' temporary folder lives as long as the backend that maps them
    weakref.finalize(backend, shutil.rmtree, weights.path.parent, ignore_errors=True)
    return backend


def shape(model: str | None) -> ModelShape | None:
    from river_models.source import model_shape

    return model_shape(model)


@hookimpl
def river_backends():
    return {"ggml": BackendPlugin(load, CAPABILITIES, shape, STAND_INS)}


@hookimpl
def river_conformance_backends():
    return {"ggml": tiny_backend}
