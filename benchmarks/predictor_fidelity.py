"""How well exit scores track the real stand-in K/V error of exiting, on the embedded model.

    river bench predictor_fidelity --prompts 4 --tokens 24

For each decoded token (greedy, full depth) and each candidate exit layer k, the token's exit
river is run from h_k and the real cumulative error sum_{j>k} rel_err(K/V_j river, K/V_j full)
is measured in the cache slot; then the full-depth K/V is put back. Two scores are compared
with it: the `transition` predictor's E(k) (the `similarity` policy), and the paper's rule's
1 - min(attention, MLP sub-block cosine) at layer k (the `settled` policy; it exits when that
falls below 1 - tau). Reports Pearson and Spearman correlation over all (token, k), within
tokens, and across tokens at a fixed k (what tells tokens apart).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from river_core import QuantSpec, RiverModel, Step
from river_core.method.predictor import TransitionPredictor
from river_core.method.predictor import relative_error

from .library.output import Harness, parser, plot_file
from .library.measures import pearson, spearman
from .library.prompts import GSM8K_TRAIN, gsm8k_questions

if TYPE_CHECKING:
    import torch


def rel(a: "torch.Tensor", b: "torch.Tensor") -> float:
    return relative_error(a.float().cpu().numpy(), b.float().cpu().numpy())


def across_tokens(predicted, measured, per_token: int) -> float:
    """For each exit layer k: do tokens with larger predicted error have larger real error?"""
    p = np.array(predicted).reshape(-1, per_token)
    m = np.array(measured).reshape(-1, per_token)
    return float(np.nanmean([spearman(p[:, k], m[:, k]) for k in range(per_token)]))


def main(argv: list[str] | None = None) -> None:
    ap = parser("predictor_fidelity", __doc__)
    ap.add_argument("--data", type=Path, default=GSM8K_TRAIN)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--bits", type=int, default=4)
    out, args = Harness.parse(ap, argv)
    import torch   # the hf extra's, which --help does not need

    model = RiverModel.from_pretrained(args.model, quant=QuantSpec(bits=args.bits),
                                       progress=True)
    b = model.backend
    n = b.num_layers
    predicted, measured, token_corr, settled, cosines = [], [], [], [], []
    for q in tqdm(gsm8k_questions(args.data, args.prompts), desc="prompts", file=sys.stderr):
        ids = b.tokenizer.chat(q)
        pre = b.prefill([ids], len(ids) + args.tokens + 1)
        p = TransitionPredictor(b.stand_in_error, pre.similarity[0])
        token = int(pre.logits[0].argmax())
        with torch.inference_mode():
            for t in range(args.tokens):
                pos = len(ids) + t
                step = b.begin([token], Step(pos))
                h = b.embed(step)
                states, pred, moved = [], [], []
                for i in range(n):
                    after, sub_blocks = b.layer(step, i, h, None, sub_blocks=True)
                    moved.append(1 - float(min(sub_blocks[0])))
                    p.observe(i, b.similarity(step, h, after, None)[0])
                    pred.append(p.predicted_error(i))
                    h = after
                    states.append(h)
                p.end_token()
                cache = b.cache
                full_kv = [(cache.k[j, :, :, pos].clone(), cache.v[j, :, :, pos].clone())
                           for j in range(n)]
                real = []
                for k in range(n - 1):
                    x, total = states[k], 0.0
                    for j in range(k + 1, n):
                        x = b.stand_in_layer(step, j, x, None)
                        total += max(rel(cache.k[j, :, :, pos], full_kv[j][0]),
                                     rel(cache.v[j, :, :, pos], full_kv[j][1]))
                    real.append(total)
                for j, (k_, v_) in enumerate(full_kv):
                    cache.k[j, :, :, pos], cache.v[j, :, :, pos] = k_, v_
                token = int(b.logits(h)[0].argmax())
                predicted += pred[:-1]
                settled += moved[:-1]
                cosines.append([1 - m for m in moved])
                measured += real
                token_corr.append(spearman(pred[:-1], real))
    info = out.machine
    result = {"pearson": pearson(predicted, measured), "spearman": spearman(predicted, measured),
              "mean_within_token_spearman": float(np.mean(token_corr)),
              "mean_across_token_spearman_at_fixed_k": across_tokens(predicted, measured, n - 1),
              "median_measured_over_predicted": float(np.median(np.array(measured)
                                                                 / np.array(predicted))),
              "settled_score_across_token_spearman_at_fixed_k":
                  across_tokens(settled, measured, n - 1),
              "settled_score_across_token_spearman_k_1_to_4":
                  across_tokens(np.array(settled).reshape(-1, n - 1)[:, 1:5].ravel(),
                                np.array(measured).reshape(-1, n - 1)[:, 1:5].ravel(), 4),
              "predictor_across_token_spearman_k_1_to_4":
                  across_tokens(np.array(predicted).reshape(-1, n - 1)[:, 1:5].ravel(),
                                np.array(measured).reshape(-1, n - 1)[:, 1:5].ravel(), 4),
              "median_min_sub_block_cosine_per_layer":
                  [round(float(c), 3) for c in np.median(cosines, axis=0)],
              "samples": len(predicted)}
    try:
        plt, save = plot_file(out, "predictor-fidelity")
        fig, ax = plt.subplots(figsize=(5, 4))
        ax.scatter(measured, predicted, s=4, alpha=0.4)
        ax.set_xlabel("measured cumulative stand-in K/V error")
        ax.set_ylabel("predicted E(k)")
        ax.set_title(f"int{args.bits} stand-ins, {args.model or 'SmolLM2-135M'}, Spearman "
                     f"{result['spearman']:.2f}")
        save(fig)
        plot = "\n![predicted vs measured](predictor-fidelity.png)\n"
    except ImportError:
        plot = "\n(install the `bench` extra for the plot)\n"
    md = (f"# Exit scores against the real K/V error, int{args.bits} stand-ins, "
          f"{args.model or 'the embedded SmolLM2-135M-Instruct'}\n\n"
          f"Command: `{out.command}`. Machine: {info['cpu']}, "
          f"{info['cores']} cores.\n\n| measure | value |\n|---|---|\n"
          f"| Pearson, all (token, k) | {result['pearson']:.3f} |\n"
          f"| Spearman, all (token, k) | {result['spearman']:.3f} |\n"
          f"| Spearman within a token, mean (both fall with k) | "
          f"{result['mean_within_token_spearman']:.3f} |\n"
          f"| Spearman across tokens at a fixed k, mean over k | "
          f"{result['mean_across_token_spearman_at_fixed_k']:.3f} |\n"
          f"| median measured / predicted | {result['median_measured_over_predicted']:.2f} |\n"
          f"| E(k), Spearman across tokens at k = 1..4 | "
          f"{result['predictor_across_token_spearman_k_1_to_4']:.3f} |\n"
          f"| paper's score 1 - min sub-block cos, across tokens at a fixed k, mean over k | "
          f"{result['settled_score_across_token_spearman_at_fixed_k']:.3f} |\n"
          f"| paper's score, across tokens at k = 1..4 | "
          f"{result['settled_score_across_token_spearman_k_1_to_4']:.3f} |\n"
          f"| samples | {result['samples']} |\n\n"
          f"Median over tokens of min(attention, MLP sub-block cosine), layer 0 to "
          f"{n - 1}: {', '.join(map(str, result['median_min_sub_block_cosine_per_layer']))}.\n"
          + plot)
    out.write("predictor-fidelity", {"machine": info, "args": vars(args) | {"data": str(args.data)},
                                  "result": result}, md)


if __name__ == "__main__":
    main()
