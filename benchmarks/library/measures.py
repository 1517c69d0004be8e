"""Comparisons of outputs and series."""

from __future__ import annotations

import numpy as np


def first_divergence(a, b) -> int:
    """Tokens two outputs share before they first differ (the shorter length if never)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def pearson(a, b) -> float:
    return float(np.corrcoef(a, b)[0, 1])


def spearman(a, b) -> float:
    rank = lambda x: np.argsort(np.argsort(x))
    return pearson(rank(np.asarray(a)), rank(np.asarray(b)))
