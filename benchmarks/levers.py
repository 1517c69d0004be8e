"""The speed levers tried for the fast step, each measured against its alternative.

    python -m benchmarks levers

On the embedded model (float32 backbone, 4-bit HQQ stand-ins), one decoding token, median over
repeats, cycling through all layers where weights are involved (cold caches, as in a real step):
- fused projections: a layer's seven projections as seven matmuls, or as four (Q/K/V and
  gate/up fused), backbone (float32) and stand-in (packed 4-bit);
- `torch.compile` (CPU inductor) of one decode block against eager;
- ONNX: the exit river after layer 3 as one session run (`stand_in_tail`) or one per layer;
- ONNX `MatMulNBits` on a 1536x576 4-bit weight: accuracy level 0 against 4, integer against
  float zero points.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from common import machine, write
from river_core import QuantSpec
from river_models import FUSED, PROJECTIONS, open_model, stand_ins


def median_us(run, repeats: int = 30, warmup: int = 5) -> float:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e6


def fused_projections(checkpoint, quantized) -> dict:
    import torch

    from river_hf.blocks import _fused, dense, packed

    cpu = torch.device("cpu")
    layers = checkpoint.weights.layers
    x = {n: torch.randn(1, 1, layers[0].projections[n].shape[1]) for n in PROJECTIONS}
    out = {}
    for kind, q in (("backbone", None), ("stand-in", quantized.layers)):
        single = [{n: dense(l.projections[n], None, torch.float32, cpu) if q is None
                   else packed(q[i][n], None, torch.float32, cpu) for n in PROJECTIONS}
                  for i, l in enumerate(layers)]
        fused = [{f: _fused(l, names, torch.float32, cpu, None if q is None else q[i])
                  for f, names in FUSED.items()} for i, l in enumerate(layers)]
        with torch.inference_mode():
            seven = median_us(lambda: [p[n](x[n]) for p in single for n in PROJECTIONS])
            four = median_us(lambda: [p[f](x[names[0]]) for p in fused
                                      for f, names in FUSED.items()])
        out[kind] = {"seven_matmuls_us_per_layer": seven / len(layers),
                     "fused_four_us_per_layer": four / len(layers)}
    return out


def compiled_block(checkpoint, quantized) -> dict:
    import torch
    import torch.nn.functional as F

    from river_hf.blocks import Block

    spec, cpu = checkpoint.spec, torch.device("cpu")
    capacity, hd = 256, spec.head_dim
    cache_k = torch.zeros(1, spec.kv_heads, capacity, hd)
    cache_v = torch.zeros(1, spec.kv_heads, capacity, hd)
    pos = torch.tensor([100])
    cos, sin = torch.randn(1, 1, 1, hd), torch.randn(1, 1, 1, hd)
    mask = torch.zeros(1, 1, 1, capacity)
    mask[..., 101:] = float("-inf")
    x = torch.randn(1, 1, spec.hidden)

    def step(b, x):
        """One decode block over a static-capacity cache (static shapes, for the compiler)."""
        xn = b.input_norm(x)
        q, k, v = (t.reshape(1, 1, -1, hd).transpose(1, 2)
                   for t in b.proj["qkv"](xn).split(b.splits, -1))
        half = hd // 2
        rot = lambda t: t * cos + torch.cat((-t[..., half:], t[..., :half]), -1) * sin
        q, k = rot(q), rot(k)
        cache_k.index_copy_(2, pos, k)
        cache_v.index_copy_(2, pos, v)
        a = F.scaled_dot_product_attention(q, cache_k, cache_v, attn_mask=mask,
                                           scale=spec.attn_scale, enable_gqa=True)
        x = x + b.proj["o"](a.transpose(1, 2).reshape(1, 1, -1))
        gate, up = b.proj["gate_up"](b.pre_mlp_norm(x)).chunk(2, -1)
        return x + b.proj["down"](F.silu(gate) * up)

    out = {}
    layer = checkpoint.weights.layers[5]
    for kind, q in (("backbone", None), ("stand-in", quantized.layers[5])):
        block = Block.build(5, layer, spec, torch.float32, cpu, q)
        with torch.inference_mode():
            eager = median_us(lambda: step(block, x), repeats=200)
            start = time.perf_counter()
            compiled = torch.compile(lambda x: step(block, x), dynamic=False)
            compiled(x)
            seconds = time.perf_counter() - start
            out[kind] = {"eager_us": eager, "compiled_us": median_us(lambda: compiled(x),
                                                                    repeats=200),
                         "compile_seconds": seconds}
    return out


def onnx_tail() -> dict:
    from river_core import RiverModel

    backend = RiverModel.from_pretrained(backend="onnx", progress=True).backend
    backend.prefill([[1] * 128], 200)
    h = backend.embed([5])
    start = 4   # a token that exits after layer 3

    def per_layer():
        x = h
        for i in range(start, backend.num_layers):
            x = backend.stand_in_layer(i, x, None)
    return {"start": start, "layers": backend.num_layers - start,
            "one_run_per_layer_ms": median_us(per_layer) / 1e3,
            "one_run_ms": median_us(lambda: backend.stand_in_tail(start, h, None)) / 1e3}


def matmul_nbits(quantized) -> dict:
    import onnx

    from river_onnx import graphs
    from river_onnx.backend import sessions_for
    from river_onnx.quant import nbits

    q = quantized.layers[5]["gate"]   # 1536 x 576, 4-bit
    folder = Path(tempfile.mkdtemp(prefix="river-levers-"))
    make = sessions_for("cpu")
    x = np.random.default_rng(0).standard_normal((1, 1, q.shape[1])).astype(np.float32)
    out = {}
    for label, level, float_zero in (("level 4, integer zero + correction", 4, False),
                                     ("level 0, integer zero + correction", 0, False),
                                     ("level 4, float zero in the kernel", 4, True)):
        weight = nbits(q)
        g = graphs.Graph()
        inp = g.input("x", [1, 1, q.shape[1]])
        if float_zero:
            y = g.op("MatMulNBits", inp, g.const(weight.packed), g.const(weight.scales),
                     g.const(np.repeat(q.zero, q.group // weight.block, 1).reshape(-1)),
                     domain="com.microsoft", K=weight.columns, N=weight.rows, bits=4,
                     block_size=weight.block, accuracy_level=level)
        else:
            saved, graphs.ACCURACY_LEVEL = graphs.ACCURACY_LEVEL, level
            y = g.linear(inp, graphs.Linear(weight))
            graphs.ACCURACY_LEVEL = saved
        g.output(y, "y")
        path = folder / f"m{len(out)}.onnx"
        onnx.save_model(g.model(), path)
        session = make(path)
        out[label] = median_us(lambda: session.run(None, {"x": x}), repeats=300)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.parse_args()
    checkpoint = open_model(progress=True)
    quantized = stand_ins(checkpoint, QuantSpec(), progress=True)
    result = {"fused_projections": fused_projections(checkpoint, quantized),
              "torch_compile": compiled_block(checkpoint, quantized),
              "onnx_tail": onnx_tail(), "matmul_nbits_us": matmul_nbits(quantized)}
    info = machine()
    f, c, t, m = (result[k] for k in ("fused_projections", "torch_compile", "onnx_tail",
                                      "matmul_nbits_us"))
    lines = ["# Speed levers, embedded SmolLM2-135M-Instruct", "",
             f"Command: `python -m benchmarks levers`. Machine: {info['cpu']}, "
             f"{info['cores']} cores.", "", "| lever | without | with |", "|---|---|---|"]
    for kind in ("backbone", "stand-in"):
        lines.append(f"| fused Q/K/V and gate/up, {kind} matmuls per layer | "
                     f"{f[kind]['seven_matmuls_us_per_layer']:.0f} µs (7 matmuls) | "
                     f"{f[kind]['fused_four_us_per_layer']:.0f} µs (4) |")
    for kind in ("backbone", "stand-in"):
        lines.append(f"| torch.compile, one {kind} decode block | {c[kind]['eager_us']:.0f} µs "
                     f"eager | {c[kind]['compiled_us']:.0f} µs compiled (after "
                     f"{c[kind]['compile_seconds']:.0f} s compiling) |")
    lines.append(f"| onnx exit river after layer {t['start'] - 1} ({t['layers']} stand-ins) | "
                 f"{t['one_run_per_layer_ms']:.1f} ms, one session run per layer | "
                 f"{t['one_run_ms']:.1f} ms, one run |")
    lines += ["", "`MatMulNBits`, 1536x576 at 4 bits, one token:", "",
              "| setting | µs |", "|---|---|"]
    lines += [f"| {label} | {us:.0f} |" for label, us in m.items()]
    write("levers", {"machine": info, "result": result}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
