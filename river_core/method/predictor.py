"""State-transition similarity and the predicted cumulative KV error of exiting.

Notation: layers 0..L-1; a token "exits after layer k" when layers 0..k ran in the backbone and
k+1..L-1 are left to the KV strategy (River's stand-ins by default).

Transition of block j: s_j = cos(h_{j-1}, h_j), the cosine between the block's input and output.
Its chord distance t_j = sqrt(2 - 2 s_j) is how far block j moves the (normalised) state.

Default predictor ("transition"), a first-order error model of the stand-ins:
- the stand-in of layer j has relative weight error eps_j (measured when it is quantized);
- its own K/V projection is off by about eps_j even on an exact input;
- its update of the state is off by about eps_j * t_j, and that drift reaches every later layer.
So the relative K/V error the stand-ins leave at layer j > k is about
    eps_j + sum_{k<i<j} eps_i * t_i,
and summed over the skipped layers (the cumulative KV error of exiting after k):
    E(k) = sum_{j>k} eps_j + c * sum_{k<i<L-1} eps_i * m_i * (L - 1 - i)
m_i is the typical t_i: its running mean over earlier tokens (started from the prompt,
updated with every layer a token really ran, backbone or stand-in). The token's own future
transitions are unknown when it decides, so c scales m by how much this token has moved so
far compared with a typical one: c = sum_{j<=k} t_j / sum_{j<=k} m_j. (The paper's `tau` is
another thing: the cosine threshold of its exit rule, policy.py.)

Properties (tested): E >= 0; E(L-1) = 0; for fixed transitions E is non-increasing in k and
non-decreasing in every eps. How well E tracks the measured K/V error is measured by
`benchmarks/predictor_fidelity.py` (see docs/results/).
"""

from __future__ import annotations

import math
from typing import Protocol, Sequence

import numpy as np


# The stand-in K/V bound (docs/river.md, "Stand-in K/V error"): at the d-th stand-in layer j
# a token runs, relative K/V error <= STAND_IN_BOUND_C * eps_j * d. C measured by
# benchmarks/river_kv_error.py (largest ratio seen 3.28) and rounded up; the kit checks it.
STAND_IN_BOUND_C = 4.0


def relative_error(approx: np.ndarray, exact: np.ndarray) -> float:
    """||approx - exact|| / ||exact|| (Frobenius): how K/V errors are measured everywhere."""
    return float(np.linalg.norm(approx - exact) / max(np.linalg.norm(exact), 1e-30))


def transition(similarity: float) -> float:
    """Chord distance between unit vectors at cosine `similarity`, in [0, 2]."""
    return math.sqrt(max(0.0, 2.0 - 2.0 * similarity))


class SimilarityPredictor(Protocol):
    """Per sequence: watches a token's transitions and predicts the error of exiting now."""

    last: float
    """The similarity observed most recently (for rules on the current layer alone)."""

    def observe(self, layer: int, similarity: float) -> None:
        """The current token's block `layer` ran with this input/output cosine."""

    def predicted_error(self, layer: int) -> float:
        """Predicted cumulative KV error of exiting after `layer` (observed up to `layer`)."""

    def end_token(self) -> None:
        """The token is finished: fold its transitions into the running statistics."""


class TransitionPredictor:
    """The default predictor; see the module docstring for its formula."""

    def __init__(self, stand_in_error: Sequence[float], prompt_similarity: Sequence[float],
                 momentum: float = 0.9) -> None:
        if len(stand_in_error) != len(prompt_similarity):
            raise ValueError("stand_in_error and prompt_similarity need one entry per layer")
        self.eps = [float(e) for e in stand_in_error]
        self.typical = [transition(float(s)) for s in prompt_similarity]
        self.momentum = momentum
        self._seen: dict[int, float] = {}
        self.last = 1.0
        self._refresh()

    def _refresh(self) -> None:
        # Suffix sums make E(k) O(1): base[k] = sum_{j>k} eps_j,
        # drift[k] = sum_{k<i<L-1} eps_i * m_i * (L-1-i).
        n = len(self.eps)
        self._base = [0.0] * n
        self._drift = [0.0] * n
        for k in range(n - 2, -1, -1):
            i = k + 1
            self._base[k] = self._base[i] + self.eps[i]
            self._drift[k] = self._drift[i] + self.eps[i] * self.typical[i] * (n - 1 - i)
        self._moved = self._moved_typically = 0.0

    def observe(self, layer: int, similarity: float) -> None:
        self.last = similarity
        t = math.sqrt(max(0.0, 2.0 - 2.0 * similarity))   # `transition`, inline: every layer
        self._seen[layer] = t
        self._moved += t
        self._moved_typically += self.typical[layer]

    def scale(self) -> float:
        """c: this token's movement so far relative to a typical token's (1 before any layer)."""
        return self._moved / self._moved_typically if self._moved_typically > 0 else 1.0

    def predicted_error(self, layer: int) -> float:
        return self._base[layer] + self.scale() * self._drift[layer]

    def end_token(self) -> None:
        m = self.momentum
        for layer, t in self._seen.items():
            self.typical[layer] = m * self.typical[layer] + (1 - m) * t
        self._seen = {}
        self._refresh()
