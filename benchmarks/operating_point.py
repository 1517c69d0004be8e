"""Speed at the paper's operating point: backbone, whole model at 4 bits, fixed exits, per layer.

    river bench operating_point --backend hf --model default
    river bench operating_point --backend onnx --model llama-1b-shape

`default` is the embedded SmolLM2-135M-Instruct; `llama-1b-shape` is a random-weight model of
Llama-3.2-1B's shape (16 layers, hidden 2048, MLP 8192, 32/8 heads, vocab 128256, tied
embeddings), built in code: only its speed means anything. Its stand-ins are quantized by RTN
(HQQ changes only the zero points, so the kernels and bytes are the same; RTN is faster to make
for 1B weights). Every configuration decodes the same random prompts, interleaved, after a
warm-up; median ms/token at batch 1. Beside each: the bytes a step reads (`footprint()`) over
the measured copy bandwidth, the physical limit, and the ideal speedup those bytes allow.
Per-layer costs cycle through all layers, so no layer's weights stay in the CPU caches.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from river_core import ExitConfig, GenerationConfig, QuantSpec, RiverModel, Step
from river_models import open_model, stand_ins
from river_models.spec import Checkpoint, LayerWeights, ModelSpec, Rotary, Weights

from .library.output import Output, parser
from .library.output import command as run_command
from .library.timing import machine

EXITS = (1, 3, 7)   # exit after these layers: 2, 4 and 8 backbone layers run


class NoText:
    """The random model has no vocabulary: it decodes token ids, never text."""

    eos_ids: frozenset = frozenset()


def llama_1b_shape(seed: int = 0) -> Checkpoint:
    rng = np.random.default_rng(seed)
    hidden, inter, heads, kv, hd, vocab, n = 2048, 8192, 32, 8, 64, 128256, 16
    w = lambda rows, cols: (rng.standard_normal((rows, cols), np.float32) * 0.02)
    layers = tuple(LayerWeights(
        input_norm=np.ones(hidden, np.float32), pre_mlp_norm=np.ones(hidden, np.float32),
        projections={"q": w(heads * hd, hidden), "k": w(kv * hd, hidden), "v": w(kv * hd, hidden),
                     "o": w(hidden, heads * hd), "gate": w(inter, hidden), "up": w(inter, hidden),
                     "down": w(hidden, inter)}) for _ in range(n))
    embed = w(vocab, hidden)
    inv_freq = tuple(float(f) for f in 1.0 / 500000.0 ** (np.arange(0, hd, 2) / hd))
    spec = ModelSpec(family="llama", num_layers=n, hidden=hidden, intermediate=inter,
                     heads=heads, kv_heads=kv, head_dim=hd, vocab=vocab, max_positions=4096,
                     eos_ids=(), windows=(None,) * n, rope_keys=("",) * n,
                     rotary={"": Rotary(inv_freq)}, norm_eps=1e-5, attn_scale=hd ** -0.5)
    return Checkpoint("llama-1b-shape", f"random{seed}", spec,
                      Weights(embed, np.ones(hidden, np.float32), embed, layers), NoText())


def backends(name: str, model: str | None, shape: str | None, quant: QuantSpec,
             dtypes: list[str]) -> dict:
    """dtype -> backend over the chosen model (a random one of `shape`, if given)."""
    if shape is None:
        checkpoint = open_model(model, progress=True)
    else:
        checkpoint = llama_1b_shape()
        quant = QuantSpec(bits=quant.bits, group_size=quant.group_size, method="rtn")
    quantized = stand_ins(checkpoint, quant, progress=True, cache=shape is None)
    if name == "hf":
        import torch

        from river_hf.backend import HFBackend

        return {d: HFBackend(checkpoint, quantized, getattr(torch, d)) for d in dtypes}
    from river_onnx.backend import OnnxBackend
    from river_onnx.export import export_model

    folder = Path(tempfile.mkdtemp(prefix="river-operating-point-"))
    manifest = export_model(checkpoint, quantized, folder, progress=True)
    return {"float32": OnnxBackend(folder, manifest, checkpoint.tokenizer)}


def layer_costs(backend, repeats: int) -> tuple[float, float]:
    """Median µs of a backbone layer and of a stand-in layer, one decoding token, cycling
    through all layers (cold caches, as in a real step)."""
    n = backend.num_layers
    backend.prefill([[1] * 64], 65)
    h = backend.embed([5], Step(64))
    costs = {"layer": [], "stand_in_layer": []}
    for _ in range(repeats):
        for kind in costs:
            run = getattr(backend, kind)
            start = time.perf_counter()
            for i in range(n):
                run(i, h, None)
            costs[kind].append((time.perf_counter() - start) / n * 1e6)
    return float(np.median(costs["layer"])), float(np.median(costs["stand_in_layer"]))


def main(argv: list[str] | None = None) -> None:
    ap = parser("operating_point", __doc__)
    ap.add_argument("--backend", default="hf", choices=["hf", "onnx"])
    ap.add_argument("--shape", choices=["llama-1b-shape"],
                    help="a random model of this shape instead of --model")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--bf16", action="store_true", help="hf: time the backbone in bfloat16 too")
    ap.add_argument("--name", default=None)
    args = ap.parse_args(argv)
    out = Output(args)
    info = machine()
    bandwidth = info["memory_bandwidth_gb_s"] * 1e9
    dtypes = ["float32", "bfloat16"] if args.bf16 and args.backend == "hf" else ["float32"]
    made = backends(args.backend, args.model, args.shape, QuantSpec(), dtypes)
    main_backend = made["float32"]
    n = main_backend.num_layers
    configs = {"full": ExitConfig(kv="full"),
               "whole model 4-bit": ExitConfig(policy="fixed", options={"layer": -1}),
               **{f"exit after {k + 1} layers": ExitConfig(policy="fixed", options={"layer": k})
                  for k in EXITS if k < n - 1}}
    runs = [(label, "float32", c) for label, c in configs.items()] + \
        [("full (bfloat16 backbone)", d, configs["full"]) for d in dtypes if d != "float32"]
    rng = np.random.default_rng(1)
    vocab = min(1000, main_backend.spec.vocab)
    prompts = [rng.integers(3, vocab, args.prompt_tokens).tolist() for _ in range(args.prompts)]
    gen = GenerationConfig(max_new_tokens=args.tokens)
    models = {d: RiverModel(b) for d, b in made.items()}
    steps = {label: [] for label, _, _ in runs}
    exits = {label: [] for label, _, _ in runs}
    for label, d, c in runs:   # warm-up
        models[d].generate_ids([prompts[0][:16]], c, GenerationConfig(max_new_tokens=4))
    for p, prompt in enumerate(tqdm(prompts, desc="prompts")):
        for label, d, c in runs[p % len(runs):] + runs[:p % len(runs)]:
            result = models[d].generate_ids([prompt], c, gen)
            steps[label] += result.step_seconds
            exits[label] += result.exit_layers[0]
    positions = args.prompt_tokens + args.tokens / 2
    backbone_us, stand_in_us = layer_costs(main_backend, 5)
    rows = {}
    for label, d, _ in runs:
        k = int(np.median(exits[label]))
        nbytes = made[d].footprint().bytes_per_token(k, positions, "stand_in")
        rows[label] = {"ms_per_token": float(np.median(steps[label])) * 1e3,
                       "layers_run": k + 1, "bytes_per_token": nbytes,
                       "limit_ms_per_token": nbytes / bandwidth * 1e3}
    base = rows["full"]
    for r in rows.values():
        r["speedup"] = base["ms_per_token"] / r["ms_per_token"]
        r["ideal_speedup_from_bytes"] = base["bytes_per_token"] / r["bytes_per_token"]
        r["share_of_ideal"] = r["speedup"] / r["ideal_speedup_from_bytes"]
        r["share_of_limit"] = r["limit_ms_per_token"] / r["ms_per_token"]
    label = args.shape or ("default" if args.model is None else "model")
    name = args.name or f"operating-point-{args.backend}-{label}"
    command = run_command("operating_point", argv)
    lines = [f"# Operating point: {args.shape or args.model or 'the embedded model'}, "
             f"{args.backend} backend, {n} layers", "",
             f"Command: `{command}`. Machine: {info['cpu']}, {info['cores']} cores, copy "
             f"bandwidth {info['memory_bandwidth_gb_s']} GB/s.", "",
             f"Per layer, one decoding token, all layers in turn: backbone {backbone_us:.0f} µs, "
             f"stand-in (4-bit) {stand_in_us:.0f} µs = {stand_in_us / backbone_us:.2f}x.", "",
             "| config | layers run | ms/token | speedup | limit ms/token (share reached) | "
             "ideal speedup from bytes | share of ideal |", "|---|---|---|---|---|---|---|"]
    for label, r in rows.items():
        lines.append(f"| {label} | {r['layers_run']} | {r['ms_per_token']:.1f} | "
                     f"{r['speedup']:.2f}x | {r['limit_ms_per_token']:.1f} "
                     f"({100 * r['share_of_limit']:.0f}%) | {r['ideal_speedup_from_bytes']:.2f}x | "
                     f"{r['share_of_ideal']:.2f} |")
    out.write(name, {"machine": info, "command": command, "backbone_layer_us": backbone_us,
                 "stand_in_layer_us": stand_in_us, "results": rows}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
