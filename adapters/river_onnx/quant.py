"""Round-to-nearest weight quantization in ONNX Runtime's `MatMulNBits` layout. No data needed.

Both precisions are asymmetric with one scale and zero point per block of `block` input
columns of each output row (4 bits: two values a byte, low nibble first). This is not the hf
backend's int8 layout (symmetric, per channel): each backend reports its own weight error in
`river_error`, and the river K/V bound is stated in terms of it.
"""

from __future__ import annotations

import attrs
import numpy as np

from river_core.config import RiverSpec


@attrs.frozen
class QuantWeight:
    packed: np.ndarray   # uint8 [rows, blocks, block * bits / 8]
    scales: np.ndarray   # float32 [rows * blocks]
    zeros: np.ndarray    # uint8 [rows * blocks] (8 bits) or packed nibbles (4 bits)
    rows: int
    columns: int
    bits: int
    block: int
    error: float         # ||Q(W) - W|| / ||W||


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def quantize(w: np.ndarray, spec: RiverSpec) -> QuantWeight:
    """w: float [rows, columns] (y = x w^T)."""
    rows, columns = w.shape
    block, top = spec.group_size, 2 ** spec.bits - 1
    blocks = -(-columns // block)
    padded = np.zeros((rows, blocks * block), dtype=np.float32)
    padded[:, :columns] = w
    wb = padded.reshape(rows, blocks, block)
    # zero points are integers in [0, top], so every block's range must include 0
    lo = np.minimum(wb.min(-1, keepdims=True), 0)
    hi = np.maximum(wb.max(-1, keepdims=True), 0)
    scale = np.maximum((hi - lo) / top, 1e-12).astype(np.float32)
    zero = np.clip(np.round(-lo / scale), 0, top)
    q = np.clip(np.round(wb / scale) + zero, 0, top).astype(np.uint8)
    deq = ((q.astype(np.float32) - zero) * scale).reshape(rows, -1)[:, :columns]
    error = float(np.linalg.norm(deq - w) / max(np.linalg.norm(w), 1e-30))
    zero = zero.reshape(rows, blocks).astype(np.uint8)
    if spec.bits == 4:
        packed = _pack_nibbles(q)
        if blocks % 2:
            zero = np.concatenate([zero, np.zeros((rows, 1), np.uint8)], axis=1)
        zero = _pack_nibbles(zero)
    else:
        packed = q
    return QuantWeight(packed, scale.reshape(-1), zero.reshape(-1), rows, columns, spec.bits,
                       block, error)
