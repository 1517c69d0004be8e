"""One device allocator for every session of the process, registered with ONNX Runtime's
environment: a model's 3L+3 sessions on CUDA would otherwise each keep an arena of its own,
each holding the largest buffers it ever served (after a long prefill, together many times
one session's peak). Sessions take it with `session.use_env_allocators` (backend.py).

Its arena grows by what is asked (`arena_extend_strategy` 1, kSameAsRequested), not by powers
of two. It is not shrunk after runs: ONNX Runtime shrinks an arena only through a run option
(`memory.enable_memory_arena_shrinkage`) that frees its unused chunks after that run, a device
free and a synchronization per run, which every decode step would pay.
"""

from __future__ import annotations

import functools

import onnxruntime as ort

from .device_kv import DEVICE_ID

PROVIDER = "CUDAExecutionProvider"
ARENA = {"arena_extend_strategy": 1}   # kSameAsRequested


@functools.cache
def shared_device_allocator() -> None:
    """Registers the process's CUDA allocator, once."""
    memory = ort.OrtMemoryInfo("Cuda", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, DEVICE_ID,
                               ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator_v2(PROVIDER, memory, {"device_id": str(DEVICE_ID)},
                                         ort.OrtArenaCfg(ARENA))
