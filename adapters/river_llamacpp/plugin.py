"""Registers the `llamacpp` backend (optional extra `llamacpp`)."""

from __future__ import annotations

import atexit
import os
from pathlib import Path

from river_core.contract.backend import ModelShape
from river_core.settings.config import QuantSpec
from river_core.settings.errors import CapabilityError, ConfigError, ModelError
from river_core.contract.hookspecs import BackendPlugin, hookimpl
from river_models.families import FAMILIES

from . import CAPABILITIES

CONTEXT = 8192   # positions allocated; smaller than most models' trained context, to save memory


def _llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        raise CapabilityError("the llamacpp backend needs llama-cpp-python: "
                              "pip install 'river-llm[llamacpp]'") from None
    return llama_cpp


def open_llama(path: Path, context: int, exact: bool):
    """llama.cpp (llama-cpp-python's `Llama`) on the GGUF at `path` with `context` positions,
    and its depth: the llamacpp backend's, and the other engines' comparisons with llama.cpp
    on the same file (tests/test_real_files.py, `river bench real_files`)."""
    llama_cpp = _llama_cpp()
    # exact: float32 K/V (llama.cpp defaults to float16), for comparisons with other backends;
    # else float16 K/V through flash attention, as llama.cpp's tools run by default (its
    # Python binding does not) and River's ggml engine runs: the two then agree bitwise, where
    # llama.cpp's other attention path rounds 1% of the logits' norm away on a quantized model
    kv_type = {"type_k": 0, "type_v": 0} if exact else {"flash_attn": True}
    try:
        # n_ubatch=1: evaluating several tokens at once crashes llama-cpp-python 0.3.36 on
        # Q4_1 weights on our AVX-512/AMX CPU (segfault in ggml). One at a time costs prefill
        # speed only; decoding is one token a step anyway.
        llm = llama_cpp.Llama(str(path), n_ctx=context, n_threads=os.cpu_count(),
                              n_ubatch=1, verbose=False, **kv_type)
    except Exception as e:   # llama.cpp reports damaged files as ValueError or RuntimeError
        raise ModelError(f"llama.cpp cannot load {path}: {e}") from None
    atexit.register(llm.close)   # before interpreter teardown, which breaks llama.cpp's __del__
    return llm, int(llm.metadata[f"{llm.metadata['general.architecture']}.block_count"])


def load(model: str | None = None, *, device: str = "cpu", dtype: str = "float32",
         quant: QuantSpec = QuantSpec(), progress: bool = False):
    """llama.cpp via llama-cpp-python (CPU): full depth only, GGUF files."""
    from river_models import default_gguf

    from .backend import LlamaCppBackend

    if device != "cpu":
        raise CapabilityError("the llamacpp backend runs on the CPU only")
    if dtype != "float32":
        raise ConfigError("llama.cpp computes in the GGUF file's own types; --dtype does not "
                          "apply to the llamacpp backend")
    path = default_gguf() if model is None else Path(model).expanduser()
    if path.suffix != ".gguf" or not path.is_file():
        raise ModelError(f"the llamacpp backend needs a .gguf file, got {path}")
    llm, layers = open_llama(path, CONTEXT, exact=False)
    return LlamaCppBackend(llm, layers, path)


# the tiny families llama.cpp computes otherwise than transformers, and why
DIFFERS = {f.name: f.llamacpp_differs for f in FAMILIES if f.llamacpp_differs}


def tiny_backend(family: str, seed: int, bits: int, exact: bool = True):
    """llama.cpp over a tiny random model written as a float32 GGUF as its converter writes
    it, with float32 K/V (`exact`) or its default float16."""
    if family in DIFFERS:
        raise CapabilityError(f"llama.cpp computes the tiny {family} otherwise than "
                              f"transformers: {DIFFERS[family]}")
    _llama_cpp()   # before the tiny GGUF, whose writer needs gguf (absent where it is absent)
    from .backend import LlamaCppBackend
    from river_conformance.fixtures.tiny_gguf import gguf_file

    path = gguf_file(seed, family)
    llm, layers = open_llama(path, 256, exact)
    return LlamaCppBackend(llm, layers, path)


def shape(model: str | None) -> ModelShape | None:
    """The GGUF's depth, and the context this backend allocates."""
    from river_models.source import model_shape

    found = model_shape(model)
    return None if found is None else ModelShape(found.num_layers, CONTEXT)


@hookimpl
def river_backends():
    return {"llamacpp": BackendPlugin(load, CAPABILITIES, shape)}


@hookimpl
def river_conformance_backends():
    return {"llamacpp": tiny_backend}
