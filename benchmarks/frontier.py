"""The user's plane: for one model, decode ms/token against quality (agreement and NLL
increase over the F16 model at full depth, teacher forced on held apart GSM8K test questions), for
llama.cpp's own F16, Q8_0, Q4_K_M and Q4_0 of the model and River's full depth, exit mode at
the model's fitted operating point and at the paper's tau, lossless mode and the whole model
on stand-ins.

    river bench frontier                                   # the embedded model
    river bench frontier --model FILE.gguf --questions 8 --tokens 64 --docs

River runs the model's F16 GGUF on its ggml engine (for the embedded model, the F16 copy it
runs by default). llama.cpp's other types are made in the run by `llama-quantize` from that
F16 GGUF into a temporary folder (never kept): a user picks them with a single command, so
they are the plane River has to stand on.

Quality: the reference is River's F16 full depth, its greedy continuation of each question
(`--tokens` tokens), scored teacher-forced as `river calibrate` scores it (river_cli.calibrate):
the share of positions whose top-1 is the reference's token and the NLL increase per token.
llama.cpp's types are scored by River's ggml engine at full depth over each GGUF: the same
continuations and scoring code, and llama.cpp's own kernels for each tensor type (ggml's), so
every point on the plane is measured one way (llama.cpp's `llama-perplexity` scores other
text with other statistics). Lossless mode's output is full depth's by construction (tested
in the conformance kit); the run checks its decoded tokens against full depth's.

Speed: decode ms/token (prefill excluded) on the same questions, `--tokens` new tokens,
greedy: River in this process, each question under every River setting in turn; llama.cpp's
`llama-completion` on the chat-templated text of each question (`--threads` threads, its
`eval time`), each call a process of its own. Writes frontier.{md,json,png} (`--name`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from river_core import ExitConfig, GenerationConfig, RiverModel
from river_core.settings.config import mode_policy

from .first_contact import llamacpp_arguments, llamacpp_folder
from .library.output import Output, Harness, heading, parser, plot_file
from .library.prompts import GSM8K_TEST, gsm8k_questions

LLAMACPP_TYPES = ("F16", "Q8_0", "Q4_K_M", "Q4_0")
PAPER_TAU = 0.97
NO_POINT = ("none (a Hugging Face folder without a profile from `river calibrate`: the "
            "policy's defaults)")


def river_settings(model: RiverModel, name: str | None,
                   backend: str) -> tuple[dict[str, ExitConfig], dict]:
    """River's points: label -> ExitConfig; and the model's operating point (fitted now and
    saved if this model has none yet, as `river generate` would)."""
    from river_cli.operating_point import describe, operating_point
    from river_core.plugins import default_registry

    # fitted where `river generate` fits it: a GGUF (the embedded model's included); a
    # Hugging Face folder takes the profile `river calibrate` saved for it, if any
    fits = name is None or name.endswith(".gguf")
    profile = operating_point(model, ExitConfig(), fit=fits, progress=True,
                              model_name=name or "default",
                              precision=default_registry().backend(backend).quant.label)
    policy, options = mode_policy("speculative")
    settings = {"River full depth": ExitConfig(kv="full")}
    point = {"line": None, "reached": None}
    if profile is not None:
        settings["River exit, fitted point"] = profile.exit_config(ExitConfig())
        point = {"line": describe(profile, model.backend.num_layers),
                 "reached": profile.point.reached if profile.point else None,
                 "options": dict(profile.options)}
    settings |= {f"River exit, paper's tau {PAPER_TAU}": ExitConfig(options={"tau": PAPER_TAU}),
                 "River lossless": ExitConfig(mode="speculative", policy=policy,
                                              options=options),
                 "River whole model on stand-ins": ExitConfig(policy="fixed",
                                                              options={"layer": -1})}
    return settings, point


def scored(model: RiverModel, refs, config: ExitConfig) -> dict:
    from river_cli.calibrate import force, quality

    q = quality(force(model, refs, config, lambda: None)[0])
    return {"agreement": q.agreement, "nll_delta": q.nll_delta, "mean_layers": q.mean_layers}


def river_speeds(model: RiverModel, prompts: list[list[int]], settings: dict[str, ExitConfig],
                 tokens: int) -> dict[str, dict]:
    """Per setting: decode ms/token over every question (each question under every setting
    in turn, the order rotated), its mean layers run, and whether its tokens were full
    depth's. An untimed short decode of each first (an engine's first use builds graphs)."""
    labels = list(settings)
    for label in labels:
        model.generate_ids(prompts[:1], settings[label], GenerationConfig(max_new_tokens=4))
    seconds = dict.fromkeys(labels, 0.0)
    decoded = dict.fromkeys(labels, 0)
    layers = {label: [] for label in labels}
    texts = {label: [] for label in labels}
    for q, prompt in enumerate(prompts):
        for label in labels[q % len(labels):] + labels[:q % len(labels)]:
            print(f"question {q + 1}/{len(prompts)}: {label}", file=sys.stderr, flush=True)
            out = model.generate_ids([prompt], settings[label],
                                     GenerationConfig(max_new_tokens=tokens))
            seconds[label] += sum(out.step_seconds)
            decoded[label] += out.decoded_tokens
            layers[label].append(out.mean_layers_run)
            texts[label].append(list(out.tokens[0]))
    full = texts["River full depth"]
    return {label: {"ms_per_token": 1e3 * seconds[label] / max(decoded[label], 1),
                    "decoded": decoded[label],
                    "same_tokens_as_full_depth": texts[label] == full} for label in labels}


class Quantizer:
    """llama.cpp's tools: `llama-quantize` and `llama-completion` from `folder`."""

    def __init__(self, folder: Path, threads: int) -> None:
        self.folder, self.threads = folder, threads

    def env(self) -> dict:
        # llama.cpp's own shared libraries for its tools only (River's ggml loads its own)
        lib = os.pathsep.join([str(self.folder), os.environ.get("LD_LIBRARY_PATH", "")])
        return {**os.environ, "LD_LIBRARY_PATH": lib}

    def run(self, tool: str, args: list[str], what: str) -> str:
        """The tool's output (stdout and stderr); its failure ends the run with its last
        lines."""
        done = subprocess.run([str(self.folder / tool), *args], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, env=self.env())
        if done.returncode:
            raise SystemExit(f"{tool} failed on {what}:\n{(done.stdout + done.stderr)[-2000:]}")
        return done.stdout + done.stderr

    def quantize(self, f16: Path, kind: str, folder: Path) -> Path:
        target = folder / f"{f16.stem}.{kind}.gguf"
        self.run("llama-quantize", [str(f16), str(target), kind, str(self.threads)], kind)
        return target

    def ms_per_token(self, gguf: Path, texts: list[str], tokens: int) -> dict:
        from .first_contact import parse_llamacpp

        ms, decoded, prompt_tokens = 0.0, 0, []
        for text in texts:
            r = parse_llamacpp(self.run(
                "llama-completion", ["-m", str(gguf), "-p", text, "-n", str(tokens), "--temp",
                                     "0", "-t", str(self.threads), "-tb", str(self.threads),
                                     "-no-cnv"], gguf.name))
            ms += r["ms_per_token"] * r["decoded"]
            decoded += r["decoded"]
            prompt_tokens.append(r["prompt_tokens"])
        return {"ms_per_token": ms / max(decoded, 1), "decoded": decoded,
                "prompt_tokens": prompt_tokens}


