"""Quality and speed of every KV strategy on GSM8K and HumanEval, side by side, in one run.

    river bench tasks --configs full river:0.15 propagate:0.15 monotonic:0.15 \\
        quantized@int8 --gsm8k-limit 20 --humaneval-limit 10

A config is KV[:THRESHOLD][@int8|@int4]: a KV strategy (river, propagate, mask, monotonic,
recompute) with the similarity policy at THRESHOLD, `full` (the baseline every ratio is taken
against), `quantized` (every layer at river precision: the river from before layer 0), or
`llamacpp` (full depth through llama-cpp-python on the same GGUF: the anchor). Every problem runs
every config back to back, order rotated per problem, greedy, at batch 1, so speed ratios come
from one run. Per problem and config one record is appended to `runs/NAME/` in the results
folder; a rerun with the same NAME skips what is there, so an interrupted run resumes.

Metrics: GSM8K exact final answer (few-shot prompts from --gsm8k-shots, default train),
HumanEval pass@1 (each program in a sandboxed subprocess), teacher-forced NLL of the reference
GSM8K solution minus full depth's, greedy agreement with full depth (identical output; tokens
to the first difference), median ms/token, bytes read per token from the backend's footprint,
layers run, peak RSS. Tune on train (--gsm8k train.jsonl, offset past the shots), report on
test_dev.
"""

from __future__ import annotations

import resource
import sys

import numpy as np
from tqdm import tqdm

from river_core import CapabilityError, ConfigError, GenerationConfig, QuantSpec, RiverModel
from river_core.plugins import default_registry

from .library import gsm8k, humaneval
from .library.measures import first_divergence
from .library.output import Output, parser, plot_file
from .library.output import command as run_command
from .library.prompts import GSM8K_TEST, GSM8K_TRAIN
from .library.runs import Config, Run, paper_summary

def generate(model: RiverModel, text: str, config: Config, max_tokens: int, stop) -> dict:
    tok = model.backend.tokenizer
    ids = tok.encode(text)
    out = model.generate_ids([ids], config.exit_config(),
                             GenerationConfig(max_new_tokens=max_tokens, stop=stop))
    tokens = out.tokens[0]
    return {"completion": model.text(tokens, stop), "tokens": tokens, "exits": out.exit_layers[0],
            "steps": out.step_seconds, "prompt_tokens": len(ids)}


def run_tasks(args, models: dict[tuple[str, int], RiverModel], configs: list[Config],
              run: Run) -> None:
    shots = gsm8k.load(args.gsm8k_shots, limit=args.shots)
    tasks = []
    if args.gsm8k_limit:
        tasks += [("gsm8k", p) for p in gsm8k.load(args.gsm8k, limit=args.gsm8k_limit,
                                                     offset=args.gsm8k_offset)]
    if args.humaneval_limit:
        tasks += [("humaneval", p) for p in humaneval.load(args.humaneval_limit)]
    for n, (task, problem) in enumerate(tqdm(tasks, desc="problems", file=sys.stderr)):
        for config in configs[n % len(configs):] + configs[:n % len(configs)]:
            if run.has(task, problem.id, config.label):
                continue
            model = models[config.model_key(args.backend)]
            if task == "gsm8k":
                prompt = gsm8k.prompt(problem, shots)
                r = generate(model, prompt, config, args.max_tokens, gsm8k.STOP)
                r["correct"] = gsm8k.correct(r["completion"], problem)
                if args.nll:
                    tok = model.backend.tokenizer
                    reference = tok.encode(" " + problem.solution)
                    r["nll"] = model.teacher_force([tok.encode(prompt)], [reference],
                                                   config.exit_config())[0].nll(reference)
            else:
                r = generate(model, problem.prompt, config, args.max_tokens, humaneval.STOP)
                r["correct"], r["reason"] = humaneval.check(problem, r["completion"])
            run.add({"task": task, "problem": problem.id, "config": config.label, **r})


