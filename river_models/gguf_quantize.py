"""GGUF files in the types llama.cpp's users pick, made as `llama-quantize` makes them: ggml's
own quantizer (`ggml_quantize_chunk`, the code llama-quantize runs) under llama-quantize's
choice of a type for each tensor (`llama_tensor_get_type` in llama.cpp's src/llama-quant.cpp,
no importance matrix):
- the file type's default type for every 2-D weight; norms, biases and rotary tensors kept;
- the LM head (or a tied embedding) Q6_K, or Q8_0 in a Q8_0 file or where its rows do not
  fill 256-weight blocks;
- Q4_K_M and Q5_K_M: Q6_K for `attn_v` (and a fused `attn_qkv`, which llama.cpp counts
  as one) and `ffn_down` on the layers `use_more_bits` picks (the first and last eighth, and
  every third between); IQ4_NL/IQ4_XS: `ffn_down` of the first eighth Q5_K, `attn_v` Q5_K
  where four query heads or more share a K/V head;
- a row length that does not fill the type's blocks falls back (Q4_K to Q5_0, Q5_K to Q5_1,
  Q6_K to Q8_0, Q2_K and Q3_K to Q4_0, the IQ types to IQ4_NL, then F16).
tests/test_real_files.py checks the choice against llama.cpp's own quantizer where
llama-cpp-python is installed.
"""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path
from typing import Callable

import numpy as np

from river_core.settings.errors import ConfigError

# llama-quantize's file types: (general.file_type, the default type of its weights)
FILE_TYPES = {"F16": (1, "F16"), "BF16": (32, "BF16"), "Q8_0": (7, "Q8_0"),
              "Q4_0": (2, "Q4_0"), "Q4_1": (3, "Q4_1"), "Q5_0": (8, "Q5_0"),
              "Q5_1": (9, "Q5_1"), "Q2_K": (10, "Q2_K"), "Q3_K_M": (12, "Q3_K"),
              "Q4_K_S": (14, "Q4_K"), "Q4_K_M": (15, "Q4_K"), "Q5_K_M": (17, "Q5_K"),
              "Q6_K": (18, "Q6_K"), "IQ4_NL": (25, "IQ4_NL"), "IQ4_XS": (30, "IQ4_XS")}
# a type whose blocks a row does not fill, and what llama-quantize takes instead
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_K": "Q4_0", "Q3_K": "Q4_0",
            "IQ4_XS": "IQ4_NL"}
_LAYER = re.compile(r"^blk\.(\d+)\.")


def use_more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp's layers that get more bits: the first and last eighth, and every
    third one between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _blocks(kind: str) -> int:
    from ggml import ggml as g

    return int(g.ggml_blck_size(_ggml_type(kind)))


def _ggml_type(kind: str) -> int:
    from gguf import GGMLQuantizationType

    return int(GGMLQuantizationType[kind])


