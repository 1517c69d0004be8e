"""Quality and speed of exit-mode and speculative configurations on GSM8K and HumanEval, side
by side in one interleaved run; `--report` puts several runs (one per engine) on one page.

    river bench tasks --backend onnx --configs full quantized river river:1.5 \\
        propagate/settled:0.97 mask/settled:0.97 lossless/fixed:-1/4= \\
        --gsm8k-limit 24 --humaneval-limit 6 --max-tokens 160 --name paper-table-onnx
    (the same with --backend hf --name paper-table-hf)
    river bench tasks --report paper-table-hf paper-table-onnx --name paper-table

A config (benchmarks/library/runs.py, `Config`) is `full` (the baseline every ratio is taken
against), `quantized[@BITS]` (every layer on stand-ins: the whole model at 4 bits), `llamacpp`
(full depth through llama-cpp-python on the same GGUF: the anchor), an exit-mode
`KV[/POLICY][:VALUE][@int8|@int4]` (a KV strategy, river, propagate, mask, monotonic or
recompute, under an exit policy; `river` alone is the paper's rule) or a speculative
`lossless/POLICY:VALUE/G[=]` (the river drafts under that policy, at most G tokens per
verification, adaptive; `=`: exactly G every round). Every problem runs every config back to
back, order rotated per problem, greedy, at batch 1, so speed ratios come from one run. Per
problem and config one record is appended to `runs/NAME/` in the results folder; a rerun with
the same NAME skips what is there, so an interrupted run resumes.

Metrics: GSM8K exact final answer (few-shot prompts from --gsm8k-shots, default train),
HumanEval pass@1 (each program in a sandboxed subprocess), greedy agreement with full depth
(identical output; tokens to the first difference), teacher-forced NLL of the reference GSM8K
solution minus full depth's (exit mode: speculative mode scores as full depth), ms/token as
`DecodeResult` defines it (all decode time over all decoded tokens, pooled over the problems),
bytes read per token from the backend's footprint and the limit they set at the measured copy
bandwidth, layers run, drafts kept and tokens per round, peak RSS. Tune on train (--gsm8k
train.jsonl, offset past the shots), report on test_dev.
"""

from __future__ import annotations

import math
import resource
import sys

import attrs
import numpy as np
from tqdm import tqdm

from river_core import CapabilityError, ConfigError, GenerationConfig, RiverModel
from river_core.loop.decode import DecodeResult
from river_core.plugins import default_registry

from .library import gsm8k, humaneval
from .library.measures import first_divergence
from .library.output import Output, Harness, engine_heading, parser, plot_file
from .library.prompts import GSM8K_TEST, GSM8K_TRAIN
from .library.runs import Config, Run, paper_summary

TASKS = ("gsm8k", "humaneval")


def bytes_read(model: RiverModel, config: Config, prompt_tokens: int, out: DecodeResult) -> float:
    """Bytes the decode steps of `out` read, weights as stored. Exit mode: each step at its
    exit, a skipped layer reading what the KV strategy reads for it. Speculative mode: each
    round's draft steps (stand-ins past the exit, the head's stand-in) and one verification
    (the backbone's weights once for all its positions)."""
    foot = model.backend.footprint()
    exits = out.exit_layers[0]
    if not out.speculative:
        reads = default_registry().kv_strategy(config.exit_config.kv).make.skipped_reads
        head = config.exit_config.stand_in_head
        return sum(foot.bytes_per_token(k, prompt_tokens + i, reads, head)
                   for i, k in enumerate(exits))
    total, step, position = 0.0, 0, prompt_tokens
    for drafted, accepted in zip(out.drafted, out.accepted):
        for i in range(drafted):
            total += foot.bytes_per_token(exits[step], position + i, "stand_in", True)
            step += 1
        total += foot.bytes_per_token(model.backend.num_layers - 1, position + drafted,
                                      "nothing")
        position += accepted + 1
    return total


