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
Beside a backbone of as many bits a weight a stand-in saves nothing (it reads as many bytes and
adds a second rounding; River's Q4_0 of a Q4_0 backbone is the backbone itself), so the
stand-ins' type is chosen below the backbone's (`choose`): F16, BF16, Q8_0, Q6_K, 5-bit and
Q4_1 (5.0 bits a weight) backbones get the repacked Q4_0 above (4.5); Q4_0 and Q4_K (4.5)
backbones get ggml's Q3_K (3.4; K/V error and speed in docs/models.md), quantized by ggml
itself (`ggml_quantize_chunk`) from the backbone's dequantized weights; where no lower type
fits (a row length not a multiple of 256, the block of every ggml type below 4 bits; a
backbone of 3.4 bits or fewer) exit mode is refused in one line (`Choice.refused`) and the
Q4_0 stand-ins still draft for lossless mode.
The head's stand-in is 8-bit with one scale per block of 32 (ggml's own Q8_0, `_head`),
not the other engines' one per row: a head's columns differ in range (the embedded model's
token embeddings: relative weight error 1.2% with a scale per row, 0.02% per block, whose
original GGUF holds them as Q8_0).
"""

from __future__ import annotations

import functools
from pathlib import Path
from collections.abc import Sequence as SequenceABC
from typing import Callable, Mapping, Sequence

import attrs
import numpy as np

from river_core.settings.config import QuantSpec
from river_core.settings.errors import ConfigError, ModelError
from river_models.cache import cache_root, cached, content_key, digest, ready
from river_models.gguf_quantize import dequantized_rows, quantized_rows
from river_models.quant import QuantWeight, quantize, weight_error

from .lib import RUNS, MappedGGUF, version

FORMAT = 6   # bump when the stand-ins' file changes (6: ggml's own dequantization and head)
BLOCK = 32
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
    return dequantized(source.raw(name), source.kind(name), source.shape(name))


def projections(source: MappedGGUF, i: int) -> list[str]:
    return [n for n in source.tensors if n.startswith(f"blk.{i}.") and n.endswith(".weight")
            and len(source.shape(n)) == 2]


def head_name(source: MappedGGUF) -> str:
    return "output.weight" if source.get("output.weight") is not None else "token_embd.weight"


# the stand-ins' types, first choice first: River's Q4_0 (ggml repacks it for its fastest
# 4-bit kernel: 1.5x Q4_1's speed, docs/results/ggml/ggml-kernels.md), then ggml's Q3_K (rows
# of 256). Not Q2_K: its K/V error is twice Q3_K's, four times Q4_0's (docs/models.md)
CANDIDATES = ("Q4_0", "Q3_K")
SUPER_BLOCK = 256   # the row length every ggml type below 4 bits quantizes in


def bits_per_weight(kind: str) -> float:
    """What a ggml type reads a weight, its scales included (Q4_1 5.0, Q4_0 and Q4_K 4.5)."""
    from .lib import g

    return 8 * g.ggml_type_size(RUNS[kind]) / g.ggml_blck_size(RUNS[kind])


@attrs.frozen
class Choice:
    """The stand-ins' ggml type for a backbone, and why exit mode is refused (None: it runs)."""

    kind: str
    backbone: str
    refused: str | None = None


def backbone_type(source: MappedGGUF, layers: int) -> str:
    """The ggml type holding most of the backbone's projection weights (a Q4_K_M file's Q4_K)."""
    counts: dict[str, int] = {}
    for i in range(layers):
        for name in projections(source, i):
            rows, columns = source.shape(name)
            counts[source.kind(name)] = counts.get(source.kind(name), 0) + rows * columns
    return max(counts, key=counts.get)


