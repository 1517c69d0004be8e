"""Random-weight GGUFs of the shapes users run, written as llama.cpp's converter writes them
(river_models.gguf_convention) in F16, ready for llama-quantize's types
(river_models.gguf_quantize): what decides which kernels run and which metadata a reader must
understand, without a download.

Two sizes a family:
- `real`: the published model's own shape, from its config.json on the hub (transcribed;
  nothing is downloaded): Qwen2.5-1.5B, Gemma-3-270M, Llama-3.2-1B... (the benchmark's);
- `small`: the family's quirks (its GQA ratio, head width, biases, norms, tying, rotary,
  windows) at widths that are multiples of 256, so K-quants apply to every row, in 2 layers
  (Gemma 3: 6, to hold a global layer after five sliding ones) and 512 tokens (the suite's).

Weights are drawn per tensor from (seed, name), so a file is the same on every machine:
embeddings N(0, 1), projections N(0, 1/in) (each block moves the residual stream about as much
as it holds), norms near 1, biases N(0, 0.5) (Qwen's large Q/K biases), an untied head
scaled to logits of a few units. The vocabulary is placeholder pieces: the models decode ids.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from .gguf_convention import ARCH, add_metadata, head_dim, rope_tensors, tensor_shapes

SIZES = ("small", "real")
# the published models each family's real shape stands for (their config.json)
HUB = {"llama": "meta-llama/Llama-2-7b-hf",
       "mistral": "mistralai/Mistral-7B-Instruct-v0.3",
       "llama3": "meta-llama/Llama-3.2-1B-Instruct", "qwen2": "Qwen/Qwen2.5-1.5B-Instruct",
       "qwen3": "Qwen/Qwen3-0.6B", "gemma3": "google/gemma-3-270m-it",
       "phi3": "microsoft/Phi-4-mini-instruct",
       "ministral3": "mistralai/Ministral-3-8B-Instruct-2512 (its text model)"}
LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=8192)
MINISTRAL3_ROPE = dict(rope_type="yarn", rope_theta=1000000.0, factor=16.0,
                       original_max_position_embeddings=16384, beta_fast=32.0, beta_slow=1.0,
                       mscale=1.0, mscale_all_dim=1.0, llama_4_scaling_beta=0.1)


def _phi4_rope(pairs: int) -> dict:
    """Phi-4-mini's LongRoPE (its factors' count and range; the values made up, smooth)."""
    ramp = np.linspace(0, 1, pairs)
    return dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.75,
                original_max_position_embeddings=4096,
                short_factor=(1 + 0.2 * ramp ** 2).tolist(),
                long_factor=(1 + 40 * ramp ** 3).tolist())


# family -> size -> the config's fields
SHAPES = {
    "llama": {"real": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                           num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                           max_position_embeddings=4096, rms_norm_eps=1e-5,
                           rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
              "small": dict(hidden_size=512, intermediate_size=1536, num_attention_heads=8,
                            num_key_value_heads=2)},
    "mistral": {"real": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                             num_attention_heads=32, num_key_value_heads=8, vocab_size=32768,
                             max_position_embeddings=32768, rms_norm_eps=1e-5,
                             rope_parameters=dict(rope_type="default", rope_theta=1e6)),
                "small": dict(hidden_size=512, intermediate_size=1792, num_attention_heads=8,
                              num_key_value_heads=2, sliding_window=16)},
    "llama3": {"real": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                            vocab_size=128256, max_position_embeddings=131072,
                            rms_norm_eps=1e-5, tie_word_embeddings=True,
                            rope_parameters=LLAMA3_ROPE),
               "small": dict(hidden_size=512, intermediate_size=2048, num_attention_heads=8,
                             num_key_value_heads=2, head_dim=64, tie_word_embeddings=True,
                             rope_parameters=LLAMA3_ROPE)},
    "qwen2": {"real": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                           num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                           max_position_embeddings=32768, rms_norm_eps=1e-6,
                           tie_word_embeddings=True,
                           rope_parameters=dict(rope_type="default", rope_theta=1e6)),
              "small": dict(hidden_size=768, intermediate_size=2048, num_attention_heads=12,
                            num_key_value_heads=2, tie_word_embeddings=True,
                            rope_parameters=dict(rope_type="default", rope_theta=1e6))},
    "qwen3": {"real": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                           num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                           vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
                           tie_word_embeddings=True,
                           rope_parameters=dict(rope_type="default", rope_theta=1e6)),
              "small": dict(hidden_size=512, intermediate_size=1536, num_attention_heads=8,
                            num_key_value_heads=4, head_dim=128, tie_word_embeddings=True,
                            rope_parameters=dict(rope_type="default", rope_theta=1e6))},
    "gemma3": {"real": dict(hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                            num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                            query_pre_attn_scalar=256, vocab_size=262144, sliding_window=512,
                            max_position_embeddings=32768, rms_norm_eps=1e-6),
               "small": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=6,
                             num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                             query_pre_attn_scalar=256, sliding_window=16,
                             tie_word_embeddings=True)},
    "phi3": {"real": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                          num_attention_heads=24, num_key_value_heads=8, vocab_size=200064,
                          max_position_embeddings=131072, original_max_position_embeddings=4096,
                          rms_norm_eps=1e-5, tie_word_embeddings=True, partial_rotary_factor=0.75,
                          sliding_window=262144, rope_parameters=_phi4_rope(48)),
             "small": dict(hidden_size=768, intermediate_size=2048, num_attention_heads=6,
                           num_key_value_heads=2, tie_word_embeddings=True,
                           max_position_embeddings=131072, original_max_position_embeddings=4096,
                           partial_rotary_factor=0.75, sliding_window=262144,
                           rope_parameters=_phi4_rope(48))},
    "ministral3": {"real": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=34,
                                num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                vocab_size=131072, max_position_embeddings=262144,
                                rms_norm_eps=1e-5, rope_parameters=MINISTRAL3_ROPE),
                   "small": dict(hidden_size=512, intermediate_size=1536,
                                 num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                                 max_position_embeddings=262144,
                                 rope_parameters=MINISTRAL3_ROPE)},
}
FAMILIES = tuple(SHAPES)
SMALL = dict(num_hidden_layers=2, vocab_size=512, max_position_embeddings=4096,
             rms_norm_eps=1e-6, tie_word_embeddings=False)
CONTEXT = 4096   # the context the files declare (a test's few tokens need no more)


def config(family: str, size: str):
    """The transformers config of `family` at `size` (SIZES)."""
    import transformers as t

    make = {"llama": t.LlamaConfig, "mistral": t.MistralConfig, "llama3": t.LlamaConfig,
            "qwen2": t.Qwen2Config, "qwen3": t.Qwen3Config, "gemma3": t.Gemma3TextConfig,
            "phi3": t.Phi3Config, "ministral3": t.Ministral3Config}[family]
    fields = dict(SHAPES[family][size]) if size == "real" else {**SMALL, **SHAPES[family][size]}
    if family == "gemma3":   # llama.cpp's pattern: five sliding layers, then one global
        fields["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                 for i in range(fields["num_hidden_layers"])]
    return make(**fields)


def _draw(seed: int, name: str, shape: tuple[int, ...], config) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if name.endswith("norm.weight"):
        return (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith(".bias"):
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    if name == "token_embd.weight":
        return rng.standard_normal(shape, np.float32) * np.float32(0.1)
    scale = 4 / config.hidden_size if name == "output.weight" else 1 / shape[-1]
    return (rng.standard_normal(shape, np.float32) * np.float32(scale ** 0.5))


def write(family: str, size: str, path: Path, seed: int = 0, text: bool = False) -> Path:
    """`family` at `size` as an F16 GGUF at `path` (2-D weights F16; norms, biases and rotary
    tensors F32, as the converter writes them), one tensor in memory at a time. Its
    vocabulary: placeholder pieces (the model decodes ids), or with `text` a byte-level BPE
    that spells any text (tiny_vocab's, padded to the model's width: for timings against
    llama.cpp's CLI on the same prompt)."""
    import gguf

    from .tiny_gguf import add_placeholder_vocabulary
    from .tiny_vocab import add_vocabulary

    cfg = config(family, size)
    shapes = tensor_shapes(family, cfg)
    rope = rope_tensors(family, cfg)
    w = gguf.GGUFWriter(path, ARCH[family])
    add_metadata(w, family, cfg, gguf.LlamaFileType.MOSTLY_F16,
                 min(CONTEXT, cfg.max_position_embeddings))
    if text:
        add_vocabulary(w, "bpe", ARCH[family], cfg.vocab_size)
    else:
        add_placeholder_vocabulary(w, [b"<unk>", b"<s>", b"</s>"]
                                   + [f"<{i}>".encode() for i in range(3, cfg.vocab_size)])
        w.add_eos_token_id(2)

    def tensor(name: str) -> np.ndarray:
        if name in rope:
            return rope[name]
        a = _draw(seed, name, shapes[name], cfg)
        return a.astype(np.float16) if a.ndim == 2 else a

    for name, shape in shapes.items():
        dtype = np.float16 if len(shape) == 2 and name not in rope else np.float32
        w.add_tensor_info(name, shape, np.dtype(dtype),
                          int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name in shapes:
        w.write_tensor_data(tensor(name))
    w.close()
    return path


def describe(family: str, size: str) -> str:
    """One line: the shape and what it stands for."""
    cfg = config(family, size)
    return (f"{family} {size}: {cfg.num_hidden_layers} layers, width {cfg.hidden_size}, "
            f"{cfg.num_attention_heads}/{cfg.num_key_value_heads} heads of {head_dim(cfg)}, "
            f"FFN {cfg.intermediate_size}, vocabulary {cfg.vocab_size}, "
            f"{'tied' if cfg.tie_word_embeddings else 'untied'}"
            + (f" ({HUB[family]})" if size == "real" else ""))
