"""The `river` command: `river generate PROMPT`, `river plugins`, and the commands plugins
add (`river cache` from the model package)."""

from __future__ import annotations

import argparse
import json
import sys

import attrs
import numpy as np

from .config import MODES, ExitConfig, GenerationConfig, QuantSpec
from .decode import DecodeResult
from .errors import ConfigError, RiverError
from .model import RiverModel, bound_options, check
from .options import parse
from .plugins import KINDS, default_registry


def _default(cls, name: str):
    return getattr(attrs.fields(cls), name).default


def _parser(registry) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="river", description="Early-exit LLM decoding with a "
                                "KV-shared exit river.")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text with early exit")
    g.add_argument("prompt")
    g.add_argument("--model", help="local Hugging Face folder or .gguf (default: embedded "
                   "SmolLM2-135M-Instruct)")
    g.add_argument("--backend", default="hf", help="hf, onnx, llamacpp (river plugins)")
    g.add_argument("--device", default="cpu")
    g.add_argument("--dtype", default="float32")
    g.add_argument("--policy", default=_default(ExitConfig, "policy"),
                   help="exit policy: similarity, fixed, ... (river plugins)")
    g.add_argument("--predictor", default=_default(ExitConfig, "predictor"))
    g.add_argument("--kv", default=_default(ExitConfig, "kv"),
                   help="KV strategy: river, propagate, mask, monotonic, recompute, full")
    g.add_argument("--prefill-exit", type=int, metavar="K",
                   help="run the prompt's layers past K as stand-ins (sequence-level exit)")
    g.add_argument("--mode", default=_default(ExitConfig, "mode"), choices=MODES,
                   help="exit: exited tokens are final (the paper, lossy); speculative: they "
                   "are drafts the backbone verifies (lossless)")
    g.add_argument("--draft-tokens", type=int, default=_default(ExitConfig, "draft_tokens"),
                   help="speculative mode: the most tokens drafted per verification")
    g.add_argument("--adaptive-draft", action="store_true",
                   help="speculative mode: vary the draft length with the drafts' runs, up "
                   "to --draft-tokens")
    g.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the chosen policy, predictor or KV strategy, e.g. "
                   "-o threshold=0.2 (repeatable; river plugins lists them)")
    g.add_argument("--bits", type=int, default=_default(QuantSpec, "bits"),
                   help="stand-in weight precision: 4 (default) or 8")
    g.add_argument("--group-size", type=int, default=_default(QuantSpec, "group_size"))
    g.add_argument("--quantizer", default=_default(QuantSpec, "method"),
                   help="4-bit stand-in quantizer: hqq (default, as the paper) or rtn")
    g.add_argument("--max-new-tokens", type=int,
                   default=_default(GenerationConfig, "max_new_tokens"))
    g.add_argument("--temperature", type=float, default=_default(GenerationConfig, "temperature"))
    g.add_argument("--top-p", type=float, default=_default(GenerationConfig, "top_p"))
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--seed", type=int, default=_default(GenerationConfig, "seed"))
    g.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    g.add_argument("--stream", action="store_true",
                   help="print the text as it is generated (Ctrl-C stops, with statistics)")
    sub.add_parser("plugins", help="list registered backends, policies, predictors, strategies, "
                   "commands and their options")
    for entry in registry.entries("command").values():   # commands plugins add
        command = sub.add_parser(entry.name, help=entry.summary, description=entry.summary)
        command.set_defaults(run=entry.factory(command))
    return p


