"""Random-weight GGUFs of the shapes users run, written as llama.cpp's converter writes them
(river_models.gguf_convention) in F16, ready for llama-quantize's types
(river_models.gguf_quantize): what decides which kernels run and which metadata a reader must
understand, without a download.

Two sizes a family:
- `real`: the published model's own shape, from its config.json on the hub (transcribed;
  nothing is downloaded; the record's `real_shape`);
- `small`: the family's quirks (its GQA ratio, head width, biases, norms, tying, rotary,
  windows) at widths that are multiples of 256, so K-quants apply to every row, in 2 layers
  (or the family's own count) and 512 tokens (the suite's).
Both are each family's record's (`Family.real`, `.small`, `.hub`: river_models.families).

Weights are drawn per tensor from (seed, name), so a file is the same on every machine:
embeddings N(0, 1), projections N(0, 1/in) (each block moves the residual stream about as much
as it holds), norms near 1, biases N(0, 0.5) (Qwen's large Q/K biases), an untied head
scaled to logits of a few units. The vocabulary is placeholder pieces: the models decode ids.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from .families import BY_NAME
from .gguf_convention import add_metadata, head_dim, rope_tensors, tensor_shapes

SIZES = ("small", "real")
FAMILIES = tuple(BY_NAME)
SMALL = dict(num_hidden_layers=2, vocab_size=512, max_position_embeddings=4096,
             rms_norm_eps=1e-6, tie_word_embeddings=False)
CONTEXT = 4096   # the context the files declare (a test's few tokens need no more)


def config(family: str, size: str):
    """The transformers config of `family` at `size` (SIZES)."""
    import transformers

    record = BY_NAME[family]
    fields = dict(record.real) if size == "real" else {**SMALL, **record.small}
    period = record.gguf.sliding_period
    if period:   # llama.cpp's pattern, which no file holds
        fields["layer_types"] = ["sliding_attention" if i % period < period - 1
                                 else "full_attention" for i in range(fields["num_hidden_layers"])]
    return getattr(transformers, record.config_class)(**fields)


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
    w = gguf.GGUFWriter(path, BY_NAME[family].gguf.arch)
    add_metadata(w, family, cfg, gguf.LlamaFileType.MOSTLY_F16,
                 min(CONTEXT, cfg.max_position_embeddings))
    if text:
        add_vocabulary(w, "bpe", BY_NAME[family].gguf.tokenizer, cfg.vocab_size)
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
            + (f" ({BY_NAME[family].hub})" if size == "real" else ""))
