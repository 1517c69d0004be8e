"""Quality and speed of every KV strategy on GSM8K and HumanEval, side by side, in one run.

    python -m benchmarks tasks --configs full river:0.15 propagate:0.15 monotonic:0.15 \\
        quantized@int8 --gsm8k-limit 20 --humaneval-limit 10

A config is KV[:THRESHOLD][@int8|@int4]: a KV strategy (river, propagate, mask, monotonic,
recompute) with the similarity policy at THRESHOLD, `full` (the baseline every ratio is taken
against), `quantized` (every layer at river precision: the river from before layer 0), or
`llamacpp` (full depth through llama-cpp-python on the same GGUF: the anchor). Every problem runs
every config back to back, order rotated per problem, greedy, at batch 1, so speed ratios come
from one run. Per problem and config one record is appended to `benchmarks/runs/NAME/`; a rerun
with the same NAME skips what is there, so an interrupted run resumes.

Metrics: GSM8K exact final answer (few-shot prompts from --gsm8k-shots, default train),
HumanEval pass@1 (each program in a sandboxed subprocess), teacher-forced NLL of the reference
GSM8K solution minus full depth's, greedy agreement with full depth (identical output; tokens
to the first difference), median ms/token, bytes read per token from the backend's footprint,
layers run, peak RSS. Tune on train (--gsm8k train.jsonl, offset past the shots), report on
test_dev.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys

import attrs
import numpy as np
from tqdm import tqdm

import gsm8k
import humaneval
from common import GSM8K_TRAIN, RUNS, first_divergence, machine, write
from river_core import (CapabilityError, ConfigError, ExitConfig, GenerationConfig, QuantSpec,
                        RiverModel)
from river_core.plugins import default_registry



MAIN_OPTION = {"similarity": "threshold", "settled": "tau", "fixed": "layer", "cascade": "margin"}


@attrs.frozen
class Config:
    """`KV[/POLICY]:VALUE[@int8|@int4]`: a KV strategy, its exit policy (similarity by default)
    at the value of the policy's main option (MAIN_OPTION), stand-ins at 4 bits (HQQ) unless
    @int8; `full`; `quantized[@BITS]` (every layer a stand-in); `llamacpp`."""

    label: str
    kv: str
    policy: str | None
    value: float | None
    bits: int
    backend: str | None = None   # None: the run's --backend

    @classmethod
    def parse(cls, text: str) -> "Config":
        if text == "llamacpp":
            return cls(text, "full", None, None, 4, "llamacpp")
        body, _, bits = text.partition("@")
        head, _, value = body.partition(":")
        kv, _, policy = head.partition("/")
        if bits not in ("", "int8", "int4"):
            raise ConfigError(f"{text}: stand-in precision is @int8 or @int4")
        if kv in ("full", "quantized") and (value or policy):
            raise ConfigError(f"{text}: {kv} takes no policy or value")
        if kv not in ("full", "quantized"):
            policy = policy or "similarity"
            if policy not in MAIN_OPTION or not value:
                raise ConfigError(f"{text}: give a policy ({', '.join(MAIN_OPTION)}) and its "
                                  f"value, e.g. {kv}/settled:0.95")
        return cls(text, kv, policy or None, float(value) if value else None,
                   int(bits[3:] or 4))

    def model_key(self, backend: str) -> tuple[str, int]:
        return self.backend or backend, self.bits

    def exit_config(self) -> ExitConfig:
        if self.kv == "full":
            return ExitConfig(kv="full")
        if self.kv == "quantized":
            return ExitConfig(kv="river", policy="fixed", options={"layer": -1})
        value = int(self.value) if self.policy == "fixed" else self.value
        return ExitConfig(kv=self.kv, policy=self.policy,
                          options={MAIN_OPTION[self.policy]: value})


class Run:
    """Records on disk, one JSON line per (task, problem, config), and the machine they ran
    on, measured (memory bandwidth included) when the run started, before any model loaded."""

    def __init__(self, name: str) -> None:
        self.path = RUNS / name / "records.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        described = self.path.with_name("machine.json")
        if not described.is_file():
            described.write_text(json.dumps(machine()))
        self.machine = json.loads(described.read_text())
        self.records = {}
        if self.path.is_file():
            for line in self.path.open():
                r = json.loads(line)
                self.records[(r["task"], r["problem"], r["config"])] = r

    def has(self, task, problem, config) -> bool:
        return (task, problem, config) in self.records

    def add(self, record: dict) -> None:
        self.records[(record["task"], record["problem"], record["config"])] = record
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def of(self, task: str, config: str) -> dict:
        return {p: r for (t, p, c), r in self.records.items() if t == task and c == config}


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
                    r["nll"] = model.teacher_force(tok.encode(prompt), reference,
                                                   config.exit_config()).nll(reference)
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


def paper_summary(rows: dict) -> dict | None:
    """The paper's three figures for the best River config of a run: its speedup over the
    backbone, its speed relative to the whole quantized model, and the share of the quantized
    model's NLL gap it recovers. Best: the fastest River config recovering at least half of
    the gap, else the one recovering most. None without `full`, `quantized` and NLL."""
    quant = next((r for label, r in rows.items() if label.startswith("quantized")), None)
    rivers = {label: r for label, r in rows.items()
              if label.startswith("river") and r["nll_delta"] is not None}
    if quant is None or not rivers or not quant["nll_delta"]:
        return None
    recovered = {label: (quant["nll_delta"] - r["nll_delta"]) / quant["nll_delta"]
                 for label, r in rivers.items()}
    half = [label for label in rivers if recovered[label] >= 0.5]
    best = max(half, key=lambda l: rivers[l]["speedup"]) if half else \
        max(recovered, key=recovered.get)
    figures = {label: {"river_speedup_vs_backbone": r["speedup"],
                       "river_speed_vs_full_quant": r["speedup"] / quant["speedup"],
                       "nll_gap_recovered": recovered[label]} for label, r in rivers.items()}
    return {"river_config": best, **figures[best], "every_river_config": figures}


def plots(name: str, rows: dict, num_layers: int) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from common import RESULTS

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
    frontier = f"{name}-frontier.png"
    fig.savefig(RESULTS / frontier, dpi=110)
    fig, ax = plt.subplots(figsize=(8, 4))
    for label, r in rows.items():
        h = np.array(r["layers_run_histogram"], dtype=float)
        ax.step(np.arange(num_layers + 1), h / max(h.sum(), 1), where="mid", label=label)
    ax.set_xlabel("backbone layers run by a token")
    ax.set_ylabel("share of decode steps")
    ax.legend(fontsize=8)
    fig.tight_layout()
    histogram = f"{name}-layers.png"
    fig.savefig(RESULTS / histogram, dpi=110)
    return [frontier, histogram]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["full", "river:0.15"])
    ap.add_argument("--backend", default="hf")
    ap.add_argument("--gsm8k", default=str(GSM8K_TRAIN.with_name("test_dev.jsonl")),
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
    args = ap.parse_args()

    try:
        configs = [Config.parse(c) for c in args.configs]
        if "full" not in [c.label for c in configs]:
            raise ConfigError("include the `full` config: every ratio is taken against it")
    except ConfigError as e:
        ap.error(str(e))
    run = Run(args.name)
    models = {}
    for name, bits in sorted({c.model_key(args.backend) for c in configs}):
        try:
            models[name, bits] = RiverModel.from_pretrained(backend=name, progress=True,
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
    images = plots(args.name, rows, num_layers)
    command = "python -m benchmarks tasks " + " ".join(sys.argv[1:])
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
    write(args.name, {"machine": info, "command": command, "args": vars(args),
                      "summary": summary, "results": rows}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
