"""Whether the machine was quiet while a benchmark ran, so no committed figure comes from a
busy one (issue 42: a grid measured beside other work gave hf 2,201 ms/token against 30).

A run reads the machine at its start and its end (`Output` does, around every benchmark): the
1-minute load average and, for a `--docs` run, the copy bandwidth (`timing.memory_bandwidth`).
The rule, `busy`:
- the load average at the start above the core count (other work was running), or at the end
  above twice the core count (the benchmark's own threads add up to the core count there);
- the copy bandwidth at the start or the end under half of this machine's quiet figure: the
  best this CPU (`river_core.settings.machine.cpu_key`) has measured, kept in the user cache.
A `--docs` run on a busy machine does not write docs/results (`Output.write`).
"""

from __future__ import annotations

import json
import os

import attrs

from river_core.settings.machine import cpu, cpu_key


@attrs.frozen
class Reading:
    load: float                    # 1-minute load average
    bandwidth_gb_s: float | None   # copy bandwidth; None: not measured


def read(bandwidth: bool) -> Reading:
    gb_s = None
    if bandwidth:
        from .timing import memory_bandwidth

        gb_s = round(memory_bandwidth() / 1e9, 1)
    return Reading(os.getloadavg()[0], gb_s)


def quiet_bandwidth(readings: list[Reading]) -> float | None:
    """This CPU's quiet copy bandwidth: the best it has measured, these readings included
    (kept in the user cache, `machines/CPU_KEY.json`)."""
    from river_models.cache import cache_root

    path = cache_root() / "machines" / f"{cpu_key()}.json"
    try:
        best = json.loads(path.read_text())["quiet_bandwidth_gb_s"]
    except (OSError, ValueError, KeyError):
        best = None
    measured = [r.bandwidth_gb_s for r in readings if r.bandwidth_gb_s is not None]
    if measured and (best is None or max(measured) > best):
        best = max(measured)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"cpu": cpu().describe(), "quiet_bandwidth_gb_s": best}))
        except OSError:   # a read-only cache: the figure holds for this run only
            pass
    return best


def busy(start: Reading, end: Reading, cores: int, quiet_gb_s: float | None) -> str | None:
    """Why the machine was busy during a run (None: it was quiet), by the module's rule."""
    if start.load > cores:
        return f"load average {start.load:.1f} at the start, above {cores} cores"
    if end.load > 2 * cores:
        return f"load average {end.load:.1f} at the end, above twice the {cores} cores"
    for when, r in (("start", start), ("end", end)):
        if quiet_gb_s and r.bandwidth_gb_s is not None and r.bandwidth_gb_s < quiet_gb_s / 2:
            return (f"copy bandwidth {r.bandwidth_gb_s} GB/s at the {when}, under half this "
                    f"machine's quiet {quiet_gb_s} GB/s")
    return None


def state(start: Reading, end: Reading, cores: int, quiet_gb_s: float | None) -> dict:
    """What a result records of the machine's state: the CPU, the readings and the verdict."""
    c = cpu()
    return {"cpu": c.model, "extensions": list(c.extensions), "cores": cores,
            "load_average": {"start": start.load, "end": end.load},
            "bandwidth_gb_s": {"start": start.bandwidth_gb_s, "end": end.bandwidth_gb_s},
            "quiet_bandwidth_gb_s": quiet_gb_s, "busy": busy(start, end, cores, quiet_gb_s)}


def describe(s: dict) -> str:
    """The state as one line of a result page."""
    bw = s["bandwidth_gb_s"]
    bandwidth = "" if bw["start"] is None else \
        f", copy bandwidth {bw['start']} GB/s at the start and {bw['end']} at the end " \
        f"(quiet: {s['quiet_bandwidth_gb_s']})"
    verdict = f"BUSY: {s['busy']}" if s["busy"] else "quiet by docs/benchmarks.md's rule"
    return (f"Machine state: {s['cpu']} ({', '.join(s['extensions']) or 'no AVX2'}), "
            f"{s['cores']} cores, load average {s['load_average']['start']:.1f} at the start "
            f"and {s['load_average']['end']:.1f} at the end{bandwidth}: {verdict}.")
