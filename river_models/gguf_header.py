"""A GGUF file's header, read without loading its tensors: its scalar metadata, and whether the
file holds all the bytes the header declares (a truncated download is named in one line, not
left to a struct error deep in a converter)."""

from __future__ import annotations

import functools
import mmap
import struct
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from river_core.settings.errors import ModelError

MAGIC = b"GGUF"
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
           12: "d"}
STRING, ARRAY = 8, 9
SHORT_ARRAY = 512   # per-layer settings; a vocabulary's scores or types are longer
DEFAULT_ALIGNMENT = 32
_LENGTH = struct.Struct("<Q")   # a string's byte count, before its bytes


class _Short(Exception):
    """The file ended: `needs` bytes were wanted."""

    def __init__(self, needs: int) -> None:
        self.needs = needs


class _Cursor:
    def __init__(self, data, size: int, arrays: bool = False) -> None:
        self.data, self.size, self.pos, self.arrays = data, size, 0, arrays

    def take(self, fmt: str):
        n = struct.calcsize("<" + fmt)
        if self.pos + n > self.size:
            raise _Short(self.pos + n)
        (value,) = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += n
        return value

    def skip(self, n: int) -> None:
        if self.pos + n > self.size:
            raise _Short(self.pos + n)
        self.pos += n

    def skip_strings(self, count: int) -> None:
        """Past `count` strings, none decoded: a 49k-token vocabulary and its merges in 0.02 s
        where decoding each took 0.1 s, paid by every call that opens the file."""
        data, pos, size, length = self.data, self.pos, self.size, _LENGTH.unpack_from
        for _ in range(count):
            if pos + 8 > size:
                raise _Short(pos + 8)
            pos += 8 + length(data, pos)[0]
        self.skip(pos - self.pos)

    def string(self) -> str:
        n = self.take("Q")
        start = self.pos
        self.skip(n)
        return bytes(self.data[start:start + n]).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind in SCALARS:
            return self.take(SCALARS[kind])
        if kind == STRING:
            return self.string()
        if kind == ARRAY:   # kept as its length, but a short one of scalars (a layer pattern)
            item, count = self.take("I"), self.take("Q")   # or with `arrays` every one whole
            if item in SCALARS and count <= SHORT_ARRAY:
                return tuple(self.take(SCALARS[item]) for _ in range(count))
            if item in SCALARS:
                start, width = self.pos, struct.calcsize("<" + SCALARS[item])
                self.skip(count * width)
                if self.arrays:   # a vocabulary's scores or types: one copy, no loop
                    return np.frombuffer(self.data, "<" + SCALARS[item], count, start).copy()
            elif self.arrays:
                return [self.value(item) for _ in range(count)]
            elif item == STRING:
                self.skip_strings(count)
            else:
                for _ in range(count):
                    self.value(item)
            return count
        raise ModelError(f"unknown GGUF value type {kind}")


@attrs.frozen
class TensorInfo:
    kind: int                # ggml type number
    dims: tuple[int, ...]    # ggml's order: the row length first
    offset: int              # from the file's start
    nbytes: int              # what its type and shape take


@attrs.frozen
class Header:
    metadata: dict[str, Any]
    size: int        # the file's bytes
    needs: int       # the bytes the header declares: tensor data start + the last tensor's end
    tensors: dict[str, TensorInfo] = attrs.field(factory=dict)


# (values a block, bytes a block) of the types River's GGUFs hold, by ggml type number (the
# GGUF format's table); others are looked up in gguf-py, whose import takes 0.7 s
BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 8: (32, 34), 12: (256, 144),
          14: (256, 210), 30: (1, 2)}


