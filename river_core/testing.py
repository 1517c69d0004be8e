"""Helpers for testing backends against the contract: scripted exits and teacher forcing."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .backend import Backend
from . import decode
from .kv import KVStrategy
from .predictor import TransitionPredictor


class ScriptedPolicy:
    """Exits step s after layer `exits[s]` (None or >= the last layer: full depth)."""

    uses_similarity, sub_blocks = False, False

    def __init__(self, exits: Sequence[int | None]) -> None:
        self.exits = list(exits)

    def should_exit(self, layer: int, step: int, predictor) -> bool:
        return step < len(self.exits) and self.exits[step] == layer


def teacher_force(backend: Backend, prompt: Sequence[int], continuation: Sequence[int],
                  strategy: KVStrategy, exits: Sequence[int | None] = ()) -> list[np.ndarray]:
    """Prefill `prompt`, then feed `continuation` one token a step with scripted exits.

    Returns the logits after the prompt and after each fed token."""
    return decode.teacher_force(backend, prompt, continuation, strategy, ScriptedPolicy(exits),
                                TransitionPredictor).logits


def relative_error(approx: np.ndarray, exact: np.ndarray) -> float:
    """||approx - exact|| / ||exact|| (Frobenius)."""
    return float(np.linalg.norm(approx - exact) / max(np.linalg.norm(exact), 1e-30))
