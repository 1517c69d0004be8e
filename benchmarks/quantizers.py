"""The stand-ins' quantizers: weight error and the whole quantized model's NLL, RTN vs HQQ,
float vs integer zero points.

    river bench quantizers --solutions 8

For each setting: eps = ||Q(W) - W|| / ||W|| over a layer's seven projections (mean / max over
layers) on the embedded model and on a random-weight model (the tests' tiny Llama), and the
teacher-forced NLL of GSM8K train reference solutions with every token running stand-ins only
(the whole model quantized), minus full depth's. The embedded model's floats are its Q4_1
weights dequantized (blocks of 32, asymmetric, float minimum): 4-bit RTN with a float zero and
groups of 32 reproduces that grid exactly (eps 0) and would flatter every result, so the
settings River uses are coarser (groups of 64 and more), as the paper's stand-ins are coarser
than its backbone.
"""

from __future__ import annotations

import json

import numpy as np
from tqdm import tqdm

from river_core import ExitConfig, QuantSpec, RiverModel
from river_conformance.fixtures import tiny
from river_models import open_model, stand_ins

from .library.output import Harness, heading, parser
from .library.prompts import GSM8K_TRAIN

SETTINGS = [  # (bits, group, method, how it relates to Q4_1 blocks of 32)
    (4, 32, "rtn", "the Q4_1 grid itself: reproduces the weights"),
    (4, 64, "rtn", "groups of 64"),
    (4, 64, "hqq", "groups of 64 (River's default)"),
    (4, 64, "hqq-int", "groups of 64, zero points rounded to integers"),
    (4, 128, "rtn", "groups of 128 (64 where 128 does not divide 576)"),
    (4, 128, "hqq", "groups of 128 (64 where 128 does not divide 576)"),
    (8, 128, "rtn", "int8, one scale per output row"),
]


def main(argv: list[str] | None = None) -> None:
    ap = parser("quantizers", __doc__, results="quantizers")
    ap.add_argument("--solutions", type=int, default=8)
    ap.add_argument("--offset", type=int, default=100)
    out, args = Harness.parse(ap, argv)
    from river_torch.backend import TorchBackend   # the hf extra's, which --help does not need

    default, random = open_model(args.model, progress=True), tiny.checkpoint("llama", seed=1)
    problems = [json.loads(line) for line in open(GSM8K_TRAIN)][args.offset:args.offset
                                                                  + args.solutions]
    quantized = ExitConfig(policy="fixed", options={"layer": -1})

    def nll(model: RiverModel, config: ExitConfig) -> float:
        tok = model.backend.tokenizer
        total = []
        for p in problems:
            prompt = tok.encode("Question: " + p["question"] + "\nAnswer:")
            answer = tok.encode(" " + p["answer"])
            total.append(model.teacher_force([prompt], [answer], config)[0].nll(answer))
        return float(np.mean(total))

    rows, full = [], None
    for bits, group, method, note in tqdm(SETTINGS, desc="settings"):
        spec = QuantSpec(bits=bits, group_size=group, method=method)
        made = stand_ins(default, spec)
        model = RiverModel(TorchBackend(default, made))
        full = nll(model, ExitConfig(kv="full")) if full is None else full
        rand = stand_ins(random, QuantSpec(bits=bits, group_size=min(group, 64), method=method),
                         cache=False)
        rows.append({"bits": bits, "group": group, "method": method, "note": note,
                     "default_model_eps_mean": float(np.mean(made.errors)),
                     "default_model_eps_max": float(np.max(made.errors)),
                     "random_model_eps_mean": float(np.mean(rand.errors)),
                     "whole_model_nll_delta": nll(model, quantized) - full})
    payload = {**out.head(), "full_depth_nll": full, "results": rows}
    lines = heading("Stand-in quantizers: weight error and whole-model NLL", payload) + [
             f"NLL: teacher forcing on GSM8K train solutions {args.offset}.."
             f"{args.offset + args.solutions - 1}, every token on stand-ins only, minus full "
             f"depth ({full:.4f} nats/token). Random model: the tests' tiny Llama (group capped "
             f"at its width 64).", "",
             "| stand-ins | group | quantizer | relation to Q4_1 | eps default model (mean / max) "
             "| eps random model | whole-model NLL delta |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| int{r['bits']} | {r['group']} | {r['method']} | {r['note']} | "
                     f"{r['default_model_eps_mean']:.4f} / {r['default_model_eps_max']:.4f} | "
                     f"{r['random_model_eps_mean']:.4f} | {r['whole_model_nll_delta']:+.4f} |")
    out.write(args.name, payload, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
