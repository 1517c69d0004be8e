"""ggml through ggml-python's ctypes binding: the CPU backend, GGUF files memory-mapped as ggml
tensors, and graphs built once and run again with new inputs.

ggml-python 0.0.45 declares two pointer-returning functions with an integer result type, which
truncates the pointer on a 64-bit machine; `_fixed` corrects them before anything calls them.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from river_core.settings.errors import ModelError

from ggml import ggml as g

__all__ = ["g", "cpu", "Graph", "MappedGGUF", "as_array", "RUNS", "version"]

# what this engine runs a GGUF's tensors as: the ggml types llama-quantize's file types hold
# without an importance matrix, each checked against a float32 reference on every family
# (tests/test_real_files.py; docs/models.md); Q3_K and Q2_K are also River's own stand-ins'
# types below 4 bits (issue 52)
RUNS = {"F32": g.GGML_TYPE_F32, "F16": g.GGML_TYPE_F16, "BF16": g.GGML_TYPE_BF16,
        "Q8_0": g.GGML_TYPE_Q8_0, "Q4_0": g.GGML_TYPE_Q4_0, "Q4_1": g.GGML_TYPE_Q4_1,
        "Q5_0": g.GGML_TYPE_Q5_0, "Q5_1": g.GGML_TYPE_Q5_1, "Q4_K": g.GGML_TYPE_Q4_K,
        "Q5_K": g.GGML_TYPE_Q5_K, "Q6_K": g.GGML_TYPE_Q6_K, "Q3_K": g.GGML_TYPE_Q3_K,
        "Q2_K": g.GGML_TYPE_Q2_K, "IQ4_NL": g.GGML_TYPE_IQ4_NL, "IQ4_XS": g.GGML_TYPE_IQ4_XS}
NAMES = {v: k for k, v in RUNS.items()}
NUMPY = {g.GGML_TYPE_F32: np.float32, g.GGML_TYPE_F16: np.float16, g.GGML_TYPE_I32: np.int32,
         g.GGML_TYPE_I64: np.int64}


def _fixed() -> None:
    for name in ("ggml_backend_cpu_buffer_type", "ggml_backend_cpu_buffer_from_ptr"):
        getattr(g.lib, name).restype = ctypes.c_void_p


_fixed()


@g.ggml_log_callback
def _log(level: int, text: bytes, user_data) -> None:
    """ggml's warnings and errors to stderr; its debug and info lines (one per repacked
    tensor) dropped."""
    if level in (g.GGML_LOG_LEVEL_WARN, g.GGML_LOG_LEVEL_ERROR):
        os.write(2, text)


g.ggml_log_set(_log, None)


@functools.cache
def repack_buffer_type() -> int | None:
    """The CPU backend's CPU_REPACK buffer type, where ggml keeps 4-bit weights interleaved
    for its fastest kernels (Q4_0 as q4_0_8x8 on AVX2), as llama.cpp loads them; None where
    this CPU's ggml offers none."""
    device = _cpu_device()
    address = g.ggml_backend_reg_get_proc_address(g.ggml_backend_dev_backend_reg(device),
                                                  b"ggml_backend_dev_get_extra_bufts")
    if not address:
        return None
    extra = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)(device)
    i = 0
    while extra and extra[i]:
        if g.ggml_backend_buft_name(extra[i]) == b"CPU_REPACK":
            return extra[i]
        i += 1
    return None


def repacks(t) -> bool:
    """Whether ggml's CPU backend repacks weight `t` for its matrix products, asked as
    llama.cpp's loader asks (`weight_buft_supported`): a product with `t` placed in the
    CPU_REPACK buffer type, which the CPU device supports only for the types and shapes its
    repacked kernels take on this CPU (Q4_0, Q4_K, IQ4_NL... as this build of ggml has them)."""
    kind = repack_buffer_type()
    if kind is None or g.ggml_n_dims(t) != 2:
        return False
    c = t.contents
    ctx = new_context(3, nodes=0)
    try:
        w = g.ggml_new_tensor_2d(ctx, c.type, c.ne[0], c.ne[1])
        x = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, c.ne[0], 1)
        product = g.ggml_mul_mat(ctx, w, x)
        probe = g.ggml_backend_buft_alloc_buffer(ctypes.c_void_p(kind), 0)
        try:
            w.contents.buffer = probe
            return bool(g.ggml_backend_dev_supports_op(_cpu_device(), product))
        finally:
            g.ggml_backend_buffer_free(probe)
    finally:
        g.ggml_free(ctx)