def generate(model: RiverModel, text: str, config: Config, max_tokens: int, stop) -> dict:
    ids = model.backend.tokenizer.encode(text)
    out = model.generate_ids([ids], config.exit_config,
                             GenerationConfig(max_new_tokens=max_tokens, stop=stop))
    tokens = out.tokens[0]
    return {"completion": model.text(tokens, stop), "tokens": tokens,
            "exits": out.exit_layers[0], "steps": out.step_seconds, "drafted": out.drafted,
            "accepted": out.accepted, "bytes": bytes_read(model, config, len(ids), out),
            "prompt_tokens": len(ids)}


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
                if args.nll and not config.speculative:
                    tok = model.backend.tokenizer
                    reference = tok.encode(" " + problem.solution)
                    r["nll"] = model.teacher_force([tok.encode(prompt)], [reference],
                                                   config.exit_config)[0].nll(reference)
            else:
                r = generate(model, problem.prompt, config, args.max_tokens, humaneval.STOP)
                r["correct"], r["reason"] = humaneval.check(problem, r["completion"])
            run.add({"task": task, "problem": problem.id, "config": config.label, **r})


def pooled(records: list[dict], num_layers: int) -> DecodeResult:
    """A config's problems as one DecodeResult, so that its speed, acceptance and layers are
    DecodeResult's own definitions over all of them."""
    return DecodeResult(tokens=[r["tokens"] for r in records],
                        exit_layers=[r["exits"] for r in records], num_layers=num_layers,
                        prefill_seconds=0.0, step_seconds=[s for r in records for s in r["steps"]],
                        drafted=[d for r in records for d in r["drafted"]],
                        accepted=[a for r in records for a in r["accepted"]])


def _number(x: float) -> float | None:
    return None if math.isnan(x) else x


def summarize(configs: list[Config], run: Run, num_layers: int, bandwidth: float) -> dict:
    """Per config: scores, agreement and NLL delta against `full`, speed (overall and by task)
    and its physical limit (bytes read per token over `bandwidth`, bytes/s)."""
    rows = {}
    for c in configs:
        records, scores, by_task = [], {}, {}
        agree, diverge, nll = [], [], []
        for task in TASKS:
            mine, base = run.of(task, c.label), run.of(task, "full")
            if not mine:
                continue
            scores[task] = (float(np.mean([r["correct"] for r in mine.values()])), len(mine))
            by_task[task] = pooled(list(mine.values()), num_layers).ms_per_token
            for p, r in mine.items():
                records.append(r)
                if p in base:
                    agree.append(r["tokens"] == base[p]["tokens"])
                    diverge.append(first_divergence(r["tokens"], base[p]["tokens"]))
                    if "nll" in r and "nll" in base[p]:
                        nll.append(r["nll"] - base[p]["nll"])
        out = pooled(records, num_layers)
        per_token = sum(r["bytes"] for r in records) / out.decoded_tokens
        rows[c.label] = {
            "scores": scores, "problems": len(records), "decoded_tokens": out.decoded_tokens,
            "ms_per_token": out.ms_per_token, "tokens_per_second": out.tokens_per_second,
            "ms_per_token_by_task": by_task,
            "bytes_per_token": per_token, "limit_ms_per_token": per_token / bandwidth * 1e3,
            "mean_layers_run": _number(out.mean_layers_run),
            "layers_run_histogram": out.layers_run_histogram().tolist(),
            "greedy_agreement": float(np.mean(agree)) if agree else None,
            "tokens_to_first_divergence": float(np.mean(diverge)) if diverge else None,
            "nll_delta": float(np.mean(nll)) if nll else None,
            "acceptance_rate": _number(out.acceptance_rate),
            "tokens_per_round": _number(out.tokens_per_round)}
    base = rows["full"]
    for r in rows.values():
        r["speedup"] = base["ms_per_token"] / r["ms_per_token"]
        r["speedup_by_task"] = {t: base["ms_per_token_by_task"][t] / ms
                                for t, ms in r["ms_per_token_by_task"].items()}
        r["ideal_speedup_from_bytes"] = base["bytes_per_token"] / r["bytes_per_token"]
        r["share_of_limit"] = r["limit_ms_per_token"] / r["ms_per_token"]
    return rows


