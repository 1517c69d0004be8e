"""The machine a benchmark ran on, its memory bandwidth, and timings: the one place a
benchmark reads a timer. On a GPU, work is queued, so every reading waits for the device
first (`now(device)`); on the CPU that wait is nothing."""

from __future__ import annotations

import os
import platform
import time

import numpy as np

from river_core.settings.machine import cpu as machine_cpu


def synchronize(device: str = "cpu") -> None:
    """Wait until the device has finished the work queued on it."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def now(device: str = "cpu") -> float:
    """Seconds on a monotonic clock, read once `device` has finished its queued work."""
    synchronize(device)
    return time.perf_counter()


def machine(device: str = "cpu") -> dict:
    """The host, and on a GPU its name; the memory bandwidth of `device` (copy, read + write)."""
    import torch

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), platform.processor())
    info = {"cpu": cpu, "extensions": list(machine_cpu().extensions), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "device": device,
            "memory_bandwidth_gb_s": round(memory_bandwidth(device=device) / 1e9, 1)}
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def memory_bandwidth(size: int = 1 << 30, repeats: int = 5, device: str = "cpu") -> float:
    """Bytes per second moved by copying a buffer larger than the caches on `device` (read +
    write), the best of `repeats`."""
    import torch

    src = torch.ones(size // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = now(device)
        dst.copy_(src)
        best = min(best, now(device) - start)
    return 2 * size / best


def median_us(run, repeats: int = 30, warmup: int = 5, device: str = "cpu") -> float:
    """Median wall time of `run()` in microseconds, after `warmup` calls, each timed once the
    device has finished it."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start = now(device)
        run()
        times.append(now(device) - start)
    return float(np.median(times)) * 1e6