@functools.cache
def _cpu_device():
    return g.ggml_backend_dev_by_type(g.GGML_BACKEND_DEVICE_TYPE_CPU)


def has_sgemm() -> bool:
    """Whether this ggml was built with llamafile's tinyBLAS (GGML_LLAMAFILE), as llama.cpp
    builds it: the kernel of every product of several activation columns (prefill,
    verification) in F16, BF16 and Q8_0."""
    return bool(g.ggml_cpu_has_llamafile())


def version() -> str:
    """The binding's and its ggml's version: a cache entry made with another is not reused."""
    import ggml

    return f"ggml-python {ggml.__version__}"


class Cpu:
    """ggml's CPU backend, one per process, on `threads` threads."""

    def __init__(self) -> None:
        if not has_sgemm():
            os.write(2, b"river: this ggml-python was built without llamafile's sgemm, so "
                        b"prefill and verification run ggml's slower per-dot path; rebuild it "
                        b"as the README installs it: CMAKE_ARGS=-DGGML_LLAMAFILE=ON pip install "
                        b"--no-cache-dir --force-reinstall --no-deps ggml-python==0.0.45\n")
        self.backend = g.ggml_backend_cpu_init()
        self.threads = 0
        self.buffer_type = g.lib.ggml_backend_cpu_buffer_type()
        address = g.ggml_backend_reg_get_proc_address(
            g.ggml_backend_dev_backend_reg(_cpu_device()), b"ggml_backend_cpu_set_use_ref")
        self._use_ref = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_bool)(address)
        self.reference = False

    def set_threads(self, threads: int) -> None:
        if threads != self.threads:
            g.ggml_backend_cpu_set_n_threads(self.backend, threads)
            self.threads = threads

    def compute(self, graph, reference: bool = False) -> None:
        """Run `graph`; `reference`: on ggml's reference kernels where it has them (flash
        attention a query at a time over every key, no fused ops), whose summation order does
        not follow the number of queries."""
        if reference != self.reference:
            self._use_ref(self.backend, reference)
            self.reference = reference
        if g.ggml_backend_graph_compute(self.backend, graph) != 0:
            raise RuntimeError("ggml failed to compute a graph")


@functools.cache
def cpu() -> Cpu:
    return Cpu()


def default_threads() -> int:
    """llama.cpp's default on a small machine: every core (RIVER_GGML_THREADS overrides)."""
    return int(os.environ.get("RIVER_GGML_THREADS", 0)) or min(os.cpu_count() or 1, 8)


def as_array(tensor) -> np.ndarray:
    """A numpy view of a contiguous tensor of F32/F16/I32/I64 (no copy), numpy's axis order
    (ggml's ne reversed), trailing dimensions of 1 dropped: callers reshape."""
    t = tensor.contents
    dtype = np.dtype(NUMPY[t.type])
    dims = [t.ne[i] for i in range(4)]
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    count = int(np.prod(dims))
    buffer = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(t.data)
    return np.frombuffer(buffer, dtype).reshape(tuple(reversed(dims)))


# the token embedding, read a row a token by `get_rows`, which reads a repacked tensor's
# interleaved blocks as if plain (garbage): it stays in the file's layout, as llama.cpp's
# loader keeps the input layer
EMBEDDING = "token_embd.weight"

CHECKED_ROWS = 16     # the rows of each product the load's self-check compares
PRODUCT_RTOL = 5e-2   # its bound: 8-bit activations cost ~1%, a wrong layout ~100%

NODES_PER_LAYER = 96   # a block's ops (about 60) and its exit cosines, with room to spare


def new_context(tensors: int, nodes: int):
    """A context for `tensors` tensors' metadata (no data) and a graph of `nodes` ops."""
    graph = g.ggml_graph_overhead_custom(nodes, False) if nodes else 0
    params = g.ggml_init_params(mem_size=g.ggml_tensor_overhead() * tensors + graph,
                                mem_buffer=None, no_alloc=True)
    return g.ggml_init(params)


