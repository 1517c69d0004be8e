"""Lossless River (speculative mode) against the backbone, lossy River and the whole 4-bit
model: one interleaved run per engine on GSM8K and HumanEval.

    river bench lossless --backend onnx --name lossless-onnx
    river bench lossless --backend hf --name lossless-hf
    river bench lossless --report lossless-hf lossless-onnx

The first two write one engine's records and table (NAME.md); --report writes
lossless.{md,json,png} from both, with a top-level "summary" per engine
(lossless_speedup_vs_backbone, identical_outputs, acceptance, tokens per round). Tuning, on
GSM8K train past the few-shot exemplars (the draft length and the draft's exit):

    river bench lossless --backend onnx --gsm8k ../shared/data/gsm8k/train.jsonl \\
        --gsm8k-offset 100 --gsm8k-limit 16 --humaneval-limit 0 --configs full \\
        lossless/fixed:-1/2= lossless/fixed:-1/4= lossless/fixed:-1/6= lossless/fixed:-1/8= \\
        lossless/fixed:-1/4 lossless/fixed:-1/6 lossless/fixed:-1/8 lossless/settled:0.97/6 \\
        lossless/fixed:3/6 --name lossless-tune-onnx

A config is `full`, `quantized` (the whole model at 4 bits, lossy), `river` (lossy River at the
paper's rule), or `lossless/POLICY:VALUE/G` (the river drafts with that exit policy, at most G
tokens per verification, adaptive; a trailing `=` drafts exactly G every round). Speed is all
decode time over all decoded tokens (a speculative round yields several), pooled over the
problems, against `full` in the same run; the limit is the bytes those steps read over the
measured memory bandwidth.
"""

from __future__ import annotations

import resource
import sys
import time

import attrs
import numpy as np
from tqdm import tqdm

from river_core import ConfigError, ExitConfig, GenerationConfig, RiverModel

from .library import gsm8k, humaneval
from .library.output import Output, parser, plot_file
from .library.output import command as run_command
from .library.measures import first_divergence
from .library.output import engine_heading
from .library.prompts import GSM8K_TRAIN
from .library.runs import MAIN_OPTION, Run

DEFAULT_CONFIGS = ("full", "quantized", "river", "lossless/settled:0.97/4=",
                   "lossless/fixed:-1/4=", "lossless/fixed:-1/4")


@attrs.frozen
class Config:
    label: str
    exit_config: ExitConfig

    @classmethod
    def parse(cls, text: str) -> "Config":
        if text == "full":
            return cls(text, ExitConfig(kv="full"))
        if text == "quantized":
            return cls(text, ExitConfig(policy="fixed", options={"layer": -1}))
        if text == "river":
            return cls(text, ExitConfig())
        kind, _, rest = text.partition("/")
        policy_value, _, length = rest.partition("/")
        policy, _, value = policy_value.partition(":")
        if kind != "lossless" or policy not in MAIN_OPTION or not value or not length:
            raise ConfigError(f"{text}: a config is full, quantized, river or "
                              f"lossless/POLICY:VALUE/G[=], e.g. lossless/fixed:-1/6")
        number = int(value) if policy == "fixed" else float(value)
        return cls(text, ExitConfig(mode="speculative", policy=policy,
                                    options={MAIN_OPTION[policy]: number},
                                    draft_tokens=int(length.rstrip("=")),
                                    adaptive=not length.endswith("=")))


def bytes_read(model: RiverModel, prompt_tokens: int, out) -> float:
    """Bytes the decode steps of `out` read, weights as stored: a lossy step at its exit; a
    round, its draft steps (stand-ins past the exit, the head's stand-in) and one
    verification (the backbone's weights once for all its positions)."""
    foot = model.backend.footprint()
    last, exits = model.backend.num_layers - 1, out.exit_layers[0]
    if not out.speculative:
        return sum(foot.bytes_per_token(k, prompt_tokens + i, "stand_in")
                   for i, k in enumerate(exits))
    total, step, position = 0.0, 0, prompt_tokens
    for drafted, accepted in zip(out.drafted, out.accepted):
        for i in range(drafted):
            total += foot.bytes_per_token(exits[step], position + i, "stand_in") \
                - foot.head_bytes + foot.stand_in_head_bytes
            step += 1
        total += foot.bytes_per_token(last, position + drafted, "nothing")
        position += accepted + 1
    return total


def generate(model: RiverModel, text: str, config: Config, max_tokens: int, stop) -> dict:
    ids = model.backend.tokenizer.encode(text)
    out = model.generate_ids([ids], config.exit_config,
                             GenerationConfig(max_new_tokens=max_tokens, stop=stop))
    tokens = out.tokens[0]
    return {"completion": model.text(tokens, stop), "tokens": tokens,
            "decode_seconds": sum(out.step_seconds), "decoded": len(tokens) - 1,
            "bytes": bytes_read(model, len(ids), out), "exits": out.exit_layers[0],
            "drafted": out.drafted, "accepted": out.accepted, "prompt_tokens": len(ids)}


