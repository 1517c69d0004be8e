"""Lossless mode on a shape where it cannot be run with real text, projected from what can be
measured: the draft acceptance of the embedded model at each draft length k (its lossless
mode, GSM8K train prompts), and on the shape the cost of a plain decode step, of a draft step
and of a verification of k+1 tokens. Speed-up over the shape's own full depth at k:
(accepted + 1) x plain / (k x draft + verify(k + 1)), accepted the mean drafts the backbone
kept per round at k.

The draft step is the shape's exit mode at `--exit` (the fixed policy: the paper's operating
point of about 4 backbone layers) with its full-precision head, dearer than a draft's 8-bit
one, so the projection leans low. A random model's drafts would be accepted by chance only,
hence the embedded model's acceptance.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from river_core import ExitConfig, GenerationConfig
from river_core.arguments import add_quant_arguments

from .grid import prompts_for
from .library import shapes
from .library.output import Harness, parser

KS = (1, 2, 3, 4, 6, 8)


def acceptance(engine: str, args) -> dict[int, float]:
    """Mean drafts kept per round at each k, the embedded model's lossless mode (fixed k)."""
    model = shapes.load(engine, shapes.REAL, args.model, "cpu", shapes.engine_quant(engine, args),
                        4096)
    prompts = prompts_for(model, shapes.REAL, args.positions, args.prompts)
    kept = {}
    for k in KS:
        config = ExitConfig(mode="speculative", draft_tokens=k, adaptive=False)
        rounds = []
        for ids in prompts:
            out = model.generate_ids([ids], config, GenerationConfig(max_new_tokens=args.tokens))
            rounds += [a for d, a in zip(out.drafted, out.accepted) if d == k]
        kept[k] = float(np.mean(rounds)) if rounds else 0.0
    return kept


def costs(engine: str, shape: str, args) -> dict:
    """ms of a plain step, a draft step, and verifying k+1 tokens, on `shape`, after a
    prompt of `args.positions` ids (medians of warm repeats)."""
    model = shapes.load(engine, shape, args.model, "cpu", shapes.engine_quant(engine, args),
                        args.positions + 64)
    [ids] = prompts_for(model, shape, args.positions, 1)
    gen = GenerationConfig(max_new_tokens=args.tokens)

    def per_token(config: ExitConfig) -> float:
        model.generate_ids([ids], config, GenerationConfig(max_new_tokens=4))   # warm
        return statistics.median(model.generate_ids([ids], config, gen).ms_per_token
                                 for _ in range(args.repeats))

    plain = per_token(ExitConfig(kv="full"))
    draft = per_token(ExitConfig(policy="fixed", options={"layer": args.exit - 1}))
    backend = model.backend
    verify = {}
    for k in KS:
        backend.prefill([ids], args.positions + 64)
        times = []
        for _ in range(args.repeats + 1):
            start = time.perf_counter()
            backend.extend([5] * (k + 1), args.positions)
            times.append(time.perf_counter() - start)
            backend.trim(args.positions)
        verify[k] = 1e3 * statistics.median(times[1:])
    return {"plain_ms": plain, "draft_ms": draft, "verify_ms": verify}


def project(kept: dict[int, float], cost: dict) -> dict[int, float]:
    return {k: (kept[k] + 1) * cost["plain_ms"] / (k * cost["draft_ms"] + cost["verify_ms"][k])
            for k in KS}


def report(p: dict) -> str:
    info, c = p["machine"], p["costs"]
    lines = [f"# Lossless mode on {p['shape']}, projected", "",
             f"Command: `{p['command']}`. Machine: {info['cpu']}, {info['cores']} cores, copy "
             f"bandwidth {info['memory_bandwidth_gb_s']} GB/s. Engine {p['engine']}, "
             f"{p['positions']} positions. On {p['shape']}: a plain step {c['plain_ms']:.1f} "
             f"ms, a draft step (exit after {p['exit']} backbone layers) {c['draft_ms']:.1f} "
             "ms. Drafts kept per round: the embedded model's lossless mode at a fixed k.", "",
             "| k | drafts kept per round (embedded model) | verify k+1 tokens, ms | "
             "projected speed-up over full depth |", "|---|---|---|---|"]
    for k in KS:
        lines.append(f"| {k} | {p['kept'][k]:.2f} | {c['verify_ms'][k]:.1f} | "
                     f"{p['projected'][k]:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = parser("projection", __doc__, results="projection")
    ap.add_argument("--engine", default="ggml")
    ap.add_argument("--shape", default="llama-1b", choices=list(shapes.SHAPES))
    ap.add_argument("--exit", type=int, default=4, help="backbone layers a draft runs")
    ap.add_argument("--positions", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=3, help="embedded-model prompts")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    add_quant_arguments(ap)
    out, args = Harness.parse(ap, argv)
    kept = acceptance(args.engine, args)
    cost = costs(args.engine, args.shape, args)
    payload = {**out.head(), "engine": args.engine, "shape": args.shape,
               "positions": args.positions, "exit": args.exit, "kept": kept, "costs": cost,
               "projected": project(kept, cost), "args": out.arguments()}
    out.write(args.name, payload, report(payload))


if __name__ == "__main__":
    main()
