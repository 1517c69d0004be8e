"""A random llama model written as a GGUF whose projections are in any ggml type, its rows 256
wide or more: the backbone of the tests and measurements of the stand-in types below 4 bits
(ggml's types below 4 bits quantize rows in super-blocks of 256), which no tiny family's
64-wide rows can take."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from river_models.gguf_quantize import quantized_rows

FLOATS = {"F32": np.float32, "F16": np.float16}
PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def random_gguf(path: Path, kind: str, hidden: int, intermediate: int, layers: int = 2,
                seed: int = 0) -> Path:
    """A random llama model (4 heads, the `spm` test vocabulary) with projections of ggml type
    `kind` (quantized by ggml itself), written at `path`."""
    import gguf

    from river_conformance.fixtures import tiny_vocab

    rng = np.random.default_rng(seed)
    vocab = len(tiny_vocab.vocabulary("spm", "llama")["tokens"])
    normal = lambda *shape: rng.standard_normal(shape).astype(np.float32) * 0.05
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(intermediate)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    tiny_vocab.add_vocabulary(w, "spm", "llama")
    w.add_tensor("token_embd.weight", normal(vocab, hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.add_tensor("output.weight", normal(vocab, hidden))
    for i in range(layers):
        for name in PROJECTIONS:
            shape = (intermediate, hidden) if name in ("ffn_gate", "ffn_up") else \
                (hidden, intermediate) if name == "ffn_down" else (hidden, hidden)
            weights = normal(*shape)
            if kind in FLOATS:
                w.add_tensor(f"blk.{i}.{name}.weight", weights.astype(FLOATS[kind]))
            else:
                w.add_tensor(f"blk.{i}.{name}.weight", quantized_rows(weights, kind),
                             raw_dtype=gguf.GGMLQuantizationType[kind])
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
