"""Decode cost against context length on River's engines: the backbone, River's exit mode,
River's lossless mode (drafts over River's default window of the context, over all of it, and
over a shorter window) and the whole 4-bit model, at short and long contexts, interleaved in
one run; and short answers in lossless mode against full depth.

    river bench context                          # onnx and hf, 64 to 4,096 positions
    river bench context --backends onnx --positions 64 2048 --tokens 32

Each prompt is GSM8K train text, tokenized and cut to the length (questions joined until it is
long enough). Every (engine, configuration, length) decodes `--tokens` tokens greedily after a
warm-up; lengths and configurations take turns within each round, so drift of a shared machine
hits all alike; the median over the rounds of each run's decode ms/token counts. Beside it, the
backbone's physical limit: the bytes a full-depth step reads (weights and the K/V of the
context) over the measured memory bandwidth.

Short answers: the README's prompt and four GSM8K train questions (chat template, up to 48
tokens each), at full depth and in lossless mode at each of `--draft-lengths`, interleaved the
same way: what chose `ExitConfig.draft_tokens`. Writes context.{md,json,png}; the summary holds
each configuration's ms/token at the longest context over the shortest, each mode's speed-up
over the backbone per length, `lossless_2048_vs_backbone` (onnx, River's defaults) and
`speculative_readme_prompt_vs_full` (hf, the README's prompt, `river generate`'s defaults).
"""

from __future__ import annotations

import statistics
import sys

from river_core import ExitConfig, GenerationConfig, RiverModel
from river_core.config import DRAFT_WINDOW

from .library.output import Output, parser, plot_file
from .library.output import command as run_command
from .library.prompts import GSM8K_TRAIN, gsm8k_questions, prompt_of
from .library.timing import machine

BACKBONE = "backbone"
LOSSLESS = "River lossless mode"
WHOLE, WINDOWED = f"{LOSSLESS}, drafts read the whole context", f"{LOSSLESS}, a shorter window"
README_PROMPT = "What is the capital of France?"   # the README's own
SHORT_ANSWER_TOKENS = 48


def configs(window: int) -> dict[str, ExitConfig]:
    return {BACKBONE: ExitConfig(kv="full"),
            "River exit mode": ExitConfig(),
            LOSSLESS: ExitConfig(mode="speculative"),
            WHOLE: ExitConfig(mode="speculative", draft_window=1 << 30),
            WINDOWED: ExitConfig(mode="speculative", draft_window=window),
            "whole 4-bit model": ExitConfig(policy="fixed", options={"layer": -1})}


def main(argv: list[str] | None = None) -> None:
    ap = parser("context", __doc__)
    ap.add_argument("--backends", nargs="+", default=["onnx", "hf"])
    ap.add_argument("--positions", type=int, nargs="+", default=[64, 512, 2048, 4096])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--draft-window", type=int, default=64,
                    help="the shorter window of a lossless configuration")
    ap.add_argument("--draft-lengths", type=int, nargs="+", default=[2, 3, 4],
                    help="short answers: lossless mode at each of these draft lengths")
    ap.add_argument("--questions", type=int, default=4,
                    help="short answers: GSM8K train questions beside the README's prompt")
    args = ap.parse_args(argv)
    out = Output(args)
    info = machine()
    gen = GenerationConfig(max_new_tokens=args.tokens)
    runs = configs(args.draft_window)
    ms: dict = {}
    short: dict = {}
    for backend in args.backends:
        model = RiverModel.from_pretrained(args.model, backend=backend, progress=True)
        prompts = {n: prompt_of(model, n) for n in args.positions}
        short[backend] = short_answers(model, args.draft_lengths, args.questions, args.rounds)
        for config in runs.values():   # warm-up, the longest context included
            for n in (min(args.positions), max(args.positions)):
                model.generate_ids([prompts[n]], config, gen)
        for r in range(args.rounds):
            print(f"{backend}: round {r + 1} of {args.rounds}", file=sys.stderr, flush=True)
            for name, config in runs.items():
                for n in args.positions:
                    stats = model.generate_ids([prompts[n]], config, gen)
                    ms.setdefault(backend, {}).setdefault(name, {}).setdefault(
                        str(n), []).append(stats.ms_per_token)
        limits = {str(n): model.backend.footprint().bytes_per_token(
            model.backend.num_layers - 1, n) / (info["memory_bandwidth_gb_s"] * 1e9) * 1e3
            for n in args.positions}
        ms.setdefault(backend, {})["physical limit (backbone)"] = {n: [v] for n, v in
                                                                    limits.items()}
        del model
    results = {b: {name: {n: statistics.median(s) for n, s in by_n.items()}
                   for name, by_n in by_config.items()} for b, by_config in ms.items()}
    payload = {"command": run_command("context", argv), "machine": info,
               "tokens": args.tokens, "rounds": args.rounds, "positions": args.positions,
               "draft_window": args.draft_window, "ms_per_token": results,
               "short_answers": short, "summary": summary(results, short, args.positions)}
    out.write("context", payload, report(payload))
    plot(out, payload)


