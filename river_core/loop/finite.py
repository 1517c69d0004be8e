"""No silent wrong answer: logits with a NaN or +inf fail the generation.

A model whose activations overflow (float16, or weights out of range) gives NaN logits, and
every engine's argmax then returns token 0, step after step, without an error. The core reads
the logits on the host anyway to choose a token; `checked` looks at each row's maximum there
(one reduction over the vocabulary, NaN and +inf propagate into it; -inf is a masked token,
not a fault). Only after a failure does it look for the cause: a diagnostic replay of the
row's sequence through a fresh prefill at full depth, whose per-layer similarities (cosine of
each layer's input and output) go NaN from the first layer whose output went non-finite.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..contract.backend import Backend
from ..settings.errors import NonFiniteError


def checked(logits: np.ndarray, backend: Backend, sequence: Callable[[int], list[int]],
            token: int) -> np.ndarray:
    """`logits` [rows, vocab] when every row's maximum is finite; else a NonFiniteError
    naming the model, the engine and the first non-finite layer of the first bad row, whose
    logits came from the token ids `sequence(row)` (`token`: the index of the token being
    chosen)."""
    top = logits.max(axis=-1)
    if np.isfinite(top).all():
        return logits
    row = int(np.argmin(np.isfinite(top)))
    raise NonFiniteError(f"{model_name(backend)} on the {backend.name} engine gave non-finite "
                         f"logits (NaN or +inf) for token {token} of sequence {row}: "
                         f"{first_nonfinite_layer(backend, sequence(row))}")


def model_name(backend: Backend) -> str:
    return getattr(backend, "model_name", None) or "the model"


def first_nonfinite_layer(backend: Backend, ids: list[int]) -> str:
    """Where a row's activations first went non-finite, as a clause; the replay overwrites
    the engine's cache (the generation has failed anyway)."""
    if not backend.capabilities.exits:
        return f"the {backend.name} engine runs its layers itself and cannot tell which layer"
    similarity = backend.prefill([ids], len(ids)).similarity[0]
    bad = ~np.isfinite(similarity)
    if not bad.any():
        return ("replayed at full depth every layer's output stays finite, so the stand-ins' "
                "path (exit mode) went non-finite")
    return (f"the first layer whose output went non-finite is layer {int(np.argmax(bad))} of "
            f"{backend.num_layers} (replayed at full depth)")