def llamacpp_tools(given: str | None, threads: int) -> Quantizer | str:
    """llama.cpp's tools, or why its rows are skipped (one line)."""
    folder = llamacpp_folder(given, ["llama-quantize", "llama-completion"])
    return folder if isinstance(folder, str) else Quantizer(folder, threads)


def f16_gguf(model: str | None) -> Path | None:
    """The model's F16 GGUF: the embedded model's F16 copy, a user GGUF's (written once into
    the user cache); None for a model that is not a GGUF."""
    from river_models import default_gguf
    from river_models.gguf_write import backbone

    source = default_gguf() if model is None else Path(model)
    return backbone(source, "F16", progress=True) if source.suffix == ".gguf" else None


def main(argv: list[str] | None = None) -> None:
    ap = parser("frontier", __doc__, results="frontier")
    ap.add_argument("--questions", type=int, default=8, help="GSM8K test questions")
    ap.add_argument("--offset", type=int, default=0, help="the first question")
    ap.add_argument("--tokens", type=int, default=64,
                    help="tokens per question: scored teacher-forced, and decoded for speed")
    ap.add_argument("--data", type=Path, default=GSM8K_TEST, help="GSM8K test JSONL")
    llamacpp_arguments(ap)
    ap.add_argument("--no-chat", action="store_true", help="no chat template")
    out, args = Harness.parse(ap, argv)
    from river_cli.calibrate import full_depth_references

    f16 = f16_gguf(args.model)
    backend = "ggml" if f16 is not None else "hf"
    model = RiverModel.from_pretrained(str(f16) if f16 else args.model, backend=backend,
                                       progress=True)
    questions = gsm8k_questions(args.data, args.questions, args.offset)
    prompts = model.encode(questions, not args.no_chat)
    settings, point = river_settings(model, args.model, backend)
    refs = full_depth_references(model, prompts, args.tokens, 0, lambda: None)
    rows = {}
    for label, config in settings.items():
        if config.lossless:   # full depth's output by construction; its tokens checked below
            rows[label] = {"agreement": 1.0, "nll_delta": 0.0, "mean_layers": None}
        else:
            rows[label] = scored(model, refs, config)
    for label, speed in river_speeds(model, prompts, settings, args.tokens).items():
        rows[label] |= {"engine": "River (ggml)" if backend == "ggml" else f"River ({backend})",
                        **speed}
    tools = llamacpp_tools(args.llamacpp, args.threads) if f16 else \
        f"llama.cpp runs a GGUF; the model {args.model} is not one"
    if isinstance(tools, Quantizer):
        rows |= llamacpp_rows(tools, f16, model, refs, questions, args)
    payload = {**out.head(),
               "model": args.model or "embedded SmolLM2-135M-Instruct", "f16_gguf": str(f16),
               "backend": backend, "questions": len(questions), "offset": args.offset,
               "tokens": args.tokens, "threads": args.threads, "operating_point": point,
               "llamacpp": None if isinstance(tools, Quantizer) else tools, "rows": rows}
    out.write(args.name, payload, report(payload))
    plot(out, payload, args.name)


