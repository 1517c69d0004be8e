"""River against what a CPU user runs instead: llama.cpp and ONNX Runtime GenAI on the same
weights, at short and long contexts, speed, output identity and peak memory in one
interleaved run.

    river bench anchors                           # 64 and 2,048 positions
    river bench anchors --positions 64 --prompts 1 --rounds 1   # a quick look
    river bench anchors --quantizer hqq-int --name anchors-hqq-int

Engines, each in a process of its own (`anchor_worker.py`), so each one's peak resident memory
is its own:
- River on onnx: full depth (the float32 backbone), River exit mode (the paper's rule; also
  with the prompt's layers past 3 on stand-ins, the paper's sequence-level exit), the whole
  4-bit model (its prompt on stand-ins too) and lossless mode (drafts from the whole 4-bit
  model, 4 per round); and with the int8 backbone (`--dtype int8`), full depth and lossless
  mode over it;
- llama.cpp (llama-cpp-python, every core, its default float16 K/V) on the embedded Q4_1 GGUF
  and on F32, F16 and Q8_0 GGUFs written from the same weights with the gguf package (into
  the benchmark cache; F32 holds exactly the float weights River's backbone runs).
- ONNX Runtime GenAI (`onnxruntime-genai`), the official fast ONNX Runtime decoder, on the
  same float weights built by its own model builder in fp32 and int4.
The anchors' packages are installed into a virtual environment in the benchmark cache on first
use (llama-cpp-python compiles llama.cpp: about 8 minutes here), or taken from
`--anchors-python`; the tests need none of it.

Each prompt is GSM8K train text cut to the length; every round sends each prompt to every
engine in turn, so drift of a shared machine hits all alike. ms/token is decode time over the
tokens decoded after the first (which comes from prefill), median over prompts and rounds.
Identity: an engine's greedy tokens against River's full depth, up to the first end of text.
Writes NAME.{md,json,png} (`--name`, default anchors); the "summary" holds issue 21's figures
(of the engines that ran: `--engines river` runs River's alone, without the anchors'
environment).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from river_core import QuantSpec, RiverModel
from river_models import default_gguf
from river_models.cache import cache_root
from river_models.source import locate

from .library import anchor_worker

from .library.output import Output, parser, plot_file
from .library.output import command as run_command
from .library.prompts import prompt_of
from .library.timing import machine, median_us

# GenAI's model builder needs torch and transformers; torch on the CPU wheel's pin
ANCHOR_PACKAGES = ("llama-cpp-python==0.3.36", "onnxruntime-genai==0.18.0", "torch==2.13.0",
                   "transformers", "onnx-ir")
GENAI_PRECISIONS = ("fp32", "int4")
LOSSLESS = "lossless/fixed:-1/4="
RIVER = {   # name: (config as `river bench tasks` names them, backbone dtype, prefill exit)
    "River full depth": ("full", "float32", "none"),
    "River exit mode": ("river", "float32", "none"),
    "River exit mode, prompt exits after layer 3": ("river", "float32", "3"),
    "River whole 4-bit model": ("quantized", "float32", "-1"),
    "River lossless mode": (LOSSLESS, "float32", "none"),
    "River int8 full depth": ("full", "int8", "none"),
    "River int8 lossless mode": (LOSSLESS, "int8", "none")}
GGUF_TYPES = ("F32", "F16", "Q8_0")   # written from the embedded Q4_1 file; Q4_1 is itself
ENGINES = ("river", "llamacpp", "genai")


def anchors_python(given: str | None) -> Path:
    """An interpreter with the anchors' packages: the given one, or the benchmark cache's own
    environment, made on first use."""
    if given:
        return Path(given)
    venv = cache_root() / "anchors" / "venv"
    python = venv / "bin" / "python"
    check = "import llama_cpp, onnxruntime_genai, torch, transformers"
    if not python.exists() or subprocess.run([python, "-c", check],
                                             capture_output=True).returncode:
        print(f"installing {' '.join(ANCHOR_PACKAGES)} into {venv} (compiles llama.cpp: about "
              "8 minutes here)", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *ANCHOR_PACKAGES], check=True)
    return python


def write_gguf(source: Path, target: Path, kind: str) -> Path:
    """`source`'s metadata and tokenizer with every tensor dequantized and stored as `kind`
    (F32, F16 or Q8_0; vectors stay F32, as llama.cpp's converter keeps them)."""
    from gguf import GGMLQuantizationType as Q, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.constants import LlamaFileType
    from gguf.quants import dequantize, quantize

    if target.is_file():
        return target
    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    writer = GGUFWriter(partial, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture",
                                                              "general.file_type"):
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    writer.add_file_type({"F32": LlamaFileType.ALL_F32, "F16": LlamaFileType.MOSTLY_F16,
                          "Q8_0": LlamaFileType.MOSTLY_Q8_0}[kind])
    for tensor in reader.tensors:
        weights = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if weights.ndim == 1 or kind == "F32":
            writer.add_tensor(tensor.name, weights)
        elif kind == "F16":
            writer.add_tensor(tensor.name, weights.astype(np.float16))
        else:
            writer.add_tensor(tensor.name, quantize(weights, Q.Q8_0), raw_dtype=Q.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(target)
    return target


def genai_model(python: Path, precision: str, model: str | None) -> Path:
    """The model's float weights built for ONNX Runtime GenAI by its own model builder (CPU,
    `precision` fp32 or int4, the builder's defaults otherwise), once per model."""
    folder = locate(model)
    target = cache_root() / "anchors" / f"genai-{folder.name}-{precision}"
    if not (target / "genai_config.json").is_file():
        print(f"building the ONNX Runtime GenAI model ({precision})", file=sys.stderr, flush=True)
        built = subprocess.run([str(python), "-m", "onnxruntime_genai.models.builder", "-i",
                                str(folder), "-o", str(target), "-p", precision, "-e",
                                "cpu", "-c", str(cache_root() / "anchors" / "genai-build")],
                               capture_output=True, text=True)
        if built.returncode:
            raise SystemExit(f"GenAI's model builder failed:\n{built.stderr[-3000:]}")
    return target


class Worker:
    """One engine in its own process (anchor_worker.py's protocol)."""

    def __init__(self, python: Path, *args: str) -> None:
        # River's engines as a module of this package (they need River); the anchors as a
        # script in their own environment (no River there)
        how = ["-m", anchor_worker.__name__] if args[0] == "river" else [anchor_worker.__file__]
        self.process = subprocess.Popen([str(python), *how, *args], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"the worker {' '.join(args)} did not start (its errors are above)")
        self.loaded_rss_mb = json.loads(line)["loaded_rss_mb"]

    def generate(self, ids: list[int], tokens: int) -> dict:
        self.process.stdin.write(json.dumps({"ids": ids, "tokens": tokens}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit("a worker died (its errors are above)")
        return json.loads(line)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def layer_costs(model: RiverModel, positions: int = 64) -> dict:
    """One decode step's backbone layer and stand-in layer on onnx, µs, cycling through the
    layers (cold caches, as in a real step)."""
    b = model.backend
    ids = prompt_of(model, positions)
    b.prefill([ids], positions + 8, None)
    h = b.embed([ids[-1]])
    cost = {}
    for name, run in (("layer", b.layer), ("stand_in", b.stand_in_layer)):
        cost[name] = median_us(lambda: [run(i, h, None) for i in range(b.num_layers)],
                               repeats=20) / b.num_layers
    return cost


def main(argv: list[str] | None = None) -> None:
    ap = parser("anchors", __doc__)
    ap.add_argument("--positions", type=int, nargs="+", default=[64, 2048])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quantizer", default="hqq", help="River's stand-in quantizer")
    ap.add_argument("--name", default="anchors", help="results file name")
    ap.add_argument("--anchors-python", help="an interpreter with llama-cpp-python "
                    "and onnxruntime-genai (default: an environment of its own in the "
                    "benchmark cache)")
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    args = ap.parse_args(argv)
    out = Output(args)
    info = machine()
    anchored = set(args.engines) - {"river"}
    llama = anchors_python(args.anchors_python) if anchored else None
    ggufs = {}
    if "llamacpp" in args.engines:
        q4 = default_gguf() if args.model is None else Path(args.model)
        if q4.suffix != ".gguf":
            raise SystemExit("llama.cpp runs a GGUF: give --model FILE.gguf or leave "
                             "llamacpp out of --engines")
        ggufs = {kind: write_gguf(q4, cache_root() / "anchors" / f"{q4.stem}.{kind}.gguf",
                                  kind) for kind in GGUF_TYPES}
        ggufs["Q4_1"] = q4
    print("measuring layer costs", file=sys.stderr, flush=True)
    model = RiverModel.from_pretrained(args.model, backend="onnx",
                                       quant=QuantSpec(method=args.quantizer))
    layers = layer_costs(model)
    prompts = {n: [prompt_of(model, n, offset=50 * p) for p in range(args.prompts)]
               for n in args.positions}
    del model
    workers = {name: Worker(Path(sys.executable), "river", *how, args.quantizer,
                            args.model or "") for name, how in RIVER.items()}
    workers.update({f"llama.cpp {kind}": Worker(llama, "llamacpp", str(path))
                    for kind, path in ggufs.items()})
    if "genai" in args.engines:
        workers.update({f"ORT GenAI {p}": Worker(llama, "genai",
                                                 str(genai_model(llama, p, args.model)))
                        for p in GENAI_PRECISIONS})
    runs: dict = {name: {str(n): [] for n in args.positions} for name in workers}
    for name, worker in workers.items():   # warm-up
        worker.generate(prompts[args.positions[0]][0], 4)
    for r in range(args.rounds):
        for n in args.positions:
            for p, ids in enumerate(prompts[n]):
                print(f"round {r + 1}/{args.rounds}, {n} positions, prompt {p + 1}",
                      file=sys.stderr, flush=True)
                for name, worker in workers.items():
                    runs[name][str(n)].append(worker.generate(ids, args.tokens))
    loaded = {name: worker.loaded_rss_mb for name, worker in workers.items()}
    for worker in workers.values():
        worker.close()
    command = run_command("anchors", argv)
    payload = {"command": command, "machine": info, "tokens": args.tokens,
               "prompts": args.prompts, "rounds": args.rounds, "positions": args.positions,
               "quantizer": args.quantizer,
               "layer_us": layers, "loaded_rss_mb": loaded, **tabulate(runs, ggufs, layers)}
    out.write(args.name, payload, report(payload))
    plot(out, payload, args.name)


def tabulate(runs: dict, ggufs: dict, layers: dict) -> dict:
    """ms/token, identity with River's full depth at the engine's precision (float32; the int8
    backbone for the int8 engines) and peak RSS per engine and length, and the summary."""
    ms, identical, rss = {}, {}, {}
    for name, by_n in runs.items():
        reference = runs["River int8 full depth" if "int8" in name else "River full depth"]
        ms[name] = {n: statistics.median(1e3 * r["decode_seconds"] / max(len(r["tokens"]) - 1, 1)
                                         for r in rs) for n, rs in by_n.items()}
        identical[name] = {n: sum(_same(r["tokens"], ref["tokens"]) for r, ref in
                                  zip(rs, reference[n])) / len(rs) for n, rs in by_n.items()}
        rss[name] = max(r["peak_rss_mb"] for rs in by_n.values() for r in rs)
    over = lambda a, b: {n: ms[a][n] / ms[b][n] for n in ms[a]} if a in ms and b in ms \
        else None
    lengths = sorted(ms["River full depth"], key=int)
    short, long = lengths[0], lengths[-1]
    summary = {
        "lossless_vs_llamacpp_f32": over("llama.cpp F32", "River lossless mode"),
        "lossless_vs_backbone": over("River full depth", "River lossless mode"),
        "exit_vs_backbone": over("River full depth", "River exit mode"),
        "whole4_vs_llamacpp_q4": over("llama.cpp Q4_1", "River whole 4-bit model"),
        "lossless_vs_genai_fp32": over("ORT GenAI fp32", "River lossless mode"),
        "whole4_vs_genai_int4": over("ORT GenAI int4", "River whole 4-bit model"),
        "int8_lossless_vs_llamacpp_q8": over("llama.cpp Q8_0", "River int8 lossless mode"),
        "int8_lossless_vs_int8_backbone": over("River int8 full depth",
                                               "River int8 lossless mode"),
        f"step_{long}_over_{short}": {name: ms[name][long] / ms[name][short] for name in ms},
        "exit_rss_over_whole4": rss["River exit mode"] / rss["River whole 4-bit model"],
        "prompt_exit_rss_over_whole4": rss["River exit mode, prompt exits after layer 3"] /
        rss["River whole 4-bit model"],
        "stand_in_over_layer": layers["stand_in"] / layers["layer"]}
    return {"ms_per_token": ms, "identical_to_full_depth": identical, "peak_rss_mb": rss,
            "gguf_bytes": {k: p.stat().st_size for k, p in ggufs.items()},
            "summary": summary}


def _same(tokens: list[int], reference: list[int]) -> bool:
    n = min(len(tokens), len(reference))
    return tokens[:n] == reference[:n]


def report(p: dict) -> str:
    info, s = p["machine"], p["summary"]
    lengths = [str(n) for n in p["positions"]]
    lines = ["# River against llama.cpp on the same weights", "",
             f"Machine: {info['cpu']}, {info['cores']} cores, copy bandwidth "
             f"{info['memory_bandwidth_gb_s']} GB/s. Command: `{p['command']}`. "
             f"Batch 1, {p['tokens']} greedy tokens, {p['prompts']} "
             f"GSM8K prompts per length, {p['rounds']} interleaved rounds; River's stand-ins "
             f"quantized by {p['quantizer']}.", "",
             "| engine | " + " | ".join(f"ms/token at {n}" for n in lengths) + " | " +
             " | ".join(f"same as full depth at {n}" for n in lengths) +
             " | RSS loaded, MB | peak RSS, MB |",
             "|---|" + "---|" * (2 * len(lengths) + 2)]
    for name, by_n in p["ms_per_token"].items():
        same = p["identical_to_full_depth"][name]
        lines.append(f"| {name} | " + " | ".join(f"{by_n[n]:.1f}" for n in lengths) + " | " +
                     " | ".join(f"{same[n]:.0%}" for n in lengths) +
                     f" | {p['loaded_rss_mb'][name]:.0f} | {p['peak_rss_mb'][name]:.0f} |")
    per = lambda d: "not run" if d is None else ", ".join(f"{v:.2f}x at {n}" for n, v in d.items())
    lines += ["", "Issue 21's figures:", "",
              f"- lossless mode against llama.cpp F32: {per(s['lossless_vs_llamacpp_f32'])} "
              "(target: at least 2x)",
              f"- lossless mode against River's backbone: {per(s['lossless_vs_backbone'])} "
              "(target: at least 2x)",
              f"- exit mode against River's backbone: {per(s['exit_vs_backbone'])} "
              "(target: at least 2.5x)",
              f"- whole 4-bit model against llama.cpp Q4_1: {per(s['whole4_vs_llamacpp_q4'])} "
              "(target: at least 1x)",
              f"- against ONNX Runtime GenAI: lossless mode over fp32 "
              f"{per(s['lossless_vs_genai_fp32'])}, the whole 4-bit model over int4 "
              f"{per(s['whole4_vs_genai_int4'])}",
              f"- int8 lossless mode against llama.cpp Q8_0: "
              f"{per(s['int8_lossless_vs_llamacpp_q8'])}; against the int8 backbone: "
              f"{per(s['int8_lossless_vs_int8_backbone'])}",
              f"- one decode step at {lengths[-1]} over {lengths[0]} positions: " +
              ", ".join(f"{name} {v:.2f}x" for name, v in
                        s[f"step_{lengths[-1]}_over_{lengths[0]}"].items()) +
              " (target on onnx: at most 1.2x)",
              f"- a stand-in layer against a backbone layer (onnx, one decode token, 64 "
              f"positions): {p['layer_us']['stand_in']:.0f} against "
              f"{p['layer_us']['layer']:.0f} µs, {s['stand_in_over_layer']:.2f}x (target: at "
              "most 0.25x)",
              f"- peak RSS of exit mode over the whole 4-bit model's: "
              f"{s['exit_rss_over_whole4']:.2f}x, with the prompt exiting after layer 3 "
              f"{s['prompt_exit_rss_over_whole4']:.2f}x (target: at most 1.3x)", "",
              "Same as full depth: greedy tokens equal to River's full depth at the engine's "
              "precision (float32; int8 for the int8 engines) up to the shorter output. RSS "
              "loaded: the worker's resident memory once its engine is loaded, before any "
              "prompt (a River worker's Python, NumPy, ONNX Runtime and tokenizer included)."]
    return "\n".join(lines)


def plot(out: Output, p: dict, name: str) -> None:
    plt, save = plot_file(out, name)
    names = list(p["ms_per_token"])
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(p["positions"])
    for j, n in enumerate(p["positions"]):
        values = [p["ms_per_token"][name][str(n)] for name in names]
        ax.barh(np.arange(len(names)) + j * width, values, width, label=f"{n} positions")
    ax.set_yticks(np.arange(len(names)) + width * (len(p["positions"]) - 1) / 2, names)
    ax.invert_yaxis()
    ax.set_xlabel("ms per token (batch 1, lower is faster)")
    ax.set_title(f"River on onnx and llama.cpp, same weights ({p['machine']['cpu']})")
    ax.legend()
    save(fig)


if __name__ == "__main__":
    main()
