"""The microseconds a decoded token spends outside ggml's compute on the ggml engine: Python,
graph lookups, inputs copied in and outputs read back, the host's decisions between graphs.

    river bench ggml_overhead                              # the embedded model's F16 copy
    river bench ggml_overhead --files Q4_0.gguf Q8_0.gguf
    river bench ggml_overhead --files Q4_0.gguf --before /path/to/older/checkout   # before/after

Each call is `river generate --json --no-chat --backend ggml` in a process of its own, with
`ggml_backend_graph_compute` wrapped by a timer (the one place River hands work to ggml). A
configuration runs at two answer lengths (--short and --long tokens, the same prompt); the
difference in graphs computed gives the graphs a decoded token runs, and the long call's last
three quarters of graphs (decoding's) give, per token, the wall-clock from one graph's end to
the last's, the part of it inside ggml's compute and what is left (the overhead). A mode River
refuses on a file (exit mode on Q4_0: no type below it for stand-ins) is left out, said so.
`--before DIR` runs the same calls on another checkout of River (its packages first on the
path, its own --before-cache), interleaved with this one's. Writes NAME.{md,json} (`--name`,
default ggml-overhead).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .ggml_cost import MODES, generate_args, prompt_text
from .library.output import Harness, heading, parser

# run in the child: the timer around ggml's compute, then the CLI; the totals as a last line
CHILD = """
import json, sys, time
from ggml import ggml as g
from river_cli.main import main
compute, spans = g.ggml_backend_graph_compute, []
def timed(backend, graph):
    start = time.perf_counter()
    try:
        return compute(backend, graph)
    finally:
        spans.append((start, time.perf_counter()))
g.ggml_backend_graph_compute = timed
if main(sys.argv[1:]):
    sys.exit(1)
tail = spans[len(spans) // 4:]   # decoding's graphs: the prompt's come first
print(json.dumps({"computes": len(spans), "tail_computes": len(tail) - 1,
                  "tail_wall_s": tail[-1][1] - tail[0][1],
                  "tail_compute_s": sum(b - a for a, b in tail[1:])}))
"""


def call(source: Path | None, cache: str | None, gguf: Path, text: str, mode: str,
         tokens: int) -> dict:
    """One `river generate` of `tokens` tokens in a fresh process: the tokens it decoded, its
    wall-clock from the CLI's entry and the compute timer's totals."""
    env = dict(os.environ)
    if source is not None:   # another checkout's packages ahead of this one's
        env["PYTHONPATH"] = os.pathsep.join(str(source / p) for p in ("", "adapters", "plugins"))
    if cache is not None:
        env["RIVER_CACHE"] = cache
    argv = generate_args(gguf, text, tokens, MODES[mode])
    # `python -c` puts its working folder first on the path: the checkout's, or one that
    # holds no packages
    done = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True,
                          env=env, stdin=subprocess.DEVNULL,
                          cwd=source or tempfile.gettempdir())
    if done.returncode:
        raise SystemExit(f"river generate failed ({gguf.name}, {mode}):\n{done.stderr[-3000:]}")
    record, totals = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    return {"decoded": record["decoded_tokens"], **totals}


def per_token(short: dict, long: dict) -> dict:
    """Per decoded token, from the long call's last three quarters of graphs (decoding's):
    their wall-clock from the end of one graph to the end of the last, and the part of it
    inside ggml's compute; graphs per token from the two calls' counts (the prompt's cancel)."""
    n = long["decoded"] - short["decoded"]
    if n <= 0:
        raise SystemExit("the long answer decoded no more tokens than the short one (an "
                         "end-of-sequence token?): use another prompt or lengths")
    graphs = (long["computes"] - short["computes"]) / n
    tokens = long["tail_computes"] / graphs
    wall, inside = (long[k] / tokens * 1e6 for k in ("tail_wall_s", "tail_compute_s"))
    return {"us_per_token": wall, "compute_us": inside, "overhead_us": wall - inside,
            "computes_per_token": graphs}


def main(argv: list[str] | None = None) -> None:
    ap = parser("ggml_overhead", __doc__, model=False, results="ggml-overhead")
    ap.add_argument("--files", nargs="+", type=Path, help="GGUF files (default: the embedded "
                    "model's F16 copy)")
    ap.add_argument("--modes", nargs="+", default=["full depth", "exit mode"],
                    choices=list(MODES))
    ap.add_argument("--context", type=int, default=64, help="prompt tokens")
    ap.add_argument("--short", type=int, default=16, help="the short answer's tokens")
    ap.add_argument("--long", type=int, default=80, help="the long answer's tokens")
    ap.add_argument("--repeats", type=int, default=3, help="pairs of calls per configuration")
    ap.add_argument("--before", type=Path, metavar="DIR", help="another checkout of River to "
                    "run beside this one")
    ap.add_argument("--before-cache", metavar="DIR", help="RIVER_CACHE for --before (its "
                    "cache entries may differ from this checkout's)")
    out, args = Harness.parse(ap, argv)
    from river_ggml.plugin import backbone_gguf, spec_and_tokenizer

    args.files = args.files or [backbone_gguf(None)]
    text = prompt_text(args.context, spec_and_tokenizer(None)[1])
    trees = {"this": (None, None)}
    if args.before is not None:
        trees["before"] = (args.before.resolve(), args.before_cache)
    configs = [(tree, f, mode) for f in args.files for mode in args.modes for tree in trees]
    for config in list(configs):   # a file's first call builds its cache entries
        tree, f, mode = config
        print(f"warm-up: {tree}, {f.name}, {mode}", file=sys.stderr, flush=True)
        try:
            call(*trees[tree], f, text, mode, 2)
        except SystemExit as refused:
            print(f"left out: {refused}".rstrip()[-400:], file=sys.stderr)
            configs.remove(config)
    runs: dict[tuple, list[dict]] = {}
    for repeat in range(args.repeats):
        shift = repeat % len(configs)
        for tree, f, mode in configs[shift:] + configs[:shift]:
            print(f"repeat {repeat + 1}/{args.repeats}: {tree}, {f.name}, {mode}",
                  file=sys.stderr, flush=True)
            short, long = (call(*trees[tree], f, text, mode, n) for n in (args.short, args.long))
            runs.setdefault((tree, f.name, mode), []).append(per_token(short, long))
    rows = [{"tree": tree, "file": name, "mode": mode, "runs": r,
             **{k: statistics.median(x[k] for x in r) for k in r[0]}}
            for (tree, name, mode), r in runs.items()]
    payload = {**out.head(), "context": args.context, "short": args.short,
               "long": args.long, "repeats": args.repeats,
               "before": None if args.before is None else git_head(args.before), "rows": rows}
    out.write(args.name, payload, markdown(payload))


def git_head(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()


def markdown(payload: dict) -> str:
    lines = [*heading("Microseconds a decoded token spends outside ggml's compute", payload),
             "A prompt of "
             f"{payload['context']} tokens, answers of {payload['short']} and "
             f"{payload['long']} tokens, per extra token; medians of {payload['repeats']}"
             + (f"; `before` is commit {payload['before']}" if payload["before"] else "") + ".",
             "", "| checkout | file | mode | µs/token | in ggml's compute | outside it | "
             "graphs/token |", "|---|---|---|---|---|---|---|"]
    for r in payload["rows"]:
        lines.append(f"| {r['tree']} | {r['file']} | {r['mode']} | {r['us_per_token']:.0f} | "
                     f"{r['compute_us']:.0f} | {r['overhead_us']:.0f} | "
                     f"{r['computes_per_token']:.1f} |")
    return "\n".join(lines) + "\n"