def choose(source: MappedGGUF, layers: int) -> Choice:
    """The first candidate type that reads fewer bits a weight than the backbone's (what the
    river saves is the bytes it does not read) and holds its rows; else Q4_0 with exit mode
    refused, and why."""
    kind = backbone_type(source, layers)
    bits = bits_per_weight(kind)
    widths = sorted({source.shape(n)[1] for i in range(layers) for n in projections(source, i)})
    odd = [w for w in widths if w % SUPER_BLOCK]
    below = [c for c in CANDIDATES if bits_per_weight(c) < bits]
    for candidate in below:
        if candidate == "Q4_0" or not odd:
            return Choice(candidate, kind)
    why = f"its rows of {odd[0]} weights are not a multiple of {SUPER_BLOCK}, the block of " \
          f"every ggml type below 4 bits" if below else \
          f"River makes none below {bits:.2f} bits a weight"
    return Choice("Q4_0", kind, f"exit mode needs stand-ins below the backbone's {kind} "
                                f"({bits:.2f} bits a weight) and {why}; run lossless mode (--mode "
                                f"speculative) or full depth (--kv full), or give River a GGUF "
                                f"of more bits (Q4_1, Q5_K, Q6_K, Q8_0, F16)")


def dequantized(data: np.ndarray, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    """float32 of `shape` from a tensor's blocks, by ggml's own dequantization."""
    return dequantized_rows(data.reshape(-1, data.shape[-1]), kind, shape[-1]).reshape(shape)


@attrs.frozen(eq=False)
class Quantized:
    """Stand-ins in River's engine-neutral form under the GGUF's tensor names."""

    layers: tuple[Mapping[str, QuantWeight | tuple[np.ndarray, str]], ...]   # or ggml's blocks
    errors: tuple[float, ...]
    head: QuantWeight | tuple[np.ndarray, str]   # or ggml's Q8_0 blocks


def quantized(source: MappedGGUF, layers: int, spec: QuantSpec, kind: str = "Q4_0",
              progress: bool = False) -> Quantized:
    """Every projection of the backbone GGUF quantized, each layer's relative weight error:
    by River's quantizer at `spec` (its Q4_0), or for a lower `kind` by ggml's own. Layers
    are quantized on every core at once (numpy and ggml release the GIL; the same numbers)."""
    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    from .lib import default_threads

    def layer(i: int) -> tuple[dict, float]:
        weights = {name: floats(source, name) for name in projections(source, i)}
        if kind == "Q4_0":
            q = {name: quantize(w, spec) for name, w in weights.items()}
            return q, weight_error(_Projections(weights), q)
        q = {name: (quantized_rows(w, kind), kind) for name, w in weights.items()}
        return q, _error(weights, {n: dequantized(b, kind, weights[n].shape)
                                   for n, (b, _) in q.items()})

    label = spec.label if kind == "Q4_0" else kind
    with ThreadPoolExecutor(default_threads()) as pool:
        done = list(tqdm(pool.map(layer, range(layers)), total=layers, unit="layer",
                         desc=f"stand-ins ({label})", disable=not progress))
    return Quantized(tuple(q for q, _ in done), tuple(e for _, e in done), _head(source))


HEAD_ROWS = 16384   # the head's rows dequantized at once: a 150k vocabulary's float32 head
                    # whole is 0.9 GB (issue 59: 4.9 GB peak quantizing it at once)


def _head(source: MappedGGUF) -> tuple[np.ndarray, str]:
    """The head's stand-in, by ggml's own Q8_0 quantizer, a slice of rows at a time."""
    name = head_name(source)
    raw, (rows, columns) = source.raw(name), source.shape(name)
    return np.concatenate([
        quantized_rows(dequantized_rows(raw[r:r + HEAD_ROWS], source.kind(name), columns), "Q8_0")
        for r in range(0, rows, HEAD_ROWS)]), "Q8_0"


def _error(weights: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray]) -> float:
    """||Q(W) - W|| / ||W|| over a layer's projections together (river_models.quant's)."""
    def square(x: np.ndarray) -> float:   # BLAS's dot: no float64 copy of a weight
        flat = x.reshape(-1)
        return float(np.dot(flat, flat))

    err = sum(square(got[n] - w) for n, w in weights.items())
    norm = sum(square(w) for w in weights.values())
    return (err / norm) ** 0.5 if norm else 0.0


@attrs.frozen
class _Projections:
    """What weight_error reads of a layer: its float projections by name."""

    projections: Mapping[str, np.ndarray]


