"""GGUF files River writes: the embedded model's tensors stored in another ggml type (what
llama.cpp and the ggml engine run as the backbone of the 4-bit embedded file)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .cache import cache_root, cached, content_key, digest

FORMAT = 1   # bump when the written file changes


def write_gguf(source: Path, target: Path, kind: str, progress: bool = False) -> Path:
    """`source`'s metadata and tokenizer with every tensor dequantized and stored as `kind`
    (F32, F16 or Q8_0; vectors stay F32, as llama.cpp's converter keeps them)."""
    from tqdm import tqdm

    from gguf import GGMLQuantizationType as Q, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.constants import LlamaFileType
    from gguf.quants import dequantize, quantize

    if target.is_file():
        return target
    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    writer = GGUFWriter(partial, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture",
                                                              "general.file_type"):
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    writer.add_file_type({"F32": LlamaFileType.ALL_F32, "F16": LlamaFileType.MOSTLY_F16,
                          "Q8_0": LlamaFileType.MOSTLY_Q8_0}[kind])
    for tensor in tqdm(reader.tensors, desc=f"{source.stem} as {kind}", unit="tensor",
                       disable=not progress):
        weights = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if weights.ndim == 1 or kind == "F32":
            writer.add_tensor(tensor.name, weights)
        elif kind == "F16":
            writer.add_tensor(tensor.name, weights.astype(np.float16))
        else:
            writer.add_tensor(tensor.name, quantize(weights, Q.Q8_0), raw_dtype=Q.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(target)
    return target


def backbone(source: Path, kind: str = "F16", progress: bool = False) -> Path:
    """`source` stored as `kind`, written once into the user cache."""
    key = digest(content_key(source), FORMAT, kind)
    target = cache_root() / "gguf" / f"{source.stem}.{kind}-{key}"
    cached(target, lambda tmp: write_gguf(source, tmp / f"{source.stem}.{kind}.gguf", kind,
                                          progress), key, source=source)
    return target / f"{source.stem}.{kind}.gguf"
