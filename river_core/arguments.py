"""River's settings on a command line, declared once from the value types' own fields and
defaults (config.py), for every command that takes them: `river generate`, `river calibrate`,
`river serve`."""

from __future__ import annotations

import argparse
from typing import Any

import attrs

from .settings.config import DRAFT_WINDOW, EXIT_HEADS, MODES, METHODS, ExitConfig, QuantSpec, mode_policy
from .contract.layout import SINKS
from .settings.options import parse


def default(cls: type, name: str) -> Any:
    """The default of field `name` of an attrs class."""
    return getattr(attrs.fields(cls), name).default


def add_exit_arguments(parser: argparse.ArgumentParser, *, speculative: bool = True,
                       prefill: bool = True) -> None:
    """ExitConfig's fields; the speculative mode's and the prompt's exit where the command
    takes them."""
    parser.add_argument("--policy", help=f"exit policy: similarity, fixed, ... (river "
                        f"plugins); default: {_described(mode_policy('exit'))}" + (
                            f", and in speculative mode {_described(mode_policy('speculative'))}"
                            if speculative else ""))
    parser.add_argument("--predictor", default=default(ExitConfig, "predictor"))
    parser.add_argument("--kv", default=default(ExitConfig, "kv"),
                        help="KV strategy: river, propagate, mask, monotonic, recompute, full")
    parser.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the chosen policy, predictor or KV strategy, e.g. "
                        "-o tau=0.95 (repeatable; river plugins lists them)")
    parser.add_argument("--exit-head", default=default(ExitConfig, "exit_head"),
                        choices=EXIT_HEADS, help="exit mode: the head a token that exited "
                        "takes: the model's own (the paper) or its 8-bit stand-in (fewer bytes, "
                        "a quality trade)")
    if prefill:
        parser.add_argument("--prefill-exit", type=int, metavar="K",
                            help="run the prompt's layers past K as stand-ins (sequence-level "
                            "exit)")
    if speculative:
        parser.add_argument("--mode", choices=MODES,
                            help="exit: exited tokens are final (the paper, lossy); "
                            "speculative: they are drafts the backbone verifies (lossless); "
                            f"default: {default(ExitConfig, 'mode')} (river generate: the "
                            "model's operating point, lossless mode until one is fitted)")
        parser.add_argument("--draft-tokens", type=int,
                            default=default(ExitConfig, "draft_tokens"),
                            help="speculative mode: the most tokens drafted per verification")
        adaptive = default(ExitConfig, "adaptive")
        parser.add_argument("--adaptive-draft", action=argparse.BooleanOptionalAction,
                            default=adaptive, help="speculative mode: vary the draft length "
                            "with the drafts' runs, up to --draft-tokens, and take plain steps "
                            f"where drafts do not pay (default: {'on' if adaptive else 'off'})")
        parser.add_argument("--drafts", default=",".join(default(ExitConfig, "drafts")),
                            metavar="SOURCE,...", help="speculative mode: where drafts come "
                            "from, e.g. river,ngram (the exit river; the context's own "
                            "n-grams); river plugins lists the sources")
        parser.add_argument("--draft-window", type=int, metavar="N",
                            help=f"speculative mode: drafts attend the context's first {SINKS} "
                            f"positions and its last N (default {DRAFT_WINDOW} where the "
                            f"backend can; verification keeps the output exact)")
    parser.add_argument("--step-aside-above", type=int, metavar="ROWS",
                        help="rows decoding in one step above which River steps aside (full "
                        "depth, no drafts); the crossover `river bench vllm --crossover` "
                        "measures (river serve's default: the one measured for each mode, "
                        "docs/scaling.md)")


def _described(policy: tuple[str, dict]) -> str:
    name, options = policy
    return " ".join([name, *(f"-o {k}={v}" for k, v in options.items())])


def exit_config(args: argparse.Namespace, **fields) -> ExitConfig:
    """The ExitConfig of parsed `add_exit_arguments` (`fields` override; a policy left unset
    is the mode's, with its options unless -o gives others: ExitConfig's defaults)."""
    given = {"kv": args.kv, "predictor": args.predictor}
    if args.policy:
        given["policy"] = args.policy
    if args.option:
        given["options"] = parse(args.option)
    for field, name in (("prefill_exit", "prefill_exit"), ("mode", "mode"),
                        ("exit_head", "exit_head"),
                        ("draft_tokens", "draft_tokens"), ("adaptive", "adaptive_draft"),
                        ("draft_window", "draft_window"), ("drafts", "drafts"),
                        ("step_aside_above", "step_aside_above")):
        if getattr(args, name, None) is not None:   # None: ExitConfig's default
            given[field] = getattr(args, name)
    return ExitConfig(**{**given, **fields})


def add_quant_arguments(parser: argparse.ArgumentParser) -> None:
    """QuantSpec's fields: the stand-ins' precision; each unset one is the backend's own
    (`BackendPlugin.quant`)."""
    parser.add_argument("--bits", type=int,
                        help=f"stand-in weight precision: 4 (default: {default(QuantSpec, 'bits')}) or 8")
    parser.add_argument("--group-size", type=int,
                        help="columns per 4-bit scale (default: the backend's; "
                        f"{default(QuantSpec, 'group_size')} for most)")
    parser.add_argument("--quantizer", choices=METHODS,
                        help="4-bit stand-in quantizer (default: the backend's): hqq (as the "
                        "paper; most backends) or rtn; hqq-int, rtn-int: zero points rounded to "
                        "integers (faster on onnx); sym: symmetric (ggml's Q4_0, its default)")


def quant_spec(args: argparse.Namespace, backend: QuantSpec = QuantSpec()) -> QuantSpec:
    """The stand-ins the arguments ask for, over the backend's own (`backend`)."""
    given = {"bits": args.bits, "group_size": args.group_size, "method": args.quantizer}
    return attrs.evolve(backend, **{k: v for k, v in given.items() if v is not None})
