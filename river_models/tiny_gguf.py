"""Tiny random models written as GGUF files as llama.cpp's converter writes them
(river_models.gguf_convention: its keys, the ones it leaves out, its tensors' layout).

One per tiny family. The default one runs the conformance kit on llama.cpp; all of them run it
on the ggml engine. Q and K rows go in permuted where llama.cpp rotates the normal way, as the
converter writes them, norms scaling by 1 + w as 1 + w. Some check River's GGUF reader on the
header fields and tensors transformers' GGUF loader drops (a partial rotary, LongRoPE's
factors, Llama 3's rope frequency factors: each family's `Gguf.restore`). Float32, so readers
compute on the very same numbers. The kit feeds token ids; the character vocabulary has no
byte tokens, so llama.cpp cannot tokenize text with it.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from .families import BY_NAME
from .gguf_convention import add_dimensions, add_metadata, rope_tensors

FAMILY = "qwen2"   # the default: the first family llama.cpp and transformers agreed on
SEPARATE = {"attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o", "ffn_gate": "gate",
            "ffn_up": "up", "ffn_down": "down"}


def permuted(w: np.ndarray, heads: int) -> np.ndarray:
    """Q and K rows as llama.cpp stores them where it rotates the normal way: each head's
    rotary halves interleaved (its converter's permutation, which transformers' GGUF loader
    undoes)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def projections(family: str, spec, p, permute=permuted, fuse=np.concatenate) -> dict:
    """A layer's projections `p` (by role) under the GGUF's names, as llama.cpp's converter
    stores them: fused or not, Q and K rows permuted or not, as the family's are. `permute` and
    `fuse` do it to whatever `p` holds (arrays; the ggml engine's quantized weights)."""
    record = BY_NAME[family]
    if record.fused:   # q, k, v fused, gate and up fused
        tensors = {"attn_qkv": fuse([p["q"], p["k"], p["v"]]), "attn_output": p["o"],
                   "ffn_up": fuse([p["gate"], p["up"]]), "ffn_down": p["down"]}
    else:
        tensors = {short: p[role] for short, role in SEPARATE.items()}
    if not record.gguf.neox:
        tensors["attn_q"] = permute(p["q"], spec.heads)
        tensors["attn_k"] = permute(p["k"], spec.kv_heads)
    return {f"{k}.weight": v for k, v in tensors.items()}


def _layer_tensors(family: str, spec, layer) -> dict[str, np.ndarray]:
    biases = {f"{short}.bias": layer.biases[SEPARATE[short]]
              for short in ("attn_q", "attn_k", "attn_v") if SEPARATE[short] in layer.biases}
    norms = {"attn_norm": layer.input_norm, "ffn_norm": layer.pre_mlp_norm,
             "attn_q_norm": layer.q_norm, "attn_k_norm": layer.k_norm,
             "post_attention_norm": layer.post_attn_norm, "post_ffw_norm": layer.post_mlp_norm}
    return {**projections(family, spec, layer.projections), **biases,
            **{f"{k}.weight": spec.norm_scale(v) for k, v in norms.items() if v is not None}}


def add_shape(w, spec, context: int, tokens: list[bytes] | None, file_type) -> None:
    """A Llama decoder's dimensions (from its ModelSpec) and a placeholder vocabulary of
    `tokens` (None: none) in GGUF writer `w` (the benchmarks' random shapes, which have no
    transformers config)."""
    shape = SimpleNamespace(hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                            num_hidden_layers=spec.num_layers, num_attention_heads=spec.heads,
                            num_key_value_heads=spec.kv_heads, rms_norm_eps=spec.norm_eps)
    add_dimensions(w, shape, context, file_type)
    if tokens is not None:
        add_placeholder_vocabulary(w, tokens)


def add_placeholder_vocabulary(w, tokens: list[bytes]) -> None:
    """A SentencePiece-style vocabulary of `tokens` (the first three control tokens, BOS 1),
    as llama.cpp's converter writes one: what llama.cpp needs to load a model it is given ids
    for."""
    import gguf

    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([gguf.TokenType.CONTROL] * 3
                      + [gguf.TokenType.NORMAL] * (len(tokens) - 3))
    w.add_bos_token_id(1)


@functools.cache
def gguf_file(seed: int = 0, family: str = FAMILY, vocabulary: str | None = None) -> Path:
    """`vocabulary`: one of tiny_vocab's real-shaped vocabularies (spm, bpe) instead of the
    placeholder (for tokenizer tests: the model's ids then go past it)."""
    import gguf

    from river_models import tiny, tiny_vocab

    ckpt = tiny.checkpoint(family, seed)
    spec, weights = ckpt.spec, ckpt.weights
    config = tiny.model(family, seed).config
    name = f"tiny-{family}-{seed}" + (f"-{vocabulary}" if vocabulary else "")
    path = Path(tempfile.mkdtemp(prefix="river-llamacpp-")) / f"{name}.gguf"
    w = gguf.GGUFWriter(path, BY_NAME[family].gguf.arch)
    add_metadata(w, family, config, gguf.LlamaFileType.ALL_F32)
    if vocabulary:
        tiny_vocab.add_vocabulary(w, vocabulary, BY_NAME[family].gguf.tokenizer)
    else:
        vocab = tiny.tokenizer().convert_ids_to_tokens(list(range(tiny.VOCAB)))
        add_placeholder_vocabulary(w, [t.encode() for t in vocab])
        w.add_eos_token_id(spec.eos_ids[0])
    w.add_tensor("token_embd.weight", weights.embed)
    for name, tensor in rope_tensors(family, config).items():
        w.add_tensor(name, tensor)
    w.add_tensor("output_norm.weight", spec.norm_scale(weights.final_norm))
    if weights.head is not weights.embed:   # tied: llama.cpp's converter writes no output
        w.add_tensor("output.weight", weights.head)
    for i, layer in enumerate(weights.layers):
        for name, tensor in _layer_tensors(family, spec, layer).items():
            w.add_tensor(f"blk.{i}.{name}", tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