def llamacpp_rows(tools: Quantizer, f16: Path, model: RiverModel, refs, questions: list[str],
                  args) -> dict[str, dict]:
    """llama.cpp's types of the model: quantized from the F16 GGUF into a temporary folder,
    each scored by River's ggml engine at full depth and timed by llama-completion."""
    from .first_contact import chat_text

    texts = questions
    if not args.no_chat and getattr(model.backend.tokenizer, "chat_template", None):
        texts = [chat_text(str(f16), q)[0] for q in questions]   # as first_contact's
    rows = {}
    with tempfile.TemporaryDirectory(prefix="river-frontier-") as folder:
        for kind in LLAMACPP_TYPES:
            print(f"llama.cpp {kind}", file=sys.stderr, flush=True)
            gguf = f16 if kind == "F16" else tools.quantize(f16, kind, Path(folder))
            quality = {"agreement": 1.0, "nll_delta": 0.0, "mean_layers": None}
            if kind != "F16":   # the F16 GGUF is the reference itself
                typed = RiverModel.from_pretrained(str(gguf), backend="ggml", progress=True)
                quality = scored(typed, refs, ExitConfig(kv="full"))
                del typed
            rows[f"llama.cpp {kind}"] = {"engine": "llama.cpp", **quality,
                                         "file_mb": gguf.stat().st_size / 1e6,
                                         **tools.ms_per_token(gguf, texts, args.tokens)}
    return rows


def report(p: dict) -> str:
    rows = p["rows"]
    full = rows["River full depth"]["ms_per_token"]
    lines = [*heading("The user's plane: ms/token against quality", p),
             f"Model: {p['model']} (River runs {p['backend']}"
             f"{' over ' + Path(p['f16_gguf']).name if p['backend'] == 'ggml' else ''}). "
             f"{p['questions']} GSM8K test questions from the {p['offset']}th, {p['tokens']} "
             f"tokens each: quality teacher-forced over River's F16 full depth's greedy "
             f"continuations; ms/token decode only, greedy"
             + (f"; llama.cpp's rows skipped: {p['llamacpp']}." if p["llamacpp"] else
                f"; llama.cpp with {p['threads']} threads."), "",
             p["operating_point"]["line"] or f"Operating point: {NO_POINT}", "",
             "| point | engine | ms/token | speed over River full depth | agreement | "
             "NLL delta, nats/token | layers a token | notes |",
             "|---|---|---|---|---|---|---|---|"]
    for label, r in rows.items():
        notes = []
        if "same_tokens_as_full_depth" in r:
            notes.append("same tokens as full depth" if r["same_tokens_as_full_depth"]
                         else "tokens differ from full depth's")
        if "file_mb" in r:
            notes.append(f"{r['file_mb']:.0f} MB")
        layers = "-" if r.get("mean_layers") is None else f"{r['mean_layers']:.1f}"
        lines.append(f"| {label} | {r['engine']} | {r['ms_per_token']:.2f} | "
                     f"{full / r['ms_per_token']:.2f}x | {r['agreement']:.3f} | "
                     f"{r['nll_delta']:+.4f} | {layers} | {', '.join(notes)} |")
    lines += ["", "Lossless mode's agreement and NLL are full depth's by construction; its "
              "tokens are checked against full depth's in the notes. llama.cpp's types are "
              "scored by River's ggml engine at full depth over each GGUF (llama.cpp's kernels)."]
    return "\n".join(lines) + "\n"


def plot(out: Output, p: dict, name: str) -> None:
    """NLL increase and agreement against ms/token, llama.cpp's points and River's."""
    plt, save = plot_file(out, name)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, key, label in zip(axes, ("nll_delta", "agreement"),
                              ("NLL increase over F16 full depth, nats/token (lower is better)",
                               "agreement with F16 full depth (higher is better)")):
        for point, r in p["rows"].items():
            river = r["engine"].startswith("River")
            ax.plot(r["ms_per_token"], r[key], marker="o" if river else "s", linestyle="",
                    color="tab:blue" if river else "tab:orange")
            ax.annotate(point.replace("River ", "").replace("llama.cpp ", "llama.cpp "),
                        (r["ms_per_token"], r[key]), fontsize=7, xytext=(4, 3),
                        textcoords="offset points")
        ax.set_xlabel("decode ms/token (lower is faster)")
        ax.set_ylabel(label)
        ax.set_xlim(left=0)
    axes[0].plot([], [], "o", color="tab:blue", label="River")
    axes[0].plot([], [], "s", color="tab:orange", label="llama.cpp's own types")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"The user's plane: {p['model']} ({p['machine']['cpu']})")
    save(fig)


if __name__ == "__main__":
    main()
