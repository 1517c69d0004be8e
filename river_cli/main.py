"""The `river` command: `river generate PROMPT`, `river calibrate`, `river plugins`, and the
commands plugins add (`river cache` from the model package)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np

from .calibrate import calibrate, tuned_option
from .calibrate import __doc__ as calibrate_doc_text
from river_core import arguments
from river_core.arguments import default
from river_core.settings.config import ExitConfig, GenerationConfig, QuantSpec, mode_policy
from river_core.loop.decode import DecodeResult, check_prompts
from river_core.settings.errors import ConfigError, RiverError
from river_core.model import RiverModel, check_text
from river_core.plan import Plan, resolve
from river_core.plugins import KINDS, default_registry
from .operating_point import chosen, describe, not_fitted, operating_point
from .profile import DEFAULT_TARGET, Profile, Target, default_path
from .prompts import GSM8K_TRAIN, read_prompts


def _model_arguments(p: argparse.ArgumentParser, *, speculative: bool) -> None:
    """What picks the model, river precision and exit rule: shared by generate and calibrate
    (the settings' own arguments declared once, river_core.arguments)."""
    p.add_argument("--model", help="local Hugging Face folder or .gguf (default: embedded "
                   "SmolLM2-135M-Instruct)")
    p.add_argument("--backend", help="ggml, hf, onnx, llamacpp (river plugins); default: ggml "
                   "for the embedded model or a GGUF on the CPU where it is installed (the "
                   "fastest there), else hf")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", help="the weights' and activations' type (default: the "
                   "backend's: float32 on the CPU; on CUDA bfloat16 for hf, float16 for onnx)")
    arguments.add_exit_arguments(p, speculative=speculative, prefill=speculative)
    arguments.add_quant_arguments(p)
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")


def default_backend(model: str | None, device: str, registry) -> str:
    """The engine `river generate` and `calibrate` run when none is named: ggml, llama.cpp's
    kernels, the fastest engine at the defaults on the CPU (docs/backends.md), for what it
    runs (the embedded model, a GGUF) where its extra is installed; else hf, which runs
    every model and device."""
    runs_ggml = model is None or model.endswith(".gguf")
    if device == "cpu" and runs_ggml and "ggml" in registry.entries("backend") \
            and importlib.util.find_spec("ggml") is not None:
        return "ggml"
    return "hf"


def _quant(args) -> QuantSpec:
    """The stand-ins the command runs: its backend's own, with what the arguments set."""
    return arguments.quant_spec(args, default_registry().backend(args.backend).quant)


def _parser(registry) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="river", description="Early-exit LLM decoding with a "
                                "KV-shared exit river.")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text with early exit")
    g.add_argument("prompt")
    _model_arguments(g, speculative=True)
    g.add_argument("--profile", type=Path, help="a calibration profile to use (default: the "
                   "one `river calibrate` saved for this model, precision and policy, if any)")
    g.add_argument("--no-profile", action="store_true",
                   help="no operating point fitted to the model, no saved profile: the "
                   "policy's own defaults")
    g.add_argument("--target", type=Target.parse, help="the operating point's target, fitted "
                   f"once per model and target (default: a saved profile's, else "
                   f"{DEFAULT_TARGET}: exit mode recovers at least half of the whole 4-bit "
                   "model's NLL gap); agreement=SHARE and nll=NATS as for calibrate")
    g.add_argument("--max-new-tokens", type=int,
                   default=default(GenerationConfig, "max_new_tokens"))
    g.add_argument("--ignore-eos", action="store_true", help="decode --max-new-tokens tokens "
                   "whatever end of text the model picks (as llama.cpp's: for timings)")
    g.add_argument("--temperature", type=float, default=default(GenerationConfig, "temperature"))
    g.add_argument("--top-p", type=float, default=default(GenerationConfig, "top_p"))
    g.add_argument("--top-k", type=int, default=default(GenerationConfig, "top_k"),
                   help="sample among the K most likely tokens (0: all)")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--seed", type=int, default=default(GenerationConfig, "seed"))
    g.add_argument("--stream", action="store_true",
                   help="print the text as it is generated (Ctrl-C stops, with statistics)")
    g.add_argument("--json", action="store_true", help="print the answer and its statistics "
                   "as one JSON object on stdout (for scripts; river bench first_contact)")
    g.add_argument("--verbose", action="store_true", help="the operating point's figures in "
                   "full (quality, speed, the policy's default beside it)")
    f = sub.add_parser("fit", help="fit the model's operating point once (exit mode's "
                       "threshold against full depth and the whole 4-bit model); `generate` "
                       "then runs it")
    f.add_argument("--model", help="local Hugging Face folder or .gguf (default: embedded "
                   "SmolLM2-135M-Instruct)")
    f.add_argument("--backend", help="as for generate")
    f.add_argument("--device", default="cpu")
    f.add_argument("--dtype")
    arguments.add_quant_arguments(f)
    f.add_argument("--policy", help="exit policy (default: exit mode's, the paper's rule)")
    f.add_argument("--target", type=Target.parse, help=f"default: {DEFAULT_TARGET}")
    c = sub.add_parser("calibrate", help="fit the policy's threshold to a quality target on "
                       "your prompts (no training); saves a profile `generate` then uses",
                       description=calibrate_doc_text,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _model_arguments(c, speculative=False)
    c.add_argument("--prompts", type=Path, default=GSM8K_TRAIN, help="JSONL (a question, "
                   "prompt or text field a line) or text (a prompt a line); default: the "
                   "bundled GSM8K train slice")
    c.add_argument("--limit", type=int, default=200, help="how many prompts")
    c.add_argument("--offset", type=int, default=0, help="skip this many prompts first")
    c.add_argument("--tokens", type=int, default=16,
                   help="full depth's continuation tokens per prompt to score")
    c.add_argument("--layer-prompts", type=int, default=8,
                   help="prompts for the per-layer table (0: none)")
    c.add_argument("--target", type=Target.parse, default=DEFAULT_TARGET,
                   help=f"gap=SHARE (of the whole 4-bit model's NLL increase over full depth "
                   f"recovered; default {DEFAULT_TARGET}), agreement=SHARE (next tokens kept) "
                   "or nll=NATS (NLL increase per token)")
    c.add_argument("--out", type=Path, help="where to write the profile (default: the user "
                   "cache, where `generate` finds it)")
    sub.add_parser("plugins", help="list registered backends, policies, predictors, strategies, "
                   "commands and their options")
    for entry in registry.entries("command").values():   # commands plugins add
        command = sub.add_parser(entry.name, help=entry.summary, description=entry.summary)
        command.set_defaults(run=entry.plugin(command))
    return p


def report_stats(stats: DecodeResult) -> str:
    """The statistics line (DecodeResult's definitions: the first token of a sequence comes
    from prefill, speed is over the decoded ones) and the histogram of the decode steps."""
    n, decoded = sum(len(t) for t in stats.tokens), stats.decoded_tokens
    first = f"{n} token{'s' * (n != 1)}: prefill {stats.prefill_ms:.0f} ms"
    if not decoded:
        return first + " gave the only one, nothing was decoded"
    median = "" if stats.speculative else f" (median step {stats.median_step_ms:.1f})"
    layers = stats.mean_layers_run   # nan: no model step drafted (n-gram drafts alone)
    lines = [f"{first}, {decoded} decoded at {stats.ms_per_token:.1f} ms/token{median}, "
             f"{stats.tokens_per_second:.1f} tokens/s" + ("" if np.isnan(layers) else
             f" | {'drafts ran' if stats.speculative else 'tokens ran'} {layers:.1f}/"
             f"{stats.num_layers} backbone layers on average")]
    if stats.speculative:
        lines[0] += (" | speculative: no drafts, every round full depth's one-token step"
                     if not sum(stats.drafted) else   # no source could pay (issue 60)
                     f" | speculative: {100 * stats.acceptance_rate:.1f}% of "
                     f"{sum(stats.drafted)} drafts kept, {stats.tokens_per_round:.2f} tokens "
                     f"per verification")
        lines[0] += "; rounds: " + ", ".join(f"{n} {source}" for source, n
                                             in stats.rounds_by_source.items())
    else:
        lines[0] += f" | {100 * stats.skipped_share:.1f}% of layers skipped"
    hist = stats.layers_run_histogram()
    if hist.sum():
        what = "draft step" if stats.speculative else "decoded token"
        lines.append(f"histogram of backbone layers run per {what} ({hist.sum()} in all):")
        scale = 40 / hist.max()
        for layers in np.nonzero(hist)[0]:
            lines.append(f"  {layers:3d} | {'#' * max(1, round(hist[layers] * scale))} "
                         f"{hist[layers]}")
    return "\n".join(lines)


def stats_record(text: str, stats: DecodeResult) -> dict:
    """`river generate --json`'s object: the answer and the statistics line's figures
    (DecodeResult's definitions; speculative figures only in speculative mode)."""
    decoded = stats.decoded_tokens
    record = {"text": text, "tokens": sum(len(t) for t in stats.tokens),
              "decoded_tokens": decoded, "prefill_ms": stats.prefill_ms,
              "decode_ms": sum(stats.step_seconds) * 1e3,
              "ms_per_token": stats.ms_per_token if decoded else None,
              "speculative": stats.speculative,
              "mean_layers_run": stats.mean_layers_run if decoded else None}
    if stats.speculative:
        record |= {"acceptance_rate": stats.acceptance_rate,
                   "tokens_per_round": stats.tokens_per_round,
                   "rounds_by_source": stats.rounds_by_source}
    return record


def report_times(load_s: float, generate_s: float, phases: dict[str, float]) -> str:
    """Wall-clock of the call's parts: the model's load with its warm-up (an engine builds
    there whatever a decode could need, so none of it lands inside the decode's timing), its
    phases where the engine measures them (`load_seconds`), and the generation (prefill,
    decode, the text)."""
    parts = ", ".join(f"{name} {s:.2f}" for name, s in phases.items())
    return (f"wall-clock: load and warm-up {load_s:.2f} s{f' ({parts})' if parts else ''}, "
            f"generate {generate_s:.2f} s, total {load_s + generate_s:.2f} s")


def _exit_config(args, profile: Profile | None = None) -> ExitConfig:
    """The command's exit settings; a profile named on the command line fills in its policy
    (unless one is given) and its calibrated options (unless given)."""
    if profile is None:
        return arguments.exit_config(args)
    return profile.exit_config(arguments.exit_config(args, policy=args.policy or profile.policy))


def _load(args, exit_config: ExitConfig, max_new_tokens: int = 1,
          find_profile: bool = False, auto: bool = False
          ) -> tuple[RiverModel, Plan, "Profile | None"]:
    """The model and its plan: resolved before the model loads wherever the backend can read
    the model's shape first (bad input fails in a second, not after a load), and again after
    it only if the model's operating point (`find_profile`: a saved profile, found by the
    loaded model's fingerprint, or one fitted now: operating_point.py) changes the settings;
    that profile, if any. With `auto` (no mode or exit setting asked for) nothing is fitted
    and no stand-in made to find one: a model without a profile at hand runs lossless mode on
    drafts that need no stand-ins (`first_call_config`)."""
    registry = default_registry()
    backend = registry.backend(args.backend)
    shape = backend.shape(args.model)
    plan = None
    if shape is not None:
        plan = resolve(exit_config, registry, backend.capabilities, shape, args.backend)
        if max_new_tokens >= shape.max_positions:
            raise ConfigError(f"max_new_tokens ({max_new_tokens}) leaves no room for a prompt "
                              f"in the model's context of {shape.max_positions} positions")
    dtype = {} if args.dtype is None else {"dtype": args.dtype}
    model = RiverModel.from_pretrained(args.model, backend=args.backend, device=args.device,
                                       quant=_quant(args), progress=True,
                                       registry=registry, **dtype)
    # a profile's key is its stand-ins' errors: where they are not made yet, an automatic
    # call does not make them (minutes on a 1.5B model) only to look
    look = find_profile and not (auto and not getattr(model.backend, "stand_ins_at_hand", True))
    found = operating_point(model, exit_config, args.target, fit=_fits(args) and not auto,
                            progress=True, model_name=args.model or "default",
                            precision=_quant(args).label) if look else None
    if found is not None:
        exit_config, plan = chosen(found, exit_config, _lossless(args)), None
    elif auto:
        exit_config, plan = first_call_config(args), None
    return model, model.plan(plan or exit_config), found


def _lossless(args, **fields) -> ExitConfig:
    policy, options = mode_policy("speculative")
    return arguments.exit_config(args, mode="speculative", policy=policy, options=options,
                                 **fields)


FIRST_CALL_DRAFTS = ("ngram",)
"""What a model without an operating point drafts from: the context's n-grams, which need no
stand-ins (issue 59: nothing before the first answer that the answer does not need)."""


def first_call_config(args) -> ExitConfig:
    """Lossless mode (full depth's own output) on drafts that cost nothing to prepare."""
    return _lossless(args, drafts=FIRST_CALL_DRAFTS)


def _automatic(args, profile: "Profile | None") -> bool:
    """Whether the call asks for nothing about exits (mode, policy, options, KV strategy,
    target, prompt exit, a profile): River then picks, from the model's operating point."""
    return (args.mode is None and args.policy is None and not args.option
            and args.kv == default(ExitConfig, "kv") and args.target is None
            and args.prefill_exit is None and profile is None and not args.no_profile)


def _fits(args) -> bool:
    """Whether a first exit-mode call fits the model's operating point where none is saved:
    on the ggml engine, which runs a GGUF as it is (the embedded model's included: issue 52's
    scope, a user's own file), or where a --target asks for one; elsewhere the profile `river
    calibrate` saved, if any."""
    return args.target is not None or args.backend == "ggml"


def _generate(args) -> None:
    profile = Profile.load(args.profile) if args.profile else None
    exit_config = _exit_config(args, profile)
    gen = GenerationConfig(max_new_tokens=args.max_new_tokens, ignore_eos=args.ignore_eos,
                           temperature=args.temperature,
                           top_p=args.top_p, top_k=args.top_k, stop=args.stop, seed=args.seed)
    check_prompts([check_text(args.prompt)])
    saved = not profile and not args.no_profile and not exit_config.lossless
    auto = _automatic(args, profile)
    started = time.perf_counter()
    model, plan, found = _load(args, exit_config, gen.max_new_tokens, find_profile=saved,
                               auto=auto)
    loaded = time.perf_counter()
    backend = model.backend
    phases = getattr(backend, "load_seconds", {})   # an engine that measures its load's phases
    if profile:
        profile.check(backend, args.profile)
    if profile:
        print(f"calibrated: {profile.describe()}", file=sys.stderr)
    elif found:
        print(describe(found, backend.num_layers, args.verbose), file=sys.stderr)
    elif auto:
        print(not_fitted(args.model), file=sys.stderr)
    if args.stream and args.json:
        raise ConfigError("--json prints one object once the answer is complete; drop --stream")
    if args.stream:
        stats = _stream(model, args.prompt, not args.no_chat, plan, gen)
    else:
        out = model.generate(args.prompt, chat=not args.no_chat, exit_config=plan,
                             generation_config=gen)
        wall = {"load_s": loaded - started, "generate_s": time.perf_counter() - loaded,
                "load_phases": phases}
        print(json.dumps(stats_record(out.text, out.stats) | wall) if args.json else out.text)
        stats = out.stats
    if not model.text(stats.tokens[0], gen.stop).strip() and not stats.interrupted:
        print("river: the answer is empty: the model ended it at once" + (
            "; an instruct model expects its chat template, which --no-chat leaves out"
            if args.no_chat else ""), file=sys.stderr)
    stopped = "\ninterrupted: what came before Ctrl-C" if stats.interrupted else ""
    done = time.perf_counter()
    print(f"{stopped}\nbackend {backend.name} on {', '.join(backend.runs_on)}\n"
          f"{report_stats(stats)}\n{report_times(loaded - started, done - loaded, phases)}",
          file=sys.stderr)
    if stats.interrupted:
        raise KeyboardInterrupt


def _fit(args) -> None:
    """`river fit`: the operating point `generate` finds, fitted now where none is kept for
    the model, its figures printed in full."""
    config = ExitConfig() if args.policy is None else ExitConfig(policy=args.policy)
    tuned_option(default_registry(), config)   # fails before the model loads
    dtype = {} if args.dtype is None else {"dtype": args.dtype}
    model = RiverModel.from_pretrained(args.model, backend=args.backend, device=args.device,
                                       quant=_quant(args), progress=True, **dtype)
    found = operating_point(model, config, args.target, fit=True, progress=True,
                            model_name=args.model or "default", precision=_quant(args).label)
    if found is None:
        raise ConfigError(getattr(model.backend.capabilities, "exit_refused", None) or
                          f"backend {args.backend!r} has no stand-ins: nothing to fit")
    print(describe(found, model.backend.num_layers, verbose=True))
    print(f"kept: {default_path(model.backend, config.policy)}")


def _calibrate(args) -> None:
    exit_config = _exit_config(args)
    tuned_option(default_registry(), exit_config)   # fails before the model loads
    prompts = read_prompts(args.prompts, args.limit, args.offset)
    model, _, _ = _load(args, exit_config)
    source = "GSM8K train (bundled)" if args.prompts == GSM8K_TRAIN else str(args.prompts)
    [profile] = calibrate(model, [model.encode(p, not args.no_chat)[0] for p in prompts],
                          exit_config, [args.target], tokens=args.tokens,
                          layer_prompts=args.layer_prompts, precision=_quant(args).label,
                          model_name=args.model or "default", source=source, progress=True)
    print(_layer_report(profile))
    path = profile.save(args.out or default_path(model.backend, exit_config.policy))
    if not profile.met:
        print(f"river: warning: {args.target} is out of reach even at the strict end; the "
              "profile holds that end", file=sys.stderr)
    print(f"{profile.describe()}\nsaved {path}")


def _layer_report(profile: Profile) -> str:
    lines = ["every token exiting after layer k (full depth's continuations, teacher-forced):",
             "    k | agreement | NLL delta | river K/V error"] if profile.layers else \
        ["no per-layer table (--layer-prompts 0)"]
    for row in profile.layers:
        q = row.quality
        error = "n/a" if row.kv_error is None else f"{row.kv_error:.3f}"
        lines.append(f"  {row.exit_layer:3d} | {q.agreement:9.3f} | {q.nll_delta:+9.3f} | {error}")
    lines.append(f"search over {profile.policy}'s {', '.join(profile.options)}:")
    for t in profile.trials:
        lines.append(f"  {t.value:8.4f}: agreement {t.quality.agreement:.3f}, NLL "
                     f"{t.quality.nll_delta:+.3f}, {t.quality.mean_layers:.1f} layers/token")
    return "\n".join(lines)


def _stream(model: RiverModel, prompt: str, chat: bool, plan: Plan,
            gen: GenerationConfig) -> DecodeResult:
    """Print the text as it grows, holding back what could still turn into a stop string."""
    tokens = model.stream(prompt, chat=chat, exit_config=plan, generation_config=gen)
    hold = max((len(s) for s in gen.stop), default=1) - 1
    shown = 0
    try:
        for _ in tokens:
            text = tokens.text()   # whole characters, decoding only the new ids
            ready = len(text) - hold
            if ready > shown:
                print(text[shown:ready], end="", flush=True)
                shown = ready
    except KeyboardInterrupt:
        tokens.interrupt()
    print(tokens.text()[shown:])
    return tokens.stats


def _plugins() -> None:
    registry = default_registry()
    for kind in KINDS:
        print(f"{kind}:")
        for e in registry.entries(kind).values():
            print(f"  {e.name:<12} {e.provider:<20} {e.summary}")
            for name, value, doc in e.options:
                print(f"  {'':<12} -o {name}={json.dumps(value)}: {doc}")
    from river_models.families import BY_MODEL_TYPE, WRAPPERS

    wrapped = ", ".join(f"{w} (its {t})" for w, t in WRAPPERS.items())
    print(f"architectures (model_type, docs/models.md): {', '.join(BY_MODEL_TYPE)}; {wrapped}")


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser(default_registry()).parse_args(argv)
        if getattr(args, "backend", "") is None:
            args.backend = default_backend(args.model, args.device, default_registry())
        if args.command == "generate":
            _generate(args)
        elif args.command == "calibrate":
            _calibrate(args)
        elif args.command == "fit":
            _fit(args)
        elif args.command == "plugins":
            _plugins()
        else:
            return args.run(args) or 0
    except RiverError as e:
        print(f"river: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("river: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
