"""Weight-only round-to-nearest quantization for river stand-ins. No training, no data.

int8: symmetric, one scale per output channel. int4: asymmetric, one scale and zero per group
of input columns. On the CPU the packed kernels run with bfloat16 activations (the fast path
there); on other devices the layer runs on dequantized weights (correct, not faster).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from river_core.config import RiverSpec
from river_core.errors import ConfigError

_GROUPS = (256, 128, 64, 32)


def _group_size(requested: int, columns: int) -> int:
    """The requested group, or the largest supported one dividing the layer's width."""
    for g in (requested, *_GROUPS):
        if g <= columns and columns % g == 0:
            return g
    raise ConfigError(f"int4 river needs layer widths divisible by 32, got {columns}")


class QuantLinear:
    """y = x W^T + b with W stored in `spec.bits` bits. `error` = ||Q(W) - W|| / ||W||."""

    def __init__(self, linear: torch.nn.Linear, spec: RiverSpec) -> None:
        w = linear.weight.detach().float()
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.out_features = w.shape[0]
        self.cpu = w.device.type == "cpu"
        if spec.bits == 8:
            scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
            q = torch.round(w / scale[:, None]).clamp(-127, 127)
            deq = q * scale[:, None]
            self.q, self.scale = q.to(torch.int8), scale.to(torch.bfloat16)
        else:
            n, k = w.shape
            self.group = _group_size(spec.group_size, k)
            wg = w.view(n, k // self.group, self.group)
            lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
            scale = ((hi - lo) / 15).clamp(min=1e-12)
            q = torch.round((wg - lo) / scale).clamp(0, 15)
            deq = (q * scale + lo).view(n, k)
            if self.cpu:
                # packed-kernel convention: w = (q - 8) * scale + zero
                zero = lo + 8 * scale
                self.q = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                    q.view(n, k).to(torch.int32), 1)
                self.scale = torch.stack([scale.squeeze(-1).t(), zero.squeeze(-1).t()], -1) \
                    .contiguous().to(torch.bfloat16)
        self.error = float((deq - w).norm() / w.norm().clamp(min=1e-12))
        if not self.cpu:
            self.q = None
            self.weight = deq.to(linear.weight.dtype)
        self.bits = spec.bits

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.cpu:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        if self.bits == 8:
            y = torch.ops.aten._weight_int8pack_mm(flat, self.q, self.scale)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.q, self.group, self.scale)
        y = y.to(x.dtype).view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias
