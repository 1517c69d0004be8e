"""The onnx engine's sessions: the options every one is made with (`session_options`), and
ONNX Runtime's optimized graphs, kept on disk so a warm start does no graph optimization.

The first load of an export on the CPU builds every session with full graph optimization and
has ONNX Runtime write each optimized graph (`SessionOptions.optimized_model_filepath`) into a
cache entry `onnx-optimized/EXPORT-KEY`, their weights then gathered into one file, each
distinct tensor once, as the export keeps them; later
loads read those graphs with graph optimization off. Optimization at this level may use the
CPU's own instructions (ONNX Runtime's NCHWc transformer, its warning says so), so KEY holds
the ONNX Runtime version, the CPU's model and flags (`river_core.settings.machine.cpu_key`) and the
export's seal: another machine or version builds its own. An entry that fails to load (a
damaged file the size check let through) is removed and rebuilt, with a one-line notice;
a partial one (an interrupted first load) is removed by the cache itself (river_models.cache).
On CUDA every load optimizes, as before: the optimized graphs there would hold the provider's
own nodes, untested here.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import onnx
import onnxruntime as ort

from river_core.settings.errors import ModelError
from river_core.settings.machine import cpu_key
from river_models.cache import MANIFEST, cache_root, cached, digest

from .weights import SharedWeights

KIND = "onnx-optimized"
FORMAT = 1   # bump when what is written changes


@functools.cache
def _shared_threads() -> bool:
    """One process-wide thread pool for the hundred-odd small sessions, when ORT still allows
    it (it must be set before the first session of the process)."""
    try:
        ort.set_global_thread_pool_sizes(0, 1)
        return True
    except Exception:   # an environment already exists: fall back to per-session pools
        return False


def session_options(device: str) -> ort.SessionOptions:
    """Options of every session on `device`. On CUDA a node with no CUDA kernel is an error,
    not a silent run on the CPU (ONNX Runtime's default: GroupQueryAttention in float32, say,
    which its CUDA provider does not register, would copy every layer's cache to the host)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # each session's CPU arena keeps the largest buffers it ever served, so after one long
    # prefill the ~150 sessions of a model together held gigabytes (docs/benchmarks.md)
    options.enable_cpu_mem_arena = False
    # any device: once the process has the shared pool, ORT refuses a session with its own
    if _shared_threads():
        options.use_per_session_threads = False
    else:
        options.intra_op_num_threads = 1
    if device != "cpu":
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        # the process's one device allocator (allocator.py), not an arena per session
        options.add_session_config_entry("session.use_env_allocators", "1")
    return options


def optimized_entry(export: Path) -> tuple[Path, str]:
    """Where the optimized graphs of the cached export `export` live, and their key."""
    seal = json.loads((export / MANIFEST).read_text())["seal"]
    key = digest(seal, ort.__version__, cpu_key(), FORMAT)
    return cache_root() / KIND / f"{export.name}-{key}", key


def build(make: Callable[[Path, ort.SessionOptions], ort.InferenceSession],
          options: Callable[[], ort.SessionOptions], folder: Path,
          names: list[str], optimized: tuple[Path, str] | None
          ) -> dict[str, ort.InferenceSession]:
    """The sessions `names` (graph files of `folder`), built several at a time. `optimized`:
    the cache entry of their optimized graphs and its key (`optimized_entry`; None: optimize
    in memory every time)."""
    paths = [folder / f"{name}.onnx" for name in names]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} lacks {', '.join(missing)}: a damaged export")
    if optimized is None:
        return _many(lambda name: make(folder / f"{name}.onnx", options()), names)
    target, key = optimized
    made: dict[str, ort.InferenceSession] = {}

    def optimize(tmp: Path) -> None:
        def one(name: str) -> ort.InferenceSession:
            o = options()
            o.optimized_model_filepath = str(tmp / f"{name}.onnx")
            o.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", f"{name}.data")
            o.add_session_config_entry(
                "session.optimized_model_external_initializers_min_size_in_bytes", "1024")
            o.log_severity_level = 3   # not its warning that the graphs suit this CPU only
            return make(folder / f"{name}.onnx", o)
        made.update(_many(one, names))
        _share_weights(tmp, names)

    try:
        entry = cached(target, optimize, key, source=folder)   # pruned with its export
    except ModelError:   # a read-only cache without them: optimized in memory, as on CUDA
        return build(make, options, folder, names, None)
    if made:   # built just now: the sessions that wrote the graphs are the ones to use
        return made

    def load(name: str) -> ort.InferenceSession:
        o = options()
        o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        return make(entry / f"{name}.onnx", o)
    try:
        return _many(load, names)
    except Exception as e:   # a damaged graph: rebuilt once, from the export
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        print(f"river: the optimized graphs {entry.name} do not load ({first}); rebuilding "
              f"them", file=sys.stderr, flush=True)
        shutil.rmtree(entry, ignore_errors=True)
        return build(make, options, folder, names, optimized)


def _share_weights(folder: Path, names: list[str]) -> None:
    """The optimized graphs' weights moved into one file, each distinct tensor once, as the
    export keeps them (`weights.SharedWeights`): ONNX Runtime writes each graph's own, which
    stores the tails' stand-ins once per tail and the tied embedding twice (1.1 GB for the
    embedded model, against the export's 719 MB)."""
    shared = SharedWeights(folder, "float32")   # the graphs' types as they are
    for name in names:
        model = onnx.load(str(folder / f"{name}.onnx"))   # with its weights
        (folder / f"{name}.data").unlink(missing_ok=True)
        shared.save(model, name)
    shared.close()


def _many(make: Callable[[str], ort.InferenceSession],
          names: list[str]) -> dict[str, ort.InferenceSession]:
    """Every session, built now, several at a time: a session made on first use would be
    made inside a timed decode (issue 36)."""
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        return dict(zip(names, pool.map(make, names)))
