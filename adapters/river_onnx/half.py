"""A graph of graphs.py in float16: the export ONNX Runtime's CUDA provider runs.

Float16, not bfloat16: the CPU provider runs the float16 graphs, so the export CUDA would run
is the one the conformance kit checks here (subject onnx-float16), and every node of it has a
CUDA kernel (tests/test_onnx_cuda.py, which also shows CUDA's ReduceMean takes no bfloat16).
Every float tensor becomes float16: weights,
scales of the quantized ones, hidden states, rotary tables, attention biases, the K/V cache;
logits go back to the host as float32 (one Cast), since the engine's sampling and exit rules
read them there.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# graph outputs the host reads, in float32
HOST_OUTPUTS = ("logits",)


def to_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (float32, as graphs.py writes it) with every float tensor in float16."""
    graph = model.graph
    for tensor in graph.initializer:
        if tensor.data_type == TensorProto.FLOAT:
            half = numpy_helper.to_array(tensor).astype(np.float16)
            tensor.CopyFrom(numpy_helper.from_array(half, tensor.name))
    for value in (*graph.input, *graph.output):
        if value.type.tensor_type.elem_type == TensorProto.FLOAT and \
                value.name not in HOST_OUTPUTS:
            value.type.tensor_type.elem_type = TensorProto.FLOAT16
    for name in HOST_OUTPUTS:
        for node in list(graph.node):   # the Cast appended below also outputs `name`
            outputs = list(node.output)
            if name in outputs:
                node.output[outputs.index(name)] = f"{name}_half"
                graph.node.append(helper.make_node("Cast", [f"{name}_half"], [name],
                                                   to=TensorProto.FLOAT))
    return model