def short_answers(model: RiverModel, lengths: list[int], questions: int, rounds: int) -> dict:
    """Per prompt (the README's, then GSM8K train questions), the median ms/token of full
    depth and of lossless mode at each draft length."""
    chats = {"README": README_PROMPT, **{f"GSM8K train {i + 1}": q for i, q in
                                         enumerate(gsm8k_questions(GSM8K_TRAIN, questions, 100))}}
    configs = {BACKBONE: ExitConfig(kv="full"),
               **{str(d): ExitConfig(mode="speculative", draft_tokens=d) for d in lengths}}
    gen = GenerationConfig(max_new_tokens=SHORT_ANSWER_TOKENS)
    ids = {name: model.encode(text)[0] for name, text in chats.items()}
    ms: dict = {}
    for r in range(rounds + 1):   # the first round warms up
        for name, prompt in ids.items():
            for config, exit_config in configs.items():
                stats = model.generate_ids([prompt], exit_config, gen)
                if r:
                    ms.setdefault(name, {}).setdefault(config, []).append(stats.ms_per_token)
    return {name: {c: statistics.median(v) for c, v in by.items()} for name, by in ms.items()}


def summary(results: dict, short: dict, positions: list[int]) -> dict:
    lo, hi = str(min(positions)), str(max(positions))
    measured = {b: {name: r for name, r in by.items() if not name.startswith("physical")}
                for b, by in results.items()}
    s = {f"ms_{hi}_over_{lo}": {b: {name: r[hi] / r[lo] for name, r in by.items()}
                                     for b, by in measured.items()},
         "speedup_over_backbone": {b: {name: {n: by[BACKBONE][n] / v for n, v in r.items()}
                                       for name, r in by.items() if name != BACKBONE}
                                   for b, by in measured.items()}}
    if "2048" in results.get("onnx", {}).get(LOSSLESS, {}):
        s["lossless_2048_vs_backbone"] = s["speedup_over_backbone"]["onnx"][LOSSLESS]["2048"]
    s["short_answers_speedup"] = {
        b: {name: {d: r[BACKBONE] / ms for d, ms in r.items() if d != BACKBONE}
            for name, r in by.items()} for b, by in short.items()}
    default = str(ExitConfig().draft_tokens)
    if default in short.get("hf", {}).get("README", {}):
        s["speculative_readme_prompt_vs_full"] = s["short_answers_speedup"]["hf"]["README"][
            default]
    return s


def report(p: dict) -> str:
    info, positions = p["machine"], p["positions"]
    speedup = p["summary"]["speedup_over_backbone"]
    lines = ["# Decode cost against context length", "",
             f"Machine: {info['cpu']}, {info['cores']} cores, copy bandwidth "
             f"{info['memory_bandwidth_gb_s']} GB/s. Command: `{p['command']}`. Batch 1, "
             f"{p['tokens']} greedy tokens per run, median decode ms/token over "
             f"{p['rounds']} interleaved rounds (speed-up over the backbone in brackets). "
             f"Lossless drafts attend the first 4 positions and the last {DRAFT_WINDOW} "
             f"(River's default), all of them, or the last {p['draft_window']} (a shorter "
             f"window).", "",
             "| engine | configuration | " + " | ".join(f"ms/token at {n}" for n in positions)
             + " |", "|---|---|" + "---|" * len(positions)]
    for backend, by_config in p["ms_per_token"].items():
        for name, by_n in by_config.items():
            ratio = speedup[backend].get(name, {})
            cells = " | ".join(f"{by_n[str(n)]:.1f}" + (f" ({ratio[str(n)]:.2f}x)"
                                                       if str(n) in ratio else "")
                               for n in positions)
            lines.append(f"| {backend} | {name} | {cells} |")
    speedups = p["summary"]["short_answers_speedup"]
    lengths = [d for d in next(iter(next(iter(speedups.values())).values()))]
    lines += ["", f"Short answers: the README's prompt (\"{README_PROMPT}\") and GSM8K train "
              f"questions, chat template, up to {SHORT_ANSWER_TOKENS} tokens; lossless mode's "
              f"speed-up over full depth by draft length (River's default: "
              f"{ExitConfig().draft_tokens}), full depth's ms/token beside:", "",
              "| engine | prompt | full depth ms/token | " +
              " | ".join(f"{d} drafts" for d in lengths) + " |",
              "|---|---|---|" + "---|" * len(lengths)]
    for backend, by_prompt in speedups.items():
        for name, r in by_prompt.items():
            full = p["short_answers"][backend][name][BACKBONE]
            lines.append(f"| {backend} | {name} | {full:.1f} | " +
                         " | ".join(f"{r[d]:.2f}x" for d in lengths) + " |")
    lines += ["", "![ms/token against context length](context.png)", ""]
    return "\n".join(lines)


def plot(out: Output, p: dict) -> None:
    plt, save = plot_file(out, "context")
    backends = list(p["ms_per_token"])
    fig, axes = plt.subplots(1, len(backends), figsize=(6 * len(backends), 4), squeeze=False)
    for ax, backend in zip(axes[0], backends):
        for name, by_n in p["ms_per_token"][backend].items():
            style = ":" if name.startswith("physical") else "-o"
            ax.plot(p["positions"], [by_n[str(n)] for n in p["positions"]], style, label=name)
        ax.set(xscale="log", xlabel="context positions", ylabel="ms/token", title=backend)
        ax.set_xticks(p["positions"], [str(n) for n in p["positions"]])
        ax.legend(fontsize=7)
    save(fig)


if __name__ == "__main__":
    main()
