"""Prefill exit (the paper's sequence-level exit): prompt time and quality, on the embedded model.

    river bench prefill_exit --backend hf --problems 8 --exits 3 7 15

For each GSM8K train problem (4-shot prompt): the prefill time of the prompt at full depth and
with its layers past K on stand-ins (interleaved, median over problems), and the teacher-forced
NLL of the reference solution decoded under the default policy after each prefill, minus the
same after a full-depth prefill.
"""

from __future__ import annotations

import time

import numpy as np
from tqdm import tqdm

from river_core import ExitConfig, RiverModel

from .library import gsm8k
from .library.output import Harness, parser
from .library.prompts import GSM8K_TRAIN


def main(argv: list[str] | None = None) -> None:
    ap = parser("prefill_exit", __doc__)
    ap.add_argument("--backend", default="hf")
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--offset", type=int, default=100)
    ap.add_argument("--exits", type=int, nargs="+", default=[3, 7, 15])
    out, args = Harness.parse(ap, argv)
    model = RiverModel.from_pretrained(args.model, backend=args.backend, progress=True)
    b, tok = model.backend, model.backend.tokenizer
    shots = gsm8k.load(str(GSM8K_TRAIN), limit=gsm8k.SHOTS)
    problems = gsm8k.load(str(GSM8K_TRAIN), limit=args.problems, offset=args.offset)
    settings = [None, *args.exits]
    seconds = {k: [] for k in settings}
    nll = {k: [] for k in settings}
    lengths = []
    for n, problem in enumerate(tqdm(problems, desc="problems")):
        prompt = tok.encode(gsm8k.prompt(problem, shots))
        reference = tok.encode(" " + problem.solution)
        lengths.append(len(prompt))
        for k in settings[n % len(settings):] + settings[:n % len(settings)]:
            start = time.perf_counter()
            b.prefill([prompt], len(prompt) + 1, k)
            seconds[k].append(time.perf_counter() - start)
            [forced] = model.teacher_force([prompt], [reference], ExitConfig(prefill_exit=k))
            nll[k].append(forced.nll(reference))
    info = out.machine
    base_s, base_nll = np.median(seconds[None]), np.mean(nll[None])
    rows = {("full" if k is None else f"exit after layer {k}"): {
        "prefill_ms": float(np.median(seconds[k]) * 1e3),
        "prefill_speedup": float(base_s / np.median(seconds[k])),
        "nll_delta": float(np.mean(nll[k]) - base_nll)} for k in settings}
    command = out.command
    lines = [f"# Prefill exit, {args.backend} backend, "
             f"{args.model or 'embedded SmolLM2-135M-Instruct'}", "",
             f"Command: `{command}`. Machine: {info['cpu']}, {info['cores']} cores. Prompts: "
             f"4-shot GSM8K train, {int(np.mean(lengths))} tokens on average. NLL: reference "
             f"solutions decoded under the default policy (settled), minus the same after a "
             f"full-depth prefill.", "",
             "| prompt | prefill ms | prefill speedup | NLL delta |", "|---|---|---|---|"]
    for label, r in rows.items():
        lines.append(f"| {label} | {r['prefill_ms']:.0f} | {r['prefill_speedup']:.2f}x | "
                     f"{r['nll_delta']:+.4f} |")
    out.write(f"prefill-exit-{args.backend}", {"machine": info, "command": command, "results": rows},
          "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
