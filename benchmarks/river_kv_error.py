"""Measures the constant C of the river K/V bound  err(j) <= C * eps_j * d  on tiny random models.

    river bench river_kv_error --trials 6

d = j - k is how many river layers the token has run when it writes layer j; eps_j is that
layer's relative weight error. Reports the largest err / (eps * d) seen per family and
precision; tests/test_invariants.py asserts the bound with C rounded up from this.
"""

from __future__ import annotations


import numpy as np

from river_core.method.kv import Full, River
from river_core.method.predictor import relative_error
from river_conformance.scripted import forced_logits
from river_torch.plugin import tiny_backend
from river_conformance.fixtures import tiny

from .library.output import Harness, heading, parser


def main(argv: list[str] | None = None) -> None:
    ap = parser("river_kv_error", __doc__, model=False)
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--seeds", type=int, default=2)
    out, args = Harness.parse(ap, argv)
    rng = np.random.default_rng(0)
    rows = []
    for family in tiny.FAMILIES:
        for bits in (8, 4):
            ratios, errors = [], []
            for seed in range(args.seeds):
                b = tiny_backend(family, seed, bits)
                n = b.num_layers
                for _ in range(args.trials):
                    prompt = [1] + rng.integers(3, tiny.VOCAB, rng.integers(1, 20)).tolist()
                    cont = rng.integers(3, tiny.VOCAB, 8).tolist()
                    forced_logits(b, prompt, cont, Full())
                    full = [b.read_kv(i) for i in range(n)]
                    exits = rng.integers(0, n, len(cont)).tolist()
                    forced_logits(b, prompt, cont, River(), exits)
                    got = [b.read_kv(i) for i in range(n)]
                    for step, k in enumerate(exits):
                        pos = len(prompt) + step
                        for j in range(k + 1, n):
                            e = max(relative_error(got[j][w][:, :, pos], full[j][w][:, :, pos])
                                    for w in (0, 1))
                            errors.append(e)
                            ratios.append(e / (b.stand_in_error[j] * (j - k)))
            rows.append({"family": family, "bits": bits, "eps": float(np.mean(b.stand_in_error)),
                         "max_error": max(errors), "max_ratio": max(ratios),
                         "p99_ratio": float(np.quantile(ratios, 0.99)), "samples": len(ratios)})
    payload = {**out.head(), "rows": rows}
    lines = heading("River K/V error against full depth (tiny random models)", payload) + [
             "| family | river | eps (weights) | max rel. K/V error | max err/(eps d) | p99 |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['family']} | int{r['bits']} | {r['eps']:.4f} | {r['max_error']:.4f} "
                     f"| {r['max_ratio']:.2f} | {r['p99_ratio']:.2f} |")
    lines.append(f"\nLargest ratio: {max(r['max_ratio'] for r in rows):.2f}.")
    out.write("river-kv-error", payload, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
