"""The stand-ins as a GGUF of ggml blocks, made once from the backbone GGUF and cached.

Each backbone projection is quantized by River's own quantizer (river_models.quant: HQQ, 4
bits, groups of 64 by default), and its codes, scales and zero points are written as ggml
Q4_1 blocks: 32 codes with an fp16 scale d and an fp16 offset m, w = code * d + m, which is
(code - zero) * scale exactly for d = scale, m = -zero * scale (a group of 64 is two blocks
with the same pair): the very stand-ins the other engines run, up to fp16 scales. Q4_0 would
run faster on this CPU (docs/backends.md) but has no offset, so it cannot carry an
asymmetric quantization. The head's stand-in is ggml's Q8_0 of the backbone's head.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from river_core.config import QuantSpec
from river_core.errors import ConfigError, ModelError
from river_models.cache import cache_root, cached, content_key, digest
from river_models.quant import QuantWeight, quantize

from .lib import MappedGGUF, g, version

FORMAT = 1   # bump when the stand-ins' file changes
BLOCK = 32
ERRORS = "river.stand_in_error"
VERSION = "river.ggml_version"


def q4_1(q: QuantWeight) -> np.ndarray:
    """`q` (4 bits, groups a multiple of 32) as ggml Q4_1 blocks: [rows, blocks * 20] uint8."""
    rows, columns = q.shape
    if q.bits != 4 or q.group % BLOCK:
        raise ConfigError(f"ggml's Q4_1 carries 4-bit groups of a multiple of {BLOCK} columns, "
                          f"not {q.bits}-bit groups of {q.group}")
    per = q.group // BLOCK
    d = np.repeat(q.scale, per, 1).astype(np.float16)
    m = np.repeat(-q.zero * q.scale, per, 1).astype(np.float16)
    codes = q.codes.reshape(rows, -1, BLOCK)
    packed = (codes[..., :BLOCK // 2] | (codes[..., BLOCK // 2:] << 4)).astype(np.uint8)
    blocks = np.concatenate([d[..., None].view(np.uint8), m[..., None].view(np.uint8),
                             packed], axis=-1)
    return np.ascontiguousarray(blocks.reshape(rows, -1))


def q8_0(q: QuantWeight) -> np.ndarray:
    """`q` (8 bits: one scale per row, zero point 128) as ggml Q8_0 blocks, [rows, blocks *
    34] uint8: each block of 32 the row's fp16 scale and its codes less 128 as int8."""
    rows, columns = q.shape
    d = np.repeat(q.scale[:, :1], columns // BLOCK, 1).astype(np.float16)
    codes = (q.codes.astype(np.int16) - 128).astype(np.int8).reshape(rows, -1, BLOCK)
    blocks = np.concatenate([d[..., None].view(np.uint8), codes.view(np.uint8)], axis=-1)
    return np.ascontiguousarray(blocks.reshape(rows, -1))


BLOCKS = {4: (q4_1, "Q4_1"), 8: (q8_0, "Q8_0")}


def ggml_quantized(w: np.ndarray, kind: int) -> np.ndarray:
    """`w` float32 [rows, columns] in ggml's own quantization `kind`: [rows, row bytes]."""
    w = np.ascontiguousarray(w, np.float32)
    rows, columns = w.shape
    out = np.empty((rows, g.ggml_row_size(kind, columns)), np.uint8)
    g.ggml_quantize_chunk(kind, w.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                          out.ctypes.data_as(ctypes.c_void_p), 0, rows, columns, None)
    return out


def floats(source: MappedGGUF, name: str) -> np.ndarray:
    """A backbone tensor dequantized to float32 [rows, columns]."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    shape = source.shape(name)
    kind = GGMLQuantizationType[source.kind(name)]
    return dequantize(source.raw(name), kind).reshape(shape).astype(np.float32)


def projections(source: MappedGGUF, i: int) -> list[str]:
    return [n for n in source.tensors if n.startswith(f"blk.{i}.") and n.endswith(".weight")
            and len(source.shape(n)) == 2]


def head_name(source: MappedGGUF) -> str:
    return "output.weight" if source.get("output.weight") is not None else "token_embd.weight"


def build(source: MappedGGUF, layers: int, spec: QuantSpec, target: Path) -> None:
    import gguf

    writer = gguf.GGUFWriter(target, "river-stand-ins")
    errors = []
    for i in range(layers):
        err = norm = 0.0
        for name in projections(source, i):
            w = floats(source, name)
            convert, kind = BLOCKS[spec.bits]
            kind = gguf.GGMLQuantizationType[kind]
            blocks = convert(quantize(w, spec))
            back = gguf.quants.dequantize(blocks, kind)
            err += float(((back.astype(np.float64) - w) ** 2).sum())
            norm += float((w.astype(np.float64) ** 2).sum())
            writer.add_tensor(name, blocks, raw_dtype=kind)
        errors.append((err / norm) ** 0.5 if norm else 0.0)
    head = head_name(source)
    writer.add_tensor("output.weight", ggml_quantized(floats(source, head), g.GGML_TYPE_Q8_0),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_array(ERRORS, errors)
    writer.add_string(VERSION, version())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def stand_ins(source: MappedGGUF, layers: int, spec: QuantSpec,
              cache: bool = True) -> tuple[MappedGGUF, list[float]]:
    """The stand-ins of the backbone GGUF `source` at `spec`, made once into the user cache
    (without `cache`: into a temporary folder, for tiny test models), memory-mapped; and each
    layer's relative weight error."""
    if spec.bits not in BLOCKS:
        raise ConfigError(f"the ggml engine's stand-ins are 4- or 8-bit, not {spec.bits}-bit")
    if not cache:
        import tempfile

        path = Path(tempfile.mkdtemp(prefix="river-ggml-")) / "stand-ins.gguf"
        build(source, layers, spec, path)
        mapped = MappedGGUF(path)
        return mapped, errors_of(mapped)
    key = digest(content_key(source.path), FORMAT, spec.bits, spec.group_size, spec.method,
                 version())
    target = cache_root() / "ggml-stand-ins" / f"{source.path.stem}-{key}"
    cached(target, lambda tmp: build(source, layers, spec, tmp / "stand-ins.gguf"), key,
           source=source.path)
    mapped = MappedGGUF(target / "stand-ins.gguf")
    made_by = mapped.metadata.get(VERSION)
    if made_by != version():
        raise ModelError(f"{target} was made by {made_by}, not this {version()}; delete it "
                         f"(river cache) and it is made again")
    return mapped, errors_of(mapped)


def errors_of(mapped: MappedGGUF) -> list[float]:
    from gguf import GGUFReader

    return [float(e) for e in GGUFReader(mapped.path).fields[ERRORS].contents()]