class Graph:
    """One graph, built once: `build(ctx, inputs)` makes its ops from named input tensors
    (made here) and returns its named outputs; the graph's inputs, intermediates and outputs
    get their memory once, and `inputs`/`outputs` are numpy views of it: a run copies new
    values into the inputs' views, computes, and reads the outputs' views."""

    def __init__(self, inputs: dict[str, tuple[int, Sequence[int]]], build,
                 layers: int = 1, reference: bool = False) -> None:
        self.reference = reference   # run on ggml's reference kernels (`Cpu.compute`)
        nodes = NODES_PER_LAYER * layers + 32   # sized from what it holds: a layer's graph
        self.ctx = new_context(nodes + len(inputs), nodes)   # is small beside a span's
        made = {}
        for name, (kind, ne) in inputs.items():
            t = g.ggml_new_tensor(self.ctx, kind, len(ne),
                                  (ctypes.c_int64 * len(ne))(*ne))
            g.ggml_set_input(t)
            made[name] = t
        outs = build(self.ctx, made)
        self.graph = g.ggml_new_graph_custom(self.ctx, nodes, False)
        for t in outs.values():
            g.ggml_set_output(t)
            g.ggml_build_forward_expand(self.graph, t)
        self.alloc = g.ggml_gallocr_new(cpu().buffer_type)
        if not g.ggml_gallocr_alloc_graph(self.alloc, self.graph):
            raise MemoryError("ggml could not allocate a graph")
        self.inputs = {name: as_array(t) for name, t in made.items()}
        self.outputs = {name: as_array(t) for name, t in outs.items()}

    def run(self, **values) -> dict[str, np.ndarray]:
        for name, value in values.items():
            dst = self.inputs[name]
            np.copyto(dst, np.reshape(value, dst.shape), casting="unsafe")
        cpu().compute(self.graph, self.reference)
        return self.outputs

    def __del__(self, free_alloc=g.ggml_gallocr_free, free=g.ggml_free) -> None:
        free_alloc(self.alloc)   # the functions bound early: at exit the module may be gone
        free(self.ctx)


