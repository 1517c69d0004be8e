"""Serving at scale, on paper: bytes per token of each exit profile for 135M, 1B and 8B shapes,
and how batching erodes what a per-token exit saves (docs/scaling.md).

    river bench scaling [--measure]

Weights as a serving engine holds them: the backbone in bf16, the river in 4-bit HQQ (4.5 bits
a weight with group-64 scales and zeros), the head in bf16, K/V in bf16. Exit profiles: the
exit histograms measured on the default model by `river bench oracle` (oracle.json in the
same results folder), mapped to other depths by the fraction of layers run (an assumption: no
larger model ran here); the lossless row prices a measured speculative round (lossless.json
there, from `river bench tasks --report`). Batch: B sequences decoding together, each
token's exit drawn independently from the profile; a backbone layer's weights are read once a
step if any row runs it, a stand-in's if any row left before it; every row reads its own K/V
in every layer (the river attends at every layer). --measure also times decode steps of the
model at batch 1, 2, 4 and 8 on this CPU (an engine's steps, hf unless --backend says, full
depth and the paper's rule; the first GSM8K train questions, one a row).
"""

from __future__ import annotations

import sys

import attrs
import numpy as np

from .library.output import Output, Harness, parser
from .library.prompts import GSM8K_TRAIN, gsm8k_questions


BF16, RIVER_BITS = 2, 4.5
DRAFTS = 4   # the lossless run's fixed draft length (lossless.json: lossless/fixed:-1/4)
RULE = "paper's rule"


@attrs.frozen
class Shape:
    """What a decode step reads of a Llama-shaped model, in parameters."""

    layers: int
    layer_params: int
    head_params: int
    kv_width: int   # K and V values a position holds in one layer

    @classmethod
    def llama(cls, layers, hidden, intermediate, heads, kv_heads, head_dim, vocab) -> "Shape":
        attention = hidden * head_dim * (2 * heads + 2 * kv_heads)   # q, o; k, v
        return cls(layers, attention + 3 * hidden * intermediate, vocab * hidden,
                   2 * kv_heads * head_dim)

    @property
    def layer_bytes(self) -> float:
        return self.layer_params * BF16

    @property
    def stand_in_bytes(self) -> float:
        return self.layer_params * RIVER_BITS / 8

    @property
    def head_bytes(self) -> float:
        return self.head_params * BF16

    def kv_bytes(self, positions: int) -> float:
        """K and V of `positions` positions in every layer."""
        return self.kv_width * BF16 * positions * self.layers


# layers, hidden, intermediate, heads, kv heads, head dim, vocabulary (their configs)
SHAPES = {"SmolLM2-135M": Shape.llama(30, 576, 1536, 9, 3, 64, 49152),
          "Llama-3.2-1B": Shape.llama(16, 2048, 8192, 32, 8, 64, 128256),
          "Llama-3.1-8B": Shape.llama(32, 4096, 14336, 32, 8, 128, 128256)}
BATCHES = (1, 4, 16, 64)
CONTEXTS = (512, 4096)


def runs_deep(histogram: np.ndarray, layers: int) -> np.ndarray:
    """Per layer of a `layers`-deep model: the chance a token runs its backbone, from a
    histogram over backbone layers run (0..L of the measured model), by depth fraction."""
    share = np.asarray(histogram, float) / np.sum(histogram)
    fraction = np.arange(len(share)) / (len(share) - 1)
    run = np.rint(fraction * layers).astype(int)   # backbone layers run, in this model
    return np.array([share[run > i].sum() for i in range(layers)])


def weight_bytes_per_step(shape: Shape, deep: np.ndarray, batch: int) -> float:
    """Expected weight bytes a decode step reads for `batch` rows exiting independently."""
    any_deep = 1 - (1 - deep) ** batch
    any_left = 1 - deep ** batch
    return float(np.sum(any_deep * shape.layer_bytes + any_left * shape.stand_in_bytes)
                 + shape.head_bytes)


def per_token(shape: Shape, deep: np.ndarray, batch: int, positions: int) -> float:
    return weight_bytes_per_step(shape, deep, batch) / batch + shape.kv_bytes(positions)


def profiles(out: Output) -> dict:
    """The exit profiles of the oracle and lossless results in the same results folder."""
    oracle = out.read("oracle", "oracle")["rows"]
    lossless = next(iter(out.read("lossless", "tasks --report RUN... --name lossless")
                         ["summary"].values()))
    n = len(oracle["oracle"]["histogram"]) - 1
    full = np.zeros(n + 1)
    full[-1] = 1
    quantized = np.zeros(n + 1)
    quantized[0] = 1
    return {"full depth": full,
            "paper's rule (settled 0.97)": np.array(oracle["settled:0.97"]["histogram"]),
            "oracle (shallowest exit keeping the top-1)": np.array(
                oracle["oracle"]["histogram"]),
            "whole model in 4 bits": quantized}, lossless["tokens_per_round"]


