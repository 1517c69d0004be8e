"""What confidence rules read from a token's logits."""

import numpy as np

from river_core.loop.sampling import softmax


def margin(logits: np.ndarray) -> float:
    """The top token's probability minus the runner-up's."""
    second, first = np.partition(softmax(logits), -2)[-2:]
    return float(first - second)


def entropy(logits: np.ndarray) -> float:
    """Of the softmax, in nats."""
    p = softmax(logits)
    return float(-(p * np.log(np.maximum(p, 1e-300))).sum())
