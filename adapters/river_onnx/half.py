"""A graph of graphs.py in half precision: the exports ONNX Runtime's CUDA provider runs.

float16: the CPU provider runs those graphs too, so the export CUDA would run is the one the
conformance kit checks here (subject onnx-float16), and every node of it has a CUDA kernel
(tests/test_onnx_cuda.py). bfloat16: for a model whose activations pass float16's range
(`activations.py`); CUDA registers GroupQueryAttention, MatMulNBits and RotaryEmbedding for it, but
not ReduceMean, so its RMS norms become one SimplifiedLayerNormalization each (CUDA's takes
bfloat16); the CPU provider runs none of it, so only its kernels are proven here.
Every float tensor becomes half: weights, scales of the quantized ones, hidden states, rotary
tables, attention biases, the K/V cache; logits go back to the host as float32 (one Cast),
since the engine's sampling and exit rules read them there.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# graph outputs the host reads, in float32
HOST_OUTPUTS = ("logits",)
HALVES = {"float16": (np.float16, TensorProto.FLOAT16),
          "bfloat16": (ml_dtypes.bfloat16, TensorProto.BFLOAT16)}


def to_half(model: onnx.ModelProto, floats: str) -> onnx.ModelProto:
    """`model` (float32, as graphs.py writes it) with every float tensor in `floats`."""
    numpy_type, elem = HALVES[floats]
    graph = model.graph
    if floats == "bfloat16":
        fuse_rms_norms(graph)
    for tensor in graph.initializer:
        if tensor.data_type == TensorProto.FLOAT:
            half = numpy_helper.to_array(tensor).astype(numpy_type)
            tensor.CopyFrom(numpy_helper.from_array(half, tensor.name))
    for value in (*graph.input, *graph.output):
        if value.type.tensor_type.elem_type == TensorProto.FLOAT and \
                value.name not in HOST_OUTPUTS:
            value.type.tensor_type.elem_type = elem
    for name in HOST_OUTPUTS:
        for node in list(graph.node):   # the Cast appended below also outputs `name`
            outputs = list(node.output)
            if name in outputs:
                node.output[outputs.index(name)] = f"{name}_half"
                graph.node.append(helper.make_node("Cast", [f"{name}_half"], [name],
                                                   to=TensorProto.FLOAT))
    return model


def fuse_rms_norms(graph: onnx.GraphProto) -> None:
    """Each RMS norm graphs.py writes (Mul(Div(x, Sqrt(Add(ReduceMean(Pow(x, 2)), eps))), w))
    as one SimplifiedLayerNormalization(x, w) in its place."""
    made = {out: node for node in graph.node for out in node.output}
    values = {t.name: t for t in graph.initializer}
    fused, gone = {}, set()
    for mul in graph.node:
        div = made.get(mul.input[0]) if mul.op_type == "Mul" else None
        if div is None or div.op_type != "Div":
            continue
        x, std = div.input
        sqrt = made.get(std)
        add = made.get(sqrt.input[0]) if sqrt is not None and sqrt.op_type == "Sqrt" else None
        mean = made.get(add.input[0]) if add is not None and add.op_type == "Add" else None
        power = made.get(mean.input[0]) \
            if mean is not None and mean.op_type == "ReduceMean" else None
        if power is None or power.op_type != "Pow" or power.input[0] != x:
            continue
        eps = float(numpy_helper.to_array(values[add.input[1]]).reshape(-1)[0])
        fused[id(mul)] = helper.make_node("SimplifiedLayerNormalization", [x, mul.input[1]],
                                          [mul.output[0]], axis=-1, epsilon=eps, stash_type=1)
        gone |= {id(n) for n in (div, sqrt, add, mean, power)}
    nodes = [fused.get(id(n), n) for n in graph.node if id(n) not in gone]
    del graph.node[:]
    graph.node.extend(nodes)