def table(shape: Shape, found: dict, tokens_per_round: float) -> list[dict]:
    rows = []
    for label, histogram in found.items():
        deep = runs_deep(histogram, shape.layers)
        for positions in CONTEXTS:
            rows.append({"profile": label, "positions": positions,
                         "mean_layers_run": float(deep.sum()),
                         "bytes": {b: per_token(shape, deep, b, positions) for b in BATCHES}})
    # lossless: per round DRAFTS stand-ins-only steps, then one full-depth pass verifying
    # them together (its weights and the context's K/V read once for all of them)
    only = runs_deep(found["whole model in 4 bits"], shape.layers)
    full = runs_deep(found["full depth"], shape.layers)
    for positions in CONTEXTS:
        rows.append({"profile": f"lossless ({DRAFTS} drafts, {tokens_per_round:.2f} tokens a "
                     "round)", "positions": positions, "mean_layers_run": None,
                     "bytes": {b: (DRAFTS * weight_bytes_per_step(shape, only, b) / b
                                   + weight_bytes_per_step(shape, full, b) / b
                                   + (DRAFTS + 1) * shape.kv_bytes(positions)) / tokens_per_round
                               for b in BATCHES}})
    return rows


def measure(model_path: str | None, batches=(1, 2, 4, 8), tokens: int = 24,
            backend: str = "hf") -> dict:
    from river_core import ExitConfig, GenerationConfig, RiverModel

    model = RiverModel.from_pretrained(model_path, backend=backend, progress=True)
    tok = model.backend.tokenizer
    questions = gsm8k_questions(GSM8K_TRAIN, max(batches))   # rows that exit differently
    prompts = [tok.encode(f"Question: {q}\nAnswer:") for q in questions]
    configs = {"full depth": ExitConfig(kv="full"), RULE: ExitConfig()}
    steps = {}
    for batch in batches:
        times = {label: [] for label in configs}
        for repeat in range(4):   # interleaved, the first round a warm-up
            for label, config in configs.items():
                result = model.generate_ids(prompts[:batch], config,
                                            GenerationConfig(max_new_tokens=tokens))
                if repeat:
                    times[label].append(np.median(result.step_seconds) * 1e3)
        steps[batch] = {label: float(np.median(t)) for label, t in times.items()}
        print(f"batch {batch}: {steps[batch]}", file=sys.stderr)
    return steps


def main(argv: list[str] | None = None) -> None:
    ap = parser("scaling", __doc__)
    ap.add_argument("--measure", action="store_true",
                    help="also time batched decode steps of the model on this CPU")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--backend", default="hf", help="the engine --measure times (default hf)")
    out, args = Harness.parse(ap, argv)
    info = out.machine
    found, tokens_per_round = profiles(out)
    command = out.command
    lines = ["# Serving at scale: bytes per token by exit profile and batch (on paper)", "",
             f"Command: `{command}`. Weights bf16, river 4-bit HQQ ({RIVER_BITS} bits a "
             "weight), K/V bf16. Exit profiles measured on SmolLM2-135M (oracle.json), mapped "
             "to the other depths by the fraction of layers run. Bytes are per generated token "
             "per sequence: a step's weights shared by the batch, each row's own K/V.", ""]
    payload = {"command": command, "machine": info, "shapes": {}}
    for name, shape in SHAPES.items():
        rows = table(shape, found, tokens_per_round)
        payload["shapes"][name] = {"shape": attrs.asdict(shape), "rows": rows}
        full = {(r["positions"]): r["bytes"] for r in rows if r["profile"] == "full depth"}
        lines += [f"## {name}: {shape.layers} layers, {shape.layer_bytes / 1e6:.1f} MB a layer "
                  f"(river {shape.stand_in_bytes / 1e6:.1f} MB), head "
                  f"{shape.head_bytes / 1e6:.0f} MB, K/V {shape.kv_bytes(1) / 1e3:.0f} KB a "
                  "position", "",
                  "| profile | context | layers run | " +
                  " | ".join(f"B={b}: MB/token (vs full)" for b in BATCHES) + " |",
                  "|---" * (3 + len(BATCHES)) + "|"]
        for r in rows:
            cells = [f"{r['bytes'][b] / 1e6:.2f} ({r['bytes'][b] / full[r['positions']][b]:.2f}x)"
                     for b in BATCHES]
            layers = "-" if r["mean_layers_run"] is None else f"{r['mean_layers_run']:.1f}"
            lines.append(f"| {r['profile']} | {r['positions']} | {layers} | "
                         + " | ".join(cells) + " |")
        lines.append("")
    if args.measure:
        measured = measure(args.model, tuple(args.batches), backend=args.backend)
        payload["measured_ms_per_step"] = measured
        lines += [f"## Measured here: decode step time against batch ({args.backend} engine, "
                  "default model)",
                  "", f"Machine: {info['cpu']}, {info['cores']} cores.", "",
                  "| batch | full depth ms/step | paper's rule ms/step | rule / full |",
                  "|---|---|---|---|"]
        for batch, t in measured.items():
            lines.append(f"| {batch} | {t['full depth']:.1f} | {t[RULE]:.1f} | "
                         f"{t[RULE] / t['full depth']:.2f} |")
    # another engine's measurement beside the hf one's
    name = "scaling" if args.backend == "hf" else f"scaling-{args.backend}"
    out.write(name, payload, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
