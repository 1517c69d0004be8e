"""A tiny random Qwen2 model written as a GGUF file, for running the conformance kit on llama.cpp.

Qwen2 because llama.cpp rotates its heads like transformers (NeoX style), so the weights go in
unpermuted; float32 so both backends compute on the very same numbers. The kit feeds token ids;
the character vocabulary has no byte tokens, so llama.cpp cannot tokenize text with it.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

FAMILY = "qwen2"


@functools.cache
def gguf_file(seed: int = 0) -> Path:
    import gguf

    from river_models import tiny

    ckpt = tiny.checkpoint(FAMILY, seed)
    spec, weights = ckpt.spec, ckpt.weights
    path = Path(tempfile.mkdtemp(prefix="river-llamacpp-")) / f"tiny-{FAMILY}-{seed}.gguf"
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_context_length(spec.max_positions)
    w.add_embedding_length(spec.hidden)
    w.add_block_count(spec.num_layers)
    w.add_feed_forward_length(spec.intermediate)
    w.add_head_count(spec.heads)
    w.add_head_count_kv(spec.kv_heads)
    w.add_rope_freq_base(float(tiny.model(FAMILY, seed).config.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(spec.norm_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = tiny.tokenizer().convert_ids_to_tokens(list(range(tiny.VOCAB)))
    w.add_tokenizer_model("llama")
    w.add_token_list([t.encode() for t in vocab])
    w.add_token_scores([0.0] * tiny.VOCAB)
    w.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (tiny.VOCAB - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(spec.eos_ids[0])
    w.add_tensor("token_embd.weight", weights.embed)
    w.add_tensor("output_norm.weight", weights.final_norm)
    w.add_tensor("output.weight", weights.head)
    names = {"attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o", "ffn_gate": "gate",
             "ffn_up": "up", "ffn_down": "down"}
    for i, layer in enumerate(weights.layers):
        for short, role in names.items():
            w.add_tensor(f"blk.{i}.{short}.weight", layer.projections[role])
        for short in ("attn_q", "attn_k", "attn_v"):
            w.add_tensor(f"blk.{i}.{short}.bias", layer.biases[names[short]])
        w.add_tensor(f"blk.{i}.attn_norm.weight", layer.input_norm)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", layer.pre_mlp_norm)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