def write(stand_ins: Quantized, path: Path) -> None:
    import gguf

    writer = gguf.GGUFWriter(path, "river-stand-ins")
    for layer in stand_ins.layers:
        for name, q in layer.items():
            data, kind = q if isinstance(q, tuple) else blocks(q)
            writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[kind])
    head, kind = stand_ins.head if isinstance(stand_ins.head, tuple) else \
        (q8_0(stand_ins.head), "Q8_0")
    writer.add_tensor("output.weight", head, raw_dtype=gguf.GGMLQuantizationType[kind])
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


def stand_ins(source: MappedGGUF, layers: int, spec: QuantSpec, kind: str = "Q4_0",
              progress: bool = False) -> "StandIns":
    """The stand-ins of the backbone GGUF `source` in ggml type `kind` (Q4_0: River's at
    `spec`), made once into the user cache when first run (`StandIns`), memory-mapped, with
    each layer's relative weight error."""
    key = digest(content_key(source.path), FORMAT, spec.bits, spec.group_size, spec.method,
                 kind, version())
    folder = cache_root() / "ggml-stand-ins"
    # the same weights under another file name: its stand-ins already made
    target = next((t for t in sorted(folder.glob(f"*-{key}")) if ready(t, key)),
                  folder / f"{source.path.stem}-{key}")
    return StandIns(lambda: _made(source, layers, spec, kind, progress, target, key),
                    kind if kind != "Q4_0" else blocks_kind(spec), source,
                    lambda: ready(target, key))


def blocks_kind(spec: QuantSpec) -> str:
    """The ggml type `blocks` holds River's quantizer's codes at `spec` in."""
    return "Q8_0" if spec.bits == 8 else "Q4_0" if spec.method == "sym" else "Q4_1"


def _made(source: MappedGGUF, layers: int, spec: QuantSpec, kind: str, progress: bool,
          target: Path, key: str) -> tuple[MappedGGUF, list[float]]:
    cached(target, lambda tmp: write(quantized(source, layers, spec, kind, progress),
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


class StandIns:
    """A backbone's stand-ins and their errors, made (or found in the cache) by `make` the
    first time a mode runs them: full depth and n-gram drafts never do, so they never wait
    for them (issue 59). What they read a token is known before: `layer_bytes` from their
    type and the backbone's shapes."""

    def __init__(self, make: Callable[[], tuple[MappedGGUF, list[float]]], kind: str,
                 backbone: MappedGGUF, in_cache: Callable[[], bool] = lambda: False) -> None:
        self._make, self.kind, self._backbone, self._in_cache = make, kind, backbone, in_cache

    @classmethod
    def made(cls, weights: MappedGGUF, errors, kind: str, backbone: MappedGGUF) -> "StandIns":
        return cls(lambda: (weights, list(errors)), kind, backbone)

    @property
    def at_hand(self) -> bool:
        """Made, or in the cache: reading them costs no quantization."""
        return self.ready or self._in_cache()

    @functools.cached_property
    def _made(self) -> tuple[MappedGGUF, list[float]]:
        return self._make()

    @property
    def weights(self) -> MappedGGUF:
        return self._made[0]

    @property
    def errors(self) -> list[float]:
        return self._made[1]

    def errors_when_read(self, layers: int) -> "Sequence[float]":
        """The errors as a sequence of `layers` that makes the stand-ins only when an error is
        read: whether an engine has stand-ins, or how many, is asked without making them."""
        return _ErrorsWhenRead(self, layers)

    @property
    def ready(self) -> bool:
        return "_made" in self.__dict__

    def layer_bytes(self, i: int) -> int:
        from .lib import g

        row = lambda kind, columns: g.ggml_row_size(RUNS[kind], columns)
        return sum(rows * row(self.kind, columns) for rows, columns in
                   (self._backbone.shape(n) for n in projections(self._backbone, i)))

    def head_bytes(self) -> int:
        from .lib import g

        rows, columns = self._backbone.shape(head_name(self._backbone))
        return rows * g.ggml_row_size(RUNS["Q8_0"], columns)


class _ErrorsWhenRead(SequenceABC):
    def __init__(self, stand_ins: StandIns, layers: int) -> None:
        self._stand_ins, self._layers = stand_ins, layers

    def __len__(self) -> int:
        return self._layers

    def __getitem__(self, i):
        return self._stand_ins.errors[i]
