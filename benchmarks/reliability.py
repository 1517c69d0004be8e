"""Reliability on the embedded model, what takes minutes (the tests cover the rest on tiny
models): interrupted and racing builds, the cache's sizes and checks, a long generation,
memory over many generations.

    river bench reliability                  # all five parts
    river bench reliability --parts memory --generations 1000

- interrupt: `river generate` in a scratch cache, killed with SIGINT and with SIGKILL while it
  converts the GGUF, quantizes the stand-ins and exports ONNX; the next run must say what it
  removes, rebuild, and leave every entry valid (checksums verified).
- race: two `river generate --backend onnx` started together on an empty cache: both succeed,
  one waits, each entry is built once.
- cache: the embedded model's entries built from an empty cache (the first `river generate` on
  hf, then on onnx, and a warm run, timed), each entry's size, and what checking it costs:
  before use (the manifest's seal and every size) and in full (every file's SHA-256).
- long: 2,048 teacher-forced tokens through River (the paper's rule) against full depth: river
  K/V error per layer over each quarter of the positions (drift shows as growth), NaN/inf.
- memory: N generations in one process (both modes, alternating prompts): RSS after each,
  plotted. Writes reliability.{md,json} and reliability-memory.png; a run of some parts keeps
  the other parts' results from the results folder's earlier run.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from river_core import ExitConfig, GenerationConfig, RiverModel
from river_core.predictor import STAND_IN_BOUND_C, relative_error
from river_models.cache import entries, problem

from .library import gsm8k
from .library.output import Output, parser, plot_file
from .library.output import command as run_command
from .library.prompts import GSM8K_TRAIN
from .library.timing import machine

PARTS = ("interrupt", "race", "cache", "long", "memory")
KINDS = {"converted": "hf", "stand-ins": "hf", "onnx": "onnx"}   # what each build is for


MODEL: list[str] = []   # `--model` and its value, for the `river generate` runs


def _river(cache: Path, backend: str) -> subprocess.Popen:
    env = {**os.environ, "RIVER_CACHE": str(cache)}
    # Ctrl-C as at a terminal, even when this benchmark runs where SIGINT is ignored
    default_ctrl_c = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)
    return subprocess.Popen([sys.executable, "-m", "river_cli.main", "generate", "2 + 2 =",
                             "--backend", backend, "--max-new-tokens", "2", *MODEL], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_ctrl_c)


def _wait_for_partial(cache: Path, kind: str, process, timeout: float = 600) -> bool:
    end = time.time() + timeout
    while time.time() < end and process.poll() is None:
        if list((cache / kind).glob(".partial-*")):
            return True
        time.sleep(0.05)
    return False


def _valid(cache: Path) -> dict:
    os.environ["RIVER_CACHE"] = str(cache)
    return {f"{e.kind}/{e.path.name}": e.problem or "ok" for e in entries(checksums=True)}


def verify_seconds(cache: Path, checksums: bool = False) -> dict:
    """What checking an entry costs: (size in MB, seconds) per entry; the check before use
    (the manifest's seal and every size), or with `checksums` every file's SHA-256."""
    os.environ["RIVER_CACHE"] = str(cache)
    out = {}
    for e in entries():
        start = time.perf_counter()
        problem(e.path, checksums=checksums)
        out[e.kind] = (e.size / 2 ** 20, time.perf_counter() - start)
    return out


def cache_costs(scratch: Path) -> dict:
    """The embedded model's entries built from an empty cache (first-run times of `river
    generate` on hf, then onnx), their sizes, and what checking them costs."""
    cache = scratch / "sizes"
    first = {}
    for backend in ("hf", "onnx"):
        start = time.perf_counter()
        _, err = _river(cache, backend).communicate(timeout=3600)
        first[backend] = time.perf_counter() - start
    start = time.perf_counter()
    _river(cache, "hf").communicate(timeout=600)
    return {"first_run_seconds": first, "warm_run_seconds_hf": time.perf_counter() - start,
            "load_check": verify_seconds(cache), "full_checksum": verify_seconds(cache, True)}


def interrupt(scratch: Path) -> list[dict]:
    rows = []
    cache = scratch / "interrupt"
    for kind, backend in KINDS.items():
        for sig in (signal.SIGINT, signal.SIGKILL):
            shutil.rmtree(cache / kind, ignore_errors=True)   # so this build runs again
            process = _river(cache, backend)
            caught = _wait_for_partial(cache, kind, process)
            time.sleep(1.0)   # well inside the build
            process.send_signal(sig)
            process.wait(120)
            left = [p.name for p in (cache / kind).glob(".partial-*")]
            again = _river(cache, backend)
            _, err = again.communicate(timeout=1800)
            said = [l for l in err.splitlines() if l.startswith("river: ")]
            rows.append({"build": kind, "signal": sig.name, "caught_during_build": caught,
                         "exit_status": process.returncode, "partial_left": left,
                         "next_run_status": again.returncode, "next_run_said": said,
                         "entries": _valid(cache)})
            print(rows[-1], file=sys.stderr)
    return rows


def race(scratch: Path) -> dict:
    cache = scratch / "race"
    processes = [_river(cache, "onnx") for _ in range(2)]
    outs = [p.communicate(timeout=3600) for p in processes]
    errs = [e for _, e in outs]
    return {"status": [p.returncode for p in processes],
            "waited": [("waiting for another process" in e) for e in errs],
            "conversions": sum(e.count("converting ") for e in errs),
            "entries": _valid(cache), "verify_seconds": verify_seconds(cache)}


def long_generation(model: RiverModel, tokens: int) -> dict:
    tok = model.backend.tokenizer
    problems = gsm8k.load(str(GSM8K_TRAIN), limit=60)
    text = "".join(f"Question: {p.question}\nAnswer: {p.solution}\n\n" for p in problems)
    ids = tok.encode(text)
    prompt, continuation = ids[:64], ids[64:64 + tokens]
    b, n = model.backend, model.backend.num_layers
    [river] = model.teacher_force([prompt], [continuation], ExitConfig())
    got = [b.read_kv(i) for i in range(n)]
    model.teacher_force([prompt], [continuation], ExitConfig(kv="full"))
    quarters = np.array_split(np.arange(len(prompt), len(prompt) + len(continuation)), 4)
    errors = [[max(relative_error(g[:, :, q], w[:, :, q]) for g, w in zip(got[i], b.read_kv(i)))
               for q in quarters] for i in range(n)]
    finite = all(np.isfinite(l).all() for l in river.logits) and \
        all(np.isfinite(k).all() and np.isfinite(v).all() for k, v in got)
    # the documented bound C * eps_j * d, d counted from the earliest exit any token took
    first = min(river.exit_layers)
    ratio = max(max(errors[j]) / (STAND_IN_BOUND_C * b.stand_in_error[j] * (j - first))
                for j in range(first + 1, n))
    return {"tokens": len(continuation), "finite": bool(finite),
            "largest_error_over_bound": float(ratio), "earliest_exit": int(first),
            "mean_layers_run": float(np.mean(river.exit_layers) + 1),
            "kv_error_by_layer_and_quarter": errors,
            "largest_growth": max(e[-1] / max(e[0], 1e-12) for e in errors if max(e) > 0)}


def memory(model: RiverModel, generations: int) -> dict:
    questions = [p.question for p in gsm8k.load(str(GSM8K_TRAIN), limit=50)]
    configs = [ExitConfig(), ExitConfig(mode="speculative", policy="fixed",
                                        options={"layer": -1})]
    rss = []
    for g in tqdm(range(generations), desc="generations", file=sys.stderr):
        model.generate(questions[g % len(questions)], exit_config=configs[g % 2],
                       generation_config=GenerationConfig(max_new_tokens=24))
        rss.append(_rss_mb())
    tenth = max(1, generations // 10)
    return {"generations": generations, "rss_mb": rss,
            "first_tenth_peak_mb": max(rss[:tenth]), "last_tenth_peak_mb": max(rss[-tenth:]),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def main(argv: list[str] | None = None) -> None:
    ap = parser("reliability", __doc__)
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    ap.add_argument("--backend", default="onnx", help="for long and memory")
    ap.add_argument("--generations", type=int, default=1000)
    ap.add_argument("--long-tokens", type=int, default=2048)
    args = ap.parse_args(argv)
    out = Output(args)
    info = machine()
    MODEL[:] = ["--model", args.model] if args.model else []
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="river-reliability-") as scratch:
        if "interrupt" in args.parts:
            results["interrupt"] = interrupt(Path(scratch))
        if "race" in args.parts:
            results["race"] = race(Path(scratch))
        if "cache" in args.parts:
            results["cache"] = cache_costs(Path(scratch))
    if "long" in args.parts or "memory" in args.parts:
        model = RiverModel.from_pretrained(args.model, backend=args.backend, progress=True)
        if "long" in args.parts:
            results["long"] = long_generation(model, args.long_tokens)
        if "memory" in args.parts:
            results["memory"] = memory(model, args.generations)
    command = run_command("reliability", argv)
    previous = out.folder / "reliability.json"
    merged = json.loads(previous.read_text()).get("results", {}) if previous.is_file() else {}
    merged.update(results)
    out.write("reliability", {"command": command, "machine": info, "results": merged},
              report(merged, info, args.backend))
    if "memory" in merged:
        plot(out, merged["memory"])


def report(results: dict, info: dict, backend: str) -> str:
    lines = ["# Reliability on the embedded model", "",
             f"Machine: {info['cpu']}, {info['cores']} cores. Command: `river bench "
             f"reliability` (parts: {', '.join(results)}); long and memory on `{backend}`.", ""]
    if "interrupt" in results:
        lines += ["## Interrupted builds", "", "| build | signal | partial left | next run "
                  "said | next run | entries afterwards |", "|---|---|---|---|---|---|"]
        for r in results["interrupt"]:
            ok = all(v == "ok" for v in r["entries"].values())
            lines.append(f"| {r['build']} | {r['signal']} | {len(r['partial_left'])} | "
                         f"{'; '.join(r['next_run_said']) or '-'} | exit {r['next_run_status']}"
                         f" | {'all valid' if ok else r['entries']} |")
        lines.append("")
    if "race" in results:
        r = results["race"]
        ok = all(v == "ok" for v in r["entries"].values())
        lines += ["## Two processes building at once", "",
                  f"Exit statuses {r['status']}; waited {r['waited']}; GGUF conversions "
                  f"{r['conversions']}; {len(r['entries'])} entries, "
                  f"{'all valid' if ok else r['entries']}.", ""]
    if "cache" in results:
        r = results["cache"]
        total = sum(mb for mb, _ in r["load_check"].values())
        lines += ["## The cache of the embedded model", "",
                  f"From an empty cache, the first `river generate` took "
                  f"{r['first_run_seconds']['hf']:.0f} s on hf (conversion and quantization "
                  f"included) and the first on onnx {r['first_run_seconds']['onnx']:.0f} s more "
                  f"(the export); a warm run {r['warm_run_seconds_hf']:.0f} s (process start and "
                  f"load included). Entries, {total:.0f} MB in all:", "",
                  "| entry | MB | check before use (seal and sizes) | full checksum "
                  "(`river cache --verify`) |", "|---|---|---|---|"]
        for kind, (mb, seconds) in r["load_check"].items():
            lines.append(f"| {kind} | {mb:.0f} | {seconds * 1e3:.1f} ms | "
                         f"{r['full_checksum'][kind][1]:.2f} s |")
        lines.append("")
    if "long" in results:
        r = results["long"]
        worst = np.array(r["kv_error_by_layer_and_quarter"]).max(0)
        lines += ["## A long generation", "",
                  f"{r['tokens']} teacher-forced tokens through River (the paper's rule, "
                  f"{r['mean_layers_run']:.1f} backbone layers per token): every logit and "
                  f"K/V finite: {r['finite']}. Largest river K/V error over layers, per quarter "
                  f"of the positions: {', '.join(f'{e:.3f}' for e in worst)}; largest growth "
                  f"from the first quarter to the last in any layer: "
                  f"{r['largest_growth']:.2f}x. Against the documented bound "
                  f"{STAND_IN_BOUND_C:g} * eps_j * d (d from the earliest exit, after layer "
                  f"{r['earliest_exit']}): at most {r['largest_error_over_bound']:.2f} of it in "
                  f"any layer.", ""]
    if "memory" in results:
        r = results["memory"]
        lines += ["## Memory over time", "",
                  f"{r['generations']} generations in one process (24 tokens each, River and "
                  f"lossless mode alternating): RSS peak over the first tenth "
                  f"{r['first_tenth_peak_mb']:.0f} MB, over the last tenth "
                  f"{r['last_tenth_peak_mb']:.0f} MB; process peak {r['peak_rss_mb']:.0f} MB.",
                  "", "![RSS](reliability-memory.png)", ""]
    return "\n".join(lines)


def plot(out: Output, r: dict) -> None:
    plt, save = plot_file(out, "reliability-memory")
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(np.arange(1, len(r["rss_mb"]) + 1), r["rss_mb"])
    ax.set_xlabel("generation")
    ax.set_ylabel("resident memory (MB)")
    ax.set_ylim(0, max(r["rss_mb"]) * 1.15)
    ax.grid(alpha=0.3)
    save(fig)


if __name__ == "__main__":
    main()
