"""How closely one engine's logits follow a reference's over the same positions: top-1
agreement, the logits' relative error and KL, and each disagreement judged as a near tie or
not. Used by the real-file matrix (tests/test_real_files.py, `river bench real_files`).

A disagreement is a near tie when the reference's own margin between its choice and the
engine's is within the engine's noise at that position: NOISE_SIGMAS * sqrt(2) * the RMS of
the two's logit differences over the vocabulary (the two logits' difference moves by sqrt(2)
times the noise of one). A wrong kernel shows as a relative error near 1 and as
disagreements beyond the band; rounding (quantized activations, a float16 cache) as a few
flips inside it. Random weights' logits are Gaussian-like (a median top-two margin of about 0.2
of their spread), so a small share of their positions sit inside any noise band: the
agreement is reported with its near ties beside it, not alone.
"""

from __future__ import annotations

import attrs
import numpy as np

NOISE_SIGMAS = 3.0


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@attrs.frozen
class Agreement:
    positions: int
    agree: int             # positions whose top-1 token is the reference's
    near_ties: int         # disagreements inside the noise band
    beyond: tuple[int, ...]   # positions of disagreements outside it
    rel_max: float         # the largest per-position ||got - want|| / ||want||
    rel_median: float
    kl_mean: float         # KL(want || got) over the positions, nats
    kl_max: float

    @classmethod
    def of(cls, got, want) -> "Agreement":
        """`got` and `want`: logits [positions, vocab] of the same positions."""
        got, want = (np.asarray(a, np.float64).reshape(len(a), -1) for a in (got, want))
        top_got, top_want = got.argmax(-1), want.argmax(-1)
        rows = np.arange(len(want))
        margin = want[rows, top_want] - want[rows, top_got]
        noise = np.sqrt(((got - want) ** 2).mean(-1))
        band = NOISE_SIGMAS * np.sqrt(2) * noise
        differ = top_got != top_want
        rel = np.linalg.norm(got - want, axis=-1) / np.linalg.norm(want, axis=-1)
        p, q = _log_softmax(want), _log_softmax(got)
        kl = (np.exp(p) * (p - q)).sum(-1)
        return cls(len(want), int((~differ).sum()), int((differ & (margin <= band)).sum()),
                   tuple(int(i) for i in np.flatnonzero(differ & (margin > band))),
                   float(rel.max()), float(np.median(rel)), float(kl.mean()), float(kl.max()))

    @property
    def top1(self) -> float:
        return self.agree / self.positions

    def line(self) -> str:
        return (f"top-1 {self.agree}/{self.positions} ({self.top1:.1%}), near ties "
                f"{self.near_ties}, beyond {len(self.beyond)}; logits' relative error median "
                f"{self.rel_median:.2e} max {self.rel_max:.2e}; KL mean {self.kl_mean:.1e} "
                f"max {self.kl_max:.1e}")


def first_difference(got: list[int], want: list[int]) -> int | None:
    """The first position two greedy sequences part at (None: they do not)."""
    return next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                None if len(got) == len(want) else min(len(got), len(want)))
