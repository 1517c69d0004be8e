"""The oracle's headroom (analysis only, never fast): per token, the shallowest exit whose
river output has full depth's top-1, and where the exit policies send the same tokens.

    river bench oracle --backend onnx --gsm8k-limit 20 \\
        --policies settled:0.97 similarity:1.5 cascade:0.3

Teacher forcing on GSM8K reference solutions (test_dev, 4-shot prompts). Per token, with the
cache exact (every earlier token at full depth): run the backbone, keep its state after every
layer, then try the river from exit -1 (stand-ins only), 0, 1, ... until its top-1 is full
depth's; the backbone then runs again to put its exact K/V back. The speed the oracle allows
is its exit mix priced at the measured decode-step time of each fixed exit (the same engine, a
single-token step). Policies run as in River (their own exits, river K/V in the cache), on the
same tokens: their exit histograms and NLL delta against full depth. Writes
oracle.{md,json,png}.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from tqdm import tqdm

from river_core import ExitConfig, RiverModel, Step
from river_core.loop.decode import Row, Run, decode_step
from river_core.method.kv import River
from river_core.method.predictor import TransitionPredictor
from river_policies import FixedDepth

from .library import gsm8k
from .library.output import Harness, parser, plot_file
from .library.prompts import GSM8K_TRAIN
from .library.runs import MAIN_OPTION


def oracle_exits(backend, prompt: list[int], continuation: list[int]) -> list[int]:
    """Per fed token, the shallowest exit (-1: stand-ins only) whose river output's top-1 is
    full depth's; the last layer when none is."""
    n = backend.num_layers
    backend.prefill([prompt], len(prompt) + len(continuation))
    found = []
    for t, token in enumerate(continuation):
        p = backend.begin([token], Step(len(prompt) + t))
        states = [backend.embed(p)]
        for i in range(n):
            states.append(backend.layer(p, i, states[-1], None)[0])
        top = int(backend.logits(states[-1])[0].argmax())
        river = River()
        k = next((k for k in range(-1, n - 1) if int(backend.logits(river.skipped_tail(
            backend, p, k + 1, states[k + 1], None))[0].argmax()) == top), n - 1)
        if k < n - 1:   # the tries wrote river K/V: the backbone puts its own back
            for i in range(n):
                backend.layer(p, i, states[i], None)
        found.append(k)
    return found


def step_times(backend, prompt: list[int], repeats: int = 8) -> np.ndarray:
    """Median single-token decode-step time in ms of every fixed exit -1..L-1, interleaved."""
    n = backend.num_layers
    policies = {k: FixedDepth(k) for k in range(-1, n)}
    backend.prefill([prompt], len(prompt) + 1)
    rows = [Row(TransitionPredictor(backend.stand_in_error, np.zeros(n)), None)]
    times = {k: [] for k in policies}
    for _ in range(repeats):
        for k, policy in policies.items():
            start = time.perf_counter()
            decode_step(backend, [42], Run(River(), policy, TransitionPredictor), rows, 0,
                        Step(len(prompt)))
            times[k].append(time.perf_counter() - start)
    return np.array([np.median(times[k]) * 1e3 for k in range(-1, n)])


def policy_config(text: str) -> ExitConfig:
    policy, _, value = text.partition(":")
    return ExitConfig(policy=policy, options={MAIN_OPTION[policy]: float(value)})


