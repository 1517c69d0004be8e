"""The ggml engine's cost beside llama.cpp's on the same files: decode ms/token, prefill time
and the process's peak memory, on the model as F16 and as llama.cpp's Q8_0, Q4_K_M and Q4_0
(made here by `llama-quantize` from the F16 copy), at short and long contexts.

    river bench ggml_cost --llamacpp DIR                       # every type, every context
    river bench ggml_cost --types Q4_0 --contexts 64 --llamacpp none   # River alone, quickly

Every call is a process of its own, cold as a user's CLI call is: `river generate --json
--no-chat --ignore-eos --backend ggml` (full depth, `--kv full`, and with `--modes` exit mode
at the policy's defaults and lossless mode too) and `llama-completion` (greedy, --ignore-eos,
--threads threads) on the same raw text, its token count checked against River's: both decode
every token asked for, whatever end of text the model picks. A context is a prompt of that
many tokens (bundled GSM8K questions in turn) and --decode tokens decoded after it: its prefill
time, the decode's ms/token and the process's peak resident memory (GNU time's) are recorded,
after one call per file and mode that is not (a new file's first call builds its cache
entries: `river bench first_call` measures that); the configurations run interleaved, the
order rotated each repeat, and each figure is the median of --repeats.
Writes NAME.{md,json,png} (`--name`, default ggml-cost).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from .first_contact import llamacpp_arguments, llamacpp_folder, parse_llamacpp
from .library.output import Output, Harness, heading, parser, plot_file
from .library.prompts import GSM8K_TEST, gsm8k_questions

TYPES = ("F16", "Q8_0", "Q4_K_M", "Q4_0")
CONTEXTS = (64, 512, 2048, 3000)
# exit mode at the policy's defaults (the paper's rule), not the model's fitted operating point,
# which may choose lossless mode
MODES = {"full depth": ["--kv", "full"], "exit mode": ["--no-profile"],
         "lossless": ["--mode", "speculative"]}
# the targets: River's full depth against llama.cpp on the same file
DECODE_TARGET, PREFILL_TARGET, MEMORY_TARGET = 1.1, 1.2, 1.5


TIME = "/usr/bin/time"   # GNU time: a small parent whose child's peak memory is the command's


def measured(command: list[str], env: dict | None = None) -> tuple[str, str, float, float]:
    """Run `command` to its end (in `env`, or this process's environment): its stdout, its
    stderr, wall seconds and peak resident memory in MB. The peak comes from GNU time, whose
    child the command is: a child of this process would inherit this process's own high-water
    mark (the kernel keeps a process's before exec), and this one holds torch."""
    if not Path(TIME).is_file():
        raise SystemExit(f"river bench ggml_cost reads peak memory with GNU time ({TIME}): "
                         "apt-get install time")
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        done = subprocess.run([TIME, "-f", "peak_kb %M", *command], stdout=out, stderr=err,
                              stdin=subprocess.DEVNULL, text=True, env=env)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    stderr, _, peak = stderr.rstrip().rpartition("\n")
    if done.returncode:
        raise SystemExit(f"{command[0]} failed ({' '.join(command[1:4])} ...):\n"
                         f"{stderr[-3000:]}")
    return stdout, stderr, wall, int(peak.split()[-1]) / 1024


def generate_args(gguf: Path, text: str, tokens: int, flags: Sequence[str]) -> list[str]:
    """`river generate`'s arguments for a timed call on the ggml engine: the raw text, `flags`,
    exactly `tokens` tokens whatever end of text the model picks (as llama.cpp's
    --ignore-eos), the statistics as JSON (its last line)."""
    return ["generate", text, "--backend", "ggml", "--model", str(gguf), "--no-chat", *flags,
            "--max-new-tokens", str(tokens), "--ignore-eos", "--json"]


def river(gguf: Path, text: str, mode: str, tokens: int) -> dict:
    command = [sys.executable, "-m", "river_cli.main",
               *generate_args(gguf, text, tokens, MODES[mode])]
    output, _, wall, rss = measured(command)
    record = json.loads(output.strip().splitlines()[-1])
    return {"wall_s": wall, "peak_rss_mb": rss, "prefill_ms": record["prefill_ms"],
            "ms_per_token": record["ms_per_token"], "decoded": record["decoded_tokens"],
            "prompt_tokens": record["tokens"] - record["decoded_tokens"]}


def llamacpp(folder: Path, gguf: Path, text: str, tokens: int, threads: int) -> dict:
    command = [str(folder / "llama-completion"), "-m", str(gguf), "-p", text, "-n", str(tokens),
               "--temp", "0", "--ignore-eos", "-t", str(threads), "-tb", str(threads),
               "-c", "4096", "-no-cnv"]
    stdout, stderr, wall, rss = measured(command)
    output = stdout + stderr
    r = parse_llamacpp(output)
    prompt_ms = float(output.split("prompt eval time =")[1].split("ms")[0])
    return {"wall_s": wall, "peak_rss_mb": rss, "prefill_ms": prompt_ms,
            "ms_per_token": r["ms_per_token"], "decoded": r["decoded"],
            "prompt_tokens": r["prompt_tokens"]}


def files(f16: Path, types: list[str], folder: Path) -> dict[str, Path]:
    """The model in each type, made once from its F16 copy by llama.cpp's quantizer into the
    user cache's anchors/ (beside the F16 copy they would be strangers in its cache entry)."""
    from river_models.cache import cache_root

    made, anchors = {}, cache_root() / "anchors"
    anchors.mkdir(parents=True, exist_ok=True)
    for kind in types:
        path = f16 if kind == "F16" else anchors / f"{f16.stem}.{kind}.gguf"
        if not path.is_file():
            print(f"llama-quantize {kind}", file=sys.stderr, flush=True)
            partial = path.with_suffix(".partial")
            done = subprocess.run([str(folder / "llama-quantize"), str(f16), str(partial),
                                   kind, str(os.cpu_count() or 1)], capture_output=True,
                                  text=True)
            if done.returncode:
                raise SystemExit(f"llama-quantize {kind} failed:\n{done.stderr[-2000:]}")
            partial.rename(path)
        made[kind] = path
    return made


def prompt_text(tokens: int, tokenizer) -> str:
    """Raw text of about `tokens` tokens: bundled GSM8K questions in turn, cut at a token."""
    questions = gsm8k_questions(GSM8K_TEST, 400, 0)
    ids: list[int] = []
    for q in questions:
        ids += tokenizer.encode(q + "\n\n")
        if len(ids) >= tokens:
            break
    return tokenizer.decode(ids[:tokens])


def main(argv: list[str] | None = None) -> None:
    ap = parser("ggml_cost", __doc__, results="ggml-cost")
    ap.add_argument("--types", nargs="+", default=list(TYPES), choices=TYPES)
    ap.add_argument("--contexts", nargs="+", type=int, default=list(CONTEXTS),
                    help="prompt tokens before the decoded ones")
    ap.add_argument("--decode", type=int, default=64, help="tokens decoded after the prompt")
    ap.add_argument("--modes", nargs="+", default=["full depth"], choices=list(MODES),
                    help="River's modes (each beside llama.cpp)")
    ap.add_argument("--repeats", type=int, default=2, help="calls per configuration (medians)")
    llamacpp_arguments(ap, "River alone, on the F16 copy")
    out, args = Harness.parse(ap, argv)
    from river_ggml.plugin import backbone_gguf, spec_and_tokenizer

    f16 = backbone_gguf(args.model)
    folder = llamacpp_folder(args.llamacpp, ["llama-completion", "llama-quantize"])
    if isinstance(folder, str):
        print(f"llama.cpp: {folder}", file=sys.stderr)
        if args.types != ["F16"]:
            raise SystemExit("other types are made by llama-quantize: give --llamacpp DIR, "
                             "or --types F16")
    ggufs = files(f16, args.types, folder) if not isinstance(folder, str) else {"F16": f16}
    tokenizer = spec_and_tokenizer(None if args.model is None else args.model)[1]
    texts = {n: prompt_text(n, tokenizer) for n in args.contexts}
    configs = [("River", m) for m in args.modes] + \
        ([("llama.cpp", "plain")] if not isinstance(folder, str) else [])
    for kind in args.types:   # a file's first call builds its cache entries: not measured
        for mode in args.modes:
            print(f"warm-up: {kind}, River {mode}", file=sys.stderr, flush=True)
            river(ggufs[kind], texts[args.contexts[0]], mode, 2)
    rows: dict[tuple, list[dict]] = {}
    for repeat in range(args.repeats):
        for kind, n in [(k, n) for k in args.types for n in args.contexts]:
            shift = repeat % len(configs)
            for engine, mode in configs[shift:] + configs[:shift]:
                print(f"repeat {repeat + 1}/{args.repeats}: {kind}, {n} tokens, {engine} "
                      f"{mode}", file=sys.stderr, flush=True)
                r = river(ggufs[kind], texts[n], mode, args.decode) if engine == "River" \
                    else llamacpp(folder, ggufs[kind], texts[n], args.decode, args.threads)
                rows.setdefault((kind, n, engine, mode), []).append(r)
    table = [summary(key, calls) for key, calls in rows.items()]
    payload = {**out.head(), "threads": args.threads, "decode": args.decode,
               "repeats": args.repeats, "contexts": args.contexts, "types": args.types,
               "rows": table, "ratios": ratios(table)}
    out.write(args.name, payload, markdown(payload))
    plot(out, args.name, payload)


def summary(key: tuple, calls: list[dict]) -> dict:
    kind, n, engine, mode = key

    def median(name: str) -> float | None:
        values = [c[name] for c in calls if c[name] is not None]
        return statistics.median(values) if values else None

    return {"type": kind, "context": n, "engine": engine, "mode": mode, "calls": calls,
            "prompt_tokens": sorted({c["prompt_tokens"] for c in calls}),
            **{name: median(name) for name in ("ms_per_token", "prefill_ms", "peak_rss_mb",
                                               "wall_s")}}


def ratios(table: list[dict]) -> list[dict]:
    """Each River row over llama.cpp's of the same type and context: decode ms/token,
    prefill time and peak memory (over 1: River costs more)."""
    plain = {(r["type"], r["context"]): r for r in table if r["engine"] == "llama.cpp"}
    out = []
    for r in table:
        base = plain.get((r["type"], r["context"]))
        if r["engine"] != "River" or base is None:
            continue
        out.append({"type": r["type"], "context": r["context"], "mode": r["mode"],
                    **{f"{name}_ratio": round(r[name] / base[name], 3)
                       for name in ("ms_per_token", "prefill_ms", "peak_rss_mb")
                       if r[name] and base[name]}})
    return out


def markdown(payload: dict) -> str:
    lines = [*heading("The ggml engine's cost beside llama.cpp", payload),
             "llama.cpp on "
             f"{payload['threads']} threads; each figure the median of {payload['repeats']} "
             f"cold calls, {payload['decode']} tokens decoded after a prompt of the context's "
             f"tokens.", "",
             "| type | context | engine, mode | decode ms/token | prefill ms | peak RSS MB |",
             "|---|---|---|---|---|---|"]
    for r in payload["rows"]:
        lines.append(f"| {r['type']} | {r['context']} | {r['engine']}, {r['mode']} | "
                     f"{fmt(r['ms_per_token'], 2)} | {fmt(r['prefill_ms'], 0)} | "
                     f"{fmt(r['peak_rss_mb'], 0)} |")
    if payload["ratios"]:
        lines += ["", f"River over llama.cpp on the same file (targets: decode <= "
                  f"{DECODE_TARGET}, prefill <= {PREFILL_TARGET}, memory <= {MEMORY_TARGET}):",
                  "", "| type | context | mode | decode | prefill | peak RSS |",
                  "|---|---|---|---|---|---|"]
        for r in payload["ratios"]:
            lines.append(f"| {r['type']} | {r['context']} | {r['mode']} | "
                         f"{r.get('ms_per_token_ratio', '-')} | {r.get('prefill_ms_ratio', '-')}"
                         f" | {r.get('peak_rss_mb_ratio', '-')} |")
    return "\n".join(lines) + "\n"


def fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def plot(out: Output, name: str, payload: dict) -> None:
    """Decode ms/token by context, one panel per type: River's modes and llama.cpp."""
    plt, save = plot_file(out, name)
    types = payload["types"]
    fig, axes = plt.subplots(1, len(types), figsize=(4 * len(types), 3.2), squeeze=False)
    for ax, kind in zip(axes[0], types):
        for label in sorted({(r["engine"], r["mode"]) for r in payload["rows"]}):
            rows = sorted((r for r in payload["rows"] if r["type"] == kind
                           and (r["engine"], r["mode"]) == label), key=lambda r: r["context"])
            ax.plot([r["context"] for r in rows], [r["ms_per_token"] for r in rows], "o-",
                    label=", ".join(label))
        ax.set_title(kind)
        ax.set_xscale("log")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("decode ms/token")
    axes[0][0].legend(fontsize=7)
    save(fig)
