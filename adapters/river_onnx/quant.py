"""The model package's quantized weights in ONNX Runtime's `MatMulNBits` layout.

MatMulNBits keeps per block of `block` input columns of each output row a float scale and an
integer zero point, codes packed low nibble first at 4 bits. The engine-neutral
`river_models.QuantWeight` maps onto it exactly: an 8-bit weight's one scale per row is
repeated over the row's blocks, so hf and onnx run the very same stand-in weights.
"""

from __future__ import annotations

import attrs
import numpy as np

from river_models import QuantWeight

BLOCKS = (256, 128, 64, 32, 16)   # MatMulNBits takes powers of two from 16


@attrs.frozen
class NBits:
    packed: np.ndarray   # uint8 [rows, blocks, block * bits / 8]
    scales: np.ndarray   # float32 [rows * blocks]
    zeros: np.ndarray    # uint8 [rows * blocks] (8 bits) or packed nibbles (4 bits)
    rows: int
    columns: int
    bits: int
    block: int

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales.nbytes + self.zeros.nbytes


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def nbits(q: QuantWeight) -> NBits:
    rows, columns = q.shape
    block = q.group if q.group in BLOCKS else next(b for b in BLOCKS if columns % b == 0)
    per_group = q.group // block   # blocks per stored scale (1, or a row's worth at 8 bits)
    blocks = columns // block
    scales = np.repeat(q.scale, per_group, axis=1)
    zeros = np.repeat(q.zero, per_group, axis=1)
    codes = q.codes.reshape(rows, blocks, block)
    if q.bits == 4:
        packed = _pack_nibbles(codes)
        if blocks % 2:
            zeros = np.concatenate([zeros, np.zeros((rows, 1), np.uint8)], axis=1)
        zeros = _pack_nibbles(zeros)
    else:
        packed = codes
    return NBits(np.ascontiguousarray(packed), np.ascontiguousarray(scales, np.float32).reshape(-1),
                 np.ascontiguousarray(zeros).reshape(-1), rows, columns, q.bits, block)
