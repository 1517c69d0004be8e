"""A GGUF's weights as River's float32 `Checkpoint`, dequantized by gguf-py (not by ggml): the
reference River's engines on the file are checked against (its torch engine computes on it in
float32). The converter's layout is undone: Q/K rows un-permuted where llama.cpp rotates the
normal way, norms back to w where the file holds 1 + w, fused projections split; the spec is
the file's own (gguf_spec, checked against transformers' reading in tests/test_gguf_spec.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .families import BY_ARCH
from .gguf_header import read_header
from .gguf_spec import gguf_spec
from .spec import Checkpoint, LayerWeights, Weights

NAMES = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate",
         "up": "ffn_up", "down": "ffn_down"}


def unpermuted(w: np.ndarray, heads: int) -> np.ndarray:
    """The converter's Q/K permutation undone (tiny_gguf.permuted's inverse)."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


class _Tensors:
    def __init__(self, path: Path) -> None:
        from gguf import GGUFReader

        self._tensors = {t.name: t for t in GGUFReader(path).tensors}

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def __getitem__(self, name: str) -> np.ndarray:
        from gguf.quants import dequantize

        t = self._tensors[name]
        shape = tuple(int(d) for d in reversed(t.shape))
        return dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)


def checkpoint(path: Path, tokenizer=None) -> Checkpoint:
    """The GGUF at `path` in float32, read tensor by tensor."""
    path = Path(path)
    spec = gguf_spec(path, read_header(path))
    arch = read_header(path).metadata["general.architecture"]
    t = _Tensors(path)
    raw = lambda w: w - np.float32(1) if spec.norm_offset else w   # Weights hold raw norms
    optional = lambda name: raw(t[name]) if name in t else None

    def layer(i: int) -> LayerWeights:
        p = f"blk.{i}."
        if p + "attn_qkv.weight" in t:   # q, k, v fused and gate, up fused
            q, kv = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
            qkv, gate_up = t[p + "attn_qkv.weight"], t[p + "ffn_up.weight"]
            projections = {"q": qkv[:q], "k": qkv[q:q + kv], "v": qkv[q + kv:],
                           "o": t[p + "attn_output.weight"], "gate": gate_up[:len(gate_up) // 2],
                           "up": gate_up[len(gate_up) // 2:], "down": t[p + "ffn_down.weight"]}
        else:
            projections = {role: t[f"{p}{name}.weight"] for role, name in NAMES.items()}
        if not BY_ARCH[arch].gguf.neox:
            projections["q"] = unpermuted(projections["q"], spec.heads)
            projections["k"] = unpermuted(projections["k"], spec.kv_heads)
        biases = {role: t[f"{p}attn_{role}.bias"] for role in "qkv"
                  if f"{p}attn_{role}.bias" in t}
        return LayerWeights(
            input_norm=raw(t[p + "attn_norm.weight"]), pre_mlp_norm=raw(t[p + "ffn_norm.weight"]),
            projections=projections, biases=biases,
            post_attn_norm=optional(p + "post_attention_norm.weight"),
            post_mlp_norm=optional(p + "post_ffw_norm.weight"),
            q_norm=optional(p + "attn_q_norm.weight"), k_norm=optional(p + "attn_k_norm.weight"))

    embed = t["token_embd.weight"]
    head = t["output.weight"] if "output.weight" in t else embed
    weights = Weights(embed, raw(t["output_norm.weight"]), head,
                      tuple(layer(i) for i in range(spec.num_layers)))
    return Checkpoint(path.stem, "gguf-float32", spec, weights, tokenizer, path)
