"""What a lossless round costs, as a model rather than a clock: the measured seconds of a
verification of k tokens on this machine, engine and model (measured once, then kept in the
user cache per CPU: drafting.py), and a river draft step as the share of a step it ran.
`DraftLength` judges drafting by these, so what it chooses follows from the prompt alone (the
drafts the backbone kept) and is the same on every run; judged by each round's clock, a spread
of a few percent chose differently run to run wherever drafting and plain steps cost about
the same."""

from __future__ import annotations

import time
from typing import Sequence

import attrs

REPEATS = 3   # a width's cost is the least of this many verifications (a busy CPU adds, never
              # takes away)
# A stand-in layer's cost over a backbone layer's, for the layers a draft step runs past its
# exit: 0.44x on onnx, 0.47x on hf (docs/backends.md, measured speed); an estimate, not this
# machine's measure, and a low-bit GGUF's stand-ins cost nearer a whole layer
STAND_IN_SHARE = 0.5


@attrs.frozen
class VerifyCosts:
    """seconds[i]: a verification of widths[i] tokens (width 1: a plain step, full depth's)."""

    widths: tuple[int, ...]
    seconds: tuple[float, ...]
    layers: int

    @property
    def step(self) -> float:
        return self.seconds[0]

    def verification(self, k: int) -> float:
        """Seconds of verifying k tokens, linear between the measured widths (and past the
        widest, along its last segment)."""
        pairs = list(zip(self.widths, self.seconds))
        for (w0, s0), (w1, s1) in zip(pairs, pairs[1:]):
            if k <= w1 or (w1, s1) == pairs[-1]:
                return s0 + (s1 - s0) * (k - w0) / (w1 - w0)
        return self.step * k

    def draft(self, exit_layers: Sequence[int]) -> float:
        """Seconds of the draft steps that ran the backbone to `exit_layers` and stand-ins
        past them (none: drafts that cost no model step, as n-grams'), each as its share of a
        plain step."""
        layers = sum(e + 1 + STAND_IN_SHARE * (self.layers - e - 1) for e in exit_layers)
        return self.step * layers / self.layers

    def round(self, drafted: int, exit_layers: Sequence[int]) -> float:
        """Seconds of a round that drafted `drafted` tokens to `exit_layers` and verified
        them with the token before."""
        return self.draft(exit_layers) + self.verification(drafted + 1)

    def can_pay(self, most: int, margin: float) -> bool:
        """Whether some draft of at most `most` tokens, drafted free and kept whole, would beat
        plain steps by `margin`: where none would, no acceptance makes drafting pay, and
        lossless mode takes plain steps without trying."""
        return any(self.verification(n + 1) / (n + 1) <= (1 - margin) * self.step
                   for n in range(1, most + 1))

    def covers(self, widest: int) -> bool:
        return self.widths[-1] >= widest

    def as_json(self) -> dict:
        return {"widths": list(self.widths), "seconds": list(self.seconds),
                "layers": self.layers}

    @classmethod
    def from_json(cls, data: dict) -> "VerifyCosts":
        return cls(tuple(int(w) for w in data["widths"]),
                   tuple(float(s) for s in data["seconds"]), int(data["layers"]))


def widths_to(widest: int) -> tuple[int, ...]:
    """1, 2, 4, ... and `widest`: a verification's cost is close to linear between them."""
    doubling = [1 << i for i in range(widest.bit_length()) if 1 << i < widest]
    return tuple(doubling + [widest])


def measure(backend, token: int, start: int, widest: int) -> VerifyCosts:
    """Time verifications of 1 .. `widest` tokens (`widths_to`) at slot `start` of the one
    sequence, each trimmed away after: the slots from `start` are overwritten by the next
    round before anything reads them."""
    widths, seconds = widths_to(widest), []
    for k in widths:
        best = float("inf")
        for _ in range(REPEATS):
            began = time.perf_counter()
            backend.extend([token] * k, start)
            best = min(best, time.perf_counter() - began)
            backend.trim(start)
        seconds.append(best)
    return VerifyCosts(widths, tuple(seconds), backend.num_layers)
