"""Everything River measures on a GPU, in one command for the day one is at hand: the test
suite on the device, decode speed against the byte limit, per-layer costs, GPU memory per
mode, ONNX Runtime on CUDA, and vLLM's CUDA engine against River's modes inside it.

    river bench gpu --dry-run                    # each part's commands, shapes, memory, time
    river bench gpu --docs --parts 1             # one part a call (a lent machine's 10 minutes)
    river bench gpu --docs --parts 2 --shapes llama-8b

Parts, in order (`--parts` picks some). Each runs in a process of its own (the memory part:
one per shape and mode kind) with its own time limit, and its rows go into gpu.{json,md} the
moment it ends, replacing only the rows it measured (the same shape, engine, configuration and
length; the same shape; the same engine), so a part that overruns loses only itself and a
rerun of one part keeps every other's. Each records ran, skipped with its reason, or failed
with its error; once `--budget` seconds are spent the rest are skipped.
1. tests: the suite's device-aware tests with RIVER_TEST_DEVICE set to the device (`--tests`);
2. speed: one interleaved `river bench grid` run at batch 1 on River's hf engine in bfloat16 (on
   the CPU float32): backbone, the whole 4-bit model, exit mode at the paper's rule, lossless
   mode, and each row's byte limit (weight and K/V bytes per token over the device's measured
   copy bandwidth), on the embedded model and random Llama-3.2-1B- and Llama-3.1-8B-shaped
   models (`--shapes`; RTN stand-ins);
3. layers: one decoding token's backbone layer and stand-in layer, per shape;
4. memory: per shape in a fresh process, the weights (memory allocated by loading) and each
   mode's per-generation peak (torch.cuda.max_memory_allocated minus what was allocated
   before it); the whole 4-bit model in a process of its own whose backend holds no backbone
   layer (its prompt runs the stand-ins too);
5. onnx: the grid on River's onnx engine at the dtype the device takes (CUDA: the onnx
   engine's CUDA default, never float32), beside torch;
6. vllm: vLLM plain (CUDA graphs on) against River's exit and lossless modes inside vLLM at
   1, 4, 16 and 64 concurrent requests (`river bench vllm`'s machinery), in a process that
   holds no model, each engine with `gpu_memory_utilization` from the memory free when it
   starts (vLLM refuses to start with less free than the fraction it asks for).
Every timer is read after the device has finished its queued work (library/timing.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import attrs

from . import grid
from .library import shapes
from .library.output import Output, parser
from .library.output import command as run_command


@attrs.frozen
class Part:
    name: str
    limit_s: int   # its processes' time limit, together
    per_shape: bool = False   # a fresh process per shape (and mode kind)


PARTS = {1: Part("tests", 540), 2: Part("speed", 540), 3: Part("layers", 300),
         4: Part("memory", 300, per_shape=True), 5: Part("onnx", 540), 6: Part("vllm", 540)}
MODES = {"backbone": "backbone", "whole 4-bit model": "whole-4bit", "exit mode": "exit",
         "lossless mode": "lossless"}
WHOLE = "whole 4-bit model"   # measured by a backend without backbone layers
TESTS = ["tests/test_conformance.py", "tests/test_invariants.py", "tests/test_speculative.py",
         "tests/test_batch.py"]
CONCURRENCY = (1, 4, 16, 64)
VLLM_MARGIN = 1 << 30   # bytes left free beside vLLM's share (its CUDA context, allocator slack)


class Skip(Exception):
    """A part that cannot run here, and why."""


def cuda(args) -> bool:
    return args.device.startswith("cuda")


def engine(args) -> str:
    """River's torch engine at the device's dtype: bfloat16 on CUDA, float32 on the CPU."""
    return "hf:bfloat16" if cuda(args) else "hf"


def onnx_engine(args) -> str:
    """The onnx engine at the dtype the device takes: the onnx engine's own default (float16
    or bfloat16 on CUDA: its provider has no float32 GroupQueryAttention)."""
    if not cuda(args):
        return "onnx"
    from river_onnx.export import default_dtype

    return f"onnx:{default_dtype('cuda')}"


def grid_args(args, engines: list[str], shape_list: list[str]) -> argparse.Namespace:
    return argparse.Namespace(engines=engines, configs=list(MODES.values()), shapes=shape_list,
                              positions=args.positions, prompts=args.prompts,
                              tokens=args.tokens, rounds=args.rounds, device=args.device,
                              bits=None, group_size=None, quantizer=None,   # each engine's own
                              anchors_python=None, model=args.model)


def capacity(args) -> int:
    return max(args.positions) + 4 * args.tokens + 64   # grid.load_models' cache


# -- the parts, each run in a child process -------------------------------------------------------

def tests(args) -> dict:
    env = {**os.environ, "RIVER_TEST_DEVICE": args.device}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.tests]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    summary = (done.stdout.strip().splitlines() or ["no output"])[-1]
    if done.returncode:
        raise RuntimeError(f"RIVER_TEST_DEVICE={args.device} {' '.join(command[2:])}: {summary}")
    return {"command": f"RIVER_TEST_DEVICE={args.device} python {' '.join(command[1:])}",
            "summary": summary}


def speed(args) -> dict:
    return {"rows": grid.measure(grid_args(args, [engine(args)], args.shapes))["rows"]}


def layers(args) -> dict:
    out = {}
    for shape in args.shapes:
        model = grid.load_models([engine(args)], shape, grid_args(args, [], []))[engine(args)]
        out[shape] = grid.layer_costs(model, args.device)
        out[shape]["stand_in_over_layer"] = out[shape]["stand_in_us"] / out[shape]["layer_us"]
    return out


def without_backbone_layers(model) -> None:
    """Frees the backbone's layer weights of an hf engine: what the whole 4-bit model never
    reads (its prompt and tokens run the stand-ins; embedding and head stay)."""
    import gc

    import torch

    model.backend.blocks = [None] * len(model.backend.blocks)
    gc.collect()
    torch.cuda.empty_cache()


def memory(args) -> dict:
    """One shape (the process's only model): its weights' bytes on the device, and each mode's
    per-generation peak above what was allocated before it (`--memory-modes`)."""
    if not cuda(args):
        raise Skip("GPU memory needs a CUDA device (torch.cuda.max_memory_allocated)")
    import torch

    from river_core import GenerationConfig

    shape, = args.shapes
    torch.cuda.empty_cache()   # the bandwidth probe's buffers
    before = torch.cuda.memory_allocated(args.device)
    model = grid.load_models([engine(args)], shape, grid_args(args, [], []))[engine(args)]
    whole = args.memory_modes == ["whole-4bit"]
    if whole:
        without_backbone_layers(model)
    weights = "whole 4-bit weights_mb" if whole else "weights_mb"
    out = {weights: (torch.cuda.memory_allocated(args.device) - before) / 2 ** 20}
    prompt = grid.prompts_for(model, shape, max(args.positions), 1)[0]
    for label, config in MODES.items():
        if MODES[label] not in args.memory_modes:
            continue
        exit_config = grid.exit_config(config)
        if whole:
            exit_config = attrs.evolve(exit_config, prefill_exit=-1)
        start = torch.cuda.memory_allocated(args.device)
        torch.cuda.reset_peak_memory_stats(args.device)
        model.generate_ids([prompt], exit_config, GenerationConfig(max_new_tokens=args.tokens))
        out[label] = (torch.cuda.max_memory_allocated(args.device) - start) / 2 ** 20
    return {shape: out}


def onnx(args) -> dict:
    import onnxruntime

    provider = "CUDAExecutionProvider" if cuda(args) else "CPUExecutionProvider"
    if provider not in onnxruntime.get_available_providers():
        raise Skip(f"onnxruntime {onnxruntime.__version__} has no {provider} here "
                   "(pip install onnxruntime-gpu)")
    engines = [onnx_engine(args), engine(args)]
    return {"rows": grid.measure(grid_args(args, engines, [shapes.REAL]))["rows"]}


def free_memory(args) -> tuple[int, int]:
    """(free, total) bytes of the device, read by a process that then exits, so this one
    holds no CUDA context beside vLLM's."""
    done = subprocess.run([sys.executable, "-c", "import torch; print(*torch.cuda.mem_get_info"
                           f"({args.device!r}))"], capture_output=True, text=True, check=True)
    free, total = map(int, done.stdout.split())
    return free, total


def memory_fraction(free: int, total: int) -> float:
    """vLLM's gpu_memory_utilization for what is free now: vLLM 0.32 refuses to start when
    less than that fraction of the device is free."""
    fraction = (free - VLLM_MARGIN) / total
    if fraction < 0.1:
        raise Skip(f"{free / 2 ** 30:.1f} GiB free of {total / 2 ** 30:.1f} GiB: too little "
                   "for vLLM")
    return round(fraction, 3)


def vllm(args) -> dict:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise Skip("vLLM is not installed (pip install vllm: its CUDA build)")
    from transformers import AutoTokenizer

    from river_models import locate
    from river_models.tokenizer import Tokenizer

    from . import vllm_serving
    from .library.prompts import GSM8K_TEST, gsm8k_questions

    folder = str(locate(args.model))
    tokenizer = Tokenizer(AutoTokenizer.from_pretrained(folder), ())
    prompts = [tokenizer.chat(q) for q in gsm8k_questions(GSM8K_TEST, max(args.concurrency))]
    settings = vllm_serving.configurations({}, {"policy": "fixed", "options": {"layer": -1}})
    out = {}
    for name in ("vllm plain", "River exit mode in vllm", vllm_serving.LOSSLESS):
        engine_args = {"dtype": "float32", "enforce_eager": True}
        if cuda(args):   # River's forward runs eagerly; plain vLLM with its CUDA graphs
            engine_args = {"dtype": "bfloat16", "enforce_eager": name != "vllm plain",
                           "gpu_memory_utilization": memory_fraction(*free_memory(args))}
        runs = vllm_serving.measure(folder, settings[name], prompts, args.tokens,
                                    engine_args=engine_args, concurrency=list(args.concurrency))
        out[name] = {str(c): {k: v for k, v in r.items() if k != "outputs"}
                     if isinstance(r, dict) else r for c, r in runs.items()}
    return out


def child(args) -> None:
    """Runs part `args.child` here and writes its outcome to `args.result`."""
    from .library.timing import machine

    name = PARTS[args.child].name
    entry: dict = {}
    try:
        # vLLM's part leaves the device to vLLM: no context, no bandwidth probe's buffers
        entry["machine"] = machine("cpu" if name == "vllm" else args.device)
        entry |= {"status": "ran", "result": globals()[name](args)}
    except Skip as e:
        entry |= {"status": "skipped", "reason": str(e)}
    except Exception as e:   # recorded; the next part still runs
        traceback.print_exc()
        entry |= {"status": "failed", "error": f"{type(e).__name__}: {e}"[:500]}
    Path(args.result).write_text(json.dumps(entry, default=str))


# -- the parent: each part in a process of its own ---------------------------------------------

def units(number: int, args) -> list[list[str]]:
    """The child processes of part `number`, as arguments beyond the shared ones."""
    if not PARTS[number].per_shape:
        return [[]]
    return [["--shapes", s, "--memory-modes", *kinds] for s in args.shapes
            for kinds in (["backbone", "exit", "lossless"], ["whole-4bit"])]


def shared_argv(args, unit: list[str]) -> list[str]:
    """The arguments every child takes from this call (a unit's shape instead of all)."""
    shape_list = [] if "--shapes" in unit else ["--shapes", *args.shapes]
    argv = ["--device", args.device, *shape_list, "--positions",
            *map(str, args.positions), "--prompts", str(args.prompts), "--tokens",
            str(args.tokens), "--rounds", str(args.rounds), "--tests", *args.tests,
            "--concurrency", *map(str, args.concurrency)]
    return argv + (["--model", args.model] if args.model else [])


def child_command(number: int, args, unit: list[str], result: str) -> list[str]:
    return [sys.executable, "-m", __package__, "gpu", "--child", str(number), "--result",
            result, *shared_argv(args, unit), *unit]


def run_unit(number: int, args, unit: list[str], timeout: float) -> dict:
    """One child process of part `number`: its entry, or its failure."""
    with tempfile.TemporaryDirectory(prefix="river-gpu-part-") as tmp:
        result = Path(tmp) / "entry.json"
        # a session of its own: on a timeout the whole group goes (pytest, vLLM's engine
        # process), so nothing of it keeps the device's memory from the next part
        child = subprocess.Popen(child_command(number, args, unit, str(result)),
                                 stdout=sys.stderr, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
        try:
            _, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            return {"status": "failed", "error": f"timed out after {timeout:.0f} s"}
        if result.is_file():
            return json.loads(result.read_text())
        sys.stderr.write(err)
        last = (err.strip().splitlines() or ["no output"])[-1]
        return {"status": "failed", "error": f"exit status {child.returncode}: {last}"[:500]}


def merged(old, new):
    """A part's result after a rerun: rows keyed by (shape, engine, config, positions) and
    anything keyed by name (a shape, an engine) replaced where measured again, kept
    elsewhere."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    if "rows" in old and "rows" in new:
        key = lambda r: (r["shape"], r["engine"], r["config"], r["positions"])
        fresh = {key(r) for r in new["rows"]}
        return {**old, **new, "rows": [r for r in old["rows"] if key(r) not in fresh]
                + new["rows"]}
    return {k: merged(old[k], v) if k in old else v for k, v in new.items()} | \
        {k: v for k, v in old.items() if k not in new}


def run_part(number: int, args, old: dict | None, budget_left) -> dict:
    """Part `number`'s entry: its units' outcomes, merged into what `old` measured."""
    part = PARTS[number]
    entry = {"part": number, "date": datetime.datetime.now(datetime.timezone.utc)
             .isoformat(timespec="seconds"), "command": args.command}
    began = time.monotonic()
    result = (old or {}).get("result")
    outcomes = []
    for unit in units(number, args):
        left = min(part.limit_s - (time.monotonic() - began), budget_left())
        if left <= 0:
            outcomes.append({"status": "skipped", "reason": "its time was spent"})
            continue
        outcome = run_unit(number, args, unit, left)
        outcomes.append(outcome)
        if outcome["status"] == "ran":
            result = merged(result, outcome["result"])
        if "machine" in outcome:
            entry["machine"] = outcome["machine"]
    worst = next((o for s in ("failed", "skipped") for o in outcomes if o["status"] == s),
                 outcomes[0])
    entry |= {k: v for k, v in worst.items() if k in ("status", "reason", "error")}
    if any(o["status"] == "ran" for o in outcomes):
        entry["status"] = "ran" if worst["status"] == "ran" else f"partly {worst['status']}"
    if result is not None:
        entry["result"] = result
    entry["seconds"] = round(time.monotonic() - began, 1)
    return entry


def write_atomically(path: Path, text: str) -> None:
    """`text` into `path` by a rename: a reader (or a killed call) never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def expected_mb(shape: str, args, element: int) -> str:
    """A random shape's device memory at `element` bytes a weight: weights, stand-ins, cache."""
    if shape not in shapes.SHAPES:
        return "the model's own size"
    s = shapes.SHAPES[shape]
    weights = s.params() * element + s.stand_in_bytes()
    cache = s.cache_bytes_per_position(element) * capacity(args)
    return f"{weights / 2 ** 20:,.0f} MB weights + {cache / 2 ** 20:,.0f} MB cache"


def dry_run(args) -> str:
    """What each chosen part would run: its processes, shapes, expected memory and time."""
    element = 2 if cuda(args) else 4
    lines = [f"river bench gpu on {args.device}: each part a process of its own "
             f"(budget {args.budget:.0f} s)"]
    for number in args.parts:
        part = PARTS[number]
        lines.append(f"part {number} {part.name}: at most {part.limit_s} s (its time limit)")
        for unit in units(number, args):
            lines.append("  $ " + " ".join(child_command(number, args, unit, "ENTRY.json")))
        shape_list = [shapes.REAL] if part.name in ("onnx", "vllm") else args.shapes
        if part.name == "tests":
            lines.append(f"  runs: RIVER_TEST_DEVICE={args.device} pytest {' '.join(args.tests)}")
            continue
        if part.name == "speed" or part.name == "onnx":
            engines = [onnx_engine(args)] * (part.name == "onnx") + [engine(args)]
            lines.append(f"  engines: {', '.join(engines)}; configurations: "
                         f"{', '.join(MODES.values())}")
        if part.name == "vllm":
            sizing = "bfloat16, gpu_memory_utilization = (free - 1 GiB) / total at each " \
                "start" if cuda(args) else "float32"
            lines.append("  engines: vllm plain, River exit mode, River lossless mode; "
                         f"{sizing}; concurrency {', '.join(map(str, args.concurrency))}")
        for shape in shape_list:
            lines.append(f"  shape {shape}: {expected_mb(shape, args, element)}")
    return "\n".join(lines)


def report(record: dict) -> str:
    parts = sorted(record["parts"].values(), key=lambda e: e["part"])
    machines = [e["machine"] for e in parts if e.get("machine")]
    # vLLM's part probes no device (it leaves the device to vLLM): the last that did
    info = next((m for m in reversed(machines) if "gpu" in m),
                machines[-1] if machines else None)
    lines = ["# River on a GPU", ""]
    if info:
        lines += [f"Machine (of the last part that probed the device): "
                  f"{info.get('gpu', 'no GPU')} ({info['device']}, copy bandwidth "
                  f"{info['memory_bandwidth_gb_s']} GB/s), host {info['cpu']}, "
                  f"{info['cores']} cores, torch {info['torch']}.", ""]
    lines += ["| part | status | date | seconds | command |", "|---|---|---|---|---|"]
    for e in parts:
        status = e["status"] + "".join(f": {e[k]}" for k in ("reason", "error") if k in e)
        lines.append(f"| {e['part']} {PARTS[e['part']].name} | {status} | {e['date']} | "
                     f"{e['seconds']} | `{e['command']}` |")
    for e in parts:
        if "result" not in e:
            continue
        r, name = e["result"], PARTS[e["part"]].name
        lines += ["", f"## {e['part']}. {name}", ""]
        if name == "tests":
            lines.append(f"`{r['command']}`: {r['summary']}")
        elif name in ("speed", "onnx"):
            table = grid.report({"machine": e.get("machine", info), "rows": r["rows"],
                                 "command": e["command"]})
            lines += table.splitlines()[4:]
        elif name == "layers":
            lines += ["| shape | backbone layer µs | stand-in µs | ratio |", "|---|---|---|---|"]
            lines += [f"| {s} | {c['layer_us']:.0f} | {c['stand_in_us']:.0f} | "
                      f"{c['stand_in_over_layer']:.2f}x |" for s, c in r.items()]
        elif name == "memory":
            columns = ["weights_mb", "backbone", "exit mode", "lossless mode",
                       "whole 4-bit weights_mb", WHOLE]
            lines += ["Per shape, in a fresh process: weights, and each mode's peak above "
                      "what was allocated before it (MB).", "",
                      "| shape | weights | backbone | exit mode | lossless mode | whole 4-bit "
                      "weights | whole 4-bit model |", "|---|" + "---|" * len(columns)]
            lines += [f"| {s} | " + " | ".join(f"{m[c]:.0f}" if c in m else "-"
                                               for c in columns) + " |" for s, m in r.items()]
        elif name == "vllm":
            lines += ["| engine | " + " | ".join(f"{c} requests, tokens/s" for c in
                                                 CONCURRENCY) + " |",
                      "|---|" + "---|" * len(CONCURRENCY)]
            for engine_name, by_c in r.items():
                cells = [f"{by_c[str(c)]['tokens_per_second']:.1f}" if str(c) in by_c
                         else by_c.get("error", "-") for c in CONCURRENCY]
                lines.append(f"| {engine_name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = parser("gpu", __doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.description = __doc__
    ap.add_argument("--parts", type=int, nargs="+", default=list(PARTS), choices=list(PARTS),
                    help="; ".join(f"{n} {p.name}" for n, p in PARTS.items()))
    ap.add_argument("--budget", type=float, default=1800,
                    help="seconds this call may spend; parts after it are skipped")
    ap.add_argument("--dry-run", action="store_true",
                    help="print each part's processes, shapes, expected memory and time limit")
    ap.add_argument("--device", default="cuda", help="cuda (the CPU: the suite's tiny run)")
    ap.add_argument("--shapes", nargs="+", default=[shapes.REAL, "llama-1b", "llama-8b"],
                    choices=[shapes.REAL, *shapes.SHAPES])
    ap.add_argument("--positions", type=int, nargs="+", default=[512])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tests", nargs="+", default=TESTS, help="part 1's pytest arguments")
    ap.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY),
                    help="part 6's concurrent requests")
    # a child process: one part (one unit of it) here, its entry to --result
    ap.add_argument("--child", type=int, choices=list(PARTS), help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--memory-modes", nargs="+", default=list(MODES.values()),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    args.command = run_command("gpu", argv)
    if args.dry_run:
        return print(dry_run(args))
    out = Output(args)
    path = out.path("gpu.json")
    record = json.loads(path.read_text()) if path.is_file() else {"parts": {}}
    start = time.monotonic()
    budget_left = lambda: args.budget - (time.monotonic() - start)
    for number in args.parts:
        name = PARTS[number].name
        print(f"part {number}: {name}", file=sys.stderr, flush=True)
        record["parts"][name] = entry = run_part(number, args, record["parts"].get(name),
                                                 budget_left)
        print(f"part {number}: {entry['status']}", file=sys.stderr, flush=True)
        record["parts"] = dict(sorted(record["parts"].items(),
                                      key=lambda kv: kv[1]["part"]))
        markdown = report(record)
        write_atomically(path, json.dumps(record, indent=2, default=str) + "\n")
        write_atomically(out.path("gpu.md"), markdown)
    print(markdown)


if __name__ == "__main__":
    main()
