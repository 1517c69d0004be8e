"""Calibration's effect: profiles fitted on GSM8K train, then reported on test_dev beside the
policy's uncalibrated default, in one interleaved tasks run.

    river bench calibration --backend onnx --prompts 64 \\
        --targets agreement=0.9 agreement=0.95 --gsm8k-limit 30

Calibration prompts: GSM8K train problems past the few-shot exemplars, in the tasks
benchmark's format but without its exemplars by default (--shots: each pass over a 4-shot
prompt prefills ~700 tokens, which makes calibration about 5x slower). Each target gives one profile
(`river calibrate`'s fit, saved under calibration/ in the results folder); then `tasks` runs full depth,
the default and every calibrated value on test_dev. Writes calibration.{md,json,png}.
"""

from __future__ import annotations

import time

import attrs
import numpy as np

from river_cli.calibrate import calibrate
from river_cli.profile import Target
from river_core import ExitConfig, RiverModel
from river_core.settings.options import tuned

from . import tasks
from .library import gsm8k
from .library.output import Harness, parser, passed_on, plot_file
from .library.prompts import GSM8K_TRAIN
from .library.runs import MAIN_OPTION


def main(argv: list[str] | None = None) -> None:
    ap = parser("calibration", __doc__, results="calibration")
    ap.add_argument("--backend", default="onnx")
    ap.add_argument("--policy", default="settled", choices=sorted(MAIN_OPTION))
    ap.add_argument("--prompts", type=int, default=64, help="GSM8K train calibration prompts")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--shots", type=int, default=0, help="exemplars in calibration prompts")
    ap.add_argument("--targets", nargs="+", type=Target.parse,
                    default=[Target("agreement", 0.9), Target("agreement", 0.95)])
    ap.add_argument("--gsm8k-limit", type=int, default=30, help="test_dev problems")
    ap.add_argument("--max-tokens", type=int, default=192, help="of each test_dev answer")
    ap.add_argument("--layer-prompts", type=int, default=4,
                    help="prompts of the per-layer table")
    out, args = Harness.parse(ap, argv)
    info = out.machine
    model = RiverModel.from_pretrained(args.model, backend=args.backend, progress=True)
    tok = model.backend.tokenizer
    shots = gsm8k.load(str(GSM8K_TRAIN), limit=gsm8k.SHOTS)
    problems = gsm8k.load(str(GSM8K_TRAIN), limit=args.prompts, offset=gsm8k.SHOTS)
    prompts = [tok.encode(gsm8k.prompt(p, shots[:args.shots])) for p in problems]
    config = ExitConfig(policy=args.policy)
    options = model.registry.policy(args.policy).options
    option = tuned(options)[0]
    default = attrs.fields_dict(options)[option].default
    start = time.perf_counter()
    profiles = calibrate(model, prompts, config, args.targets, tokens=args.tokens,
                         layer_prompts=args.layer_prompts, model_name=args.model or "default",
                         precision=model.registry.backend(args.backend).quant.label,
                         source=f"GSM8K train {gsm8k.SHOTS}..{gsm8k.SHOTS + args.prompts - 1} "
                         f"({args.shots}-shot)", progress=True)
    seconds = time.perf_counter() - start
    for profile in profiles:
        target = profile.target
        profile.save(out.path("calibration") / f"{args.policy}-{target.metric}-"
                     f"{target.value:g}.json")
    del model   # the tasks run loads its own
    values = [round(p.options[option], 4) for p in profiles]
    configs = ["full", f"river/{args.policy}:{default}",
               *[f"river/{args.policy}:{v}" for v in values]]
    tasks_name = f"{args.name}-tasks-{args.backend}"
    tasks.main(["--backend", args.backend, "--configs", *configs, "--gsm8k-limit",
                str(args.gsm8k_limit), "--max-tokens", str(args.max_tokens), "--name",
                tasks_name, *passed_on(args)])
    rows = out.read(tasks_name, "tasks")["results"]
    report(out, args, info, profiles, seconds, option, default, configs, rows,
           out.command)


def report(out, args, info, profiles, seconds, option, default, configs, rows,
           command) -> None:
    lines = [f"# Calibration ({args.policy}, {args.backend} engine)", "",
             f"Command: `{command}`", "",
             f"Machine: {info['cpu']}, {info['cores']} cores. Calibrated on {args.prompts} GSM8K "
             f"train prompts ({args.shots}-shot, {args.tokens} tokens of full depth's "
             f"continuation each); reported on the first {args.gsm8k_limit} test_dev problems "
             f"in one interleaved tasks run ([its results]"
             f"({args.name}-tasks-{args.backend}.md)).", "",
             f"Calibration for all targets took {seconds / 60:.1f} min (shared references and "
             "per-layer table).", "",
             "| profile | fitted | train: agreement | train: NLL delta | train: layers "
             "| test_dev: GSM8K | test_dev: same output | test_dev: NLL delta | test_dev: "
             "layers | speedup |", "|---" * 10 + "|"]

    def test_dev(label: str) -> str:
        r = rows[label]
        acc = r["scores"]["gsm8k"][0]
        return (f"{100 * acc:.1f}% | {100 * r['greedy_agreement']:.0f}% | "
                f"{r['nll_delta']:+.4f} | {r['mean_layers_run']:.1f} | {r['speedup']:.2f}x")

    lines.append(f"| uncalibrated default | {option}={default} | - | - | - | "
                 f"{test_dev(configs[1])} |")
    for profile, label in zip(profiles, configs[2:]):
        q = profile.quality
        lines.append(f"| {profile.target} | {option}={profile.options[option]:.4f} | "
                     f"{q.agreement:.3f} | {q.nll_delta:+.3f} | "
                     f"{q.mean_layers:.1f} | {test_dev(label)} |")
    lines.append(f"| full depth | - | 1 | 0 | {profiles[0].layers[-1].exit_layer + 2} | "
                 f"{test_dev('full')} |")
    layers = profiles[0].layers
    lines += ["", "Every token exiting after layer k (the first profile's per-layer table, "
              "4 prompts): agreement with full depth's next token and the "
              "river's real K/V error in the skipped layers.", "",
              "![per-layer table](calibration.png)", ""]
    out.write(args.name, {"command": command, "machine": info, "configs": configs,
                          "profiles": [attrs.asdict(p) for p in profiles],
                          "seconds": seconds, "test_dev": {c: rows[c] for c in configs}},
              "\n".join(lines))
    plot(out, layers)


def plot(out, layers) -> None:
    plt, save = plot_file(out, "calibration")
    k = np.array([r.exit_layer for r in layers])
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(k, [r.quality.agreement for r in layers], "o-", label="agreement (next token)")
    ax.set_xlabel("exit layer k (-1: stand-ins only)")
    ax.set_ylabel("share of positions")
    if layers[0].kv_error is not None:
        twin = ax.twinx()
        twin.plot(k, [r.kv_error for r in layers], "s--", color="C1",
                  label="river K/V error (relative)")
        twin.set_ylabel("relative K/V error")
        twin.legend(loc="lower right", fontsize=8)
    ax.legend(loc="lower left", fontsize=8)
    ax.set_title("Every token exiting after layer k")
    save(fig)


if __name__ == "__main__":
    main()
