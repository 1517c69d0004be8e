"""Decode speed of every backend at full depth and with the river, interleaved in one run.

    river bench speed --backends hf onnx llamacpp --prompts 6 --tokens 64 \\
        --thresholds 0.1 0.15

Every prompt runs every (backend, configuration) back to back, order rotated per prompt,
after one warm-up generation each, so drift of a shared machine hits all alike. ms/token is the
median decode-step time at batch 1. The physical limit is bytes read per token (each backend's
`footprint()`: weights of the layers that ran at their stored precision, the head, the KV
cache) over measured copy bandwidth. Backends whose extra is not installed are skipped.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from river_core import CapabilityError, ExitConfig, GenerationConfig, QuantSpec, RiverModel
from river_models.source import hf_model, locate

from .library.output import Output, parser
from .library.output import command as run_command
from .library.measures import first_divergence
from .library.prompts import GSM8K_TRAIN, gsm8k_questions
from .library.timing import machine


TRANSFORMERS = "transformers generate()"


def transformers_generate(model, ids: list[int], tokens: int) -> tuple[list[int], list[float]]:
    """transformers' own greedy generate() on the same model: tokens and the time of each
    decode step (between consecutive logits-processor calls)."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    class Clock(LogitsProcessor):
        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids, scores):
            self.times.append(time.perf_counter())
            return scores

    clock = Clock()
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=tokens,
                                     logits_processor=LogitsProcessorList([clock]))
    return out[0, len(ids):].tolist(), list(np.diff(clock.times))


def main(argv: list[str] | None = None) -> None:
    ap = parser("speed", __doc__)
    ap.add_argument("--backends", nargs="+", default=["hf", "onnx", "llamacpp"])
    ap.add_argument("--data", type=Path, default=GSM8K_TRAIN)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--thresholds", type=float, nargs="+", default=[0.1, 0.15])
    ap.add_argument("--bits", type=int, default=8)
    ap.add_argument("--name", default="speed-cpu")
    args = ap.parse_args(argv)
    out = Output(args)

    models, configs = {}, {}
    for name in args.backends:
        try:
            models[name] = RiverModel.from_pretrained(args.model, backend=name, progress=True,
                                                      quant=QuantSpec(bits=args.bits))
        except CapabilityError as e:
            print(f"skipping {name}: {e}", file=sys.stderr)
            continue
        configs[(name, "full")] = ExitConfig(kv="full")
        if name == "hf":
            configs[(name, TRANSFORMERS)] = None
            reference, _ = hf_model(locate(args.model))
        if models[name].backend.capabilities.exits:
            configs.update({(name, f"river t={t}"): ExitConfig(policy="similarity",
                                                               options={"threshold": t})
                            for t in args.thresholds})
    gen = GenerationConfig(max_new_tokens=args.tokens)
    questions = gsm8k_questions(args.data, args.prompts)

    def run(key, question):
        model = models[key[0]]
        if key[1] == TRANSFORMERS:
            ids = model.backend.tokenizer.chat(question)
            tokens, steps = transformers_generate(reference, ids, args.tokens)
            return tokens, steps, [model.backend.num_layers - 1] * len(steps)
        stats = model.generate(question, exit_config=configs[key], generation_config=gen).stats
        return stats.tokens[0], stats.step_seconds, stats.exit_layers[0]

    for key in configs:   # warm-up
        run(key, questions[0])
    keys = list(configs)
    steps = {k: [] for k in keys}
    exits = {k: [] for k in keys}
    read = {k: [] for k in keys}
    agree = {k: [] for k in keys}
    diverge = {k: [] for k in keys}
    footprints = {name: m.backend.footprint() for name, m in models.items()}
    for p, q in enumerate(tqdm(questions, desc="prompts", file=sys.stderr)):
        texts = {}
        prompt_lens = {name: len(m.backend.tokenizer.chat(q)) for name, m in models.items()}
        for key in keys[p % len(keys):] + keys[: p % len(keys)]:
            texts[key], seconds, row = run(key, q)
            steps[key] += seconds
            exits[key] += row
            foot, start = footprints[key[0]], prompt_lens[key[0]]
            read[key] += [foot.bytes_per_token(k, start + i) for i, k in enumerate(row)]
        for key in keys:
            full = texts[(key[0], "full")]
            agree[key].append(texts[key] == full)
            diverge[key].append(first_divergence(texts[key], full))

    info = machine()
    bandwidth = info["memory_bandwidth_gb_s"] * 1e9
    ms = {k: float(np.median(steps[k])) * 1e3 for k in keys}
    nbytes = {k: float(np.mean(read[k])) for k in keys}
    reference = ms.get(("hf", "full"))
    rows = {}
    for key in keys:
        full = (key[0], "full")
        limit = nbytes[key] / bandwidth * 1e3
        rows[f"{key[0]} {key[1]}"] = {
            "backend": key[0], "config": key[1], "ms_per_token": ms[key],
            "speedup_vs_own_full": ms[full] / ms[key],
            "speedup_vs_hf_full": reference / ms[key] if reference else None,
            "ideal_speedup_from_bytes": nbytes[full] / nbytes[key],
            "bytes_per_token": nbytes[key], "limit_ms_per_token": limit,
            "share_of_limit": limit / ms[key], "mean_layers_run": float(np.mean(exits[key]) + 1),
            "greedy_agreement": float(np.mean(agree[key])),
            "tokens_to_first_divergence": float(np.mean(diverge[key])), "steps": len(steps[key])}
    command = run_command("speed", argv)
    lines = [f"# Decode speed, {args.prompts} GSM8K train prompts x {args.tokens} tokens, "
             f"int{args.bits} stand-ins", "",
             f"Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}, measured "
             f"copy bandwidth {info['memory_bandwidth_gb_s']} GB/s.", "",
             f"Command: `{command}`", "",
             "Speedups are against the same backend's full depth, and against the hf backend's "
             "full depth. The limit is bytes read per token over the measured bandwidth.", "",
             "| backend | config | ms/token | vs own full | vs hf full | ideal (bytes) | "
             "limit ms/token | % of limit | layers run | same text as full | "
             "tokens to first divergence |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows.values():
        vs_hf = f"{r['speedup_vs_hf_full']:.2f}x" if r["speedup_vs_hf_full"] else "-"
        lines.append(f"| {r['backend']} | {r['config']} | {r['ms_per_token']:.1f} | "
                     f"{r['speedup_vs_own_full']:.2f}x | {vs_hf} | "
                     f"{r['ideal_speedup_from_bytes']:.2f}x | {r['limit_ms_per_token']:.2f} | "
                     f"{100 * r['share_of_limit']:.0f}% | {r['mean_layers_run']:.1f} | "
                     f"{100 * r['greedy_agreement']:.0f}% | "
                     f"{r['tokens_to_first_divergence']:.1f} |")
    out.write(args.name, {"machine": info, "command": command,
                      "args": vars(args) | {"data": str(args.data)}, "results": rows},
          "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