def lossless_summary(rows: dict) -> dict | None:
    """The fastest speculative config of a run against the backbone, lossy River and the whole
    4-bit model; None without one."""
    lossless = {k: r for k, r in rows.items() if k.startswith("lossless/")}
    if not lossless:
        return None
    best = max(lossless, key=lambda k: lossless[k]["speedup"])
    r = lossless[best]
    versus = lambda label: r["speedup"] / rows[label]["speedup"] if label in rows else None
    return {"config": best, "lossless_speedup_vs_backbone": r["speedup"],
            "identical_outputs": r["greedy_agreement"], "acceptance_rate": r["acceptance_rate"],
            "tokens_per_round": r["tokens_per_round"], "vs_lossy_river": versus("river"),
            "vs_whole_4bit": versus("quantized")}


def summary(rows: dict) -> dict | None:
    """A run's summary: `paper_summary`'s figures and `lossless_summary`'s (their keys apart),
    as the retired paper_table and lossless benchmarks wrote them; None without either."""
    return {**(paper_summary(rows) or {}), **(lossless_summary(rows) or {})} or None


def table(rows: dict) -> list[str]:
    def score(r, task):
        if task not in r["scores"]:
            return "-"
        value, n = r["scores"][task]
        return f"{100 * value:.1f}% (n={n})"

    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    def share(x):
        return "-" if x is None else f"{100 * x:.0f}%"

    lines = ["| config | GSM8K | HumanEval | same output as full | tokens to first difference "
             "| NLL delta | ms/token | speedup (by task) | limit ms/token (share reached) | "
             "ideal (bytes) | layers run | drafts kept | tokens/round |", "|---" * 13 + "|"]
    for label, r in rows.items():
        by_task = ", ".join(f"{v:.2f}x" for v in r["speedup_by_task"].values())
        lines.append(f"| {label} | {score(r, 'gsm8k')} | {score(r, 'humaneval')} | "
                     f"{share(r['greedy_agreement'])} | "
                     f"{num(r['tokens_to_first_divergence'], '.1f')} | "
                     f"{num(r['nll_delta'], '+.4f')} | {r['ms_per_token']:.1f} | "
                     f"{r['speedup']:.2f}x ({by_task}) | {r['limit_ms_per_token']:.1f} "
                     f"({100 * r['share_of_limit']:.0f}%) | "
                     f"{r['ideal_speedup_from_bytes']:.2f}x | "
                     f"{num(r['mean_layers_run'], '.1f')} | "
                     f"{share(r['acceptance_rate'])} | "
                     f"{num(r['tokens_per_round'], '.2f')} |")
    return lines


def summary_lines(rows: dict) -> list[str]:
    paper, lossless = paper_summary(rows), lossless_summary(rows)
    lines = []
    if paper:
        lines += ["", f"Best River config ({paper['river_config']}: the fastest recovering at "
                  f"least half of the whole 4-bit model's NLL gap, else the one recovering "
                  f"most):"]
        lines += [f"- {label}: {f['river_speedup_vs_backbone']:.2f}x the backbone, "
                  f"{f['river_speed_vs_full_quant']:.2f}x the whole 4-bit model's speed, "
                  f"{100 * f['nll_gap_recovered']:.0f}% of its NLL gap recovered."
                  for label, f in paper["every_river_config"].items()]
    if lossless:
        lines += ["", f"Fastest speculative config ({lossless['config']}): "
                  f"{lossless['lossless_speedup_vs_backbone']:.2f}x the backbone, "
                  f"{100 * lossless['identical_outputs']:.0f}% of outputs identical to full "
                  f"depth, {lossless['tokens_per_round']:.2f} tokens per round."]
    return lines


def frontier(out: Output, name: str, rows: dict, num_layers: int) -> list[str]:
    """One run's plots: speed against accuracy, agreement and NLL delta; layers run."""
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
        ax.set_xlabel("speedup over full depth (ms/token)")
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
    ax.set_xlabel("backbone layers run by a token (speculative: by a draft)")
    ax.set_ylabel("share of decode steps")
    ax.legend(fontsize=8)
    save(fig)
    return [f"{name}-frontier.png", f"{name}-layers.png"]


