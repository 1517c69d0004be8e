"""How a decoded token walks through River: Python calls per layer of a decode step and the
River files they run in (counted with a profiler on each engine over a tiny model, in exit
mode with the paper's rule and in a lossless round), and the decode speed of the same runs on
the embedded model (each engine: full depth, exit mode, lossless mode; median ms/token of
warm, interleaved runs). With `--python PY ...` the same measurements also run under other
interpreters (another checkout's virtual environment: the code before a change), interleaved
with this one, so before and after come from one run.

Counted calls are those whose code lives in River's own packages (river_core, river_models,
the engines, the policies), so the count is the call graph a reader follows, not the
internals of torch, ONNX Runtime or ggml.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path


PACKAGES = ("river_core", "river_models", "river_torch", "river_onnx", "river_ggml",
            "river_llamacpp", "river_vllm", "river_policies")
ENGINES = ["ggml", "hf", "onnx"]   # the default engine first
# spelled out, so that runs of code with other defaults compare the same settings
MODES = {"exit": {"policy": "settled"},
         "lossless": {"mode": "speculative", "policy": "fixed", "options": {"layer": -1},
                      "draft_tokens": 2, "adaptive": False}}
SPEED_CONFIGS = {"full depth": {"kv": "full"}, "exit": {}, **{"lossless": MODES["lossless"]}}


def _ours(filename: str) -> str | None:
    """The River module a code object's file belongs to (package/file), or None."""
    parts = Path(filename).parts
    for i, part in enumerate(parts):
        if part in PACKAGES:
            return "/".join(parts[i:])
    return None


def count_calls(engines: list[str], tokens: int = 8) -> dict:
    """Per engine and mode: River calls per layer a decode pass runs (backbone or stand-in; a
    decode step, a draft step or a verification; prefill excluded) and the River files they
    ran in, over the engine's tiny Llama (its conformance backend)."""
    return {engine: _count_engine(engine, tokens) for engine in engines}


def _count_engine(engine: str, tokens: int) -> dict:
    from river_core import ExitConfig, GenerationConfig, RiverModel
    from river_core.plugins import default_registry

    tiny = default_registry().get("conformance backend", engine)
    model = RiverModel(tiny("llama", 0, 4))
    prompt = [[1, 20, 21, 22, 23]]
    out = {}
    for mode, settings in MODES.items():
        config = ExitConfig(**settings)
        gen = GenerationConfig(max_new_tokens=tokens)
        model.generate_ids(prompt, config, gen)   # warm: plans, packed weights
        calls, files, counting = [0], set(), [False]
        backend = model.backend
        prefill = backend.prefill

        def quiet_prefill(*a, **k):
            counting[0] = False
            try:
                return prefill(*a, **k)
            finally:
                counting[0] = True
        backend.prefill = quiet_prefill

        def profile(frame, event, arg):
            if event == "call" and counting[0]:
                where = _ours(frame.f_code.co_filename)
                if where is not None:
                    calls[0] += 1
                    files.add(where)
        sys.setprofile(profile)
        try:
            result = model.generate_ids(prompt, config, gen)
        finally:
            sys.setprofile(None)
            del backend.prefill
        # every layer a token passes, backbone or stand-in: each decode step (a draft too)
        # and each verification pass all of them
        passes = len(result.exit_layers[0]) + len(result.drafted)
        layers = passes * backend.num_layers
        out[mode] = {"calls_per_layer": round(calls[0] / layers, 1), "files": sorted(files),
                     "decoded_tokens": result.decoded_tokens}
    return out


def speed(model_path: str | None, engines: list[str], tokens: int, rounds: int) -> dict:
    """Median ms/token per engine and configuration, warm, on `model_path` (None: the
    embedded model)."""
    from river_core import ExitConfig, GenerationConfig, RiverModel

    prompt = "Natalia sold clips to 48 of her friends in April, and then she sold half as " \
             "many clips in May. How many clips did Natalia sell altogether in April and May?"
    gen = GenerationConfig(max_new_tokens=tokens)
    out = {}
    for engine in engines:
        model = RiverModel.from_pretrained(model_path, backend=engine)
        ids = model.encode(prompt)
        for config in SPEED_CONFIGS.values():   # warm: sessions, plans, packed weights
            model.generate_ids(ids, ExitConfig(**config), gen)
        times = {name: [] for name in SPEED_CONFIGS}
        for _ in range(rounds):
            for name, config in SPEED_CONFIGS.items():
                times[name].append(model.generate_ids(ids, ExitConfig(**config),
                                                      gen).ms_per_token)
        out[engine] = {name: statistics.median(t) for name, t in times.items()}
    return out


def _worker(python: str, argv: list[str]) -> dict:
    """One round in a fresh process of `python`, which runs this file as a script: it needs
    only River's public API, so it also runs under a checkout that lacks this benchmark."""
    done = subprocess.run([python, __file__, *argv], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _worker_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--engines", nargs="+")
    ap.add_argument("--tokens", type=int)
    args = ap.parse_args(argv)
    print(json.dumps({"calls": count_calls(args.engines),
                      "speed": speed(args.model, args.engines, args.tokens, 1)}))


def main(argv: list[str] | None = None) -> None:
    from .library.output import Output, command, parser
    from .library.timing import machine

    ap = parser("walk", __doc__)
    ap.add_argument("--python", nargs="*", default=[],
                    help="other interpreters to measure beside this one (e.g. a checkout "
                         "before a change), interleaved")
    ap.add_argument("--engines", nargs="+", default=ENGINES)
    ap.add_argument("--tokens", type=int, default=32, help="decoded tokens a run")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    args = ap.parse_args(argv)
    inner = ["--engines", *args.engines, "--tokens", str(args.tokens),
             *(["--model", args.model] if args.model else [])]
    pythons = [sys.executable, *args.python]
    runs = {p: [] for p in pythons}
    for _ in range(args.rounds):   # each interpreter in turn, a fresh warm process a round
        for p in pythons:
            runs[p].append(_worker(p, inner))
    results = {}
    for p, measured in runs.items():
        results[p] = {"calls": measured[0]["calls"], "speed": {
            engine: {name: statistics.median(m["speed"][engine][name] for m in measured)
                     for name in SPEED_CONFIGS} for engine in args.engines}}
    lines = ["# How a token walks through River", "", f"Command: `{command('walk', argv)}`",
             "", f"Machine: {machine()['cpu']}.", ""]
    for p, r in results.items():
        lines += [f"## {p}", "", "| engine | mode | calls per layer | River files |",
                  "|---|---|---|---|"]
        lines += [f"| {e} | {m} | {c['calls_per_layer']} | {len(c['files'])} |"
                  for e, modes in r["calls"].items() for m, c in modes.items()]
        lines += ["", "| engine | " + " | ".join(SPEED_CONFIGS) + " |",
                  "|---|" + "---|" * len(SPEED_CONFIGS)]
        lines += [f"| {e} | " + " | ".join(f"{v:.1f}" for v in s.values()) + " |"
                  for e, s in r["speed"].items()]
        lines.append("")
    Output(args).write("walk", {"command": command("walk", argv), "machine": machine(),
                                "results": results}, "\n".join(lines))


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
