"""ggml's CPU matrix kernels on this machine, for the ggml engine's choices: a layer's worth of
matrix products (`--count` matrices of `--rows` x `--columns`, random weights) in one graph,
per weight type (F16, Q8_0, Q4_1, Q4_0, and Q4_0 in the CPU backend's CPU_REPACK buffer, as
llama.cpp loads it), with 1 to 16 activation columns (a decode step, a verification of k
tokens). Median ms of warm repeats, and the weight bytes read per second.
"""

from __future__ import annotations

import ctypes
import statistics
import time

import numpy as np

from .library.output import Harness, parser

KINDS = ("F16", "Q8_0", "Q4_1", "Q4_0", "Q4_0 repacked")


def weights(kind: str, rows: int, columns: int) -> np.ndarray:
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    w = np.random.default_rng(0).standard_normal((rows, columns)).astype(np.float32) * 0.02
    stored = kind.split()[0]
    return w.astype(np.float16) if stored == "F16" else \
        quantize(w, GGMLQuantizationType[stored])


def measure(kind: str, rows: int, columns: int, count: int, tokens: int, repeats: int) -> float:
    """Median ms of `count` products of `kind` weights [rows, columns] by [columns, tokens]."""
    from river_ggml.lib import Graph, cpu, g, new_context, repack_buffer_type

    data = weights(kind, rows, columns)
    ctx = new_context(count + 4, 0)
    stored = getattr(g, f"GGML_TYPE_{kind.split()[0]}")
    matrices = [g.ggml_new_tensor_2d(ctx, stored, columns, rows) for _ in range(count)]
    buffer_type = repack_buffer_type() if kind.endswith("repacked") else cpu().buffer_type
    if buffer_type is None:
        raise SystemExit("this CPU's ggml offers no CPU_REPACK buffer")
    buffer = g.ggml_backend_alloc_ctx_tensors_from_buft(ctx, ctypes.c_void_p(buffer_type))
    for m in matrices:
        g.ggml_backend_tensor_set(m, data.ctypes.data_as(ctypes.c_void_p), 0, data.nbytes)
    graph = Graph({"x": (g.GGML_TYPE_F32, [columns, tokens])},
                  lambda c, t: {f"y{i}": g.ggml_mul_mat(c, m, t["x"])
                                for i, m in enumerate(matrices)})
    x = np.random.default_rng(1).standard_normal((tokens, columns)).astype(np.float32)
    times = []
    for _ in range(repeats + 3):
        start = time.perf_counter()
        graph.run(x=x)
        times.append(time.perf_counter() - start)
    g.ggml_backend_buffer_free(buffer)
    g.ggml_free(ctx)
    return 1e3 * statistics.median(times[3:])


def report(p: dict) -> str:
    info = p["machine"]
    lines = ["# ggml's CPU matrix kernels", "",
             f"Command: `{p['command']}`. Machine: {info['cpu']}, {info['cores']} cores, copy "
             f"bandwidth {info['memory_bandwidth_gb_s']} GB/s, {p['threads']} threads. "
             f"{p['count']} matrices of {p['matrix'][0]} x {p['matrix'][1]} in one graph; median ms "
             "(GB/s of weights read at one column).", "",
             "| weights | " + " | ".join(f"{t} column{'s' * (t > 1)}" for t in p["tokens"]) + " |",
             "|---|" + "---|" * len(p["tokens"])]
    for kind, row in p["rows"].items():
        cells = [f"{row[str(t)]:.2f}" for t in p["tokens"]]
        cells[0] += f" ({row['gb_s']:.1f} GB/s)"
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = parser("ggml_kernels", __doc__, model=False, results="ggml-kernels")
    ap.add_argument("--rows", type=int, default=1536)
    ap.add_argument("--columns", type=int, default=576)
    ap.add_argument("--count", type=int, default=90, help="matrices in the graph (the "
                    "embedded model: 30 layers of 3 MLP matrices of 1536 x 576)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    ap.add_argument("--threads", type=int, default=None, help="default: the engine's")
    ap.add_argument("--repeats", type=int, default=15)
    out, args = Harness.parse(ap, argv)
    from river_ggml.lib import cpu, default_threads

    threads = args.threads or default_threads()
    cpu().set_threads(threads)
    rows = {}
    for kind in args.kinds:
        rows[kind] = {str(t): measure(kind, args.rows, args.columns, args.count, t, args.repeats)
                      for t in args.tokens}
        one = args.tokens[0]
        rows[kind]["gb_s"] = weights(kind, args.rows, args.columns).nbytes * args.count / \
            (rows[kind][str(one)] * 1e-3) / 1e9
    payload = {**out.head(), "threads": threads, "rows": rows, "tokens": args.tokens,
               "count": args.count, "matrix": [args.rows, args.columns],
               "args": out.arguments()}
    out.write(args.name, payload, report(payload))


if __name__ == "__main__":
    main()
