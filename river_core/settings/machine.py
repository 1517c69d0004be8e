"""The CPU this process runs on, as far as speed depends on it: its model and its instruction
set flags. What is measured or optimized for one CPU (ONNX Runtime's optimized graphs, a
calibration of the draft length) is keyed by `cpu_key`, so another CPU's is remeasured, not
trusted; benchmark results record `Cpu.describe()` beside each figure."""

from __future__ import annotations

import functools
import hashlib
import os
import platform

import attrs

# the vector extensions that decide the CPU kernels' speed (Linux /proc/cpuinfo flag names)
EXTENSIONS = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_vnni": "AVX-512 VNNI",
              "avx_vnni": "AVX-VNNI", "amx_tile": "AMX"}


@attrs.frozen
class Cpu:
    model: str
    flags: frozenset[str]

    @property
    def extensions(self) -> tuple[str, ...]:
        """The vector extensions present, by their common names (EXTENSIONS' order)."""
        return tuple(name for flag, name in EXTENSIONS.items() if flag in self.flags)

    def describe(self) -> str:
        return f"{self.model} ({', '.join(self.extensions) or 'no AVX2'})"


def read_cpu(cpuinfo: str | None) -> Cpu:
    """The CPU described by the text of /proc/cpuinfo (None: not Linux; the platform's name)."""
    fields: dict[str, str] = {}
    for line in (cpuinfo or "").splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())   # the first processor's
    model = fields.get("model name") or platform.processor() or platform.machine()
    return Cpu(model, frozenset(fields.get("flags", "").split()))


@functools.cache
def cpu() -> Cpu:
    try:
        with open("/proc/cpuinfo") as f:
            return read_cpu(f.read())
    except OSError:
        return read_cpu(None)


def cpu_key() -> str:
    """A digest of the CPU's model and flags, and of the cores the process may use."""
    c = cpu()
    text = "|".join([c.model, *sorted(c.flags), str(len(os.sched_getaffinity(0))
                                                    if hasattr(os, "sched_getaffinity")
                                                    else os.cpu_count())])
    return hashlib.sha256(text.encode()).hexdigest()[:12]
