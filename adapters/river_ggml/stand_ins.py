"""The stand-ins as a GGUF of ggml blocks, made once from the backbone GGUF and cached.

Each backbone projection is quantized by River's own quantizer (river_models.quant) and its
codes and scales written in the ggml block type that holds them exactly, up to fp16 scales (a
group of 64 is two blocks of 32 with the same scale):
- the `sym` quantizer (this engine's default) as Q4_0 blocks: 32 codes and an fp16 scale d,
  w = (code - 8) * d, which ggml repacks for its fastest kernel (1.5x Q4_1's speed on an AVX2
  CPU: docs/results/ggml/ggml-kernels.md);
- an asymmetric grid (`hqq`, `rtn`: the other engines' default) as Q4_1 blocks: 32 codes, an
  fp16 scale d and offset m, w = code * d + m, (code - zero) * scale for d = scale,
  m = -zero * scale: the very stand-ins the other engines run.
The head's stand-in is 8-bit with one scale per block of 32 (HEAD: ggml's own Q8_0 rounding),
not the other engines' one per row: a head's columns differ in range (the embedded model's
token embeddings: relative weight error 1.2% with a scale per row, 0.02% per block, whose
original GGUF holds them as Q8_0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import attrs
import numpy as np

from river_core.config import QuantSpec
from river_core.errors import ConfigError, ModelError
from river_models.cache import cache_root, cached, content_key, digest
from river_models.quant import QuantWeight, quantize, weight_error

from .lib import MappedGGUF, version

FORMAT = 4   # bump when the stand-ins' file changes (4: the head's scales per block of 32)
BLOCK = 32
HEAD = QuantSpec(bits=8, group_size=BLOCK, method="sym")
ERRORS = "river.stand_in_error"
VERSION = "river.ggml_version"


def _nibbles(q: QuantWeight) -> np.ndarray:
    """4-bit codes packed as ggml's 4-bit blocks hold them: [rows, blocks, 16] uint8, byte j
    the block's code j in its low nibble and code j + 16 in its high one."""
    rows, columns = q.shape
    if q.bits != 4 or q.group % BLOCK:
        raise ConfigError(f"ggml's 4-bit blocks carry groups of a multiple of {BLOCK} columns, "
                          f"not {q.bits}-bit groups of {q.group}")
    codes = q.codes.reshape(rows, -1, BLOCK)
    return (codes[..., :BLOCK // 2] | (codes[..., BLOCK // 2:] << 4)).astype(np.uint8)


def _per_block(values: np.ndarray, q: QuantWeight) -> np.ndarray:
    """A per-group value [rows, groups] repeated for each block of 32, as fp16 bytes."""
    return np.repeat(values, q.group // BLOCK, 1).astype(np.float16)[..., None].view(np.uint8)


def q4_0(q: QuantWeight) -> np.ndarray:
    """Symmetric `q` (zero point 8) as ggml Q4_0 blocks: [rows, blocks * 18] uint8, each 32
    codes and an fp16 scale d, w = (code - 8) * d."""
    blocks = np.concatenate([_per_block(q.scale, q), _nibbles(q)], axis=-1)
    return np.ascontiguousarray(blocks.reshape(len(blocks), -1))


def q4_1(q: QuantWeight) -> np.ndarray:
    """`q` as ggml Q4_1 blocks: [rows, blocks * 20] uint8, each 32 codes with an fp16 scale d
    and an fp16 offset m, w = code * d + m."""
    blocks = np.concatenate([_per_block(q.scale, q), _per_block(-q.zero * q.scale, q),
                             _nibbles(q)], axis=-1)
    return np.ascontiguousarray(blocks.reshape(len(blocks), -1))


def q8_0(q: QuantWeight) -> np.ndarray:
    """`q` (8 bits: one scale per row or per group of 32, zero point 128) as ggml Q8_0 blocks,
    [rows, blocks * 34] uint8: each block of 32 its fp16 scale and its codes less 128 as
    int8."""
    rows, columns = q.shape
    d = np.repeat(q.scale, columns // BLOCK // q.scale.shape[1], 1).astype(np.float16)
    codes = (q.codes.astype(np.int16) - 128).astype(np.int8).reshape(rows, -1, BLOCK)
    blocks = np.concatenate([d[..., None].view(np.uint8), codes.view(np.uint8)], axis=-1)
    return np.ascontiguousarray(blocks.reshape(rows, -1))


def blocks(q: QuantWeight) -> tuple[np.ndarray, str]:
    """`q` in the ggml type that carries it exactly: 8 bits as Q8_0; 4 bits symmetric about
    8 (the `sym` quantizer) as Q4_0, the faster; any other 4-bit grid as Q4_1."""
    if q.bits == 8:
        return q8_0(q), "Q8_0"
    if np.all(q.zero == 8):
        return q4_0(q), "Q4_0"
    return q4_1(q), "Q4_1"


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


def quantized(source: MappedGGUF, layers: int, spec: QuantSpec,
              progress: bool = False) -> Quantized:
    """Every projection of the backbone GGUF quantized by River's quantizer, each layer's
    error by river_models.quant.weight_error."""
    from tqdm import tqdm

    out, errors = [], []
    for i in tqdm(range(layers), desc=f"stand-ins ({spec.label})", unit="layer",
                  disable=not progress):
        weights = {name: floats(source, name) for name in projections(source, i)}
        q = {name: quantize(w, spec) for name, w in weights.items()}
        out.append(q)
        errors.append(weight_error(_Projections(weights), q))
    return Quantized(tuple(out), tuple(errors), quantize(floats(source, head_name(source)),
                                                         HEAD))


@attrs.frozen
class _Projections:
    """What weight_error reads of a layer: its float projections by name."""

    projections: Mapping[str, np.ndarray]


def write(stand_ins: Quantized, path: Path) -> None:
    import gguf

    writer = gguf.GGUFWriter(path, "river-stand-ins")
    for layer in stand_ins.layers:
        for name, q in layer.items():
            data, kind = blocks(q)
            writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[kind])
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


def stand_ins(source: MappedGGUF, layers: int, spec: QuantSpec,
              progress: bool = False) -> tuple[MappedGGUF, list[float]]:
    """The stand-ins of the backbone GGUF `source` at `spec`, made once into the user cache,
    memory-mapped; and each layer's relative weight error."""
    key = digest(content_key(source.path), FORMAT, spec.bits, spec.group_size, spec.method,
                 version())
    target = cache_root() / "ggml-stand-ins" / f"{source.path.stem}-{key}"
    cached(target, lambda tmp: write(quantized(source, layers, spec, progress),
                                     tmp / "stand-ins.gguf"),
           key, source=source.path)
    weights = MappedGGUF(target / "stand-ins.gguf")
    made_by = weights.metadata.get(VERSION)
    if made_by != version():
        raise ModelError(f"{target} was made by {made_by}, not this {version()}; delete it "
                         f"(river cache) and it is made again")
    return weights, errors_of(weights)


def errors_of(mapped: MappedGGUF) -> list[float]:
    return [float(e) for e in mapped.floats(ERRORS)]