class MappedGGUF:
    """A GGUF's tensors as ggml tensors over the memory-mapped file: no copy, no conversion,
    each in the file's own type; only types in RUNS are accepted. The tensors ggml repacks
    (`repacks`) are copied once into its CPU_REPACK buffer instead, as llama.cpp loads them:
    the layout its fastest 4-bit kernels read (2.5x F16's GEMV speed, against 1.8x for Q4_0
    as stored: docs/results/ggml/ggml-kernels.md)."""

    def __init__(self, path: Path) -> None:
        from river_models.gguf_header import check_gguf

        self.path = Path(path)
        self.metadata = check_gguf(self.path).metadata   # truncated: one line, before ggml
        meta = ctypes.c_void_p()
        params = g.gguf_init_params(no_alloc=True, ctx=ctypes.pointer(meta))
        self._gguf = g.gguf_init_from_file(str(self.path).encode(), params)
        if not self._gguf:
            raise ModelError(f"ggml cannot read GGUF {self.path} (damaged, or a GGUF version "
                             f"ggml does not know)")
        self.ctx = meta.value
        self._file = open(self.path, "rb")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self._bytes = np.frombuffer(self._map, np.uint8)   # read-only: ggml only reads weights
        self._base = base = self._bytes.__array_interface__["data"][0]
        self._buffer = g.lib.ggml_backend_cpu_buffer_from_ptr(base, len(self._map))
        start = g.gguf_get_data_offset(self._gguf)
        self.tensors, self._offsets, repacked = {}, {}, []
        self._repacked_names: set[str] = set()
        for i in range(g.gguf_get_n_tensors(self._gguf)):
            name = g.gguf_get_tensor_name(self._gguf, i)
            t = g.ggml_get_tensor(self.ctx, name)
            kind = t.contents.type
            if kind not in NAMES:
                raise ModelError(f"{self.path.name}: tensor {name.decode()} is of ggml type "
                                 f"{g.ggml_type_name(kind).decode()}, which the ggml engine "
                                 f"does not run; it runs {', '.join(RUNS)}")
            offset = start + g.gguf_get_tensor_offset(self._gguf, i)
            if name.decode() != EMBEDDING and repacks(t):
                repacked.append((t, offset))
                self._repacked_names.add(name.decode())
            else:
                g.ggml_backend_tensor_alloc(self._buffer, t, base + offset)
            self.tensors[name.decode()] = t
            self._offsets[name.decode()] = offset
        self.head = self._head(repacked)
        self._repacked = self._repack(repacked) if repacked else None

    def _head(self, repacked: list):
        """The LM head's weight: `output.weight`, or where the embedding is tied to it the
        embedding itself, or (its type repacked on this CPU) a second copy of it that is,
        as llama.cpp's loader duplicates a tied embedding: `get_rows` reads the plain one."""
        head = self.tensors.get("output.weight")
        if head is not None or EMBEDDING not in self.tensors:
            return head
        embedding = self.tensors[EMBEDDING]
        if not repacks(embedding):
            return embedding
        self._copies = new_context(1, 0)
        head = g.ggml_dup_tensor(self._copies, embedding)
        repacked.append((head, self._offsets[EMBEDDING]))
        return head

    def _repack(self, tensors: list):
        """`tensors`, (tensor, its offset in the file) pairs, copied from the map into one
        CPU_REPACK buffer (ggml interleaves each as it is set)."""
        kind = ctypes.c_void_p(repack_buffer_type())
        align = g.ggml_backend_buft_get_alignment(kind)
        sizes = [-(-g.ggml_backend_buft_get_alloc_size(kind, t) // align) * align
                 for t, _ in tensors]
        buffer = g.ggml_backend_buft_alloc_buffer(kind, sum(sizes))
        if not buffer:
            raise MemoryError(f"ggml could not allocate {sum(sizes)} bytes to repack "
                              f"{self.path.name}'s 4-bit tensors")
        at = g.ggml_backend_buffer_get_base(buffer)
        for (t, offset), size in zip(tensors, sizes):
            g.ggml_backend_tensor_alloc(buffer, t, at)
            g.ggml_backend_tensor_set(t, ctypes.c_void_p(self._base + offset), 0,
                                      g.ggml_nbytes(t))
            # the file's pages of a repacked tensor are read once: give them back, or the
            # process holds its weights twice (a later read maps them in again)
            start, end = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE, offset + g.ggml_nbytes(t)
            if end - start >= mmap.PAGESIZE:
                self._map.madvise(mmap.MADV_DONTNEED, start,
                                  (end - start) // mmap.PAGESIZE * mmap.PAGESIZE)
            at += size
        return buffer

    def get(self, name: str):
        return self.tensors.get(name)

    def self_check(self) -> None:
        """Each way this file's weights are read (a product with each type, as placed here:
        repacked or plain; the embedding's rows) against ggml's own dequantization of the
        same rows, before any answer: a kernel or a layout that reads the bytes wrong (the
        embedding once was, repacked: issue 58) is named in one line instead of answering
        garbage. A product of the smallest matrix of each kind (milliseconds a file); a
        product's activations are rounded to 8 bits, the bound is far above that."""
        rng = np.random.default_rng(0)
        first: dict[tuple[int, bool], str] = {}
        matrices = [n for n, t in self.tensors.items() if g.ggml_n_dims(t) == 2]
        for name in sorted(matrices, key=lambda n: g.ggml_nelements(self.tensors[n])):
            first.setdefault((self.tensors[name].contents.type, name in self._repacked_names),
                             name)
        checks = [(name, self.tensors[name], name, repacked)
                  for (_, repacked), name in first.items()]
        if self.head is not None and self.head is not self.tensors.get("output.weight") \
                and self.head is not self.tensors.get(EMBEDDING):
            checks.append(("the head (a repacked copy of the tied embedding)", self.head,
                           EMBEDDING, True))
        for label, t, name, repacked in checks:
            x = rng.standard_normal(t.contents.ne[0]).astype(np.float32)
            graph = Graph({"x": (g.GGML_TYPE_F32, [len(x), 1])},
                          lambda ctx, i: {"y": g.ggml_mul_mat(ctx, t, i["x"])})
            got = graph.run(x=x)["y"].reshape(-1)[:CHECKED_ROWS]
            want = self._dequantized(name, range(CHECKED_ROWS)) @ x.astype(np.float64)
            self._compare(got, want, label, t, f"product ({_placed(repacked)})", PRODUCT_RTOL)
        table = self.tensors.get(EMBEDDING)
        if table is not None:
            ids = np.array([0, table.contents.ne[1] // 2, table.contents.ne[1] - 1], np.int32)
            graph = Graph({"ids": (g.GGML_TYPE_I32, [len(ids)])},
                          lambda ctx, i: {"rows": g.ggml_get_rows(ctx, table, i["ids"])})
            got = graph.run(ids=ids)["rows"].reshape(len(ids), -1)
            self._compare(got, self._dequantized(EMBEDDING, ids), EMBEDDING, table,
                          f"row read ({_placed(False)})", 1e-6)

    def _dequantized(self, name: str, rows) -> np.ndarray:
        """Rows `rows` of tensor `name` from the file's bytes, dequantized by ggml's own type
        traits (not the kernels under test), float64."""
        from river_models.gguf_quantize import dequantized_rows

        return dequantized_rows(self.raw(name)[list(rows)], self.kind(name),
                                self.tensors[name].contents.ne[0]).astype(np.float64)

    def _compare(self, got, want, label: str, t, what: str, rtol: float) -> None:
        error = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
        if not error <= rtol:
            kind = g.ggml_type_name(t.contents.type).decode()
            raise ModelError(f"{self.path.name}: ggml's {kind} {what} on {label} is off the "
                             f"type's own dequantization by {error:.2g} (relative, the bound "
                             f"{rtol:g}); River will not answer with it (report it, with the "
                             f"file and this CPU)")

    def floats(self, key: str) -> list[float]:
        """A float32 array of the GGUF's metadata, read by ggml (River's header reader keeps
        arrays as their lengths; gguf-py's import alone takes 0.7 s)."""
        at = g.gguf_find_key(self._gguf, key.encode())
        if at < 0 or g.gguf_get_arr_type(self._gguf, at) != g.GGUF_TYPE_FLOAT32:
            raise ModelError(f"{self.path.name} has no float array {key}")
        n = g.gguf_get_arr_n(self._gguf, at)
        return list((ctypes.c_float * n).from_address(g.gguf_get_arr_data(self._gguf, at)))

    def __del__(self, free=g.ggml_backend_buffer_free, free_context=g.ggml_free) -> None:
        if getattr(self, "_repacked", None):
            free(self._repacked)
        if getattr(self, "_copies", None):
            free_context(self._copies)

    def raw(self, name: str) -> np.ndarray:
        """A tensor's bytes in the file, [rows, row bytes] uint8 (a view of the map)."""
        t = self.tensors[name].contents
        rows = int(t.ne[1] * t.ne[2] * t.ne[3])
        row = g.ggml_row_size(t.type, t.ne[0])
        offset = self._offsets[name]
        return self._bytes[offset:offset + rows * row].reshape(rows, row)

    def kind(self, name: str) -> str:
        return NAMES[self.tensors[name].contents.type]

    def shape(self, name: str) -> tuple[int, ...]:
        t = self.tensors[name].contents
        return tuple(int(t.ne[i]) for i in range(g.ggml_n_dims(self.tensors[name])))[::-1]


def _placed(repacked: bool) -> str:
    return "repacked for this CPU" if repacked else "as stored"


class HostTensors:
    """ggml tensors over numpy arrays this process owns (the K/V cache): ggml writes them in
    place and numpy reads and indexes them, with no copy either way."""

    def __init__(self, array: np.ndarray, tensors: int) -> None:
        self.array = array
        self.ctx = new_context(tensors, 0)
        self._buffer = g.lib.ggml_backend_cpu_buffer_from_ptr(
            array.__array_interface__["data"][0], array.nbytes)

    def tensor(self, kind: int, ne: Sequence[int], offset: int):
        t = g.ggml_new_tensor(self.ctx, kind, len(ne), (ctypes.c_int64 * len(ne))(*ne))
        g.ggml_backend_tensor_alloc(self._buffer, t,
                                    self.array.__array_interface__["data"][0] + offset)
        return t


def aligned(shape: Sequence[int], dtype) -> np.ndarray:
    """An uninitialised numpy array whose memory ggml accepts as a buffer (64-byte aligned)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + 64, np.uint8)
    skip = -raw.__array_interface__["data"][0] % 64
    return raw[skip:skip + nbytes].view(dtype).reshape(shape)
