"""Shared by the benchmark scripts: machine description, prompts, bandwidth, output files."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from river_core import ConfigError
from river_cli.prompts import GSM8K, read_prompts

CHECKOUT = Path(__file__).resolve().parents[1]
IN_CHECKOUT = (CHECKOUT / "docs").is_dir() and (CHECKOUT / "pyproject.toml").is_file()
# the whole GSM8K files beside a checkout (the project's own runs), else the bundled slices
_SHARED = CHECKOUT.parent / "shared/data/gsm8k"
GSM8K_TRAIN = (_SHARED if (_SHARED / "train.jsonl").is_file() else GSM8K) / "train.jsonl"
RESULTS = Path(os.environ.get("RIVER_RESULTS") or
               (CHECKOUT / "docs/results" if IN_CHECKOUT else Path.cwd() / "river-results"))
RUNS = CHECKOUT / "benchmarks/runs" if IN_CHECKOUT else RESULTS / "runs"   # resumable records


def machine() -> dict:
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(),
            "memory_bandwidth_gb_s": round(memory_bandwidth() / 1e9, 1)}


def memory_bandwidth(size: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes per second moved by copying a buffer larger than the caches (read + write)."""
    src = torch.ones(size // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * size / best


def median_us(run, repeats: int = 30, warmup: int = 5) -> float:
    """Median wall time of `run()` in microseconds, after `warmup` calls."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e6


def gsm8k_questions(path: Path, n: int, offset: int = 0) -> list[str]:
    try:
        return read_prompts(path, n, offset)
    except ConfigError as e:
        raise SystemExit(f"{e} (pass --data)") from None


def write(name: str, payload: dict, markdown: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown)
    print(markdown)


def first_divergence(a, b) -> int:
    """Tokens two outputs share before they first differ (the shorter length if never)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def pearson(a, b) -> float:
    return float(np.corrcoef(a, b)[0, 1])


def spearman(a, b) -> float:
    rank = lambda x: np.argsort(np.argsort(x))
    return pearson(rank(np.asarray(a)), rank(np.asarray(b)))


def runs_by_engine(names, script: str) -> dict:
    """Each named result file in docs/results (one run of `script` per engine), by engine."""
    runs = {}
    for name in names:
        path = RESULTS / f"{name}.json"
        if not path.is_file():
            raise SystemExit(f"{path} not found: run `python -m benchmarks {script} ... --name "
                             f"{name}` first (see that script's docstring)")
        runs[name] = json.loads(path.read_text())
    return {r["args"]["backend"]: r for r in runs.values()}


def engine_heading(engine: str, run: dict) -> list[str]:
    """A result page's section for one engine's run: its command and machine."""
    info = run["machine"]
    rss = f", peak RSS {info['peak_rss_mb']:.0f} MB" if "peak_rss_mb" in info else ""
    return [f"## {engine}", "", f"Command: `{run['command']}`", "",
            f"Machine: {info['cpu']}, {info['cores']} cores, copy bandwidth "
            f"{info['memory_bandwidth_gb_s']} GB/s{rss}.", ""]
