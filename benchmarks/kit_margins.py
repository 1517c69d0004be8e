"""How far inside its float type's bounds a conformance subject stays: the errors the kit bounds,
measured over random prompts and continuations per tiny family.

    river bench kit_margins --subject ggml --prompts 40

The kit (river_conformance) checks each bound on a few hypothesis draws; this measures the
largest error over many, per family, for the four bounds a float type sets
(`river_conformance.kit.Precision`): full depth's logits and K/V against the reference engine
(hf, float32); a multi-token `extend` against one token at a time (its own runs in another
order); a fused stand-in tail against its layers one by one, from every start; the sub-block
cosines against the reference. Prompts of 2-25 tokens and continuations of 1-10 drawn from the
tiny vocabulary, as the kit draws them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from river_conformance.scripted import forced_logits
from river_core.contract.backend import Step
from river_core.method.kv import Full
from river_core.method.predictor import relative_error
from river_conformance.fixtures import tiny

from .library.output import Harness, parser

if TYPE_CHECKING:
    from river_conformance.kit import Subject

MEASURES = {"reference": "rtol", "own order": "own_rtol", "fused tail": "fused_rtol",
            "cosines": "cosine_atol"}


def _kv(backend) -> list:
    return [backend.read_kv(i) for i in range(backend.num_layers)]


def _kv_error(got: list, want: list, positions: int) -> float:
    return max(relative_error(g[:, :, :positions], w[:, :, :positions])
               for pair_g, pair_w in zip(got, want) for g, w in zip(pair_g, pair_w))


def reference_error(b, ref, prompt, cont) -> tuple[float, float]:
    """Full depth against the reference: the largest logits error over the positions, and the
    cache's error after them."""
    got, want = forced_logits(b, prompt, cont, Full()), forced_logits(ref, prompt, cont, Full())
    n = len(prompt) + len(cont)
    return (max(relative_error(g, w) for g, w in zip(got, want)),
            _kv_error(_kv(b), _kv(ref), n))


def own_order_error(b, prompt, cont) -> tuple[float, float]:
    """A multi-token extend of `cont` against feeding it a token at a time."""
    stepped = forced_logits(b, prompt, cont, Full())   # after the prompt, then each token
    stepped_kv = _kv(b)
    b.prefill([prompt], len(prompt) + len(cont) + 1)
    extended = b.extend(cont, len(prompt))
    n = len(prompt) + len(cont)
    return (max(relative_error(e, s) for e, s in zip(extended, stepped[1:])),
            _kv_error(_kv(b), stepped_kv, n))


def fused_tail_error(b, prompt) -> tuple[float, float]:
    """The stand-ins' tail as one call against its layers one by one, from every start."""
    from river_conformance.kit import tail_both_ways

    worst = [0.0, 0.0]
    for start in range(b.num_layers):
        (fl, fkv), (l, kv) = tail_both_ways(b, prompt, start)
        worst[0] = max(worst[0], relative_error(fl, l))
        # layers before `start` hold no entry for the step's slot
        worst[1] = max(worst[1], _kv_error(fkv[start:], kv[start:], len(prompt) + 1))
    return worst[0], worst[1]


def cosine_error(b, ref, prompt, cont) -> float:
    """The last token's sub-block cosines after each layer, against the reference's."""
    got = []
    for backend in (b, ref):
        backend.prefill([prompt + cont], len(prompt) + len(cont) + 1)
        p = backend.begin([cont[-1]], Step(len(prompt) + len(cont)))
        h, cosines = backend.embed(p), []
        for i in range(backend.num_layers):
            h, pair = backend.layer(p, i, h, None, sub_blocks=True)
            cosines.append(pair[0])
        got.append(np.asarray(cosines))
    return float(np.abs(got[0] - got[1]).max())


def measure(subject: Subject, family: str, prompts: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    # against the kit's reference engine, hf
    b, ref = subject.backend(family), type(subject).registered("hf").backend(family)
    caps = b.capabilities
    worst = {f"{m} {part}": 0.0 for m in ("reference", "own order", "fused tail")
             for part in ("logits", "K/V")} | {"cosines": 0.0}

    def keep(name: str, value: float) -> None:
        worst[name] = max(worst[name], float(value))

    for _ in range(prompts):
        prompt = [1] + rng.integers(3, tiny.VOCAB, rng.integers(1, 25)).tolist()
        cont = rng.integers(3, tiny.VOCAB, rng.integers(1, 11)).tolist()
        for part, value in zip(("logits", "K/V"), reference_error(b, ref, prompt, cont)):
            keep(f"reference {part}", value)
        if caps.verify:
            for part, value in zip(("logits", "K/V"), own_order_error(b, prompt, cont)):
                keep(f"own order {part}", value)
        if caps.stand_in:
            for part, value in zip(("logits", "K/V"), fused_tail_error(b, prompt)):
                keep(f"fused tail {part}", value)
        if caps.sub_blocks:
            keep("cosines", cosine_error(b, ref, prompt, cont))
    return worst


def main(argv: list[str] | None = None) -> None:
    ap = parser("kit_margins", __doc__, model=False)
    ap.add_argument("--subject", default="ggml", help="a conformance subject (river plugins)")
    ap.add_argument("--prompts", type=int, default=40, help="per family")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default=None, help="default: kit-margins-SUBJECT")
    out, args = Harness.parse(ap, argv)
    # the kit needs the test extra's pytest and hypothesis, which --help does not
    from river_conformance.kit import Subject

    subject = Subject.registered(args.subject)
    precision = subject.precision
    rows = {family: measure(subject, family, args.prompts, args.seed)
            for family in tqdm(subject.families, desc="families")}
    measures = list(next(iter(rows.values())))
    worst = {m: max(r[m] for r in rows.values()) for m in measures}

    def bound(measure: str) -> float:   # "reference logits" -> the reference's bound
        return getattr(precision, MEASURES[measure.removesuffix(" logits").removesuffix(" K/V")])

    info = out.machine
    command = out.command
    lines = [f"# The conformance kit's bounds and the `{args.subject}` subject's errors", "",
             f"Command: `{command}`. Machine: {info['cpu']}, {info['cores']} cores. Precision "
             f"{precision.name}; {args.prompts} random prompts and continuations per family; "
             "relative errors (cosines: absolute); 0 where the subject does not declare the "
             "capability a measure needs.", "",
             "| measure | bound | largest | share of the bound | " +
             " | ".join(rows) + " |", "|---" * (4 + len(rows)) + "|"]
    for m in measures:
        lines.append(f"| {m} | {bound(m):g} | {worst[m]:.2e} | {worst[m] / bound(m):.0%} | "
                     + " | ".join(f"{rows[f][m]:.1e}" for f in rows) + " |")
    out.write(args.name or f"kit-margins-{args.subject}",
              {"command": command, "machine": info, "precision": precision.name,
               "bounds": {m: bound(m) for m in measures}, "families": rows, "largest": worst},
              "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
