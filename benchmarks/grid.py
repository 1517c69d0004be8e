"""Decode speed as one grid: engines x configurations x prompts x context positions x model
shapes, interleaved, median ms/token at batch 1, beside the byte limit.

    river bench grid                                   # hf and onnx, embedded model
    river bench grid --engines hf hf:bfloat16 --shapes default llama-1b --positions 64 2048
    river bench grid --engines onnx llamacpp:Q4_1 llamacpp:F32 genai:fp32 --configs backbone
    river bench grid --device cuda --engines hf:bfloat16 --shapes default llama-1b llama-8b

Engines: River's, BACKEND[:DTYPE] (hf, hf:bfloat16, onnx, onnx:int8, ...), and the anchors,
what a CPU user runs instead, each in a worker process of its own environment: llama.cpp
(`llamacpp:KIND`, KIND Q4_1, the embedded GGUF, or F32, F16, Q8_0 written from it) and ONNX
Runtime GenAI (`genai:fp32`, `genai:int4`, built by its own model builder from the same
weights); and `transformers`, transformers' own greedy generate() in this process (a step:
between consecutive logits-processor calls). They decode at full depth, on the real model only. Configurations (River's
engines): backbone (full depth), exit (exit mode at the paper's rule, ExitConfig()), lossless
(lossless mode, River's defaults), whole-4bit (every layer a stand-in), exit@K (every token
leaves after layer K), lossless@W (drafts attend the last W positions), lossless/D (D drafts a
round); an exit-mode name + "+stand-in-head" (exit+stand-in-head, exit@3+stand-in-head): its
exited tokens take the head's 8-bit stand-in (ExitConfig.exit_head). Shapes: `default` (the
embedded model, or --model) and random-weight models of known shapes (library/shapes.py:
tiny, llama-1b, llama-8b), for speed alone.

Per shape, every round sends each prompt at each length to every (engine, configuration), in
an order rotated per prompt, after one warm-up generation each, so drift of a shared machine
hits all alike. ms/token is River's one definition (DecodeResult.ms_per_token: decode time
over the tokens after the first, which comes from prefill; the anchors' workers time the
same), the median over prompts and rounds. The byte limit: the bytes a token reads at its
exit layer (the engine's `footprint()`: weights at their stored precision, the head, the K/V
of the context) over the device's measured copy bandwidth; lossless rows have none (a token's
bytes there depend on what the backbone accepts). Same as backbone: greedy tokens equal to the
same engine's backbone (anchors: to the first River engine's), up to the shorter output; where
identity is the contract (lossless rows against their own engine's backbone, transformers'
generate() against the first River engine's), a run that parts is judged by the conformance
kit's near-tie rule (`Precision.agreement`, at the bounds of the engine's float type): the
column shows the runs that are the same, those that part only at a near tie, and those that
part beyond one (in bfloat16 a verification of several tokens rounds unlike one-token steps,
and random logits are nearly tied, so lossless rows part at near ties there).
"""

from __future__ import annotations

import statistics
import sys
import time

import attrs
import numpy as np

from river_core import ExitConfig, GenerationConfig, RiverModel, Step
from river_core.arguments import add_quant_arguments


from .library import anchors, shapes
from .library.measures import first_divergence
from .library.output import Harness, parser
from .library.prompts import prompt_of
from .library.runs import HEAD_SUFFIX
from .library.timing import machine, median_us

ANCHORS = ("llamacpp", "genai")
TRANSFORMERS = "transformers"   # transformers' own generate() on the real model, in process
CONFIGS = ("backbone", "exit", "lossless", "whole-4bit")
# seconds between cells: the last engine's worker threads (OpenMP's, llama.cpp's) spin-wait a
# while after their work, and on a 2-core machine they took the next cell's cores (a tiny
# model's full depth measured 6x slower right after llama.cpp)
PARK = 0.2


def exit_config(name: str) -> ExitConfig:
    """A configuration's name (the docstring's list) as River's ExitConfig."""
    if name.endswith(HEAD_SUFFIX):
        return attrs.evolve(exit_config(name.removesuffix(HEAD_SUFFIX)), exit_head="stand-in")
    known = {"backbone": ExitConfig(kv="full"), "exit": ExitConfig(),
             "lossless": ExitConfig(mode="speculative"),
             "whole-4bit": ExitConfig(policy="fixed", options={"layer": -1})}
    numbered = {"exit@": lambda k: ExitConfig(policy="fixed", options={"layer": k}),
                "lossless@": lambda w: ExitConfig(mode="speculative", draft_window=w),
                "lossless/": lambda d: ExitConfig(mode="speculative", draft_tokens=d)}
    if name in known:
        return known[name]
    for prefix, make in numbered.items():
        number = name.removeprefix(prefix)
        if number != name and number.lstrip("-").isdigit():
            return make(int(number))
    raise SystemExit(f"unknown configuration {name!r}: use {', '.join(known)}, exit@K, "
                     f"lossless@W or lossless/D, an exit mode's with {HEAD_SUFFIX}")


