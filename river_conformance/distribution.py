"""Sampled exactness as a test: does a sampler draw the plain model's distribution?

A lossless sampler (speculative decoding, River's or a serving engine's) must leave the plain
model's distribution unchanged, token for token and jointly. Greedy identity cannot show that;
this module compares many seeded continuations of one prompt drawn by the plain model and by
the sampler under test, each scored under the plain model (`score`):

- two-sample, per position t of the first generated tokens: Pearson's chi-square test of
  homogeneity of the token frequencies (tokens seen fewer than `POOL_BELOW` times in both
  samples together share one cell);
- two-sample: the mean log-likelihood per token under the plain model (raw logits), Welch's z;
- one-sample, exact: every token the sampler under test drew, against the plain sampling
  distribution p_t at its place (temperature, top-k and top-p applied): a token p_t cannot
  draw fails outright, and the excess surprise, the sum over tokens of -log p_t(x) - H(p_t),
  whose mean is exactly 0 under the null (a martingale: each term has mean 0 given the tokens
  before), is tested as a z-score against its variance, sum Var_{p_t}[log p_t].

The statistical tests run at family level `ALPHA` (Bonferroni), so a correct sampler fails with
probability at most ALPHA. `Comparison.summary` states what a run could detect, with power
`POWER`: for a position's chi-square test (n samples a side, c cells) the triangular distance
D = sum_i (p_i - q_i)^2 / (p_i + q_i) at which it rejects (the statistic is then noncentral
chi-square with noncentrality n * D), and since D >= 2 TV^2 the total variation that always
suffices; for the exact test, the shift of the mean log-likelihood per token.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np

from river_core.loop.sampling import log_softmax, probabilities

ALPHA = 1e-3        # family-wise: the chance that a correct sampler fails the comparison
POOL_BELOW = 10     # tokens seen fewer times in both samples together share one cell
POWER = 0.9         # the power at which detectable shifts are stated


@attrs.frozen
class Scored:
    """Continuations of one prompt, scored under the plain model."""

    tokens: list[list[int]]
    nll: list[float]         # per continuation: mean NLL per token under the raw model (nats)
    surprise: float          # sum over tokens of -log p_t(x) - H(p_t) (p_t: sampling distribution)
    variance: float          # sum over tokens of Var_{p_t}[log p_t]
    impossible: int          # tokens p_t gives no probability

    @property
    def count(self) -> int:
        return sum(len(t) for t in self.tokens)


def score(tokens: Sequence[Sequence[int]], logits: Sequence[Sequence[np.ndarray]],
          temperature: float, top_p: float = 1.0, top_k: int = 0) -> Scored:
    """`tokens[i]` scored by the plain model's `logits[i][t]`, the logits that predicted
    `tokens[i][t]` (the prompt's last position first), under the sampling settings that drew
    them."""
    nll, surprise, variance, impossible = [], 0.0, 0.0, 0
    for sample, rows in zip(tokens, logits):
        nll.append(-float(np.mean([log_softmax(l)[x] for l, x in zip(rows, sample)]))
                   if sample else 0.0)
        for l, x in zip(rows, sample):
            p = probabilities(l, temperature, top_p, top_k)
            kept = p > 0
            log_p = np.log(p[kept])
            entropy = -float(p[kept] @ log_p)
            variance += float(p[kept] @ log_p ** 2) - entropy ** 2
            if p[x] > 0:
                surprise -= float(np.log(p[x])) + entropy
            else:
                impossible += 1
    return Scored([list(t) for t in tokens], nll, surprise, variance, impossible)


@attrs.frozen
class Power:
    """What a position's chi-square test detects with `n` samples a side over `cells` cells
    at level `level`: with probability `power`, any pair of distributions at triangular
    distance >= `distance`, and so any at total variation >= `total_variation`."""

    n: int
    cells: int
    level: float
    power: float
    distance: float
    total_variation: float

    @classmethod
    def of(cls, n: int, cells: int, level: float, power: float = POWER) -> "Power":
        from scipy import optimize, stats

        df = max(cells - 1, 1)
        critical = stats.chi2.isf(level, df)
        missed = lambda d: stats.ncx2.cdf(critical, df, n * d) - (1 - power)
        distance = float(optimize.brentq(missed, 1e-9, 2.0))
        return cls(n, cells, level, power, distance, float(np.sqrt(distance / 2)))


@attrs.frozen
class Comparison:
    """The tests of one prompt's continuations: the plain model against a sampler under test."""

    position_p: list[float]      # chi-square p-value of each position's token frequencies
    cells: list[int]             # cells of each position's table, after pooling
    nll_plain: float             # mean NLL per token under the raw plain model (nats)
    nll_other: float
    nll_z: float                 # Welch's z of their difference (other minus plain)
    exact_z: float               # the sampler under test's excess surprise, as a z-score
    exact_tokens: int            # tokens in that test
    exact_sd: float              # its per-token standard deviation (nats)
    impossible: int              # tokens the plain sampling distribution could not draw
    n: int                       # samples a side
    alpha: float = ALPHA

    @property
    def level(self) -> float:
        """Each statistical test's level: Bonferroni over the positions and two likelihoods."""
        return self.alpha / (len(self.position_p) + 2)

    @property
    def nll_p(self) -> float:
        return _two_sided(self.nll_z)

    @property
    def exact_p(self) -> float:
        return _two_sided(self.exact_z)

    @property
    def same(self) -> bool:
        """Nothing impossible and no test rejects: consistent with the plain distribution."""
        return self.impossible == 0 and \
            min(self.position_p + [self.nll_p, self.exact_p]) > self.level

    def power(self, position: int, power: float = POWER) -> Power:
        return Power.of(self.n, self.cells[position], self.level, power)

    def detectable_nll_shift(self, power: float = POWER) -> float:
        """The shift of the mean log-likelihood per token the exact test detects."""
        from scipy import stats

        z = stats.norm.isf(self.level / 2) + stats.norm.ppf(power)
        return float(z * self.exact_sd / np.sqrt(max(self.exact_tokens, 1)))

    def summary(self) -> str:
        positions = ", ".join(f"{p:.2g}" for p in self.position_p)
        widest = self.power(int(np.argmax(self.cells)))
        return (f"{'same' if self.same else 'DIFFERENT'} distribution (family level "
                f"{self.alpha:g}): position p-values [{positions}]; mean NLL/token "
                f"{self.nll_plain:.3f} plain vs {self.nll_other:.3f} (z {self.nll_z:+.2f}); "
                f"exact z {self.exact_z:+.2f}; {self.impossible} impossible tokens. With "
                f"n={self.n} a side, power {widest.power:g}: any position's total-variation "
                f"shift >= {widest.total_variation:.2f}, a log-likelihood shift >= "
                f"{self.detectable_nll_shift():.3f} nats/token")


def _two_sided(z: float) -> float:
    from scipy import stats

    return float(2 * stats.norm.sf(abs(z)))


def chi_square(a: Sequence[int], b: Sequence[int]) -> tuple[float, int]:
    """Pearson's homogeneity test of two samples of tokens: (p-value, cells after pooling)."""
    from scipy import stats

    tokens, counts = np.unique(np.concatenate([a, b]), return_counts=True)
    common = tokens[counts >= POOL_BELOW]
    table = [[int(np.sum(np.asarray(s) == t)) for t in common] for s in (a, b)]
    rare = [len(s) - sum(row) for s, row in zip((a, b), table)]
    if sum(rare) >= POOL_BELOW:
        table = [row + [r] for row, r in zip(table, rare)]
    table = np.array(table, dtype=float)
    if table.shape[1] < 2:   # one token holds both samples: nothing can differ
        return 1.0, table.shape[1]
    return float(stats.chi2_contingency(table, correction=False).pvalue), table.shape[1]


def compare(plain: Scored, other: Scored, positions: int, alpha: float = ALPHA) -> Comparison:
    """The plain model's continuations against the sampler under test's, the same number a
    side, on their first `positions` tokens (shorter ones, ended by EOS, count where they
    reach)."""
    if len(plain.tokens) != len(other.tokens):
        raise ValueError("compare equal numbers of samples a side")
    p_values, cells = [], []
    for t in range(positions):
        p, c = chi_square([s[t] for s in plain.tokens if len(s) > t],
                          [s[t] for s in other.tokens if len(s) > t])
        p_values.append(p)
        cells.append(c)
    x, y = np.asarray(plain.nll), np.asarray(other.nll)
    spread = np.sqrt(x.var(ddof=1) / x.size + y.var(ddof=1) / y.size)
    nll_z = float((y.mean() - x.mean()) / spread) if spread > 0 else 0.0
    exact_z = other.surprise / np.sqrt(other.variance) if other.variance > 0 else 0.0
    exact_sd = float(np.sqrt(other.variance / max(other.count, 1)))
    return Comparison(p_values, cells, float(x.mean()), float(y.mean()), nll_z,
                      float(exact_z), other.count, exact_sd, other.impossible,
                      len(plain.tokens), alpha)