def _report(stats: DecodeResult) -> str:
    n = sum(len(t) for t in stats.tokens)
    if stats.speculative:
        lines = [f"{n} tokens | {stats.ms_per_token:.1f} ms/token (mean) | "
                 f"{stats.tokens_per_second:.1f} tokens/s | speculative: "
                 f"{100 * stats.acceptance_rate:.1f}% of {sum(stats.drafted)} drafts kept, "
                 f"{stats.tokens_per_round:.2f} tokens per verification | drafts' mean exit "
                 f"layer {stats.mean_exit_layer:.1f}/{stats.num_layers}"]
    else:
        lines = [f"{n} tokens | {stats.ms_per_token:.1f} ms/token (median decode step) | "
                 f"{stats.tokens_per_second:.1f} tokens/s | mean exit layer "
                 f"{stats.mean_exit_layer:.1f}/{stats.num_layers} | "
                 f"{100 * stats.skipped_share:.1f}% of layers skipped"]
    hist = stats.histogram()
    if hist.sum():
        what = "draft step" if stats.speculative else "token"
        lines.append(f"histogram of backbone layers run per {what}:")
        scale = 40 / hist.max()
        for layer in np.nonzero(hist)[0]:
            lines.append(f"  {layer:3d} | {'#' * max(1, round(hist[layer] * scale))} "
                         f"{hist[layer]}")
    return "\n".join(lines)


def _generate(args) -> None:
    # every setting is checked first: bad input fails before the model loads
    quant = QuantSpec(bits=args.bits, group_size=args.group_size, method=args.quantizer)
    exit_config = ExitConfig(policy=args.policy, kv=args.kv, predictor=args.predictor,
                             options=parse(args.option), prefill_exit=args.prefill_exit,
                             mode=args.mode, draft_tokens=args.draft_tokens,
                             adaptive=args.adaptive_draft)
    gen = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                           top_p=args.top_p, stop=args.stop, seed=args.seed)
    if not args.prompt.strip():
        raise RiverError("empty prompt")
    registry = default_registry()
    load = registry.backend(args.backend)
    caps = getattr(load, "capabilities", None)   # a loader may declare them
    if caps is not None:
        check(registry, exit_config, caps, args.backend)
    else:
        bound_options(registry, exit_config)
    context = getattr(load, "context_length", lambda model: None)(args.model)
    if context is not None and gen.max_new_tokens >= context:
        raise ConfigError(f"max_new_tokens ({gen.max_new_tokens}) leaves no room for a prompt "
                          f"in the model's context of {context} positions")
    model = RiverModel.from_pretrained(args.model, backend=args.backend, device=args.device,
                                       dtype=args.dtype, quant=quant, progress=True,
                                       registry=registry)
    if args.stream:
        stats = _stream(model, args.prompt, not args.no_chat, exit_config, gen)
    else:
        out = model.generate(args.prompt, chat=not args.no_chat, exit_config=exit_config,
                             generation_config=gen)
        print(out.text)
        stats = out.stats
    backend = model.backend
    stopped = "\ninterrupted: what came before Ctrl-C" if stats.interrupted else ""
    print(f"{stopped}\nbackend {backend.name} on {', '.join(backend.runs_on)}\n"
          f"{_report(stats)}", file=sys.stderr)
    if stats.interrupted:
        raise KeyboardInterrupt


def _stream(model: RiverModel, prompt: str, chat: bool, exit_config: ExitConfig,
            gen: GenerationConfig) -> DecodeResult:
    """Print the text as it grows, holding back what could still turn into a stop string."""
    tokens = model.stream(prompt, chat=chat, exit_config=exit_config, generation_config=gen)
    hold = max((len(s) for s in gen.stop), default=1) - 1
    shown = ""
    try:
        for _ in tokens:
            text = model.text(tokens.ids(), gen.stop)
            ready = text[:len(text) - hold]
            if ready.startswith(shown) and not ready.endswith("\ufffd"):   # whole characters
                print(ready[len(shown):], end="", flush=True)
                shown = ready
    except KeyboardInterrupt:
        tokens.interrupt()
    text = model.text(tokens.ids(), gen.stop)
    print(text[len(shown):] if text.startswith(shown) else "\n" + text)
    return tokens.stats


def _plugins() -> None:
    registry = default_registry()
    for kind in KINDS:
        print(f"{kind}:")
        for e in registry.entries(kind).values():
            print(f"  {e.name:<12} {e.provider:<20} {e.summary}")
            for name, default, doc in e.options:
                print(f"  {'':<12} -o {name}={json.dumps(default)}: {doc}")


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser(default_registry()).parse_args(argv)
        if args.command == "generate":
            _generate(args)
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
