"""River's ggml engine on GGUFs of the shapes users run, as llama.cpp writes and quantizes them,
against a float32 reference and llama.cpp itself on the same file (issue 58).

    river bench real_files --docs                          # every family's real shape, Q4_K_M;
                                                           # Qwen2.5-1.5B's in every type too
    river bench real_files --size small --families qwen2   # the suite's shapes (seconds)

Each family's published shape (river_conformance.fixtures.real_gguf: Qwen2.5-1.5B, Gemma-3-270M,
Llama-3.2-1B, ...) with random weights, written as llama.cpp's converter writes it (F16) and
quantized as llama-quantize quantizes it (river_models.gguf_quantize), once into the benchmark
cache. On each file: 64 greedy tokens from one random token by River's ggml engine (loaded
as `river generate --model FILE` loads it) and by llama.cpp (llama-cpp-python: a float16
cache through flash attention, as llama.cpp's tools run and River runs; a token a step, as
its binding evaluates here), then 8 random ids and llama.cpp's text teacher-forced a token a
step through River, llama.cpp and the float32 reference (River's torch engine on gguf-py's dequantization of the file; left out
where the float32 model would not fit in `--reference-gb`): top-1 agreement, disagreements
inside each position's noise band (near ties) and beyond it, the logits' relative error and
KL (river_conformance.agreement). llama.cpp against the same reference is the yardstick: on
random weights, logits are Gaussian-like, so a share of positions are near ties for any
engine that rounds its activations to 8 bits. Writes NAME.{md,json} (`--name`, default
real-files).
"""

from __future__ import annotations

import gc
import sys
import time

import attrs
import numpy as np

from .library.output import Harness, heading, parser
from .library.shapes import made_once