def is_anchor(engine: str) -> bool:
    return engine.partition(":")[0] in (*ANCHORS, TRANSFORMERS)


class Transformers:
    """transformers' greedy generate() on the real model, answering as an anchor's worker."""

    def __init__(self, model: str | None) -> None:
        from river_models.source import hf_model, locate

        self.model, _ = hf_model(locate(model))

    @classmethod
    def of(cls, hf) -> "Transformers":
        """The same for a transformers model at hand (`river bench gpu`: random weights)."""
        worker = cls.__new__(cls)
        worker.model = hf
        return worker

    def generate(self, ids: list[int], tokens: int) -> dict:
        import torch
        from transformers import LogitsProcessor, LogitsProcessorList

        from .library.timing import now

        class Clock(LogitsProcessor):
            def __init__(self) -> None:
                self.times: list[float] = []

            def __call__(self, input_ids, scores):
                self.times.append(now(str(scores.device)))
                return scores

        clock = Clock()
        with torch.inference_mode():
            out = self.model.generate(torch.tensor([ids], device=self.model.device),
                                      do_sample=False,
                                      max_new_tokens=tokens,
                                      logits_processor=LogitsProcessorList([clock]))
        return {"tokens": out[0, len(ids):].tolist(),
                "decode_seconds": clock.times[-1] - clock.times[0]}

    def close(self) -> None:
        pass


def prompts_for(model: RiverModel, shape: str, length: int, n: int) -> list[list[int]]:
    """`n` prompts of `length` tokens: GSM8K train text on a real model, random ids on a
    random one."""
    if shape == shapes.REAL:
        return [prompt_of(model, length, offset=50 * p) for p in range(n)]
    rng = np.random.default_rng(length)
    vocab = min(1000, model.backend.spec.vocab)
    return [rng.integers(3, vocab, length).tolist() for _ in range(n)]


class Cell:
    """One (engine, configuration) of a shape: how it decodes a prompt."""

    def __init__(self, engine: str, config: str, model: RiverModel | None, worker) -> None:
        self.engine, self.config, self.model, self.worker = engine, config, model, worker
        self.exit_config = None if worker else exit_config(config)

    def run(self, ids: list[int], tokens: int) -> dict:
        if self.worker:
            r = self.worker.generate(ids, tokens)
            made = max(len(r["tokens"]) - 1, 1)   # the first comes from prefill
            return {"tokens": r["tokens"], "ms": 1e3 * r["decode_seconds"] / made, "exits": None,
                    **{k: r[k] for k in ("peak_rss_mb",) if k in r}}
        out = self.model.generate_ids([ids], self.exit_config,
                                      GenerationConfig(max_new_tokens=tokens))
        return {"tokens": out.tokens[0], "ms": out.ms_per_token,
                "exits": None if self.exit_config.lossless else out.exit_layers[0]}


def load_models(engines: list[str], shape: str, args, loaded: dict | None = None) -> dict:
    """River's engines on `shape` (taken from `loaded`, a cache kept between calls, where
    given)."""
    loaded = {} if loaded is None else loaded
    capacity = max(args.positions) + 4 * args.tokens + 64
    for engine in engines:
        if (engine, shape) not in loaded:
            loaded[(engine, shape)] = shapes.load(engine, shape, args.model, args.device,
                                                  shapes.engine_quant(engine, args), capacity)
    return {engine: loaded[(engine, shape)] for engine in engines}


