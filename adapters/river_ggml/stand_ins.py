"""The stand-ins as a GGUF of ggml blocks, made once from the backbone GGUF and cached.

Each backbone projection is quantized by River's own quantizer (river_models.quant: HQQ, 4
bits, groups of 64 by default), and its codes, scales and zero points are written as ggml
Q4_1 blocks: 32 codes with an fp16 scale d and an fp16 offset m, w = code * d + m, which is
(code - zero) * scale exactly for d = scale, m = -zero * scale (a group of 64 is two blocks
with the same pair): the very stand-ins the other engines run, up to fp16 scales. Q4_0 would
run faster on this CPU (docs/backends.md) but has no offset, so it cannot carry an
asymmetric quantization. The head's stand-in is River's 8-bit head (one scale per row) as Q8_0
blocks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import attrs
import numpy as np

from river_core.config import QuantSpec
from river_core.errors import ConfigError, ModelError
from river_models.cache import cache_root, cached, content_key, digest
from river_models.quant import HEAD, QuantWeight, quantize, weight_error

from .lib import MappedGGUF, version

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


@attrs.frozen(eq=False)
class Quantized:
    """Stand-ins in River's engine-neutral form under the GGUF's tensor names."""

    layers: tuple[Mapping[str, QuantWeight], ...]
    errors: tuple[float, ...]
    head: QuantWeight


def quantized(source: MappedGGUF, layers: int, spec: QuantSpec) -> Quantized:
    """Every projection of the backbone GGUF quantized by River's quantizer, each layer's
    error by river_models.quant.weight_error."""
    out, errors = [], []
    for i in range(layers):
        weights = {name: floats(source, name) for name in projections(source, i)}
        q = {name: quantize(w, spec) for name, w in weights.items()}
        out.append(q)
        errors.append(weight_error(_Projections(weights), q))
    return Quantized(tuple(out), tuple(errors), quantize(floats(source, head_name(source)), HEAD))


@attrs.frozen
class _Projections:
    """What weight_error reads of a layer: its float projections by name."""

    projections: Mapping[str, np.ndarray]


def write(stand_ins: Quantized, path: Path) -> None:
    import gguf

    writer = gguf.GGUFWriter(path, "river-stand-ins")
    for layer in stand_ins.layers:
        for name, q in layer.items():
            convert, kind = BLOCKS[q.bits]
            writer.add_tensor(name, convert(q), raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.add_tensor("output.weight", q8_0(stand_ins.head),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_array(ERRORS, list(stand_ins.errors))
    writer.add_string(VERSION, version())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def mapped(stand_ins: Quantized) -> tuple[MappedGGUF, list[float]]:
    """`stand_ins` written into a temporary folder and mapped (tiny test models)."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="river-ggml-")) / "stand-ins.gguf"
    write(stand_ins, path)
    return MappedGGUF(path), list(stand_ins.errors)


def stand_ins(source: MappedGGUF, layers: int, spec: QuantSpec) -> tuple[MappedGGUF, list[float]]:
    """The stand-ins of the backbone GGUF `source` at `spec`, made once into the user cache,
    memory-mapped; and each layer's relative weight error."""
    if spec.bits not in BLOCKS:
        raise ConfigError(f"the ggml engine's stand-ins are 4- or 8-bit, not {spec.bits}-bit")
    key = digest(content_key(source.path), FORMAT, spec.bits, spec.group_size, spec.method,
                 version())
    target = cache_root() / "ggml-stand-ins" / f"{source.path.stem}-{key}"
    cached(target, lambda tmp: write(quantized(source, layers, spec), tmp / "stand-ins.gguf"),
           key, source=source.path)
    weights = MappedGGUF(target / "stand-ins.gguf")
    made_by = weights.metadata.get(VERSION)
    if made_by != version():
        raise ModelError(f"{target} was made by {made_by}, not this {version()}; delete it "
                         f"(river cache) and it is made again")
    return weights, errors_of(weights)


def errors_of(mapped: MappedGGUF) -> list[float]:
    from gguf import GGUFReader

    return [float(e) for e in GGUFReader(mapped.path).fields[ERRORS].contents()]
