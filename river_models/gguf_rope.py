"""The settings transformers' GGUF loader drops, read back from the GGUF itself.

transformers (5.19) builds a model's config from a GGUF header by a fixed table of keys, which
misses what some families need, so their converted models would run wrong with no error:
- `attention.key_length`, where the heads are not hidden / heads wide;
- what a family's record puts back (`Gguf.restore` in river_models.families: a query scalar in
  no file, a partial rotary and LongRoPE's factors);
- Llama 3.1/3.2: llama.cpp's converter stores the llama3 rope scaling only as each frequency's
  divisor (tensor `rope_freqs`); the parameters behind it are recovered here and checked by
  recomputing the divisors with transformers' own llama3 rule, or the file is refused.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from river_core.settings.errors import ModelError

from .families import BY_ARCH
from .gguf_header import float_tensor, read_header

# Meta's Llama 3.x values, which llama.cpp's converter also falls back to
LLAMA3_BAND = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
LLAMA3_CONTEXT = 8192


def rope_tensors(path: Path) -> dict[str, np.ndarray]:
    header = read_header(path)
    return {name: float_tensor(path, header, name).astype(np.float64)
            for name in header.tensors if name.startswith("rope_")}


def complete(config, metadata: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    """Puts into `config` (transformers' reading of a GGUF) the fields it dropped."""
    arch = metadata["general.architecture"]
    if f"{arch}.attention.key_length" in metadata and hasattr(config, "head_dim"):
        config.head_dim = int(metadata[f"{arch}.attention.key_length"])
    family = BY_ARCH.get(arch)
    if family is not None and family.gguf.restore is not None:
        family.gguf.restore(config, metadata, tensors)
    if "rope_freqs.weight" in tensors:
        config.rope_parameters = _llama3(config, tensors["rope_freqs.weight"],
                                         metadata.get(f"{arch}.rope.scaling.original_context_length"))


def _llama3(config, divisors: np.ndarray, context: int | None) -> dict:
    """llama3 rope parameters whose divisors are `divisors`, with Meta's frequency band; the
    original context from the header, else from a divisor inside the band, else Meta's."""
    theta = config.rope_parameters["rope_theta"]
    dim = 2 * len(divisors)
    inv_freq = 1.0 / theta ** (np.arange(0, dim, 2) / dim)
    factor = round(float(divisors.max()), 4)   # stored in float32
    low, high = LLAMA3_BAND["low_freq_factor"], LLAMA3_BAND["high_freq_factor"]
    candidates = [c for c in (context, LLAMA3_CONTEXT) if c]
    for divisor, freq in zip(divisors, inv_freq):
        if 1 < divisor < factor:   # smooth = (context / wavelength - low) / (high - low)
            smooth = (1 / divisor - 1 / factor) / (1 - 1 / factor)
            candidates.append(round((smooth * (high - low) + low) * 2 * math.pi / freq))
    for original in candidates:
        rope = {"rope_type": "llama3", "rope_theta": theta, "factor": factor, **LLAMA3_BAND,
                "original_max_position_embeddings": int(original)}
        if np.allclose(inv_freq / _llama3_inv_freq(config, rope), divisors, rtol=1e-5):
            return rope
    raise ModelError("this GGUF's rope frequency factors (rope_freqs) match no llama3 rope "
                     "scaling River can rebuild; convert the model from its Hugging Face "
                     "folder instead")


def _llama3_inv_freq(config, rope: dict) -> np.ndarray:
    import copy

    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    trial = copy.deepcopy(config)
    trial.rope_parameters = rope
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](trial, None)
    return inv_freq.double().numpy()