def measure(args, loaded: dict | None = None) -> dict:
    """The grid's rows (and the machine), for `args` as main's parser makes them."""
    info = machine(args.device)
    bandwidth = info["memory_bandwidth_gb_s"] * 1e9
    river = [e for e in args.engines if not is_anchor(e)]
    python = anchors.anchors_python(args.anchors_python) \
        if any(e.partition(":")[0] in ANCHORS for e in args.engines) else None
    rows = []
    for shape in args.shapes:
        models = load_models(river, shape, args, loaded)
        workers = {e: Transformers(args.model) if e == TRANSFORMERS else
                   anchors.start(e, python, args.model,
                                 None if shape == shapes.REAL else shape)
                   for e in args.engines if is_anchor(e)
                   and (shape == shapes.REAL or e.startswith("llamacpp"))}
        cells = [Cell(e, c, models[e], None) for e in river for c in args.configs] + \
            [Cell(e, "backbone", None, w) for e, w in workers.items()]
        text_model = next(iter(models.values()))
        prompts = {n: prompts_for(text_model, shape, n, args.prompts) for n in args.positions}
        for cell in cells:   # warm-up
            cell.run(prompts[min(args.positions)][0], 4)
        runs = {(c.engine, c.config, n): [] for c in cells for n in args.positions}
        for r in range(args.rounds):
            for n in args.positions:
                for p, ids in enumerate(prompts[n]):
                    print(f"{shape}: round {r + 1}/{args.rounds}, {n} positions, prompt "
                          f"{p + 1}", file=sys.stderr, flush=True)
                    for cell in cells[p % len(cells):] + cells[:p % len(cells)]:
                        time.sleep(PARK)
                        runs[(cell.engine, cell.config, n)].append(
                            cell.run(ids, args.tokens) | {"ids": ids})
        for worker in workers.values():
            worker.close()
        rows += tabulate(shape, runs, models, bandwidth, river[0] if river else None)
    return {"machine": info, "rows": rows}


def precision_of(engine: str):
    """The conformance kit's bounds for an engine's float type (BACKEND[:DTYPE]): float32's,
    which admit no near tie, for any type the kit has none for (int8 activations, say)."""
    from river_conformance.kit import BFLOAT16, FLOAT32, PRECISIONS

    dtype = engine.partition(":")[2] or "float32"
    return {**PRECISIONS, BFLOAT16.name: BFLOAT16}.get(dtype, FLOAT32)


def agreement(model: RiverModel, precision, rtol: float, ids: list[int], got: list[int],
              want: list[int]) -> str:
    """The kit's verdict (`Precision.agreement`) on greedy tokens `got` against `want`, which
    River `model` decoded after prompt `ids`, up to the shorter: want's logits teacher-forced
    at full depth, only where the two part."""
    n = min(len(got), len(want))
    forced = lambda: model.teacher_force([ids], [want[:n]], exit_config("backbone"))[0].logits
    return precision.agreement(got[:n], want[:n], forced, rtol)


def shares(verdicts: list[str]) -> dict:
    """The share of each of the kit's verdicts: the same, parted at a near tie, parted."""
    from river_conformance.kit import NEAR_TIE, PARTED, SAME

    return {v: verdicts.count(v) / len(verdicts) for v in (SAME, NEAR_TIE, PARTED)}


def tabulate(shape: str, runs: dict, models: dict, bandwidth: float,
             reference: str | None) -> list[dict]:
    """One row per (engine, configuration, length): median ms/token, speed-up over the same
    engine's backbone, the byte limit, layers run and identity with the backbone (judged by
    the kit's near-tie rule where identity is the contract)."""
    ms = {key: statistics.median(r["ms"] for r in rs) for key, rs in runs.items()}
    rows = []
    for (engine, config, n), rs in runs.items():
        own = (engine, "backbone", n) if (engine, "backbone", n) in runs else None
        base = own if own and not is_anchor(engine) else (reference, "backbone", n)
        pairs = list(zip(rs, runs.get(base, [])))
        same = [first_divergence(r["tokens"], b["tokens"]) >= min(len(r["tokens"]),
                                                                   len(b["tokens"]))
                for r, b in pairs]
        row = {"shape": shape, "engine": engine, "config": config, "positions": n,
               "ms_per_token": ms[(engine, config, n)], "runs": len(rs),
               "speedup_vs_backbone": ms[own] / ms[(engine, config, n)] if own else None,
               "same_as_backbone": float(np.mean(same)) if same else None, "agreement": None,
               "bytes_per_token": None, "limit_ms_per_token": None, "mean_layers_run": None}
        judged = engine == TRANSFORMERS or engine in models and exit_config(config).lossless
        if judged and pairs:   # the kit's verdicts, at the bounds of the reference's floats
            precision = precision_of(base[0])
            rtol = precision.rtol if engine == TRANSFORMERS else precision.own_rtol
            row["agreement"] = shares([agreement(models[base[0]], precision, rtol, r["ids"],
                                                 r["tokens"], b["tokens"]) for r, b in pairs])
        exits = [k for r in rs for k in (r["exits"] or [])]
        if engine in models and exits:
            footprint = models[engine].backend.footprint()
            row["mean_layers_run"] = float(np.mean(exits)) + 1
            head = exit_config(config).stand_in_head
            row["bytes_per_token"] = float(np.mean(
                [footprint.bytes_per_token(k, n + i, stand_in_head=head) for r in rs
                 for i, k in enumerate(r["exits"])]))
            row["limit_ms_per_token"] = row["bytes_per_token"] / bandwidth * 1e3
        if "peak_rss_mb" in rs[0]:
            row["peak_rss_mb"] = max(r["peak_rss_mb"] for r in rs)
        rows.append(row)
    return rows