def run_tasks(args, model: RiverModel, configs: list[Config], run: Run) -> None:
    shots = gsm8k.load(args.gsm8k_shots, limit=gsm8k.SHOTS)
    tasks = [("gsm8k", p) for p in gsm8k.load(args.gsm8k, args.gsm8k_limit, args.gsm8k_offset)]
    tasks += [("humaneval", p) for p in humaneval.load(args.humaneval_limit)] \
        if args.humaneval_limit else []
    for n, (task, problem) in enumerate(tqdm(tasks, desc="problems", file=sys.stderr)):
        for config in configs[n % len(configs):] + configs[:n % len(configs)]:
            if run.has(task, problem.id, config.label):
                continue
            if task == "gsm8k":
                r = generate(model, gsm8k.prompt(problem, shots), config, args.max_tokens,
                             gsm8k.STOP)
                r["correct"] = gsm8k.correct(r["completion"], problem)
            else:
                r = generate(model, problem.prompt, config, args.max_tokens, humaneval.STOP)
                r["correct"], r["reason"] = humaneval.check(problem, r["completion"])
            run.add({"task": task, "problem": problem.id, "config": config.label, **r})


def summarize(configs: list[Config], run: Run, bandwidth: float, num_layers: int) -> dict:
    rows = {}
    for c in configs:
        records, scores = [], {}
        same, diverge = [], []
        for task in ("gsm8k", "humaneval"):
            mine, base = run.of(task, c.label), run.of(task, "full")
            if mine:
                scores[task] = (float(np.mean([r["correct"] for r in mine.values()])),
                                len(mine))
            for p, r in mine.items():
                records.append(r)
                same.append(r["tokens"] == base[p]["tokens"])
                diverge.append(first_divergence(r["tokens"], base[p]["tokens"]))
        decoded = sum(r["decoded"] for r in records)
        seconds = sum(r["decode_seconds"] for r in records)
        drafted = sum(sum(r["drafted"]) for r in records)
        accepted = sum(sum(r["accepted"]) for r in records)
        rounds = sum(len(r["drafted"]) for r in records)
        exits = np.array([k for r in records for k in r["exits"]]) + 1
        per_token = float(sum(r["bytes"] for r in records) / decoded)
        by_task = {task: [r for r in run.of(task, c.label).values()]
                   for task in ("gsm8k", "humaneval")}
        rows[c.label] = {
            "scores": scores, "problems": len(records),
            "ms_per_token": seconds * 1e3 / decoded, "bytes_per_token": per_token,
            "ms_per_token_by_task": {
                task: sum(r["decode_seconds"] for r in rs) * 1e3 / sum(r["decoded"] for r in rs)
                for task, rs in by_task.items() if rs and sum(r["decoded"] for r in rs)},
            "limit_ms_per_token": per_token / bandwidth * 1e3,
            "identical_outputs": float(np.mean(same)),
            "tokens_to_first_divergence": float(np.mean(diverge)),
            "acceptance_rate": accepted / drafted if drafted else None,
            "tokens_per_round": (accepted + rounds) / rounds if rounds else None,
            "mean_draft_tokens": drafted / rounds if rounds else None,
            "mean_layers_run": float(exits.mean()) if exits.size else None,
            "layers_run_histogram": np.bincount(exits, minlength=num_layers + 1).tolist()
            if exits.size else None}
    base = rows["full"]
    for r in rows.values():
        r["speedup"] = base["ms_per_token"] / r["ms_per_token"]
        r["speedup_by_task"] = {task: base["ms_per_token_by_task"][task] / ms
                                for task, ms in r["ms_per_token_by_task"].items()}
        r["ideal_speedup_from_bytes"] = base["bytes_per_token"] / r["bytes_per_token"]
        r["share_of_limit"] = r["limit_ms_per_token"] / r["ms_per_token"]
    return rows


def summary(rows: dict) -> dict:
    """The issue's figures for the fastest lossless config of a run."""
    lossless = {k: r for k, r in rows.items() if k.startswith("lossless")}
    best = max(lossless, key=lambda k: lossless[k]["speedup"])
    r = lossless[best]
    return {"config": best, "lossless_speedup_vs_backbone": r["speedup"],
            "identical_outputs": r["identical_outputs"], "acceptance_rate": r["acceptance_rate"],
            "tokens_per_round": r["tokens_per_round"],
            "vs_lossy_river": r["speedup"] / rows["river"]["speedup"] if "river" in rows else None,
            "vs_whole_4bit": r["speedup"] / rows["quantized"]["speedup"]
            if "quantized" in rows else None}