def report(out: Output, names: list[str], name: str) -> None:
    """NAME.{md,json,png}: the named runs (one per engine) on one page, with each run's
    summaries: the paper's three figures for its best River config (`paper_summary`) and its
    fastest speculative config (`lossless_summary`), both under `summary`."""
    engines = out.runs_by_engine(names, "tasks")
    lines = ["# Exit and speculative modes on GSM8K and HumanEval, per engine", "",
             "Each engine in its own interleaved run (same problems, configs rotated per "
             "problem, greedy, batch 1); speed is all decode time over all decoded tokens, "
             "against that engine's float32 backbone. Stand-ins: 4-bit HQQ, groups of 64.", ""]
    for engine, run in engines.items():
        lines += [*engine_heading(engine, run), *table(run["results"]),
                  *summary_lines(run["results"]), ""]
    plt, save = plot_file(out, name)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for engine, run in engines.items():
        for label, r in run["results"].items():
            for ax, value in zip(axes, (r["nll_delta"], r["greedy_agreement"])):
                if value is not None and (ax is axes[1] or value < 1):
                    ax.scatter(r["speedup"], value)
                    ax.annotate(f"{engine} {label}", (r["speedup"], value), fontsize=7)
    axes[0].set_ylabel("NLL delta vs full depth (nats/token; below 1)")
    axes[1].set_ylabel("share of outputs identical to full depth")
    for ax in axes:
        ax.set_xlabel("speedup over the engine's float32 backbone")
        ax.grid(alpha=0.3)
    save(fig)
    out.write(name, {"summary": {e: summary(r["results"]) for e, r in engines.items()},
                     "runs": list(names)},
              "\n".join(lines + [f"![speed against quality]({name}.png)", ""]))


def load_models(args, configs: list[Config]) -> dict[tuple[str, int], RiverModel]:
    """A model per (backend, stand-in bits) the configs name; an optional anchor that is not
    installed is skipped, with a line saying so."""
    models = {}
    for name, bits in sorted({c.model_key(args.backend) for c in configs}):
        try:
            own = default_registry().backend(name).quant   # the engine's own stand-ins
            models[name, bits] = RiverModel.from_pretrained(args.model, backend=name,
                                                            progress=True,
                                                            quant=attrs.evolve(own, bits=bits))
        except CapabilityError as e:
            if name == args.backend:
                raise
            print(f"skipping {name}: {e}", file=sys.stderr)
    return models


def main(argv: list[str] | None = None) -> None:
    ap = parser("tasks", __doc__)
    ap.add_argument("--configs", nargs="+", default=["full", "quantized", "river"])
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
    ap.add_argument("--name", default="tasks-cpu",
                    help="the run (its records and results), or with --report the page")
    ap.add_argument("--report", nargs="+", metavar="RUN",
                    help="write NAME.{md,json,png} from these runs' results instead of running")
    out, args = Harness.parse(ap, argv)
    if args.report:
        return report(out, args.report, args.name)
    try:
        configs = [Config.parse(c) for c in args.configs]
        if "full" not in args.configs:
            raise ConfigError("include the `full` config: every ratio is taken against it")
    except ConfigError as e:
        ap.error(str(e))
    run = Run(out.runs, args.name)
    models = load_models(args, configs)
    configs = [c for c in configs if c.model_key(args.backend) in models]
    for warm in configs:   # every path warm (the verification weights packed) before timing
        generate(models[warm.model_key(args.backend)], "Question: What is 2 + 3?\nAnswer:", warm,
                 8, gsm8k.STOP)
    run_tasks(args, models, configs, run)
    info = run.machine | {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    num_layers = next(iter(models.values())).backend.num_layers
    rows = summarize(configs, run, num_layers, info["memory_bandwidth_gb_s"] * 1e9)
    images = frontier(out, args.name, rows, num_layers)
    command = out.command
    lines = [f"# Exit and speculative modes on GSM8K and HumanEval ({args.backend} backend)",
             "", f"Machine: {info['cpu']}, {info['cores']} cores, copy bandwidth "
             f"{info['memory_bandwidth_gb_s']} GB/s, peak RSS {info['peak_rss_mb']:.0f} MB.",
             "", f"Command: `{command}`", "", *table(rows), *summary_lines(rows), "",
             *[f"![{i}]({i})" for i in images]]
    out.write(args.name, {"machine": info, "command": command, "args": vars(args),
                          "summary": summary(rows), "results": rows}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