def layer_costs(model: RiverModel, device: str, positions: int = 64) -> dict:
    """One decoding token's backbone layer and stand-in layer, µs, cycling through all layers
    (cold caches, as in a real step)."""
    b = model.backend
    b.prefill([[3] * positions], positions + 1, None)
    p = b.begin([5], Step(positions))
    h = b.embed(p)
    return {name: median_us(lambda: [run(p, i, h, None) for i in range(b.num_layers)],
                            repeats=20, device=device) / b.num_layers
            for name, run in (("layer_us", b.layer), ("stand_in_us", b.stand_in_layer))}


def arguments(ap) -> None:
    """The grid's options (also `river bench gpu`'s speed part's)."""
    ap.add_argument("--engines", nargs="+", default=["hf", "onnx"],
                    help="BACKEND[:DTYPE] for River's engines; llamacpp:KIND and genai:PRECISION "
                    "for the anchors")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS),
                    help=f"of River's engines: {', '.join(CONFIGS)}, exit@K, lossless@W, "
                    "lossless/D")
    ap.add_argument("--shapes", nargs="+", default=[shapes.REAL],
                    choices=[shapes.REAL, *shapes.SHAPES])
    ap.add_argument("--positions", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--prompts", type=int, default=2, help="prompts per length")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    add_quant_arguments(ap)   # random shapes quantize by RTN where HQQ is asked (shapes.py)
    ap.add_argument("--anchors-python", help="an interpreter with llama-cpp-python and "
                    "onnxruntime-genai (default: an environment of its own in the benchmark "
                    "cache)")


def report(p: dict, title: str = "Decode speed grid") -> str:
    info = p["machine"]
    where = info.get("gpu") or f"{info['cpu']}, {info['cores']} cores"
    lines = [f"# {title}", "",
             f"Command: `{p['command']}`. Machine: {where}, {info['device']} copy bandwidth "
             f"{info['memory_bandwidth_gb_s']} GB/s, torch {info['torch']}. Batch 1; median "
             "ms/token (DecodeResult.ms_per_token) over prompts and rounds; limit: bytes a "
             "token reads over the copy bandwidth.", "",
             "| shape | engine | config | positions | ms/token | vs backbone | limit ms/token "
             "(share reached) | layers run | same as backbone (judged: same / near tie / "
             "parted) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in p["rows"]:
        f = lambda v, fmt: "-" if v is None else fmt.format(v)
        limit = "-" if r["limit_ms_per_token"] is None else \
            f"{r['limit_ms_per_token']:.2f} ({r['limit_ms_per_token'] / r['ms_per_token']:.0%})"
        same = verdicts(r.get("agreement")) or f(r['same_as_backbone'], '{:.0%}')
        lines.append(f"| {r['shape']} | {r['engine']} | {r['config']} | {r['positions']} | "
                     f"{r['ms_per_token']:.2f} | {f(r['speedup_vs_backbone'], '{:.2f}x')} | "
                     f"{limit} | {f(r['mean_layers_run'], '{:.1f}')} | {same} |")
    return "\n".join(lines) + "\n"


def verdicts(agreement: dict | None) -> str:
    """The kit's verdicts' shares as a cell: same / near tie / parted ("" where not judged)."""
    return " / ".join(f"{v:.0%}" for v in agreement.values()) if agreement else ""


def main(argv: list[str] | None = None) -> None:
    ap = parser("grid", __doc__, results="grid")
    arguments(ap)
    out, args = Harness.parse(ap, argv)
    payload = {"command": out.command, **measure(args), "args": out.arguments()}
    out.write(args.name, payload, report(payload))


if __name__ == "__main__":
    main()