TYPES = ("Q4_K_M",)
# the types beside Q4_K_M on the family whose embedding is its head (Qwen2.5-1.5B)
MORE_TYPES = ("Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "IQ4_NL", "IQ4_XS")
MORE_ON = "qwen2"
PROMPT = 8   # random ids teacher-forced before llama.cpp's greedy text


def made(family: str, size: str, file_type: str):
    """The benchmark cache's `family` at `size` in `file_type` (made once)."""
    from river_conformance.fixtures import real_gguf
    from river_models import gguf_quantize
    from river_models.cache import cache_root

    folder = cache_root() / "bench" / "real-files"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{family}-{size}-{file_type}.gguf"
    if target.is_file():
        return target
    source = made_once(folder / f"{family}-{size}-converted.gguf",
                       f"writing {real_gguf.describe(family, size)}",
                       lambda p: real_gguf.write(family, size, p))
    return made_once(target, f"quantizing {family} {size} to {file_type}",
                     lambda p: gguf_quantize.quantize(source, p, file_type))


def float32_gb(path) -> float:
    from river_models.gguf_header import read_header

    return sum(int(np.prod(t.dims)) for t in read_header(path).tensors.values()) * 4 / 2**30


def reference(path):
    import torch

    from river_core.settings.config import QuantSpec
    from river_torch.backend import TorchBackend
    from river_models import gguf_weights
    from river_models.quant import stand_ins

    checkpoint = gguf_weights.checkpoint(path)
    unused = stand_ins(checkpoint, QuantSpec(bits=8, group_size=64, method="rtn"), cache=False)
    return TorchBackend(checkpoint, unused, torch.float32)


def greedy(backend, prompt, tokens: int) -> tuple[list[int], float]:
    """`tokens` greedy ids and the decode ms/token."""
    from river_conformance.scripted import scripted_run
    from river_core.settings.config import GenerationConfig
    from river_core.loop.decode import generate_ids
    from river_core.method.kv import Full

    result = generate_ids(backend, [prompt], GenerationConfig(max_new_tokens=tokens,
                                                              ignore_eos=True),
                          scripted_run(Full(), []))
    return result.tokens[0], result.ms_per_token


def row(family: str, size: str, file_type: str, tokens: int, reference_gb: float) -> dict:
    from river_conformance.agreement import Agreement, first_difference
    from river_conformance.scripted import forced_logits
    from river_core.method.kv import Full
    from river_ggml.plugin import load
    from river_llamacpp.backend import LlamaCppBackend
    from river_llamacpp.plugin import open_llama
    from river_conformance.fixtures import real_gguf

    path = made(family, size, file_type)
    cfg = real_gguf.config(family, size)
    ids = np.random.default_rng(1).integers(3, cfg.vocab_size, PROMPT).tolist()
    prompt = ids[:1]   # a token a step: llama.cpp's binding evaluates so here (n_ubatch 1)
    out = {"family": family, "size": size, "type": file_type,
           "shape": real_gguf.describe(family, size), "file_mb": path.stat().st_size / 2**20}
    start = time.perf_counter()
    ours = load(str(path))
    out["river_load_s"] = time.perf_counter() - start
    out["river_tokens"], out["river_ms_per_token"] = greedy(ours, prompt, tokens)
    llm, layers = open_llama(path, PROMPT + tokens + 8, exact=False)
    theirs = LlamaCppBackend(llm, layers, path)
    out["llamacpp_tokens"], out["llamacpp_ms_per_token"] = greedy(theirs, prompt, tokens)
    out["first_difference"] = first_difference(out["river_tokens"], out["llamacpp_tokens"])
    forced = ids[1:] + out["llamacpp_tokens"][:-1]   # the prompt too, a token a step
    logits = {"river": forced_logits(ours, prompt, forced, Full()),
              "llama.cpp": forced_logits(theirs, prompt, forced, Full())}
    llm.close()
    del ours, theirs, llm
    gc.collect()
    out["float32_gb"] = float32_gb(path)
    if out["float32_gb"] <= reference_gb:
        logits["float32"] = forced_logits(reference(path), prompt, forced, Full())
        gc.collect()
    pairs = [("river", "llama.cpp"), ("river", "float32"), ("llama.cpp", "float32")]
    out["agreement"] = {f"{a} vs {b}": attrs.asdict(Agreement.of(logits[a], logits[b]))
                        for a, b in pairs if a in logits and b in logits}
    return out


def main(argv: list[str] | None = None) -> None:
    from river_conformance.fixtures import real_gguf

    ap = parser("real_files", __doc__, model=False, results="real-files")
    ap.add_argument("--families", nargs="*", default=list(real_gguf.FAMILIES),
                    choices=real_gguf.FAMILIES)
    ap.add_argument("--size", default="real", choices=real_gguf.SIZES)
    ap.add_argument("--types", nargs="*", default=list(TYPES),
                    help=f"llama-quantize file types on every family (and {', '.join(MORE_TYPES)} "
                         f"on {MORE_ON}, unless --no-more-types)")
    ap.add_argument("--no-more-types", action="store_true")
    ap.add_argument("--tokens", type=int, default=64, help="greedy tokens a file")
    ap.add_argument("--reference-gb", type=float, default=8.0,
                    help="the largest float32 reference to build (GB of weights)")
    out, args = Harness.parse(ap, argv)
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise SystemExit("river bench real_files compares with llama.cpp: pip install "
                         "'river-llm[llamacpp]'") from None
    cells = [(f, t) for f in args.families for t in args.types]
    if not args.no_more_types and MORE_ON in args.families:
        cells += [(MORE_ON, t) for t in MORE_TYPES if t not in args.types]
    rows = []
    for n, (family, file_type) in enumerate(cells):
        print(f"{family} {args.size} {file_type}", file=sys.stderr, flush=True)
        rows.append(row(family, args.size, file_type, args.tokens, args.reference_gb))
        if all(f != family for f, _ in cells[n + 1:]):   # its F16 source: 14 GB at 7B
            made(family, args.size, file_type).with_name(
                f"{family}-{args.size}-converted.gguf").unlink(missing_ok=True)
        # written after each file: hours at 7B shapes
        payload = {**out.head(), "tokens": args.tokens, "rows": rows}
        out.write(args.name, payload, markdown(payload))


def markdown(payload: dict) -> str:
    lines = [*heading("River's ggml engine on GGUFs as llama.cpp writes them", payload),
             f"Random weights at each family's published shape; {payload['tokens']} greedy "
             f"tokens from one random token; {PROMPT} random ids and llama.cpp's text "
             f"teacher-forced a token a step through each engine. Top-1: positions whose token is the other's "
             f"(near ties: disagreements inside the position's noise band; beyond: outside "
             f"it); rel: the logits' relative error, median / max; KL: mean, nats. A "
             f"correctness table: the ms/token in the JSON are a side note, not a speed "
             f"measurement.", "",
             "| shape | type | MB | greedy, River = llama.cpp | River vs llama.cpp | "
             "River vs float32 | llama.cpp vs float32 |", "|---|---|---|---|---|---|---|"]

    def cell(a: dict | None) -> str:
        if a is None:
            return "- (float32 too large)"
        return (f"{a['agree']}/{a['positions']} ({a['near_ties']} near ties, "
                f"{len(a['beyond'])} beyond); rel {a['rel_median']:.1e} / {a['rel_max']:.1e}; "
                f"KL {a['kl_mean']:.1e}")

    for r in payload["rows"]:
        at = r["first_difference"]
        same = "all" if at is None else f"first {at}"
        a = r["agreement"]
        lines.append(f"| {r['shape']} | {r['type']} | {r['file_mb']:.0f} | {same} | "
                     f"{cell(a.get('river vs llama.cpp'))} | {cell(a.get('river vs float32'))} "
                     f"| {cell(a.get('llama.cpp vs float32'))} |")
    return "\n".join(lines) + "\n"
