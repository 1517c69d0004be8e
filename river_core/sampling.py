"""Samplers: factories returning a callable from [batch, vocab] logits to one token per row."""

from __future__ import annotations

from typing import Callable

import numpy as np

Sampler = Callable[[np.ndarray], list[int]]


def greedy(logits: np.ndarray) -> list[int]:
    return logits.argmax(axis=-1).tolist()


def make_sampler(temperature: float = 0.0, top_p: float = 1.0, seed: int = 0) -> Sampler:
    if temperature == 0.0:
        return greedy
    rng = np.random.default_rng(seed)

    def sample(logits: np.ndarray) -> list[int]:
        out = []
        for row in logits.astype(np.float64) / temperature:
            p = np.exp(row - row.max())
            p /= p.sum()
            order = np.argsort(-p)
            # nucleus: the smallest prefix of the sorted distribution with mass >= top_p
            keep = order[: int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1]
            out.append(int(rng.choice(keep, p=p[keep] / p[keep].sum())))
        return out

    return sample
