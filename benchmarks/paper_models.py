"""The memory each of the paper's four models needs in each engine, from the dimensions of
their config.json files (benchmarks/library/shapes.py; nothing is downloaded): the table of
docs/models.md.

Weights: every parameter at the engine's precision. Stand-ins: River's default (4 bits, groups
of 64, a bfloat16 scale and zero point a group, as the hf engine packs them) for every layer's
seven projections, plus the LM head's 8-bit stand-in (one bfloat16 scale a row). Cache: K and V
of every layer per position at the engine's precision. Arithmetic, not a measurement."""

from __future__ import annotations

from .library.output import Output, command, parser
from .library.shapes import PAPER, SHAPES

# element bytes of weights and cache per engine as River runs it by default: hf on the CPU in
# float32 (on CUDA bfloat16: 2), onnx's float32 graphs, vLLM in the checkpoint's bfloat16
ENGINES = {"hf": 4, "onnx": 4, "vllm": 2}


def gib(n: float) -> str:
    return f"{n / 2 ** 30:.2f}"


def table(context: int) -> list[dict]:
    return [{"model": SHAPES[name].hub, "parameters_b": round(SHAPES[name].params() / 1e9, 2),
             "engine": engine, "weights_gib": gib(SHAPES[name].params() * element),
             "stand_ins_gib": gib(SHAPES[name].stand_in_bytes()),
             "cache_gib": gib(context * SHAPES[name].cache_bytes_per_position(element))}
            for name in PAPER for engine, element in ENGINES.items()]


def main(argv: list[str] | None = None) -> None:
    ap = parser("paper_models", __doc__, model=False)
    ap.add_argument("--context", type=int, default=8192, help="positions of cache")
    args = ap.parse_args(argv)
    rows = table(args.context)
    lines = [f"# Memory of the paper's models (`{command('paper_models', argv)}`)", "",
             "| model | parameters | engine | weights GiB | stand-ins GiB | cache GiB at "
             f"{args.context:,} positions |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['parameters_b']:.2f} B | {r['engine']} | {r['weights_gib']} "
              f"| {r['stand_ins_gib']} | {r['cache_gib']} |" for r in rows]
    Output(args).write("paper-models", {"command": command("paper_models", argv),
                                        "rows": rows}, "\n".join(lines) + "\n")