def main(argv: list[str] | None = None) -> None:
    ap = parser("oracle", __doc__)
    ap.add_argument("--backend", default="onnx")
    ap.add_argument("--gsm8k", default=str(GSM8K_TRAIN.with_name("test_dev.jsonl")))
    ap.add_argument("--gsm8k-limit", type=int, default=20)
    ap.add_argument("--policies", nargs="*", default=["settled:0.97", "similarity:1.5",
                                                       "cascade:0.3"])
    out, args = Harness.parse(ap, argv)
    info = out.machine
    model = RiverModel.from_pretrained(args.model, backend=args.backend, progress=True)
    b, n = model.backend, model.backend.num_layers
    tok = b.tokenizer
    shots = gsm8k.load(str(GSM8K_TRAIN), limit=gsm8k.SHOTS)
    problems = gsm8k.load(args.gsm8k, limit=args.gsm8k_limit)
    found, exits, nll = [], {p: [] for p in args.policies}, {p: [] for p in args.policies}
    full_nll = []
    for problem in tqdm(problems, desc="problems", file=sys.stderr):
        prompt = tok.encode(gsm8k.prompt(problem, shots))
        reference = tok.encode(" " + problem.solution)
        found += oracle_exits(b, prompt, reference[:-1])
        full_nll.append(model.teacher_force([prompt], [reference], ExitConfig(kv="full"))[0]
                        .nll(reference))
        for p in args.policies:
            [forced] = model.teacher_force([prompt], [reference], policy_config(p))
            exits[p] += forced.exit_layers[:-1]
            nll[p].append(forced.nll(reference) - full_nll[-1])
    times = step_times(b, tok.encode(gsm8k.prompt(problems[0], shots)))
    found = np.array(found)
    price = lambda ks: float(np.mean(times[np.asarray(ks) + 1]))
    full_ms = float(times[-1])
    rows = {"oracle": {"mean_layers_run": float(found.mean() + 1),
                       "stand_ins_only_share": float(np.mean(found == -1)),
                       "full_depth_share": float(np.mean(found == n - 1)),
                       "ms_per_token": price(found), "speedup": full_ms / price(found),
                       "histogram": np.bincount(found + 1, minlength=n + 1).tolist()}}
    for p in args.policies:
        ks = np.array(exits[p])
        rows[p] = {"mean_layers_run": float(ks.mean() + 1), "ms_per_token": price(ks),
                   "speedup": full_ms / price(ks), "nll_delta": float(np.mean(nll[p])),
                   "histogram": np.bincount(ks + 1, minlength=n + 1).tolist()}
    command = out.command
    lines = ["# The oracle's headroom", "", f"Command: `{command}`", "",
             f"Machine: {info['cpu']}, {info['cores']} cores; engine {args.backend}. "
             f"{len(found)} tokens of {len(problems)} GSM8K test_dev reference solutions.", "",
             "The oracle exits each token at the shallowest layer whose river output has full "
             "depth's top-1, with an exact cache; its speed prices that exit mix at the "
             "measured step time of each fixed exit (full depth "
             f"{full_ms:.1f} ms, stand-ins only {times[0]:.1f} ms). Policies' speed is priced "
             "the same way from their own exits (cascade rechecks count as full depth, which "
             "flatters them: a recheck costs the river plus the backbone's rest).", "",
             f"- stand-ins only (exit -1) already give full depth's top-1 for "
             f"{100 * rows['oracle']['stand_ins_only_share']:.1f}% of tokens; "
             f"{100 * rows['oracle']['full_depth_share']:.1f}% need the whole backbone.", "",
             "| exit rule | mean layers run | priced ms/token | speedup | NLL delta |",
             "|---|---|---|---|---|"]
    for label, r in rows.items():
        delta = f"{r['nll_delta']:+.3f}" if "nll_delta" in r else "0 (top-1 kept)"
        lines.append(f"| {label} | {r['mean_layers_run']:.2f} | {r['ms_per_token']:.2f} | "
                     f"{r['speedup']:.2f}x | {delta} |")
    out.write("oracle", {"command": command, "machine": info, "engine": args.backend,
                     "tokens": len(found), "step_ms_by_exit": times.tolist(), "rows": rows},
          "\n".join(lines + ["", "![exit histograms](oracle.png)", ""]))
    plot(out, rows, n)


def plot(out, rows: dict, n: int) -> None:
    plt, save = plot_file(out, "oracle")
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(rows)
    for j, (label, r) in enumerate(rows.items()):
        h = np.array(r["histogram"], dtype=float)
        ax.bar(np.arange(n + 1) + (j - len(rows) / 2 + 0.5) * width, h / h.sum(), width,
               label=f"{label} (mean {r['mean_layers_run']:.1f} layers)")
    ax.set_xlabel("backbone layers run by a token (0: stand-ins only)")
    ax.set_ylabel("share of tokens")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title("Where tokens leave: the oracle beside the exit policies")
    save(fig)


if __name__ == "__main__":
    main()
