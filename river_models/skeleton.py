"""A decoder layer's residual structure, written once for every engine over the engine's
ops (as llama.cpp's `build_*` helpers); projections, rotary and attention stay the engine's."""

import operator


def decoder_layer(x, norms, attention, mlp, add=operator.add):
    """(out, mid) of one layer on x, mid the state between attention and MLP (what the exit
    rule reads). `norms`: callables (input, post-attention, pre-MLP, post-MLP), the sandwich
    ones (Gemma's) None where absent; `attention`, `mlp`: a normed state to its sub-block's
    output."""
    input_norm, post_attn_norm, pre_mlp_norm, post_mlp_norm = norms
    a = attention(input_norm(x))
    mid = add(x, a if post_attn_norm is None else post_attn_norm(a))
    m = mlp(pre_mlp_norm(mid))
    return add(mid, m if post_mlp_norm is None else post_mlp_norm(m)), mid


def norms_of(layer, norm) -> tuple:
    """`layer`'s norm weights (None where absent) as `decoder_layer`'s norms: h -> norm(h, w)."""
    return tuple(None if (w := getattr(layer, name)) is None else (lambda h, w=w: norm(h, w))
                 for name in ("input_norm", "post_attn_norm", "pre_mlp_norm", "post_mlp_norm"))
