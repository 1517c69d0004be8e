"""River weight error with quantizers aligned and not aligned to the default model's Q4_1.

    python -m benchmarks quantizer_alignment

The default model's float weights are dequantized Q4_1 (blocks of 32, asymmetric with a float
minimum), so a 4-bit asymmetric river with groups of 32 reproduces them almost exactly and
flatters int4. This lists each backend's relative weight error eps (mean over layers) for
aligned and non-aligned settings, on the default model and on a random-weight model of the
same shape family, so river-fidelity figures can be read for what they are.
"""

from __future__ import annotations

import argparse

import numpy as np

from common import machine, write
from river_core import RiverModel, RiverSpec

SETTINGS = [  # (backend, bits, group, how it relates to Q4_1 blocks of 32)
    ("hf", 4, 32, "aligned: asymmetric min/max per 32"),
    ("hf", 4, 128, "not aligned: groups of 128"),
    ("hf", 8, 128, "not aligned: int8 per channel"),
    ("onnx", 4, 32, "not aligned: integer zero point, range forced to hold 0"),
    ("onnx", 8, 128, "not aligned: int8 blocks of 128"),
]


def random_model_error(bits: int, group: int) -> float:
    """Mean eps of the hf river on a random-weight Llama (tiny config), same quantizer."""
    from river_hf import tiny
    from river_hf.backend import HFBackend

    b = HFBackend(tiny.model("llama", seed=1), tiny.tokenizer(), RiverSpec(bits=bits,
                                                                         group_size=group))
    return float(np.mean(b.river_error))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="quantizer-alignment")
    args = ap.parse_args()
    rows = []
    for backend, bits, group, note in SETTINGS:
        model = RiverModel.from_pretrained(backend=backend, river=RiverSpec(bits=bits,
                                                                            group_size=group))
        eps = model.backend.river_error
        rows.append({"backend": backend, "bits": bits, "group": group, "note": note,
                     "default_model_eps_mean": float(np.mean(eps)),
                     "default_model_eps_max": float(np.max(eps)),
                     "random_model_eps_mean": random_model_error(bits, min(group, 64))
                     if backend == "hf" else None})
    info = machine()
    lines = ["# River weight error: aligned and non-aligned quantizers", "",
             f"Command: `python -m benchmarks quantizer_alignment`. Machine: {info['cpu']}.", "",
             "eps = ||Q(W) - W|| / ||W|| over a layer's seven projections. Random model: the "
             "tiny random Llama of the tests (hf quantizer, group capped at its width 64).", "",
             "| backend | river | group | relation to Q4_1 | eps default model (mean / max) "
             "| eps random model |", "|---|---|---|---|---|---|"]
    for r in rows:
        rand = "-" if r["random_model_eps_mean"] is None else f"{r['random_model_eps_mean']:.4f}"
        lines.append(f"| {r['backend']} | int{r['bits']} | {r['group']} | {r['note']} | "
                     f"{r['default_model_eps_mean']:.4f} / {r['default_model_eps_max']:.4f} | "
                     f"{rand} |")
    write(args.name, {"machine": info, "results": rows}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
