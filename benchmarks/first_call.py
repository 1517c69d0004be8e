"""A user's own GGUF, first call to later call: `river generate --model FILE` with a fresh cache
(the spec, the tokenizer, the backbone and the answer: no stand-ins, no fit), `river fit
--model FILE` (the operating point, once), and a later call, each beside llama.cpp's CLI cold
on the same file, prompt and answer length: wall-clock and peak memory (issue 59's targets).

    river bench first_call                       # the embedded GGUF, F16/Q8_0/Q4_K_M of it, and
                                                 # Qwen2.5-1.5B's shape in Q4_K_M and Q8_0
    river bench first_call --types --shapes --llamacpp none   # the embedded GGUF, River alone

Each River call is a process of its own with the cache given by RIVER_CACHE: a new, empty
folder for the first call (default flags: with no operating point at hand River runs lossless
mode on n-gram drafts, making no stand-ins), the same folder for the fit (`river fit`, which
makes the stand-ins and fits the point, or finds the profile River ships) and the later call
(default flags, everything at hand: it runs the fitted point). llama.cpp's `llama-completion`
runs the same raw text, greedy, the same answer length. Peak memory is GNU time's. What the
cache holds after each file's calls is listed (no float32 copy should be among it). The F16,
Q8_0 and Q4_K_M files of the embedded model are made by llama.cpp's quantizer from its F16
copy (`river bench ggml_cost`'s files); the 1.5B shape is river_conformance.fixtures.real_gguf's random
Qwen2.5-1.5B, written with a byte-level vocabulary so both tools tokenize the text, quantized
by river_models.gguf_quantize. Writes NAME.{md,json} (`--name`, default first-call).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from .first_contact import llamacpp_arguments, llamacpp_folder
from .ggml_cost import files, generate_args, llamacpp, measured
from .library.output import Harness, heading, parser
from .library.shapes import made_once
from .library.prompts import GSM8K_TEST, gsm8k_questions

TYPES = ("F16", "Q8_0", "Q4_K_M")
SHAPES = {"qwen2.5-1.5b": ("qwen2", ("Q4_K_M", "Q8_0"))}   # random weights: real_gguf's
# issue 59's targets: a first call (the embedded GGUF; a 1.5B file), its peak memory over
# llama.cpp's, the fit on a 1.5B model, a later call over llama.cpp's cold CLI
FIRST_S, FIRST_1_5B_S, MEMORY_OVER_LLAMACPP, FIT_S, LATER_OVER_LLAMACPP = 6, 10, 1.3, 90, 1.2


def river(gguf: Path, cache: Path, text: str, tokens: int) -> dict:
    """One `river generate --json` of `tokens` tokens with cache folder `cache`."""
    command = [sys.executable, "-m", "river_cli.main", *generate_args(gguf, text, tokens, [])]
    output, stderr, wall, rss = measured(command, os.environ | {"RIVER_CACHE": str(cache)})
    record = json.loads(output.strip().splitlines()[-1])
    return {"wall_s": wall, "peak_rss_mb": rss, "load_s": record["load_s"],
            "decoded": record["decoded_tokens"],
            "line": next((l for l in stderr.splitlines() if l.startswith("river: ")), None)}


def fit(gguf: Path, cache: Path) -> dict:
    """`river fit --model gguf` with cache folder `cache`: its wall-clock and what it says."""
    command = [sys.executable, "-m", "river_cli.main", "fit", "--backend", "ggml", "--model",
               str(gguf)]
    output, stderr, wall, rss = measured(command, os.environ | {"RIVER_CACHE": str(cache)})
    fitted = re.search(r"(fitted|measured) once, in (\d+) s", output)
    return {"wall_s": wall, "peak_rss_mb": rss, "fit_s": int(fitted[2]) if fitted else None,
            "fitted": fitted is not None and fitted[1] == "fitted",
            "point": output.strip().splitlines()[0] if output.strip() else None}


def shape_files(names: list[str]) -> dict[str, Path]:
    """Each random shape in its types (SHAPES), made once into the benchmark cache."""
    from river_conformance.fixtures import real_gguf
    from river_models import gguf_quantize
    from river_models.cache import cache_root

    folder = cache_root() / "bench" / "first-call"
    folder.mkdir(parents=True, exist_ok=True)
    made = {}
    for name in names:
        family, types = SHAPES[name]
        source = made_once(folder / f"{name}-F16.gguf",
                           f"writing {real_gguf.describe(family, 'real')}",
                           lambda p: real_gguf.write(family, "real", p, text=True))
        for kind in types:
            made[f"{name} {kind}"] = made_once(
                folder / f"{name}-{kind}.gguf", f"quantizing {name} to {kind}",
                lambda p: gguf_quantize.quantize(source, p, kind))
    return made


def held(cache: Path) -> dict[str, int]:
    """MB under each folder of the cache."""
    return {p.name: round(sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) / 2**20)
            for p in sorted(cache.iterdir()) if p.is_dir()}


def main(argv: list[str] | None = None) -> None:
    ap = parser("first_call", __doc__, model=False, results="first-call")
    ap.add_argument("--types", nargs="*", default=list(TYPES), choices=TYPES,
                    help="llama.cpp's types of the embedded model, beside its own GGUF")
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES),
                    help="random-weight files of a real model's shape")
    ap.add_argument("--tokens", type=int, default=64, help="the answer's tokens")
    llamacpp_arguments(ap, "River alone")
    out, args = Harness.parse(ap, argv)
    from river_ggml.plugin import backbone_gguf
    from river_models import default_gguf

    folder = llamacpp_folder(args.llamacpp, ["llama-completion", "llama-quantize"])
    if isinstance(folder, str) and args.types:
        raise SystemExit(f"the other types are made by llama-quantize: {folder}")
    ggufs = {"embedded": default_gguf()}
    if args.types:
        ggufs |= files(backbone_gguf(None), args.types, folder)
    ggufs |= shape_files(args.shapes)
    text = gsm8k_questions(GSM8K_TEST, 1, 0)[0]
    rows = []
    for kind, gguf in ggufs.items():
        cache = Path(tempfile.mkdtemp(prefix="river-first-call-"))
        try:
            row = {"type": kind, "file": gguf.name, "file_mb": round(gguf.stat().st_size / 2**20)}
            print(f"{kind}: first call", file=sys.stderr, flush=True)
            row["first"] = river(gguf, cache, text, args.tokens)
            row["first_cache_mb"] = held(cache)
            print(f"{kind}: river fit", file=sys.stderr, flush=True)
            row["fit"] = fit(gguf, cache)
            print(f"{kind}: later call", file=sys.stderr, flush=True)
            row["later"] = river(gguf, cache, text, args.tokens)
            row["cache_mb"] = held(cache)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        if not isinstance(folder, str):
            print(f"{kind}: llama.cpp", file=sys.stderr, flush=True)
            row["llama.cpp"] = llamacpp(folder, gguf, text, args.tokens, args.threads)
        rows.append(row)
    payload = {**out.head(), "tokens": args.tokens, "rows": rows}
    out.write(args.name, payload, markdown(payload))


def markdown(payload: dict) -> str:
    lines = [*heading("A GGUF's first call, its fit and a later call, beside llama.cpp",
                      payload),
             "One GSM8K test "
             f"question as raw text, {payload['tokens']} tokens; every call a fresh process. "
             f"Targets (issue 59): a first call <= {FIRST_S} s on the embedded GGUF and <= "
             f"{FIRST_1_5B_S} s on a 1.5B one, its peak memory <= {MEMORY_OVER_LLAMACPP}x "
             f"llama.cpp's; the fit <= {FIT_S} s on a 1.5B model; a later call <= "
             f"{LATER_OVER_LLAMACPP}x llama.cpp's wall-clock.", "",
             "| file | first call | its peak MB (over llama.cpp's) | cache after it, MB | "
             "river fit | later call | its peak MB | llama.cpp cold | later over llama.cpp |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in payload["rows"]:
        first, fit, later, base = r["first"], r["fit"], r["later"], r.get("llama.cpp")
        stated = "shipped" if fit["fit_s"] is not None and fit["wall_s"] < fit["fit_s"] else \
            "nothing fitted" if fit["fit_s"] is None else \
            f"fitted in {fit['fit_s']} s" if fit.get("fitted", True) else \
            f"exit mode cannot pay, timed in {fit['fit_s']} s"
        over = f" ({first['peak_rss_mb'] / base['peak_rss_mb']:.2f}x)" if base else ""
        lines.append(
            f"| {r['type']} ({r['file_mb']} MB) | {first['wall_s']:.1f} s | "
            f"{first['peak_rss_mb']:.0f}{over} | "
            f"{sum(r['first_cache_mb'].values())} | {fit['wall_s']:.0f} s ({stated}) | "
            f"{later['wall_s']:.2f} s | {later['peak_rss_mb']:.0f} | "
            + (f"{base['wall_s']:.2f} s, {base['peak_rss_mb']:.0f} MB | "
               f"{later['wall_s'] / base['wall_s']:.2f}x" if base else "- | -")
            + " |")
    lines += ["", "What each file's calls said:", ""]
    for r in payload["rows"]:
        lines += [f"- {r['type']}: first call `{r['first']['line']}`; river fit: "
                  f"`{r['fit']['point']}`; later call `{r['later']['line']}`",
                  f"  (the cache after: {', '.join(f'{k} {v} MB' for k, v in r['cache_mb'].items())})"]
    return "\n".join(lines) + "\n"
