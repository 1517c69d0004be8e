"""A user's own GGUF, first call to later call: `river generate --model FILE` with a fresh cache
(the spec, the tokenizer, the backbone, the stand-ins and the answer; the fit left out), the
call that fits the model's operating point, and a later call, each beside llama.cpp's CLI cold
on the same file, prompt and answer length: wall-clock and peak memory (issue 52's targets).

    river bench first_call                       # the embedded GGUF, and F16/Q8_0/Q4_K_M of it
    river bench first_call --types --llamacpp none   # the embedded GGUF alone, River alone

Each River call is a process of its own with the cache given by RIVER_CACHE: a new, empty
folder for the first call (`--no-profile`: exit mode at the policy's defaults, which makes
the stand-ins but fits nothing; lossless mode where River refuses exit mode on the file),
the same folder for the second (default flags: the first exit-mode call on a model fits its
operating point, its time stated by River) and the third (default flags, everything cached).
llama.cpp's `llama-completion` runs the same raw text, greedy, the same answer length. Peak
memory is GNU time's. What the cache holds after each file's calls is listed (no float32
copy should be among it). The F16, Q8_0 and Q4_K_M files are made by llama.cpp's quantizer
from the F16 copy of the embedded model (`river bench ggml_cost`'s files). Writes
NAME.{md,json} (`--name`, default first-call).
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
from .library.output import Output, parser
from .library.output import command as run_command
from .library.prompts import GSM8K_TEST, gsm8k_questions
from .library.timing import machine

TYPES = ("F16", "Q8_0", "Q4_K_M")
# issue 52's targets: a fresh cache's first call on the embedded GGUF and the fit on a new model
FIRST_S, FIRST_MB, FIT_S, LATER_OVER_LLAMACPP = 15, 1000, 60, 1.2


def river(gguf: Path, cache: Path, text: str, tokens: int, flags: list[str]) -> dict:
    """One `river generate --json` of `tokens` tokens with cache folder `cache`."""
    command = [sys.executable, "-m", "river_cli.main",
               *generate_args(gguf, text, tokens, flags)]
    env = os.environ | {"RIVER_CACHE": str(cache)}
    output, stderr, wall, rss = measured(command, env)
    record = json.loads(output.strip().splitlines()[-1])
    fitted = re.search(r"fitted once, in (\d+) s", stderr)
    return {"wall_s": wall, "peak_rss_mb": rss, "load_s": record["load_s"],
            "decoded": record["decoded_tokens"], "flags": flags,
            "fit_s": int(fitted[1]) if fitted else None,
            "point": next((l for l in stderr.splitlines() if l.startswith("operating point")),
                          None)}


def first(gguf: Path, cache: Path, text: str, tokens: int) -> dict:
    """The first call on `gguf` with the empty cache `cache`: exit mode without a fit
    (`--no-profile`) where River runs it on the file, else, in a cache emptied again,
    lossless mode."""
    try:
        return river(gguf, cache, text, tokens, ["--no-profile"])
    except SystemExit:   # exit mode refused on this file (the line says why)
        shutil.rmtree(cache)
        cache.mkdir()
        return river(gguf, cache, text, tokens, ["--mode", "speculative"])


def held(cache: Path) -> dict[str, int]:
    """MB under each folder of the cache."""
    return {p.name: round(sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) / 2**20)
            for p in sorted(cache.iterdir()) if p.is_dir()}


def main(argv: list[str] | None = None) -> None:
    ap = parser("first_call", __doc__, model=False)
    ap.add_argument("--types", nargs="*", default=list(TYPES), choices=TYPES,
                    help="llama.cpp's types of the embedded model, beside its own GGUF")
    ap.add_argument("--tokens", type=int, default=64, help="the answer's tokens")
    llamacpp_arguments(ap, "River alone")
    ap.add_argument("--name", default="first-call", help="results file name")
    args = ap.parse_args(argv)
    out = Output(args)
    info, load = machine(), {"start": os.getloadavg()[0]}
    from river_ggml.plugin import backbone_gguf
    from river_models import default_gguf

    folder = llamacpp_folder(args.llamacpp, ["llama-completion", "llama-quantize"])
    if isinstance(folder, str) and args.types:
        raise SystemExit(f"the other types are made by llama-quantize: {folder}")
    ggufs = {"embedded": default_gguf()}
    if args.types:
        ggufs |= files(backbone_gguf(None), args.types, folder)
    text = gsm8k_questions(GSM8K_TEST, 1, 0)[0]
    rows = []
    for kind, gguf in ggufs.items():
        cache = Path(tempfile.mkdtemp(prefix="river-first-call-"))
        try:
            row = {"type": kind, "file": gguf.name, "file_mb": round(gguf.stat().st_size / 2**20)}
            print(f"{kind}: first call", file=sys.stderr, flush=True)
            row["first"] = first(gguf, cache, text, args.tokens)
            for call in ("fit", "later"):
                print(f"{kind}: {call} call", file=sys.stderr, flush=True)
                row[call] = river(gguf, cache, text, args.tokens, [])
            row["cache_mb"] = held(cache)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        if not isinstance(folder, str):
            print(f"{kind}: llama.cpp", file=sys.stderr, flush=True)
            row["llama.cpp"] = llamacpp(folder, gguf, text, args.tokens, args.threads)
        rows.append(row)
    load["end"] = os.getloadavg()[0]
    payload = {"command": run_command("first_call", argv), "machine": info,
               "load_average": load, "tokens": args.tokens, "rows": rows}
    out.write(args.name, payload, markdown(payload))


def markdown(payload: dict) -> str:
    m = payload["machine"]
    lines = ["# A GGUF's first call, its fit and a later call, beside llama.cpp", "",
             f"`{payload['command']}`", "",
             f"{m['cpu']} ({m['cores']} cores; {', '.join(m['extensions'])}); one GSM8K test "
             f"question as raw text, {payload['tokens']} tokens; every call a fresh process. "
             f"Targets (issue 52): first call <= {FIRST_S} s and <= {FIRST_MB} MB on the "
             f"embedded GGUF; the fit <= {FIT_S} s; a later call <= {LATER_OVER_LLAMACPP}x "
             f"llama.cpp's wall-clock.", "",
             "| file | first call (flags) | its peak MB | fit call (the fit as River states it) | "
             "later call | its peak MB | llama.cpp cold | later over llama.cpp | "
             "the cache after, MB |", "|---|---|---|---|---|---|---|---|---|"]
    for r in payload["rows"]:
        first, fit, later, base = r["first"], r["fit"], r["later"], r.get("llama.cpp")
        stated = " (no fit)" if fit["fit_s"] is None else \
            f" (a profile River ships, fitted before in {fit['fit_s']} s)" \
            if fit["wall_s"] < fit["fit_s"] else f" (fitted in {fit['fit_s']} s)"
        lines.append(
            f"| {r['type']} ({r['file_mb']} MB) | {first['wall_s']:.1f} s "
            f"({' '.join(first['flags'])}) | {first['peak_rss_mb']:.0f} | "
            f"{fit['wall_s']:.1f} s{stated} | {later['wall_s']:.2f} s | "
            f"{later['peak_rss_mb']:.0f} | "
            + (f"{base['wall_s']:.2f} s | {later['wall_s'] / base['wall_s']:.2f}x"
               if base else "- | -")
            + f" | {', '.join(f'{k} {v}' for k, v in r['cache_mb'].items())} |")
    lines += ["", "The operating point each file's fit call stated:", ""]
    lines += [f"- {r['type']}: {r['fit']['point'] or '(none stated)'}" for r in payload["rows"]]
    return "\n".join(lines) + "\n"
