"""Decode speed of full depth against River on the embedded model, interleaved in one run.

    python benchmarks/speed.py --prompts 6 --tokens 64 --thresholds 0.1 0.15

Every prompt runs every configuration back to back (order rotated per prompt) after one
warm-up generation, so drift of a shared machine hits all alike. ms/token is the median
decode-step time at batch 1. The physical limit is bytes read per token (weights of the
layers that ran at their precision, the LM head, the KV cache) over measured bandwidth.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from common import GSM8K_TRAIN, gsm8k_questions, machine, write
from river_core import ExitConfig, GenerationConfig, RiverModel, RiverSpec


def param_bytes(linears) -> int:
    return sum(l.weight.numel() * l.weight.element_size() for l in linears)


def quant_bytes(linears) -> int:
    return sum(q.q.numel() * q.q.element_size() + q.scale.numel() * q.scale.element_size()
               for q in linears)


def bytes_per_token(backend, exits: list[int], positions: float) -> float:
    """Mean bytes a decode step reads for the given exit layers (hf backend)."""
    names = ("q", "k", "v", "o", "gate", "up", "down")
    layer = [param_bytes(getattr(b, n) for n in names) for b in backend.blocks]
    river = [quant_bytes(getattr(b, n) for n in names) for b in backend.rivers]
    head = backend._head.weight.numel() * backend._head.weight.element_size()
    cache = backend._cache
    kv = 2 * cache.k[0, 0].numel() / cache.k.shape[3] * cache.k.element_size()  # per position
    per_step = [sum(layer[: k + 1]) + sum(river[k + 1:]) for k in exits]
    return float(np.mean(per_step)) + head + kv * positions * backend.num_layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=GSM8K_TRAIN)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--thresholds", type=float, nargs="+", default=[0.1, 0.15])
    ap.add_argument("--river-bits", type=int, default=8)
    ap.add_argument("--name", default="speed-cpu")
    args = ap.parse_args()

    model = RiverModel.from_pretrained(river=RiverSpec(bits=args.river_bits), progress=True)
    configs = {"full": ExitConfig(kv="full")}
    configs.update({f"river t={t}": ExitConfig(threshold=t) for t in args.thresholds})
    gen = GenerationConfig(max_new_tokens=args.tokens)
    questions = gsm8k_questions(args.data, args.prompts)
    model.generate(questions[0], generation=gen)   # warm-up
    steps = {name: [] for name in configs}
    exits = {name: [] for name in configs}
    limits = {name: [] for name in configs}
    agree = {name: [] for name in configs}
    diverge = {name: [] for name in configs}
    names = list(configs)
    for p, q in enumerate(tqdm(questions, desc="prompts", file=sys.stderr)):
        order = names[p % len(names):] + names[: p % len(names)]
        prompt_len = len(model.backend.tokenizer.chat(q))
        texts = {}
        for name in order:
            out = model.generate(q, exit=configs[name], generation=gen)
            texts[name] = out.stats.tokens[0]
            steps[name] += out.stats.step_seconds
            row = out.stats.exit_layers[0]
            exits[name] += row
            limits[name].append(bytes_per_token(model.backend, row, prompt_len + len(row) / 2))
        for name in names:
            agree[name].append(texts[name] == texts["full"])
            pairs = list(zip(texts[name], texts["full"]))
            diverge[name].append(next((i for i, (a, b) in enumerate(pairs) if a != b), len(pairs)))
    info = machine()
    bandwidth = info["memory_bandwidth_gb_s"] * 1e9
    full_ms = float(np.median(steps["full"])) * 1e3
    full_bytes = float(np.mean(limits["full"]))
    rows = {}
    for name in names:
        ms = float(np.median(steps[name])) * 1e3
        b = float(np.mean(limits[name]))
        e = np.array(exits[name])
        rows[name] = {"ms_per_token": ms, "speedup": full_ms / ms,
                      "ideal_speedup_from_bytes": full_bytes / b,
                      "bytes_per_token": b, "limit_ms_per_token": b / bandwidth * 1e3,
                      "mean_layers_run": float(e.mean() + 1),
                      "greedy_agreement": float(np.mean(agree[name])),
                      "tokens_to_first_divergence": float(np.mean(diverge[name])),
                      "steps": len(steps[name])}
    lines = [f"# Decode speed, {args.prompts} GSM8K train prompts x {args.tokens} tokens, "
             f"int{args.river_bits} river", "",
             f"Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}, measured "
             f"copy bandwidth {info['memory_bandwidth_gb_s']} GB/s.", "",
             f"Command: `python benchmarks/speed.py --prompts {args.prompts} --tokens "
             f"{args.tokens} --thresholds {' '.join(map(str, args.thresholds))} "
             f"--river-bits {args.river_bits}`", "",
             "| config | ms/token | speedup | ideal (bytes) | measured/ideal | limit ms/token "
             "| layers run | same text as full | tokens to first divergence |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['ms_per_token']:.1f} | {r['speedup']:.2f}x | "
                     f"{r['ideal_speedup_from_bytes']:.2f}x | "
                     f"{r['speedup'] / r['ideal_speedup_from_bytes']:.2f} | "
                     f"{r['limit_ms_per_token']:.2f} | {r['mean_layers_run']:.1f} | "
                     f"{100 * r['greedy_agreement']:.0f}% | "
                     f"{r['tokens_to_first_divergence']:.1f} |")
    write(args.name, {"machine": info, "args": vars(args) | {"data": str(args.data)},
                      "results": rows}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
