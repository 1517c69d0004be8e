"""Decode-step cost against context length on River's engines: the backbone, River's exit
mode and the whole 4-bit model, at short and long contexts, interleaved in one run.

    river bench context                          # onnx and hf, 64 and 2,048 positions
    river bench context --backends onnx --positions 64 512 2048 --tokens 32

Each prompt is GSM8K train text, tokenized and cut to the length (questions joined until it is
long enough). Every (engine, configuration, length) decodes `--tokens` tokens greedily after a
warm-up generation; lengths and configurations take turns within each round, so drift of a
shared machine hits all alike; the median decode step over the rounds counts. Writes
context.{md,json}; the summary is each configuration's step at the longest
context over its step at the shortest (issue 21's target: at most 1.2x at 2,048 against 64
on onnx).
"""

from __future__ import annotations

import statistics
import sys

from river_core import ExitConfig, GenerationConfig, RiverModel

from .library.output import Output, parser
from .library.output import command as run_command
from .library.prompts import prompt_of
from .library.timing import machine

CONFIGS = {"backbone": ExitConfig(kv="full"),
           "River exit mode": ExitConfig(),
           "whole 4-bit model": ExitConfig(policy="fixed", options={"layer": -1})}


def main(argv: list[str] | None = None) -> None:
    ap = parser("context", __doc__)
    ap.add_argument("--backends", nargs="+", default=["onnx", "hf"])
    ap.add_argument("--positions", type=int, nargs="+", default=[64, 2048])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    out = Output(args)
    info = machine()
    gen = GenerationConfig(max_new_tokens=args.tokens)
    steps: dict = {}
    for backend in args.backends:
        model = RiverModel.from_pretrained(args.model, backend=backend, progress=True)
        prompts = {n: prompt_of(model, n) for n in args.positions}
        for config in CONFIGS.values():
            model.generate_ids([prompts[args.positions[0]]], config, gen)   # warm-up
        for r in range(args.rounds):
            print(f"{backend}: round {r + 1} of {args.rounds}", file=sys.stderr, flush=True)
            for name, config in CONFIGS.items():
                for n in args.positions:
                    stats = model.generate_ids([prompts[n]], config, gen)
                    steps.setdefault(backend, {}).setdefault(name, {}).setdefault(
                        str(n), []).extend(stats.step_seconds)
        del model
    results = {b: {name: {n: statistics.median(s) * 1e3 for n, s in by_n.items()}
                   for name, by_n in by_config.items()} for b, by_config in steps.items()}
    short, long = str(min(args.positions)), str(max(args.positions))
    summary = {f"step_{long}_over_{short}": {
        b: {name: r[long] / r[short] for name, r in by_config.items()}
        for b, by_config in results.items()}}
    command = run_command("context", argv)
    payload = {"command": command, "machine": info, "tokens": args.tokens,
               "rounds": args.rounds, "positions": args.positions, "ms_per_step": results,
               "summary": summary}
    out.write("context", payload, report(payload, short, long))


def report(p: dict, short: str, long: str) -> str:
    info = p["machine"]
    ratio = p["summary"][f"step_{long}_over_{short}"]
    lines = ["# Decode-step cost against context length", "",
             f"Machine: {info['cpu']}, {info['cores']} cores. Command: `{p['command']}`. "
             f"Batch 1, {p['tokens']} greedy tokens per run, median decode "
             f"step over {p['rounds']} interleaved rounds.", "",
             "| engine | configuration | " + " | ".join(f"ms/step at {n}" for n in
                                                      p["positions"]) +
             f" | {long} over {short} |", "|---|---|" + "---|" * (len(p["positions"]) + 1)]
    for backend, by_config in p["ms_per_step"].items():
        for name, by_n in by_config.items():
            cells = " | ".join(f"{ms:.1f}" for ms in by_n.values())
            lines.append(f"| {backend} | {name} | {cells} | {ratio[backend][name]:.2f}x |")
    return "\n".join(lines + [""])


if __name__ == "__main__":
    main()
