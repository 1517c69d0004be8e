"""Stand-in weight error of each quantizer setting, on the embedded model and a random one.

    python -m benchmarks quantizer_alignment

The embedded model's floats are its Q4_1 weights dequantized (blocks of 32, asymmetric, float
minimum): a quantizer aligned with that grid would reproduce them and flatter every quality
result. River's 4-bit quantizer keeps integer zero points (the range of a group is widened to
hold 0), so even groups of 32 are not aligned; this measures by how much.
"""

from __future__ import annotations

import argparse

import numpy as np

from common import machine, write
from river_core import QuantSpec
from river_models import open_model, stand_ins, tiny

SETTINGS = [  # (bits, group, how it relates to Q4_1 blocks of 32)
    (4, 32, "same blocks of 32; integer zero point, range widened to hold 0"),
    (4, 64, "groups of 64"),
    (4, 128, "groups of 128 (64 where 128 does not divide the width)"),
    (8, 128, "int8, one scale per output row"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="quantizer-alignment")
    args = ap.parse_args()
    default, random = open_model(progress=True), tiny.checkpoint("llama", seed=1)
    rows = []
    for bits, group, note in SETTINGS:
        spec = QuantSpec(bits=bits, group_size=group)
        eps = stand_ins(default, spec, progress=True).errors
        rand = stand_ins(random, QuantSpec(bits=bits, group_size=min(group, 64)), cache=False)
        rows.append({"bits": bits, "group": group, "note": note,
                     "default_model_eps_mean": float(np.mean(eps)),
                     "default_model_eps_max": float(np.max(eps)),
                     "random_model_eps_mean": float(np.mean(rand.errors))})
    info = machine()
    lines = ["# Stand-in weight error: quantizer settings against the Q4_1 grid", "",
             f"Command: `python -m benchmarks quantizer_alignment`. Machine: {info['cpu']}.", "",
             "eps = ||Q(W) - W|| / ||W|| over a layer's seven projections, the same weights on "
             "every backend. Random model: the tiny random Llama of the tests (group capped at "
             "its width 64).", "",
             "| stand-ins | group | relation to Q4_1 | eps default model (mean / max) "
             "| eps random model |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| int{r['bits']} | {r['group']} | {r['note']} | "
                     f"{r['default_model_eps_mean']:.4f} / {r['default_model_eps_max']:.4f} | "
                     f"{r['random_model_eps_mean']:.4f} |")
    write(args.name, {"machine": info, "results": rows}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
