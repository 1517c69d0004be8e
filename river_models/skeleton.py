"""The decoder layer's residual structure, written once for every engine (torch, ONNX, ggml,
vLLM, the example): the engine supplies its ops, as llama.cpp's `build_*` helpers; what the
projections, rotary and attention are stays in each engine."""

from __future__ import annotations

import operator

NORMS = ("input_norm", "post_attn_norm", "pre_mlp_norm", "post_mlp_norm")


def decoder_layer(x, norms, attention, mlp, add=operator.add):
    """(out, mid) of one layer on x. `norms`: the (input, post-attention, pre-MLP, post-MLP)
    norms as callables, the sandwich ones (Gemma) None where the model has none; `attention`
    and `mlp` map a normed state to the sub-block's output; `add` the residual add. `mid` is
    the state between the attention and MLP sub-blocks (what the paper's exit rule reads)."""
    input_norm, post_attn_norm, pre_mlp_norm, post_mlp_norm = norms
    a = attention(input_norm(x))
    if post_attn_norm is not None:
        a = post_attn_norm(a)
    mid = add(x, a)
    m = mlp(pre_mlp_norm(mid))
    if post_mlp_norm is not None:
        m = post_mlp_norm(m)
    return add(mid, m), mid


def norms_of(layer, norm) -> tuple:
    """`layer`'s norm weights (attributes `NORMS`, None where absent) as the callables
    `decoder_layer` takes: h -> norm(h, weight)."""
    return tuple(None if (w := getattr(layer, name)) is None else
                 (lambda h, w=w: norm(h, w)) for name in NORMS)
