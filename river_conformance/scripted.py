"""Teacher forcing with exits chosen by the test, not by a policy: what the kit, the tests and
the K/V measurements drive a backend with."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from river_core.contract.backend import Backend
from river_core.loop.decode import Run, teacher_force
from river_core.method.kv import KVStrategy
from river_core.method.policy import ScriptedExits
from river_core.method.predictor import TransitionPredictor


def scripted_run(strategy: KVStrategy, exits: Sequence[int | None] = ()) -> Run:
    """`strategy` with step s exiting after layer `exits[s]` (None or past the end: full
    depth)."""
    return Run(strategy, ScriptedExits(exits), TransitionPredictor)


def forced_logits(backend: Backend, prompt: Sequence[int], continuation: Sequence[int],
                  strategy: KVStrategy, exits: Sequence[int | None] = ()) -> list[np.ndarray]:
    """Prefill `prompt`, feed `continuation` a token a step, step s exiting after layer
    `exits[s]` (None or past the end: full depth): the logits after the prompt and after each
    fed token."""
    return teacher_force(backend, [prompt], [continuation], scripted_run(strategy, exits))[0].logits
