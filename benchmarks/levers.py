"""The speed levers tried for the fast step, each measured against its alternative.

    river bench levers
    river bench levers --only draft_head verification_ms   # some again, keep the rest

On the embedded model (float32 backbone, 4-bit HQQ stand-ins), one decoding token, median over
repeats, cycling through all layers where weights are involved (cold caches, as in a real step):
- fused projections: a layer's seven projections as seven matmuls, or as four (Q/K/V and
  gate/up fused), backbone (float32) and stand-in (packed 4-bit);
- `torch.compile` (CPU inductor) of one decode block against eager;
- the decoder layer written once over each engine's primitives: its own Python calls;
- ONNX: the exit river after layer 3 as one session run (`stand_in_tail`) or one per layer;
- ONNX `MatMulNBits` on a 1536x576 4-bit weight: accuracy level 0 against 4, integer against
  float zero points;
- the drafts' head (speculative mode): the float32 LM head against its int8 and 4-bit copies,
  time on onnx and how often each picks full precision's token (the whole model at 4 bits
  reading 4-shot GSM8K text);
- verification (speculative mode, hf): the backbone over 1-7 positions, a pass a token;
- what a confidence rule (CALM) pays: a step exiting after layer 3 reading the early softmax
  at no layer, one, or four;
- ONNX stand-ins with HQQ's float zero points (corrected by extra nodes) or integer ones.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np

from river_core import QuantSpec
from river_models import FUSED, PROJECTIONS, open_model, stand_ins

from .library import gsm8k
from .library.output import Harness, parser
from .library.prompts import GSM8K_TRAIN
from .library.timing import median_us


def fused_projections(checkpoint, quantized) -> dict:
    import torch

    from river_compute.torch_blocks import Dense, fused, packed

    cpu = torch.device("cpu")
    layers = checkpoint.weights.layers
    x = {n: torch.randn(1, 1, layers[0].projections[n].shape[1]) for n in PROJECTIONS}
    out = {}
    for kind, q in (("backbone", None), ("stand-in", quantized.layers)):
        single = [{n: Dense(l.projections[n], None, torch.float32, cpu) if q is None
                   else packed(q[i][n], None, torch.float32, cpu) for n in PROJECTIONS}
                  for i, l in enumerate(layers)]
        joined = [{f: fused(l, names, torch.float32, cpu, None if q is None else q[i])
                  for f, names in FUSED.items()} for i, l in enumerate(layers)]
        with torch.inference_mode():
            seven = median_us(lambda: [p[n](x[n]) for p in single for n in PROJECTIONS])
            four = median_us(lambda: [p[f](x[names[0]]) for p in joined
                                      for f, names in FUSED.items()])
        out[kind] = {"seven_matmuls_us_per_layer": seven / len(layers),
                     "fused_four_us_per_layer": four / len(layers)}
    return out


def compiled_block(model: str | None) -> dict:
    """Layer 5 of the hf engine as it runs a decoding token at 100 positions (the skeleton's
    block over the engine's primitives, its cache write included), eager and under
    `torch.compile` with static shapes (under no_grad: inductor does not write the cache's
    inference tensors)."""
    import torch

    from river_compute.skeleton import decoder_layer
    from river_compute.torch_blocks import TorchLayer

    backend, p, x = decoding(model, "hf", 100)
    x = x.clone()   # not an inference tensor
    out = {}
    for kind, blocks in (("backbone", backend.blocks), ("stand-in", backend.stand_ins)):
        step = lambda x: decoder_layer(x, TorchLayer(blocks[5], p, 5, backend.cache, None))[0]
        with torch.no_grad():
            eager = median_us(lambda: step(x), repeats=200)
            start = time.perf_counter()
            compiled = torch.compile(step, dynamic=False)
            compiled(x)
            seconds = time.perf_counter() - start
            out[kind] = {"eager_us": eager, "compiled_us": median_us(lambda: compiled(x),
                                                                    repeats=200),
                         "compile_seconds": seconds}
    return out


def skeleton_python() -> dict:
    """What writing the decoder layer once costs in Python: `decoder_layer` over primitives
    that do no work (every engine's layer pays these calls beside its tensor operations; the
    onnx and ggml engines only while building a graph)."""
    import timeit

    from river_compute.skeleton import BoundLayer, Primitives, decoder_layer
    from river_models.spec import NORMS

    class Idle(Primitives):
        layer = BoundLayer({**dict.fromkeys(NORMS), "input_norm": 1, "pre_mlp_norm": 1}, {})

        def norm(self, h, weight):
            return h

        def project(self, h, name, parts=None):
            return (h,) * len(parts or FUSED[name])

        def rotate(self, q, k):
            return q, k

        def attend(self, q, k, v):
            return q

        def activation(self, gate):
            return gate
    ops, calls = Idle(), 100_000
    seconds = min(timeit.repeat(lambda: decoder_layer(1.0, ops), number=calls, repeat=7))
    return {"us_per_layer": seconds / calls * 1e6}


def decoding(model: str | None, engine: str, positions: int, **load):
    """`engine`'s backend over `model`, a prompt of `positions` tokens prefilled: (backend, the
    pass of one decoding token after it, that token's embedding)."""
    from river_core import RiverModel, Step

    backend = RiverModel.from_pretrained(model, backend=engine, progress=True, **load).backend
    backend.prefill([[1] * positions], positions + 72)
    p = backend.begin([5], Step(positions))
    return backend, p, backend.embed(p)


def onnx_tail(model: str | None) -> dict:
    backend, p, h = decoding(model, "onnx", 128)
    start = 4   # a token that exits after layer 3

    def per_layer():
        x = h
        for i in range(start, backend.num_layers):
            x = backend.stand_in_layer(p, i, x, None)
    return {"start": start, "layers": backend.num_layers - start,
            "one_run_per_layer_ms": median_us(per_layer) / 1e3,
            "one_run_ms": median_us(lambda: backend.stand_in_tail(p, start, h, None)) / 1e3}


def stand_in_zero_points(model: str | None) -> dict:
    """onnx, one decode token at 64 positions: a stand-in layer (cycling through the layers)
    and the whole 4-bit model's exit river (tail_0), with HQQ's float zero points (corrected
    by three extra nodes per projection) and with them rounded to integers (hqq-int)."""
    runs = {method: decoding(model, "onnx", 64, quant=QuantSpec(method=method))
            for method in ("hqq", "hqq-int")}
    out = {method: {} for method in runs}
    for _ in range(3):   # interleaved rounds
        for method, (b, p, h) in runs.items():
            layers = median_us(lambda: [b.stand_in_layer(p, i, h, None)
                                        for i in range(b.num_layers)], repeats=10)
            out[method].setdefault("stand_in_us", []).append(layers / b.num_layers)
            out[method].setdefault("tail_0_ms", []).append(
                median_us(lambda: b.stand_in_tail(p, 0, h, None), repeats=10) / 1e3)
    return {m: {k: float(np.median(v)) for k, v in r.items()} for m, r in out.items()}


def onnx_scratch(width: int):
    """(a scratch folder for graphs, ONNX Runtime's CPU sessions, a random state [1, 1,
    width])."""
    from river_onnx.backend import sessions_for

    return (Path(tempfile.mkdtemp(prefix="river-levers-")), sessions_for("cpu"),
            np.random.default_rng(0).standard_normal((1, 1, width)).astype(np.float32))


def matmul_nbits(quantized) -> dict:
    import onnx

    from river_onnx import graphs
    from river_onnx.quant import nbits

    q = quantized.layers[5]["gate"]   # 1536 x 576, 4-bit
    folder, make, x = onnx_scratch(q.shape[1])
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


def draft_head(checkpoint, model_path: str | None) -> dict:
    """Time of the head and its copies on onnx, and their argmax agreement with float32 over
    the final states of the whole model at 4 bits."""
    import onnx

    from river_core import ExitConfig, RiverModel
    from river_models.quant import quantize
    from river_onnx import graphs
    from river_onnx.quant import nbits

    weight = checkpoint.weights.head
    copies = {"int8": quantize(weight, QuantSpec(bits=8)),
              "int4 (HQQ, groups of 64)": quantize(weight, QuantSpec())}
    norm = graphs.Norm.of(checkpoint.weights.final_norm, checkpoint.spec)
    folder, make, x = onnx_scratch(weight.shape[1])
    times = {}
    for label, w in [("float32", weight), *((k, nbits(q)) for k, q in copies.items())]:
        path = folder / f"head{len(times)}.onnx"
        onnx.save_model(graphs.head(norm, w, None), path, save_as_external_data=True,
                        location=f"head{len(times)}.data")
        session = make(path)
        times[label] = median_us(lambda: session.run(None, {"h": x})) / 1e3
    model = RiverModel.from_pretrained(model_path, backend="hf")
    states = []
    backend = model.backend
    head = backend.logits
    backend.logits = lambda h: (states.append(h[:, -1].float().numpy()), head(h))[1]
    problems = gsm8k.load(str(GSM8K_TRAIN), limit=8)
    tok = backend.tokenizer
    for p in problems[4:]:
        prompt = tok.encode(gsm8k.prompt(p, problems[:4]))
        model.teacher_force([prompt], [tok.encode(" " + p.solution)],
                            ExitConfig(policy="fixed", options={"layer": -1}))
    backend.logits = head
    h = np.concatenate(states)
    h = h / np.sqrt((h * h).mean(-1, keepdims=True) + checkpoint.spec.norm_eps) * norm.weight
    want = (h @ weight.T).argmax(-1)
    agree = {k: float(((h @ q.dequantize().T).argmax(-1) == want).mean())
             for k, q in copies.items()}
    return {"ms": times, "argmax_agreement": agree, "states": len(h)}


def verification(model: str | None, repeats: int = 15) -> dict:
    """The hf backbone verifying m positions (speculative mode), ms: a pass a token, each
    computed bitwise as a decode step (`LayerEngine.exact_width`: a batched matmul's summation
    order follows its rows; oneDNN's prepacked kernel, faster from 4 rows, was dropped so)."""
    from river_core import RiverModel

    backend = RiverModel.from_pretrained(model, backend="hf").backend
    backend.prefill([[1] * 300], 400)
    return {"a pass a token": {m: median_us(lambda: backend.extend([42] * m, 300),
                                            repeats=repeats) / 1e3
                               for m in (1, 2, 3, 4, 5, 7)}}


def confidence_cost(model: str | None, repeats: int = 30) -> dict:
    """A decode step exiting after layer 3, with the early softmax read at no layer (a fixed
    rule), at layer 3 only, and at every layer from 0 (CALM from the first layer): ms, onnx,
    on the embedded model's 49,152-token vocabulary."""
    from river_core import RiverModel, Step
    from river_core.loop.decode import Row, Run, decode_step
    from river_core.method.kv import River
    from river_core.method.policy import Policy
    from river_core.method.predictor import TransitionPredictor

    class Reading(Policy):
        def __init__(self, first: int | None) -> None:
            self.first = first

        def should_exit(self, row) -> bool:
            if self.first is not None and row.layer >= self.first:
                row.logits()
            return row.layer == 3

    backend = RiverModel.from_pretrained(model, backend="onnx").backend
    n = backend.num_layers
    backend.prefill([[1] * 128], 129)
    rows = [Row(TransitionPredictor(backend.stand_in_error, np.zeros(n)), None)]
    out = {}
    for label, first in (("no reading", None), ("read at layer 3", 3),
                         ("read at layers 0-3", 0)):
        run = Run(River(), Reading(first), TransitionPredictor)

        def step():
            decode_step(backend, [42], run, rows, 0, Step(128))
        out[label] = median_us(step, repeats=repeats) / 1e3
    return out


LEVERS = {"fused_projections": lambda c, q, model: fused_projections(c, q),
          "torch_compile": lambda c, q, model: compiled_block(model),
          "skeleton_python": lambda c, q, model: skeleton_python(),
          "onnx_tail": lambda c, q, model: onnx_tail(model),
          "matmul_nbits_us": lambda c, q, model: matmul_nbits(q),
          "draft_head": lambda c, q, model: draft_head(c, model),
          "verification_ms": lambda c, q, model: verification(model),
          "confidence_cost_ms": lambda c, q, model: confidence_cost(model),
          "stand_in_zero_points": lambda c, q, model: stand_in_zero_points(model)}


def by_kind(entry: dict | None, row) -> list[str]:
    """A lever's table rows for the backbone and the stand-ins (none where it did not run)."""
    return [row(kind, entry[kind]) for kind in ("backbone", "stand-in")] if entry else []


def main(argv: list[str] | None = None) -> None:
    ap = parser("levers", __doc__)
    ap.add_argument("--only", nargs="+", choices=list(LEVERS),
                    help="measure these levers again and keep the other results")
    out, args = Harness.parse(ap, argv)
    checkpoint = open_model(args.model, progress=True)
    quantized = stand_ins(checkpoint, QuantSpec(), progress=True)
    previous = out.folder / "levers.json"
    kept = json.loads(previous.read_text()) if args.only and previous.is_file() else {}
    result = kept.get("result", {})
    info = out.machine
    # which machine measured each lever: --only keeps results measured elsewhere
    ran_on = kept.get("ran_on") or {name: kept["machine"]["cpu"] for name in result}
    for name in args.only or LEVERS:
        result[name] = LEVERS[name](checkpoint, quantized, args.model)
        ran_on[name] = info["cpu"]
    machines = "; ".join(f"{cpu}: {', '.join(n for n in ran_on if ran_on[n] == cpu)}"
                         for cpu in dict.fromkeys(ran_on.values()))
    lines = [f"# Speed levers, {args.model or 'embedded SmolLM2-135M-Instruct'}", "",
             f"Command: `{out.command}` (`--only NAME` measures one again). "
             f"Machines, {info['cores']} cores, by lever: {machines}.", "",
             "| lever | without | with |", "|---|---|---|"]
    lines += by_kind(result.get("fused_projections"), lambda kind, f: (
        f"| fused Q/K/V and gate/up, {kind} matmuls per layer | "
        f"{f['seven_matmuls_us_per_layer']:.0f} µs (7 matmuls) | "
        f"{f['fused_four_us_per_layer']:.0f} µs (4) |"))
    lines += by_kind(result.get("torch_compile"), lambda kind, c: (
        f"| torch.compile, one {kind} decode block | {c['eager_us']:.0f} µs eager | "
        f"{c['compiled_us']:.0f} µs compiled (after {c['compile_seconds']:.0f} s compiling) |"))
    if k := result.get("skeleton_python"):
        lines.append(f"| the decoder layer written once (`river_compute.skeleton`), its Python "
                     f"calls alone (primitives doing no work) | each engine's own block | "
                     f"{k['us_per_layer']:.1f} µs a layer |")
    if t := result.get("onnx_tail"):
        lines.append(f"| onnx exit river after layer {t['start'] - 1} ({t['layers']} "
                     f"stand-ins) | {t['one_run_per_layer_ms']:.1f} ms, one session run per "
                     f"layer | {t['one_run_ms']:.1f} ms, one run |")
    if m := result.get("matmul_nbits_us"):
        lines += ["", "`MatMulNBits`, layer 5's gate projection at 4 bits, one token:", "",
                  "| setting | µs |", "|---|---|"]
        lines += [f"| {label} | {us:.0f} |" for label, us in m.items()]
    if d := result.get("draft_head"):
        lines += ["", f"The drafts' head, one token on onnx, and how often its argmax is "
                  f"float32's over {d['states']} final states of the whole model at 4 bits "
                  f"(4-shot GSM8K):", "", "| head | ms | same token as float32 |",
                  "|---|---|---|"]
        same = {**d["argmax_agreement"], "float32": None}
        lines += [f"| {k} | {ms:.2f} | {'-' if same[k] is None else format(same[k], '.1%')} |"
                  for k, ms in d["ms"].items()]
    if v := result.get("verification_ms"):
        lines += ["", "Verification on hf: the backbone over m positions at once, ms:", "",
                  "| matmul | " + " | ".join(f"m={m}" for m in next(iter(v.values()))) + " |",
                  "|---" * (1 + len(next(iter(v.values())))) + "|"]
        lines += [f"| {k} | " + " | ".join(f"{ms:.1f}" for ms in row.values()) + " |"
                  for k, row in v.items()]
    if "confidence_cost_ms" in result:
        lines += ["", "A decode step exiting after layer 3 (onnx), reading the early softmax "
                  "(final norm and the 49,152-token head) where a confidence rule would:", "",
                  "| reading | ms per step |", "|---|---|"]
        lines += [f"| {k} | {ms:.2f} |" for k, ms in result["confidence_cost_ms"].items()]
    if "stand_in_zero_points" in result:
        z = result["stand_in_zero_points"]
        lines += ["", "HQQ's float zero points (three correction nodes per projection, "
                  "quant.py) against zero points rounded to integers (`--quantizer hqq-int`), "
                  "onnx, one decode token at 64 positions:", "",
                  "| stand-ins | µs per stand-in layer | whole 4-bit model's exit river, ms |",
                  "|---|---|---|"]
        lines += [f"| {m} | {r['stand_in_us']:.0f} | {r['tail_0_ms']:.2f} |"
                  for m, r in z.items()]
    out.write("levers", {"machine": info, "ran_on": ran_on, "result": result},
              "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
