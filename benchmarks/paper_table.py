"""The paper's table on the embedded model: one task run per engine, side by side.

    river bench tasks --backend onnx --configs full quantized river/settled:0.97 \\
        river:1.5 propagate/settled:0.97 mask/settled:0.97 monotonic/settled:0.97 \\
        recompute/settled:0.97 --gsm8k-limit 24 --humaneval-limit 6 --max-tokens 160 \\
        --name paper-table-onnx
    (the same with --backend hf --name paper-table-hf)
    river bench paper_table

Reads paper-table-{hf,onnx}.json (each one interleaved run of one engine) from the results
folder and writes paper-table.{md,json,png}: backbone, whole model at 4 bits, River and the
peer strategies at River's exits, with accuracy, agreement, NLL delta, speed and exit
histograms, and a top-level "summary" with, per engine, the paper's three figures for the best
River setting (river_speedup_vs_backbone, river_speed_vs_full_quant, nll_gap_recovered).
"""

from __future__ import annotations


import numpy as np

from .library.output import Output, parser, plot_file
from .library.output import engine_heading
from .library.runs import paper_summary


ENGINES = ("hf", "onnx")


def main(argv: list[str] | None = None) -> None:
    ap = parser("paper_table", __doc__, model=False)
    ap.add_argument("--runs", nargs="+", default=[f"paper-table-{e}" for e in ENGINES])
    args = ap.parse_args(argv)
    out = Output(args)
    engines = out.runs_by_engine(args.runs, "tasks")
    summary = {e: paper_summary(r["results"]) for e, r in engines.items()}
    lines = ["# The paper's table on the embedded SmolLM2-135M-Instruct", "",
             "Each engine in its own interleaved run (same problems, same configs); speedups "
             "are against that engine's float32 backbone. Stand-ins: 4-bit HQQ, groups of 64. "
             "GSM8K accuracy is 0-2% for every config (a 135M model), so agreement with full "
             "depth and the NLL delta on reference solutions carry the signal.", ""]
    for engine, run in engines.items():
        lines += [*engine_heading(engine, run), "| config | GSM8K | HumanEval | same output "
                  "as full | NLL delta | ms/token | speedup | vs whole 4-bit | layers run |", "|---" * 9 + "|"]
        rows = run["results"]
        quant = rows["quantized"]["speedup"]
        for label, r in rows.items():
            score = lambda t: f"{100 * r['scores'][t][0]:.1f}%" if t in r["scores"] else "-"
            agree = r["greedy_agreement"]
            nll = r["nll_delta"]
            lines.append(
                f"| {label} | {score('gsm8k')} | {score('humaneval')} | "
                f"{'-' if agree is None else f'{100 * agree:.0f}%'} | "
                f"{'-' if nll is None else f'{nll:+.4f}'} | {r['ms_per_token']:.1f} | "
                f"{r['speedup']:.2f}x | {r['speedup'] / quant:.2f}x | "
                f"{r['mean_layers_run']:.1f} |")
        s = summary[engine]
        if s:
            lines += ["", f"Best River setting (the fastest recovering at least half of the "
                      f"whole 4-bit model's NLL gap, else the one recovering most): "
                      f"{s['river_config']}."]
            for label, f in s["every_river_config"].items():
                lines.append(f"- {label}: {f['river_speedup_vs_backbone']:.2f}x the backbone, "
                             f"{f['river_speed_vs_full_quant']:.2f}x the whole 4-bit model's "
                             f"speed, {100 * f['nll_gap_recovered']:.0f}% of its NLL gap "
                             f"recovered.")
            lines.append("")
    plot = _plot(out, engines)
    lines += ["", f"![exit histograms and frontier]({plot})", ""]
    out.write("paper-table", {"summary": summary, "runs": list(args.runs)}, "\n".join(lines))


def _plot(out, engines: dict) -> str:
    plt, save = plot_file(out, "paper-table")
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    markers = {"hf": "o", "onnx": "s"}
    for engine, run in engines.items():
        for label, r in run["results"].items():
            if r["nll_delta"] is not None and r["nll_delta"] < 1:   # peers at +12 off the scale
                axes[0].scatter(r["speedup"], r["nll_delta"], marker=markers.get(engine, "^"))
                axes[0].annotate(f"{engine} {label}", (r["speedup"], r["nll_delta"]),
                                 fontsize=7)
        for label in ("quantized", *[l for l in run["results"] if l.startswith("river")]):
            h = np.array(run["results"][label]["layers_run_histogram"], dtype=float)
            axes[1].step(np.arange(len(h)), h / max(h.sum(), 1), where="mid",
                         label=f"{engine} {label}")
    axes[0].set_xlabel("speedup over the engine's float32 backbone")
    axes[0].set_ylabel("NLL delta vs full depth (nats/token)")
    axes[0].grid(alpha=0.3)
    axes[1].set_xlabel("backbone layers run by a token")
    axes[1].set_ylabel("share of decode steps")
    axes[1].legend(fontsize=7)
    save(fig)
    return "paper-table.png"


if __name__ == "__main__":
    main()