def summarize(models, configs: list[Config], run: Run, backend_name: str,
              bandwidth: float) -> dict:
    """Per config: scores, agreement, NLL delta, speed and its physical limit (bytes read per
    token over `bandwidth`, bytes/s)."""
    full = "full"
    rows = {}
    for c in configs:
        backend = models[c.model_key(backend_name)].backend
        reads = default_registry().kv_strategy(c.exit_config().kv).make.skipped_reads
        foot = backend.footprint()
        steps, exits, nbytes, agree, diverge, nll = [], [], [], [], [], []
        scores = {}
        for task in ("gsm8k", "humaneval"):
            mine, base = run.of(task, c.label), run.of(task, full)
            if mine:
                scores[task] = (float(np.mean([r["correct"] for r in mine.values()])),
                                len(mine))
            for p, r in mine.items():
                steps += r["steps"]
                exits += r["exits"]
                nbytes += [foot.bytes_per_token(k, r["prompt_tokens"] + i, reads)
                           for i, k in enumerate(r["exits"])]
                if p in base:
                    agree.append(r["tokens"] == base[p]["tokens"])
                    diverge.append(first_divergence(r["tokens"], base[p]["tokens"]))
                    if "nll" in r and "nll" in base[p]:
                        nll.append(r["nll"] - base[p]["nll"])
        layers = np.array(exits) + 1
        ms = float(np.median(steps)) * 1e3
        rows[c.label] = {
            "scores": scores, "ms_per_token": ms, "tokens_per_second": 1e3 / ms,
            # the mean counts a cascade's rechecked steps, which the median hides
            "mean_ms_per_token": float(np.mean(steps)) * 1e3,
            "bytes_per_token": float(np.mean(nbytes)),
            "limit_ms_per_token": float(np.mean(nbytes)) / bandwidth * 1e3,
            "mean_layers_run": float(layers.mean()),
            "skipped_share": float(1 - layers.mean() / backend.num_layers),
            "layers_run_histogram": np.bincount(layers, minlength=backend.num_layers + 1).tolist(),
            "greedy_agreement": float(np.mean(agree)) if agree else None,
            "tokens_to_first_divergence": float(np.mean(diverge)) if diverge else None,
            "nll_delta": float(np.mean(nll)) if nll else None, "steps": len(steps)}
    base = rows[full]
    for r in rows.values():
        r["speedup"] = base["ms_per_token"] / r["ms_per_token"]
        r["mean_speedup"] = base["mean_ms_per_token"] / r["mean_ms_per_token"]
        r["ideal_speedup_from_bytes"] = base["bytes_per_token"] / r["bytes_per_token"]
    return rows


def plots(out: Output, name: str, rows: dict, num_layers: int) -> list[str]:
    plt, save = plot_file(out, f"{name}-frontier")
    fig, axes = plt.subplots(1, 3, figsize=(15, 5))
    panels = ((lambda r: r["scores"].get("gsm8k", (None,))[0], "GSM8K accuracy", "linear"),
              (lambda r: r["greedy_agreement"], "greedy agreement with full depth", "linear"),
              (lambda r: r["nll_delta"], "NLL delta vs full depth (nats/token)", "symlog"))
    markers = "osD^v<>pPX*h"
    for n, (label, r) in enumerate(rows.items()):
        for ax, (value, _, _) in zip(axes, panels):
            if value(r) is not None:
                ax.scatter(r["speedup"], value(r), s=45, marker=markers[n % len(markers)],
                           label=label if ax is axes[0] else None)
    for ax, (_, what, scale) in zip(axes, panels):
        ax.set_yscale(scale, **({"linthresh": 1e-3} if scale == "symlog" else {}))
        ax.set_ylabel(what)
        ax.set_xlabel("speedup over full depth (median ms/token)")
        ax.axvline(1.0, color="grey", lw=0.5)
        ax.grid(alpha=0.3)
    fig.legend(loc="lower center", ncol=min(len(rows), 6), fontsize=8)
    fig.subplots_adjust(bottom=0.26, wspace=0.3)
    fig.suptitle("Speed-quality frontier")
    save(fig)
    plt, save = plot_file(out, f"{name}-layers")
    fig, ax = plt.subplots(figsize=(8, 4))
    for label, r in rows.items():
        h = np.array(r["layers_run_histogram"], dtype=float)
        ax.step(np.arange(num_layers + 1), h / max(h.sum(), 1), where="mid", label=label)
    ax.set_xlabel("backbone layers run by a token")
    ax.set_ylabel("share of decode steps")
    ax.legend(fontsize=8)
    save(fig)
    return [f"{name}-frontier.png", f"{name}-layers.png"]


