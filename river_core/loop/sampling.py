"""Token choice: samplers (factories returning a callable from [batch, vocab] logits to one
token per row), the distribution they draw from, the speculative-sampling rule, and the one
softmax every part of River uses."""

from __future__ import annotations

from typing import Callable

import numpy as np

Sampler = Callable[[np.ndarray], list[int]]


def greedy(logits: np.ndarray) -> list[int]:
    return logits.argmax(axis=-1).tolist()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Of one row of logits, in float64."""
    z = logits.astype(np.float64)
    top = z.max()
    return z - (top + np.log(np.exp(z - top).sum()))


def softmax(logits: np.ndarray) -> np.ndarray:
    """Of one row of logits, in float64."""
    z = logits.astype(np.float64)
    p = np.exp(z - z.max())
    return p / p.sum()


def probabilities(logits: np.ndarray, temperature: float, top_p: float = 1.0,
                  top_k: int = 0) -> np.ndarray:
    """The distribution a sampler draws one row's token from: softmax(logits / temperature)
    cut to the `top_k` most likely tokens (0: all; ties at the cut stay), then to the nucleus
    (the smallest most-likely set with mass >= top_p), renormalised after each cut."""
    p = softmax(logits.astype(np.float64) / temperature)
    if 0 < top_k < p.size:
        p = np.where(p >= np.partition(p, -top_k)[-top_k], p, 0.0)
        p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p)
        cut = np.zeros_like(p)
        keep = order[: int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1]
        cut[keep] = p[keep]
        p = cut / cut.sum()
    return p


def make_sampler(temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                 top_k: int = 0) -> Sampler:
    if temperature == 0.0:
        return greedy
    rng = np.random.default_rng(seed)

    def sample(logits: np.ndarray) -> list[int]:
        return [draw(probabilities(row, temperature, top_p, top_k), rng) for row in logits]

    return sample


def draw(p: np.ndarray, rng: np.random.Generator) -> int:
    return int(rng.choice(p.size, p=p))


def verify_draft(target: np.ndarray, draft: np.ndarray, token: int,
                 rng: np.random.Generator) -> int | None:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): keep `token`, drawn from
    `draft`, with probability min(1, target/draft) at it (None: kept); otherwise return a
    token drawn from the normalised excess max(0, target - draft). Either way the token that
    stands follows `target` exactly."""
    if rng.random() * draft[token] <= target[token]:
        return None
    excess = np.maximum(target - draft, 0.0)
    return draw(excess / excess.sum(), rng)
