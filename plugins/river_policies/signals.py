"""What confidence rules read from a token's logits."""

import numpy as np


def _probabilities(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    p = np.exp(z - z.max())
    return p / p.sum()


def margin(logits: np.ndarray) -> float:
    """The top token's probability minus the runner-up's."""
    second, first = np.partition(_probabilities(logits), -2)[-2:]
    return float(first - second)


def entropy(logits: np.ndarray) -> float:
    """Of the softmax, in nats."""
    p = _probabilities(logits)
    return float(-(p * np.log(np.maximum(p, 1e-300))).sum())
