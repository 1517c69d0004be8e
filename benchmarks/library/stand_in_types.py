"""The ggml engine's stand-in types below a backbone's (issue 52): weight error, K/V error and
speed of each choice, for docs/models.md.

    python -m benchmarks.library.stand_in_types [--layers 30] [--runs 200]

1. Weight error on real weights: the embedded model's ffn_down matrices (1536 columns: the only
   ones a type below 4 bits can hold, whose super-blocks are 256 wide), quantized from its F16
   copy and from that copy requantized to Q4_K and Q4_0 by ggml (a 4-bit backbone), relative to
   the backbone each stand-in stands in for.
2. K/V error on a random llama GGUF of 256-wide rows (4 layers, 20 prompts, random exits, as
   benchmarks/river_kv_error.py measures it): the worst relative K/V error a river layer
   writes, per backbone and stand-in type.
3. Speed: one token's matrix-vector product by ggml's CPU kernels on a 4096 x 4096 matrix of
   each type (Q4_0 repacked as the engine runs it), on the engine's threads: the fastest of ten
   batches of runs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


def weight_errors(layers: int) -> list[dict]:
    from river_ggml.lib import MappedGGUF
    from river_ggml.stand_ins import dequantized, floats
    from river_models.gguf_quantize import quantized_rows
    from river_models import default_gguf
    from river_models.gguf_write import backbone
    from river_models.quant import quantize
    from river_ggml.plugin import STAND_INS

    source = MappedGGUF(backbone(default_gguf(), "F16"))
    rows = []
    for base in ("F16", "Q4_K", "Q4_0"):
        for kind in ("Q4_0", "Q3_K", "Q2_K"):
            err = norm = 0.0
            for i in range(layers):
                w = floats(source, f"blk.{i}.ffn_down.weight")
                if base != "F16":   # the backbone as a 4-bit GGUF holds it
                    w = dequantized(quantized_rows(w, base), base, w.shape)
                got = quantize(w, STAND_INS).dequantize() if kind == "Q4_0" else \
                    dequantized(quantized_rows(w, kind), kind, w.shape)
                err += float(((got.astype(np.float64) - w) ** 2).sum())
                norm += float((w.astype(np.float64) ** 2).sum())
            rows.append({"backbone": base, "stand_ins": kind, "error": (err / norm) ** 0.5})
    return rows


def kv_errors(prompts: int) -> list[dict]:
    from river_core.method.kv import Full, River
    from river_core.method.predictor import relative_error
    from river_conformance.scripted import forced_logits
    from river_ggml.backend import GgmlBackend
    from river_ggml.lib import MappedGGUF
    from river_ggml.plugin import STAND_INS, spec_and_tokenizer
    from river_ggml.stand_ins import stand_ins
    from river_ggml.wide import random_gguf

    rng = np.random.default_rng(0)
    rows = []
    folder = Path(tempfile.mkdtemp(prefix="river-stand-in-types-"))
    for base, kinds in (("F16", ("Q4_0",)), ("Q8_0", ("Q4_0",)),
                        ("Q4_K", ("Q4_0", "Q3_K", "Q2_K")), ("Q4_0", ("Q4_0", "Q3_K", "Q2_K"))):
        path = random_gguf(folder / f"{base}.gguf", base, 256, 768, layers=4)
        spec, tokenizer = spec_and_tokenizer(str(path))
        source = MappedGGUF(path)
        for kind in kinds:
            b = GgmlBackend(source, spec, tokenizer,
                            stand_ins(source, spec.num_layers, STAND_INS, kind))
            worst = []
            for _ in range(prompts):
                prompt = [1] + rng.integers(10, spec.vocab, rng.integers(2, 20)).tolist()
                cont = rng.integers(10, spec.vocab, 8).tolist()
                forced_logits(b, prompt, cont, Full())
                full = [b.read_kv(i) for i in range(b.num_layers)]
                exits = rng.integers(0, b.num_layers - 1, len(cont)).tolist()
                forced_logits(b, prompt, cont, River(), exits)
                got = [b.read_kv(i) for i in range(b.num_layers)]
                for step, k in enumerate(exits):
                    pos = len(prompt) + step
                    worst += [max(relative_error(got[j][w][:, :, pos].astype(np.float32),
                                                 full[j][w][:, :, pos].astype(np.float32))
                                  for w in (0, 1)) for j in range(k + 1, b.num_layers)]
            rows.append({"backbone": base, "stand_ins": kind, "eps": float(np.mean(b.stand_in_error)),
                         "max_kv_error": max(worst), "mean_kv_error": float(np.mean(worst))})
    return rows


def speeds(runs: int) -> list[dict]:
    import gguf

    from river_ggml import lib
    from river_ggml.lib import MappedGGUF, g
    from river_models.gguf_quantize import quantized_rows

    n = 4096   # 9 MiB at 4 bits: past the caches, as a model's layers are
    w = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32) * 0.05
    path = Path(tempfile.mkdtemp(prefix="river-stand-in-speed-")) / "types.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    kinds = ("F16", "Q8_0", "Q6_K", "Q5_K", "Q4_K", "Q4_0", "Q3_K", "Q2_K")
    for kind in kinds:
        if kind == "F16":
            writer.add_tensor(kind, w.astype(np.float16))
        else:
            writer.add_tensor(kind, quantized_rows(w, kind),
                              raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    mapped = MappedGGUF(path)
    lib.cpu().set_threads(lib.default_threads())
    graphs = {kind: lib.Graph({"x": (g.GGML_TYPE_F32, [n, 1])},
                              lambda ctx, t, k=kind: {"y": g.ggml_mul_mat(ctx, mapped.get(k),
                                                                          t["x"])})
              for kind in kinds}
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    best = dict.fromkeys(kinds, float("inf"))
    for _ in range(10):   # the types in turn, the fastest batch of each: a shared host's
        for kind, graph in graphs.items():   # load only adds time
            graph.run(x=x)
            start = time.perf_counter()
            for _ in range(runs // 10):
                graph.run(x=x)
            best[kind] = min(best[kind], (time.perf_counter() - start) / (runs // 10) * 1e6)
    return [{"type": k, "bytes": int(g.ggml_nbytes(mapped.get(k))), "us": best[k]}
            for k in kinds]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    from benchmarks.library.timing import machine

    print(machine())
    for r in weight_errors(args.layers):
        print(f"weights | {r['backbone']} | {r['stand_ins']} | {r['error']:.4f}")
    for r in kv_errors(args.prompts):
        print(f"kv | {r['backbone']} | {r['stand_ins']} | eps {r['eps']:.4f} | "
              f"max {r['max_kv_error']:.4f} | mean {r['mean_kv_error']:.4f}")
    for r in speeds(args.runs):
        print(f"speed | {r['type']} | {r['bytes'] / 2 ** 20:.2f} MiB | {r['us']:.0f} us")


if __name__ == "__main__":
    main()