def main(argv: list[str] | None = None) -> None:
    ap = parser("tasks", __doc__)
    ap.add_argument("--configs", nargs="+", default=["full", "river:0.15"])
    ap.add_argument("--backend", default="hf")
    ap.add_argument("--gsm8k", default=str(GSM8K_TEST),
                    help="JSONL path or Hugging Face dataset name (scored)")
    ap.add_argument("--gsm8k-shots", default=str(GSM8K_TRAIN), help="few-shot exemplars")
    ap.add_argument("--shots", type=int, default=gsm8k.SHOTS)
    ap.add_argument("--gsm8k-limit", type=int, default=20)
    ap.add_argument("--gsm8k-offset", type=int, default=0)
    ap.add_argument("--humaneval-limit", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--no-nll", dest="nll", action="store_false",
                    help="skip the teacher-forced NLL of GSM8K reference solutions (halves the "
                    "time per problem)")
    ap.add_argument("--name", default="tasks-cpu")
    args = ap.parse_args(argv)
    out = Output(args)

    try:
        configs = [Config.parse(c) for c in args.configs]
        if "full" not in [c.label for c in configs]:
            raise ConfigError("include the `full` config: every ratio is taken against it")
    except ConfigError as e:
        ap.error(str(e))
    run = Run(out.runs, args.name)
    models = {}
    for name, bits in sorted({c.model_key(args.backend) for c in configs}):
        try:
            models[name, bits] = RiverModel.from_pretrained(args.model, backend=name,
                                                            progress=True,
                                                            quant=QuantSpec(bits=bits))
        except CapabilityError as e:   # an optional anchor that is not installed
            if name == args.backend:
                raise
            print(f"skipping {name}: {e}", file=sys.stderr)
    configs = [c for c in configs if c.model_key(args.backend) in models]
    for warm in configs:
        generate(models[warm.model_key(args.backend)], "Question: What is 2 + 3?\nAnswer:", warm,
                 8, gsm8k.STOP)
    run_tasks(args, models, configs, run)
    info = run.machine | {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    rows = summarize(models, configs, run, args.backend, info["memory_bandwidth_gb_s"] * 1e9)
    num_layers = next(iter(models.values())).backend.num_layers
    images = plots(out, args.name, rows, num_layers)
    command = run_command("tasks", argv)
    lines = [f"# Strategies on GSM8K and HumanEval ({args.backend} backend)", "",
             f"Machine: {info['cpu']}, {info['cores']} cores, copy bandwidth "
             f"{info['memory_bandwidth_gb_s']} GB/s, peak RSS {info['peak_rss_mb']:.0f} MB.",
             "", f"Command: `{command}`", "",
             "| config | GSM8K acc | HumanEval pass@1 | same output as full | tokens to first "
             "difference | NLL delta (nats/token) | ms/token | limit ms/token (bytes / "
             "bandwidth) | speedup | speedup (mean) | ideal (bytes) | layers run |",
             "|---" * 12 + "|"]

    def score(r, task):
        if task not in r["scores"]:
            return "-"
        value, n = r["scores"][task]
        return f"{100 * value:.1f}% (n={n})"

    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    for label, r in rows.items():
        lines.append(f"| {label} | {score(r, 'gsm8k')} | {score(r, 'humaneval')} | "
                     f"{num(r['greedy_agreement'] and 100 * r['greedy_agreement'], '.0f')}% | "
                     f"{num(r['tokens_to_first_divergence'], '.1f')} | "
                     f"{num(r['nll_delta'], '+.4f')} | {r['ms_per_token']:.1f} | "
                     f"{r['limit_ms_per_token']:.1f} "
                     f"({100 * r['limit_ms_per_token'] / r['ms_per_token']:.0f}% reached) | "
                     f"{r['speedup']:.2f}x | {r['mean_speedup']:.2f}x | "
                     f"{r['ideal_speedup_from_bytes']:.2f}x | "
                     f"{r['mean_layers_run']:.1f} |")
    summary = paper_summary(rows)
    if summary:
        lines += ["", f"Best River config ({summary['river_config']}): "
                  f"{summary['river_speedup_vs_backbone']:.2f}x the backbone's speed, "
                  f"{summary['river_speed_vs_full_quant']:.2f}x the whole quantized model's, "
                  f"recovering {100 * summary['nll_gap_recovered']:.0f}% of its NLL gap."]
    lines += ["", *[f"![{i}]({i})" for i in images]]
    out.write(args.name, {"machine": info, "command": command, "args": vars(args),
                          "summary": summary, "results": rows}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
