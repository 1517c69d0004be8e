"""Everything River measures on a GPU, in one command for the day one is at hand: the test
suite on the device, decode speed against the byte limit, per-layer costs, peak GPU memory per
mode, ONNX Runtime on CUDA, and vLLM's CUDA engine against River's modes inside it.

    river bench gpu --docs                       # all six parts, about 30 minutes
    river bench gpu --docs --parts 1 2 --budget 540
    river bench gpu --docs --parts 3 4 5 6 --budget 540

Parts, in order (`--parts` picks some; each records ran, skipped with its reason, or failed
with its error, and the command goes on to the next; once `--budget` seconds are spent the rest
are skipped):
1. tests: the suite's device-aware tests with RIVER_TEST_DEVICE set to the device (`--tests`);
2. speed: one interleaved `river bench grid` run at batch 1 on River's hf engine in bfloat16 (on
   the CPU float32): backbone, the whole 4-bit model, exit mode at the paper's rule, lossless
   mode, and each row's byte limit (weight and K/V bytes per token over the device's measured
   copy bandwidth), on the embedded model and random Llama-3.2-1B- and Llama-3.1-8B-shaped
   models (`--shapes`; RTN stand-ins);
3. layers: one decoding token's backbone layer and stand-in layer, per shape;
4. memory: peak GPU memory of one generation per mode (torch.cuda.max_memory_allocated,
   reset between modes);
5. onnx: the grid on River's onnx engine with ONNX Runtime's CUDA provider, beside torch;
6. vllm: vLLM plain (CUDA graphs on) against River's exit and lossless modes inside vLLM at
   1, 4, 16 and 64 concurrent requests (`river bench vllm`'s machinery).
Every timer is read after the device has finished its queued work (library/timing.py).
Results accumulate over calls in gpu.{md,json}: the GPU, the command and date of each part.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import traceback

from river_core import ExitConfig, GenerationConfig

from . import grid
from .library import shapes
from .library.output import Output, parser
from .library.output import command as run_command
from .library.timing import machine

PARTS = {1: "tests", 2: "speed", 3: "layers", 4: "memory", 5: "onnx", 6: "vllm"}
MODES = {"backbone": "backbone", "whole 4-bit model": "whole-4bit", "exit mode": "exit",
         "lossless mode": "lossless"}
TESTS = ["tests/test_conformance.py", "tests/test_invariants.py", "tests/test_speculative.py",
         "tests/test_batch.py"]
CONCURRENCY = (1, 4, 16, 64)


class Skip(Exception):
    """A part that cannot run here, and why."""


def engine(args) -> str:
    """River's torch engine at the device's dtype: bfloat16 on CUDA, float32 on the CPU."""
    return "hf:bfloat16" if args.device.startswith("cuda") else "hf"


def grid_args(args, engines: list[str], shape_list: list[str]) -> argparse.Namespace:
    return argparse.Namespace(engines=engines, configs=list(MODES.values()), shapes=shape_list,
                              positions=args.positions, prompts=args.prompts,
                              tokens=args.tokens, rounds=args.rounds, device=args.device,
                              bits=4, quantizer="hqq", anchors_python=None, model=args.model)


def tests(args, loaded) -> dict:
    env = {**os.environ, "RIVER_TEST_DEVICE": args.device}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.tests]
    done = subprocess.run(command, env=env, capture_output=True, text=True,
                          timeout=max(args.budget_left(), 1))
    summary = (done.stdout.strip().splitlines() or ["no output"])[-1]
    if done.returncode:
        raise RuntimeError(f"RIVER_TEST_DEVICE={args.device} {' '.join(command[2:])}: {summary}")
    return {"command": f"RIVER_TEST_DEVICE={args.device} python {' '.join(command[1:])}",
            "summary": summary}


def speed(args, loaded) -> dict:
    payload = grid.measure(grid_args(args, [engine(args)], args.shapes), loaded)
    return {"rows": payload["rows"]}


def layers(args, loaded) -> dict:
    out = {}
    for shape in args.shapes:
        model = grid.load_models([engine(args)], shape, grid_args(args, [], []),
                                 loaded)[engine(args)]
        out[shape] = grid.layer_costs(model, args.device)
        out[shape]["stand_in_over_layer"] = out[shape]["stand_in_us"] / out[shape]["layer_us"]
    return out


def memory(args, loaded) -> dict:
    if not args.device.startswith("cuda"):
        raise Skip("peak GPU memory needs a CUDA device (torch.cuda.max_memory_allocated)")
    import torch

    out = {}
    for shape in args.shapes:
        model = grid.load_models([engine(args)], shape, grid_args(args, [], []),
                                 loaded)[engine(args)]
        prompt = grid.prompts_for(model, shape, max(args.positions), 1)[0]
        for label, config in MODES.items():
            torch.cuda.reset_peak_memory_stats(args.device)
            model.generate_ids([prompt], grid.exit_config(config),
                               GenerationConfig(max_new_tokens=args.tokens))
            out.setdefault(shape, {})[label] = \
                torch.cuda.max_memory_allocated(args.device) / 2 ** 20
    return {"peak_mb": out}


def onnx(args, loaded) -> dict:
    import onnxruntime

    provider = "CUDAExecutionProvider" if args.device.startswith("cuda") \
        else "CPUExecutionProvider"
    if provider not in onnxruntime.get_available_providers():
        raise Skip(f"onnxruntime {onnxruntime.__version__} has no {provider} here "
                   "(pip install onnxruntime-gpu)")
    payload = grid.measure(grid_args(args, ["onnx", engine(args)], [shapes.REAL]), loaded)
    return {"rows": payload["rows"]}


def vllm(args, loaded) -> dict:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise Skip("vLLM is not installed (pip install vllm: its CUDA build)")
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise Skip("torch sees no CUDA device")
    from river_models import locate

    from . import vllm_serving
    from .library.prompts import GSM8K_TEST, gsm8k_questions

    folder = str(locate(args.model))
    model = grid.load_models([engine(args)], shapes.REAL, grid_args(args, [], []),
                             loaded)[engine(args)]
    prompts = model.encode(gsm8k_questions(GSM8K_TEST, max(args.concurrency)))
    settings = vllm_serving.configurations({}, {"policy": "fixed", "options": {"layer": -1}})
    cuda = args.device.startswith("cuda")
    engine_args = {"dtype": "bfloat16" if cuda else "float32"}
    out = {}
    for name in ("vllm plain", "River exit mode in vllm", vllm_serving.LOSSLESS):
        graphs = cuda and name == "vllm plain"   # River's forward runs eagerly
        out[name] = vllm_serving.measure(folder, settings[name], prompts, args.tokens,
                                         engine_args={**engine_args,
                                                      "enforce_eager": not graphs},
                                         concurrency=list(args.concurrency))
        out[name] = {str(c): {k: v for k, v in r.items() if k != "outputs"}
                     if isinstance(r, dict) else r for c, r in out[name].items()}
    return out


def run_parts(args, record: dict) -> None:
    """Each chosen part in order, its outcome into `record` (parts already there are
    replaced); models loaded once and shared between parts."""
    loaded: dict = {}
    start = time.monotonic()
    args.budget_left = lambda: args.budget - (time.monotonic() - start)
    for number in args.parts:
        name = PARTS[number]
        began = time.monotonic()
        entry = {"part": number, "date": datetime.datetime.now(datetime.timezone.utc)
                 .isoformat(timespec="seconds"), "command": args.command}
        print(f"part {number}: {name}", file=sys.stderr, flush=True)
        if args.budget_left() <= 0:
            entry |= {"status": "skipped", "reason": f"the budget of {args.budget:.0f} s was "
                      "spent"}
        else:
            try:
                entry |= {"status": "ran", "result": globals()[name](args, loaded)}
            except Skip as e:
                entry |= {"status": "skipped", "reason": str(e)}
            except Exception as e:   # recorded; the next part still runs
                traceback.print_exc()
                entry |= {"status": "failed", "error": f"{type(e).__name__}: {e}"[:500]}
        entry["seconds"] = round(time.monotonic() - began, 1)
        record["parts"][name] = entry
        print(f"part {number}: {entry['status']}", file=sys.stderr, flush=True)


def report(record: dict) -> str:
    info = record["machine"]
    lines = ["# River on a GPU", "",
             f"Machine: {info.get('gpu', 'no GPU')} ({info['device']}, copy bandwidth "
             f"{info['memory_bandwidth_gb_s']} GB/s), host {info['cpu']}, {info['cores']} "
             f"cores, torch {info['torch']}.", "",
             "| part | status | date | seconds | command |", "|---|---|---|---|---|"]
    parts = sorted(record["parts"].values(), key=lambda e: e["part"])
    for e in parts:
        status = {"ran": "ran", "skipped": f"skipped: {e.get('reason')}",
                  "failed": f"failed: {e.get('error')}"}[e["status"]]
        lines.append(f"| {e['part']} {PARTS[e['part']]} | {status} | {e['date']} | "
                     f"{e['seconds']} | `{e['command']}` |")
    for e in parts:
        if e["status"] != "ran":
            continue
        r, name = e["result"], PARTS[e["part"]]
        lines += ["", f"## {e['part']}. {name}", ""]
        if name == "tests":
            lines.append(f"`{r['command']}`: {r['summary']}")
        elif name in ("speed", "onnx"):
            table = grid.report({"machine": info, "rows": r["rows"], "command": e["command"]})
            lines += table.splitlines()[4:]
        elif name == "layers":
            lines += ["| shape | backbone layer µs | stand-in µs | ratio |", "|---|---|---|---|"]
            lines += [f"| {s} | {c['layer_us']:.0f} | {c['stand_in_us']:.0f} | "
                      f"{c['stand_in_over_layer']:.2f}x |" for s, c in r.items()]
        elif name == "memory":
            lines += ["| shape | " + " | ".join(MODES) + " |", "|---|" + "---|" * len(MODES)]
            lines += [f"| {s} | " + " | ".join(f"{m[k]:.0f} MB" for k in MODES) + " |"
                      for s, m in r["peak_mb"].items()]
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
                    help="; ".join(f"{n} {p}" for n, p in PARTS.items()))
    ap.add_argument("--budget", type=float, default=1800,
                    help="seconds this call may spend; parts after it are skipped")
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
    args = ap.parse_args(argv)
    out = Output(args)
    args.command = run_command("gpu", argv)
    path = out.folder / "gpu.json"
    record = json.loads(path.read_text()) if path.is_file() else {"parts": {}}
    try:
        record["machine"] = machine(args.device)
    except Exception as e:   # no such device: every part then says so itself
        record["machine"] = machine() | {"device": args.device, "device_error": str(e)[:300]}
    run_parts(args, record)
    out.write("gpu", record, report(record))


if __name__ == "__main__":
    main()
