"""A tiny random Qwen2 model written as a GGUF file, for running the conformance kit on llama.cpp.

Qwen2 because llama.cpp rotates its heads like transformers (NeoX style), so the weights go in
unpermuted; float32 so both backends compute on the very same numbers. The kit feeds token ids;
the character vocabulary has no byte tokens, so llama.cpp cannot tokenize text with it.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np

FAMILY = "qwen2"


def _np(t) -> np.ndarray:
    return t.detach().float().cpu().numpy()


@functools.cache
def gguf_file(seed: int = 0) -> Path:
    import gguf

    from river_hf import tiny

    model = tiny.model(FAMILY, seed)
    c = model.config
    path = Path(tempfile.mkdtemp(prefix="river-llamacpp-")) / f"tiny-{FAMILY}-{seed}.gguf"
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = tiny.tokenizer().convert_ids_to_tokens(list(range(tiny.VOCAB)))
    w.add_tokenizer_model("llama")
    w.add_token_list([t.encode() for t in vocab])
    w.add_token_scores([0.0] * tiny.VOCAB)
    w.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (tiny.VOCAB - 3))
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id)
    inner = model.model
    w.add_tensor("token_embd.weight", _np(inner.embed_tokens.weight))
    w.add_tensor("output_norm.weight", _np(inner.norm.weight))
    w.add_tensor("output.weight", _np(model.lm_head.weight))
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
             "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    params = dict(model.named_parameters())
    for i in range(c.num_hidden_layers):
        for short, long in names.items():
            w.add_tensor(f"blk.{i}.{short}.weight", _np(params[f"model.layers.{i}.{long}.weight"]))
        for short in ("attn_q", "attn_k", "attn_v"):
            bias = params[f"model.layers.{i}.{names[short]}.bias"]
            w.add_tensor(f"blk.{i}.{short}.bias", _np(bias))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
