"""The machine a benchmark ran on, its memory bandwidth, and timings."""

from __future__ import annotations

import os
import platform
import time

import numpy as np


def machine() -> dict:
    import torch

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(),
            "memory_bandwidth_gb_s": round(memory_bandwidth() / 1e9, 1)}


def memory_bandwidth(size: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes per second moved by copying a buffer larger than the caches (read + write)."""
    import torch

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