class _Choice:
    """llama_tensor_get_type over one file, its counters walked in llama.cpp's order (by
    layer, then by name)."""

    def __init__(self, file_type: str, names: list[str], heads: int, kv_heads: int,
                 layers: int) -> None:
        self.ftype, self.default = file_type, FILE_TYPES[file_type][1]
        self.tied = "output.weight" not in names
        self.gqa = heads // max(kv_heads, 1)
        self.n_v = sum(1 for n in names if "attn_v.weight" in n or "attn_qkv.weight" in n)
        self.n_ffn = layers
        self.i_v = self.i_down = 0

    def __call__(self, name: str, columns: int) -> str:
        kind = self._mix(name)
        if columns % _blocks(kind):
            kind = FALLBACK.get(kind, "F16")
            if columns % _blocks(kind):
                kind = "F16"
        return kind

    def _mix(self, name: str) -> str:
        f, kind = self.ftype, self.default
        if kind in ("F16", "BF16"):   # llama-quantize mixes quantized file types only
            return kind
        if name == "output.weight" or (self.tied and name == "token_embd.weight"):
            return kind if kind == "Q8_0" else "Q6_K"
        if name == "token_embd.weight":
            return kind
        if "attn_v.weight" in name or "attn_qkv.weight" in name:
            i, self.i_v = self.i_v, self.i_v + 1
            if f in ("Q4_K_M", "Q5_K_M") and use_more_bits(i, self.n_v):
                return "Q6_K"
            if f in ("IQ4_NL", "IQ4_XS") and self.gqa >= 4:
                return "Q5_K"
            if f == "Q3_K_M":
                return "Q5_K" if i < 2 else "Q4_K"
            if f == "Q2_K":
                return "Q4_K" if self.gqa >= 4 else "Q3_K"
            return kind
        if "ffn_down" in name:
            i, self.i_down = self.i_down, self.i_down + 1
            n = self.n_ffn
            if f in ("Q4_K_M", "Q5_K_M") and use_more_bits(i, n):
                return "Q6_K"
            if f in ("IQ4_NL", "IQ4_XS") and i < n // 8:
                return "Q5_K"
            if f == "Q4_K_S" and i < n // 8:
                return "Q5_K"
            if f == "Q3_K_M":
                return "Q5_K" if i < n // 16 else "Q4_K"
            if f == "Q2_K":
                return "Q3_K"
            return kind
        if "attn_output" in name:
            return {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K"}.get(f, kind)
        return kind


CHUNK_ROWS = 256   # rows a thread converts at once (ctypes lets go of the GIL meanwhile)


def _by_chunks(rows: int, convert: Callable[[int, int], None]) -> None:
    """`convert(start, n)` over every CHUNK_ROWS rows, on every core."""
    from concurrent.futures import ThreadPoolExecutor

    starts = range(0, rows, CHUNK_ROWS)
    chunk = lambda start: convert(start, min(CHUNK_ROWS, rows - start))
    if len(starts) == 1:
        chunk(0)
    else:
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            list(pool.map(chunk, starts))


def quantized_rows(weights: np.ndarray, kind: str) -> np.ndarray:
    """float32 [rows, columns] in ggml type `kind`, by ggml's own quantizer (no importance
    matrix; each row on its own, as llama-quantize's threads split it): [rows, row bytes]
    uint8, chunks of rows on every core."""
    from ggml import ggml as g

    weights = np.ascontiguousarray(weights, np.float32)
    rows, columns = weights.shape
    out = np.empty((rows, g.ggml_row_size(_ggml_type(kind), columns)), np.uint8)
    _by_chunks(rows, lambda start, n: g.ggml_quantize_chunk(
        _ggml_type(kind), weights[start:].ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
        out[start:].ctypes.data_as(ctypes.c_void_p), 0, n, columns, None))
    return out


def dequantized_rows(data: np.ndarray, kind: str, columns: int) -> np.ndarray:
    """[rows, row bytes] uint8 of ggml type `kind` back to float32 [rows, columns] by ggml's
    own type traits (C, 40x gguf-py's numpy on Q4_K), chunks of rows on every core."""
    from ggml import ggml as g

    data = np.ascontiguousarray(data).reshape(len(data), -1)
    if kind == "F32":
        return data.view(np.float32).reshape(len(data), columns).copy()
    to_float = g.ggml_get_type_traits(_ggml_type(kind)).contents.to_float
    out = np.empty((len(data), columns), np.float32)
    _by_chunks(len(data), lambda start, n: to_float(
        data[start:].ctypes.data_as(ctypes.c_void_p),
        out[start:].ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n * columns))
    return out


def _order(name: str) -> tuple[int, str]:
    """llama.cpp's walk of a file's tensors: those outside the layers first, then by layer,
    each layer's by name."""
    match = _LAYER.match(name)
    return (int(match.group(1)) if match else -1, name)


def quantize(source: Path, target: Path, file_type: str) -> dict[str, str]:
    """`source` (an F32 or F16 GGUF, as the converter writes) written to `target` in llama-quantize's `file_type`
    (FILE_TYPES), its metadata kept but the file type; each tensor's type, by name."""
    import gguf

    if file_type not in FILE_TYPES:
        raise ConfigError(f"llama-quantize file types River makes: {', '.join(FILE_TYPES)}; "
                          f"not {file_type}")
    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    meta = {f.name: f for f in reader.fields.values()}
    count = lambda key: int(meta[f"{arch}.{key}"].contents())
    heads = count("attention.head_count")
    kv_heads = count("attention.head_count_kv") if f"{arch}.attention.head_count_kv" in meta \
        else heads
    choice = _Choice(file_type, [t.name for t in reader.tensors], heads, kv_heads,
                     count("block_count"))
    writer = gguf.GGUFWriter(target, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = FILE_TYPES[file_type][0] if field.name == "general.file_type" \
            else field.contents()
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    kinds = {}
    for tensor in sorted(reader.tensors, key=lambda t: _order(t.name)):
        data = np.asarray(tensor.data)
        if data.ndim < 2 or not tensor.name.endswith(".weight") \
                or tensor.name.endswith("_norm.weight") or tensor.name.startswith("rope_"):
            writer.add_tensor(tensor.name, data)
            kinds[tensor.name] = tensor.tensor_type.name
            continue
        floats = data.astype(np.float32).reshape(-1, data.shape[-1])
        kind = kinds[tensor.name] = choice(tensor.name, floats.shape[1])
        writer.add_tensor(tensor.name, quantized_rows(floats, kind),
                          raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return kinds
