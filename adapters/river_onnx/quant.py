"""The model package's quantized weights in ONNX Runtime's `MatMulNBits` layout.

MatMulNBits keeps per block of `block` input columns of each output row a float scale and an
integer zero point, codes packed low nibble first at 4 bits (an 8-bit weight's one scale per
row is repeated over the row's blocks). Float zero points are accepted too, but run many times
slower on this CPU (docs/results/levers.md, "matmul_nbits_us"), so a float zero point z is
split into an integer part zi, kept in the kernel, and the rest, which `correction` carries:
with w = (code - z) * s, y = x W^T = MatMulNBits(x) - sum over groups of (z - zi) * s * (sum
of x over the group), a [groups] x [groups, rows] product. So the graph computes exactly the
model package's weights, and hf and onnx run the very same stand-ins.
"""

from __future__ import annotations

import attrs
import numpy as np

from river_models import QuantWeight

BLOCKS = (256, 128, 64, 32, 16)   # MatMulNBits takes powers of two from 16
# The largest block ONNX Runtime's CUDA MatMulNBits takes, by bits: its one-row product (every
# decode step) runs in TryMatMul4BitsM1 at 4 bits, which has kernels for blocks of 16-128 and
# throws for any other (onnxruntime/contrib_ops/cuda/quantization/matmul_4bits_m1_impl.cuh;
# the onnxruntime-gpu 1.31.1 wheel's CUDA provider holds exactly those four instances, and
# 16-256 for the 8-bit one-row kernel). A CUDA export splits a larger group into blocks.
CUDA_LARGEST_BLOCK = {4: 128, 8: 256}


@attrs.frozen
class NBits:
    packed: np.ndarray   # uint8 [rows, blocks, block * bits / 8]
    scales: np.ndarray   # float32 [rows * blocks]
    zeros: np.ndarray    # uint8 [rows * blocks] (8 bits) or packed nibbles (4 bits)
    rows: int
    columns: int
    bits: int
    block: int
    correction: np.ndarray | None   # float32 [groups, rows], or None when zeros are integers
    group: int                      # input columns per correction row

    @property
    def nbytes(self) -> int:
        extra = 0 if self.correction is None else self.correction.nbytes
        return self.packed.nbytes + self.scales.nbytes + self.zeros.nbytes + extra


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def nbits(q: QuantWeight, cuda: bool = False) -> NBits:
    """`q` in MatMulNBits' layout; for `cuda`, in blocks no larger than CUDA_LARGEST_BLOCK, a
    larger group's scale and zero point repeated over its blocks: the same weights."""
    rows, columns = q.shape
    sizes = [b for b in BLOCKS if not cuda or b <= CUDA_LARGEST_BLOCK[q.bits]]
    block = next(b for b in sizes if q.group % b == 0 and columns % b == 0)
    per_group = q.group // block   # blocks per stored scale (1, or a row's worth at 8 bits)
    blocks = columns // block
    top = 2 ** q.bits - 1
    whole = np.clip(np.round(q.zero), 0, top)
    rest = (q.zero - whole) * q.scale
    correction = np.ascontiguousarray(rest.T, np.float32) if np.any(rest) else None
    scales = np.repeat(q.scale, per_group, axis=1)
    zeros = np.repeat(whole.astype(np.uint8), per_group, axis=1)
    codes = q.codes.reshape(rows, blocks, block)
    if q.bits == 4:
        packed = _pack_nibbles(codes)
        if blocks % 2:
            zeros = np.concatenate([zeros, np.zeros((rows, 1), np.uint8)], axis=1)
        zeros = _pack_nibbles(zeros)
    else:
        packed = codes
    return NBits(np.ascontiguousarray(packed), np.ascontiguousarray(scales, np.float32).reshape(-1),
                 np.ascontiguousarray(zeros).reshape(-1), rows, columns, q.bits, block,
                 correction, q.group)