def _tensor_bytes(name: str, ggml_type: int, dims: list[int]) -> int:
    """What tensor `name` of `ggml_type` and `dims` takes in the file; ModelError where no
    ggml type has that number, or its rows do not fill whole blocks of the type (its bytes
    could not match its shape)."""
    if ggml_type in BLOCKS:
        block, type_size = BLOCKS[ggml_type]
    else:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError):
            raise ModelError(f"tensor {name} is of ggml type {ggml_type}, which gguf "
                             f"{_gguf_version()} does not know") from None
    if dims and dims[0] % block:
        raise ModelError(f"tensor {name} has rows of {dims[0]} values, not whole blocks of "
                         f"{block} of its ggml type {ggml_type}: its bytes cannot match its "
                         f"shape")
    count = 1
    for d in dims:
        count *= d
    return count // block * type_size


def _gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


def read_header(path: Path, arrays: bool = False) -> Header:
    """The header of the GGUF at `path`; ModelError if it is not one or is cut short. With
    `arrays`, long arrays (the vocabulary, its scores, types and merges) are read whole too
    (strings as a list, numbers as a numpy array), not kept as their length. Without
    `arrays`, read once a process while the file stays as it was (a call reads the header for
    its spec, its tokenizer and its weights; a 49k-token vocabulary, skipped, still takes
    0.02 s to walk); with them, read each time (once, when the tokenizer is built: kept, the header
    would hold the whole vocabulary for the process's life)."""
    path = Path(path).resolve()
    stat = path.stat()
    return _parse(path, stat.st_size, True) if arrays else \
        _kept(path, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _kept(path: Path, size: int, mtime_ns: int) -> Header:
    return _parse(path, size, False)


def _parse(path: Path, size: int, arrays: bool) -> Header:
    with path.open("rb") as f:
        if size < len(MAGIC) or f.read(len(MAGIC)) != MAGIC:
            raise ModelError(f"{path} is not a GGUF file (no GGUF magic)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            c = _Cursor(data, size, arrays)
            try:
                c.skip(len(MAGIC))
                c.take("I")   # version
                tensors, entries = c.take("Q"), c.take("Q")
                metadata = {}
                for _ in range(entries):
                    key = c.string()
                    metadata[key] = c.value(c.take("I"))
                end, infos = 0, {}
                for _ in range(tensors):
                    name = c.string()
                    dims = [c.take("Q") for _ in range(c.take("I"))]
                    kind, offset = c.take("I"), c.take("Q")
                    try:
                        nbytes = _tensor_bytes(name, kind, dims)
                    except ModelError as e:
                        raise ModelError(f"{path.name}: {e}") from None
                    end = max(end, offset + nbytes)
                    infos[name] = (kind, tuple(dims), offset, nbytes)
            except _Short as short:
                raise ModelError(f"truncated GGUF {path}: {size} bytes, its header needs at "
                                 f"least {short.needs}") from None
            except (ValueError, KeyError) as e:
                raise ModelError(f"damaged GGUF {path}: {e}") from None
    align = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    start = -(-c.pos // align) * align
    return Header(metadata, size, start + end,
                  {n: TensorInfo(k, d, start + o, b) for n, (k, d, o, b) in infos.items()})


def float_tensor(path: Path, header: Header, name: str) -> np.ndarray | None:
    """A small F32 tensor of the file (rope factors), None where the file has none."""
    info = header.tensors.get(name)
    if info is None:
        return None
    if info.kind != 0:
        raise ModelError(f"{Path(path).name}: tensor {name} is of ggml type {info.kind}, "
                         f"not F32 as llama.cpp's converter writes it")
    count = int(np.prod(info.dims))
    with Path(path).open("rb") as f:
        f.seek(info.offset)
        return np.frombuffer(f.read(4 * count), "<f4").copy()


def check_gguf(path: Path) -> Header:
    """`read_header`, and the file holds every tensor byte the header declares."""
    header = read_header(path)
    if header.size < header.needs:
        raise ModelError(f"truncated GGUF {path}: {header.size} bytes, its tensors need "
                         f"{header.needs}")
    placed = sorted(header.tensors.items(), key=lambda item: item[1].offset)
    for (name, t), (after, u) in zip(placed, placed[1:]):
        if t.offset + t.nbytes > u.offset:
            raise ModelError(f"{Path(path).name}: tensor {name} ({t.nbytes} bytes by its type "
                             f"and shape) runs into tensor {after}: damaged")
    return header