def table(rows: dict) -> list[str]:
    def score(r, task):
        return f"{100 * r['scores'][task][0]:.1f}%" if task in r["scores"] else "-"

    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    def by_task(r):
        return ", ".join(f"{v:.2f}x" for v in r["speedup_by_task"].values())

    lines = ["| config | GSM8K | HumanEval | identical to full | ms/token | speedup (GSM8K, "
             "HumanEval) | limit ms/token | of limit | drafts kept | tokens/round | "
             "drafts/round |", "|---" * 11 + "|"]
    for label, r in rows.items():
        lines.append(f"| {label} | {score(r, 'gsm8k')} | {score(r, 'humaneval')} | "
                     f"{100 * r['identical_outputs']:.0f}% | {r['ms_per_token']:.2f} | "
                     f"{r['speedup']:.2f}x ({by_task(r)}) | "
                     f"{r['limit_ms_per_token']:.2f} | "
                     f"{100 * r['share_of_limit']:.0f}% | "
                     f"{num(r['acceptance_rate'] and 100 * r['acceptance_rate'], '.1f')} | "
                     f"{num(r['tokens_per_round'], '.2f')} | "
                     f"{num(r['mean_draft_tokens'], '.2f')} |")
    return lines


def report(out, names: list[str]) -> None:
    engines = out.runs_by_engine(names, "lossless")
    lines = ["# Lossless River: the exit river as a self-speculative draft", "",
             "Each engine in its own interleaved run (same problems, configs rotated per "
             "problem, greedy, batch 1); speed is all decode time over all decoded tokens, "
             "against that engine's float32 backbone. `identical to full`: share of problems "
             "whose output is token for token full depth's. Drafts: 4-bit HQQ stand-ins "
             "(groups of 64) and the head's int8 stand-in.", ""]
    for engine, run in engines.items():
        lines += [*engine_heading(engine, run), *table(run["results"]), ""]
    out.write("lossless", {"summary": {e: r["summary"] for e, r in engines.items()},
                       "runs": {e: r["results"] for e, r in engines.items()}},
          "\n".join(lines + ["![lossless](lossless.png)", ""]))
    plot(out, engines)


def plot(out, engines: dict) -> None:
    plt, save = plot_file(out, "lossless")
    fig, axes = plt.subplots(1, len(engines), figsize=(6 * len(engines), 4.5), squeeze=False)
    for ax, (engine, run) in zip(axes[0], engines.items()):
        rows = run["results"]
        labels = list(rows)
        speed = [rows[k]["speedup"] for k in labels]
        colors = ["tab:green" if rows[k]["identical_outputs"] == 1.0 else "tab:orange"
                  for k in labels]
        ax.barh(labels, speed, color=colors)
        ax.axvline(1.0, color="grey", lw=0.8)
        for y, k in enumerate(labels):
            same = 100 * rows[k]["identical_outputs"]
            ax.text(speed[y] + 0.02, y, f"{speed[y]:.2f}x, {same:.0f}% identical", va="center",
                    fontsize=8)
        ax.set_xlabel("speedup over the float32 backbone")
        ax.set_title(f"{engine}: green = every output identical to full depth")
        ax.set_xlim(0, max(speed) * 1.45)
    save(fig)


def main(argv: list[str] | None = None) -> None:
    ap = parser("lossless", __doc__)
    ap.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS))
    ap.add_argument("--backend", default="onnx")
    ap.add_argument("--gsm8k", default=str(GSM8K_TRAIN.with_name("test_dev.jsonl")))
    ap.add_argument("--gsm8k-shots", default=str(GSM8K_TRAIN))
    ap.add_argument("--gsm8k-limit", type=int, default=30)
    ap.add_argument("--gsm8k-offset", type=int, default=0)
    ap.add_argument("--humaneval-limit", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--name", default="lossless-onnx")
    ap.add_argument("--report", nargs="*", metavar="RUN",
                    help="write lossless.* from these runs' results instead")
    args = ap.parse_args(argv)
    out = Output(args)
    if args.report is not None:
        return report(out, args.report or ["lossless-hf", "lossless-onnx"])
    try:
        configs = [Config.parse(c) for c in args.configs]
    except ConfigError as e:
        ap.error(str(e))
    if "full" not in args.configs:
        ap.error("include `full`: every ratio is taken against it")
    run = Run(out.runs, args.name)
    model = RiverModel.from_pretrained(args.model, backend=args.backend, progress=True)
    for c in configs:   # warm every path (and pack the verification weights) before timing
        generate(model, "Question: What is 2 + 3?\nAnswer:", c, 8, gsm8k.STOP)
    start = time.perf_counter()
    run_tasks(args, model, configs, run)
    rows = summarize(configs, run, run.machine["memory_bandwidth_gb_s"] * 1e9,
                     model.backend.num_layers)
    command = run_command("lossless", argv)
    info = run.machine | {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    payload = {"args": vars(args), "command": command, "machine": info, "results": rows,
               "summary": summary(rows) if any(k.startswith("lossless") for k in rows) else None,
               "seconds": time.perf_counter() - start}
    out.write(args.name, payload, "\n".join([
        f"# Lossless River ({args.backend})", "", f"Command: `{command}`", "",
        f"Machine: {info['cpu']}, {info['cores']} cores, copy bandwidth "
        f"{info['memory_bandwidth_gb_s']} GB/s, peak RSS {info['peak_rss_mb']:.0f} MB.", "",
        *table(rows), ""]))


if __name__ == "__main__":
    main()
