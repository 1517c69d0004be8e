"""ONNX graphs for one decoder block, its stand-in, its K/V projection, the embedding and the
head, written node by node from the model package's numpy weights: the same math as the hf
backend's blocks, with no tracing and no exporter version drift.

A block graph takes its layer's whole preallocated cache as past K/V and gives it back as
present K/V: ONNX Runtime's GroupQueryAttention writes the new tokens' K/V into it, in place when
the backend binds both to the same buffer, and reads only the slots written so far, under the
backend's additive bias (padding, holes, windows: -inf), so a step's cost follows the context,
not the capacity. Rotary is ONNX Runtime's RotaryEmbedding, applied before the attention in
the block and in the K/V projection graph alike, so the two agree by construction.
"""

from __future__ import annotations

import attrs
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from river_models import FUSED, LayerWeights, ModelSpec, QuantWeight
from river_compute.skeleton import BoundLayer, Primitives, decoder_layer, keys_values

from .quant import NBits, nbits

OPSET, IR_VERSION = 21, 10
FLOAT = TensorProto.FLOAT
# MatMulNBits computes with activations quantized to int8 per block: on CPUs 3-50x faster than
# level 0 (float), at a measured extra output error of about half the int8 weight error.
ACCURACY_LEVEL = 4


@attrs.frozen
class Norm:
    weight: np.ndarray   # effective scale (a 1 + w norm's already folded in)
    eps: float

    @classmethod
    def of(cls, w: np.ndarray | None, spec: ModelSpec) -> "Norm | None":
        if w is None:
            return None
        return cls(spec.norm_scale(w), spec.norm_eps)


@attrs.frozen
class Linear:
    weight: np.ndarray | NBits   # float [out, in], or quantized
    bias: np.ndarray | None = None


@attrs.frozen
class BlockWeights:
    weights: BoundLayer   # Norm and Linear (q, k and v as one; gate and up as one)
    heads: int
    kv_heads: int
    head_dim: int
    scaling: float
    activation: str
    rotary_dim: int        # a partial rotary: the leading dims the rotary turns
    query_scaled: bool     # q times the step's `qscale` input after the rotary

    @classmethod
    def of(cls, layer: LayerWeights, spec: ModelSpec,
           quantized: dict[str, QuantWeight] | None = None,
           cuda: bool = False) -> "BlockWeights":
        """A backbone block, or its stand-in when `quantized` projections are given (in blocks
        CUDA's MatMulNBits takes, for `cuda`: quant.nbits)."""
        def linear(fused: str) -> Linear:
            weight, bias = layer.fused(FUSED[fused])
            if quantized is not None:
                weight = nbits(QuantWeight.stack([quantized[n] for n in FUSED[fused]]), cuda)
            return Linear(weight, bias)
        return cls(BoundLayer.bind(lambda n: Norm.of(getattr(layer, n), spec), linear),
                   spec.heads, spec.kv_heads, spec.head_dim, spec.attn_scale, spec.activation,
                   2 * len(spec.rotary[spec.rope_keys[0]].inv_freq), spec.query_scale is not None)


class Graph:
    """A graph under construction: every helper returns the name of the tensor it made."""

    def __init__(self, causal_branch: bool = False) -> None:
        """`causal_branch`: each attention is two branches, masked and causal, chosen by the
        step (`LayerInputs.masked`); else it always takes the bias."""
        self.causal_branch = causal_branch
        self.nodes: list = []
        self.initializers: list = []
        self.inputs: list = []
        self.outputs: list = []

    def _name(self) -> str:
        return f"t{len(self.nodes) + len(self.initializers)}"

    def input(self, name: str, shape, elem=FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def output(self, tensor: str, name: str) -> None:
        self.nodes.append(helper.make_node("Identity", [tensor], [name]))
        self.outputs.append(helper.make_tensor_value_info(name, FLOAT, None))

    def const(self, array) -> str:
        name = self._name()
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def op(self, op_type: str, *inputs: str, domain: str = "", **attributes) -> str:
        return self.ops(op_type, 1, *inputs, domain=domain, **attributes)[0]

    def ops(self, op_type: str, outputs: int, *inputs: str, domain: str = "",
            names: list[str | None] | None = None, **attributes) -> list[str]:
        """`names`: outputs that are graph outputs as they are (no copy), by name; the first
        `outputs` of the node are returned."""
        base = self._name()
        names = [name or f"{base}_{j}" for j, name in
                 enumerate(names or [None] * outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, domain=domain or None,
                                           **attributes))
        return names[:outputs]

    def shape(self, *dims: int) -> str:
        return self.const(np.array(dims, dtype=np.int64))

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "river", self.inputs, self.outputs,
                                  self.initializers)
        opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
        return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)

    # -- layers --------------------------------------------------------------------------

    def rms_norm(self, x: str, norm: Norm) -> str:
        # the Pow/ReduceMean/Add/Sqrt/Div pattern ONNX Runtime fuses into one kernel
        var = self.op("ReduceMean", self.op("Pow", x, self.const(np.float32(2))),
                      self.shape(-1), keepdims=1)
        std = self.op("Sqrt", self.op("Add", var, self.const(np.float32(norm.eps))))
        return self.op("Mul", self.op("Div", x, std), self.const(norm.weight.astype(np.float32)))

    def linear(self, x: str, lin: Linear) -> str:
        w = lin.weight
        if isinstance(w, NBits):
            y = self.op("MatMulNBits", x, self.const(w.packed), self.const(w.scales),
                        self.const(w.zeros), domain="com.microsoft", K=w.columns, N=w.rows,
                        bits=w.bits, block_size=w.block, accuracy_level=ACCURACY_LEVEL)
            if w.correction is not None:   # the zero points' fractional parts (quant.py)
                sums = self.op("ReduceSum", self.op("Reshape", x, self.shape(0, 0, -1, w.group)),
                               self.shape(-1), keepdims=0)
                y = self.op("Sub", y, self.op("MatMul", sums, self.const(w.correction)))
        else:
            y = self.op("MatMul", x, self.const(w.T.astype(np.float32)))
        return y if lin.bias is None else self.op("Add", y, self.const(lin.bias))



class OnnxLayer(Primitives):
    """The skeleton's primitives as nodes of graph `g`: block `b` over the rotary inputs
    `rope` and, to attend, the layer's inputs `inputs` (output names suffixed `suffix`).
    Every tensor is [B, T, width]: queries, keys and values with the heads side by side."""

    def __init__(self, g: Graph, b: BlockWeights, rope: "Rope",
                 inputs: "LayerInputs | None" = None, suffix: str = "") -> None:
        self.g, self.b, self.layer, self.rope = g, b, b.weights, rope
        self.inputs, self.suffix, self.query_scale = inputs, suffix, rope.query_scale

    def norm(self, h, weight):
        return self.g.rms_norm(h, weight)

    def head_norm(self, a, weight, part: str):
        """On [B, T, heads*hd]: each head's [hd] normed."""
        g, b = self.g, self.b
        heads = b.heads if part == "q" else b.kv_heads
        a = g.rms_norm(g.op("Reshape", a, g.shape(0, 0, heads, b.head_dim)), weight)
        return g.op("Reshape", a, g.shape(0, 0, heads * b.head_dim))

    def project(self, h, name: str, parts=None) -> tuple:
        g, b = self.g, self.b
        y = g.linear(h, self.layer.proj[name])
        if name == "gate_up":
            return tuple(g.ops("Split", 2, y, axis=-1, num_outputs=2))
        if name != "qkv":
            return (y,)
        widths = np.array([b.heads, b.kv_heads, b.kv_heads], dtype=np.int64) * b.head_dim
        q, k, v = g.ops("Split", 3, y, g.const(widths), axis=-1)
        return (q, k, v) if parts is None else tuple({"q": q, "k": k, "v": v}[p] for p in parts)

    def rotate(self, q, k) -> tuple:
        """Rotary on [B, T, heads*hd], one contrib node (the halves rotated, NeoX style; on
        the leading rotary_dim dims of each head only, for a partial rotary)."""
        b, r = self.b, self.rope
        partial = {} if b.rotary_dim == b.head_dim else {"rotary_embedding_dim": b.rotary_dim}
        turn = lambda x, heads: self.g.op("RotaryEmbedding", x, r.positions, r.cos, r.sin,
                                          domain="com.microsoft", num_heads=heads,
                                          interleaved=0, **partial)
        return (None if q is None else turn(q, b.heads)), turn(k, b.kv_heads)

    def mul(self, a, b):
        return self.g.op("Mul", a, b)

    def add(self, a, b):
        return self.g.op("Add", a, b)

    def activation(self, gate):
        if self.b.activation == "silu":
            return self.g.op("Mul", gate, self.g.op("Sigmoid", gate))
        return self.g.op("Gelu", gate, approximate="tanh")

    def write(self, k, v) -> None:
        """The keys and values as the graph's outputs k, v [B, Hkv, T, hd]."""
        g, b = self.g, self.b
        for name, x in (("k", k), ("v", v)):
            x = g.op("Reshape", x, g.shape(0, 0, b.kv_heads, b.head_dim))
            g.output(g.op("Transpose", x, perm=[0, 2, 1, 3]), name)

    def attend(self, q, k, v):
        """GroupQueryAttention writes the new tokens' K/V into the layer's cache at slots
        total-T..total-1 and attends over slots 0..total-1 only, so a step's cost follows the
        context, not the allocated capacity; the graph's outputs present_k/present_v are the
        cache itself when the caller binds them to the buffers it passes as past_k/past_v."""
        g, b, layer, suffix = self.g, self.b, self.inputs, self.suffix
        inputs = [q, k, v, layer.past_k, layer.past_v, layer.seqlens, layer.total]
        attributes = dict(domain="com.microsoft", num_heads=b.heads, kv_num_heads=b.kv_heads,
                          scale=b.scaling)
        presents = [f"present_k{suffix}", f"present_v{suffix}"]
        masked = inputs + ["", "", "", layer.bias]
        if not g.causal_branch:
            out = g.ops("GroupQueryAttention", 1, *masked, names=[None, *presents],
                        **attributes)[0]
        else:
            def branch(tag: str, attention_inputs: list[str]) -> onnx.GraphProto:
                names = [f"{name}_{tag}" for name in [f"attention{suffix}", *presents]]
                node = helper.make_node("GroupQueryAttention", attention_inputs, names,
                                        **attributes)
                return helper.make_graph([node], f"attention{suffix}_{tag}", [],
                                         [onnx.ValueInfoProto(name=name) for name in names])
            # a bias, even all zeros, keeps CUDA's GroupQueryAttention off its fused kernels
            # (flash / memory-efficient attention): a step that needs none runs the causal
            # branch. Not in the CPU's float32 graphs: its kernel gains nothing, and the If's
            # subgraph call per layer cost ~1 of 20 ms a token (docs/backends.md)
            out = g.ops("If", 1, layer.masked, names=[None, *presents],
                        then_branch=branch("masked", masked),
                        else_branch=branch("causal", inputs))[0]
        g.outputs += [helper.make_tensor_value_info(f"present_{kv}{suffix}", FLOAT, None)
                      for kv in "kv"]
        return out


@attrs.frozen
class Rope:
    """The names of a graph's rotary inputs: the step's tables cos, sin [B*T, rotary_dim/2]
    (one row per token of the step: a length-dependent table such as LongRoPE's is chosen by
    the host per row) and positions [B, T] int64, each token's row in them; and, for
    a model with a query scale, qscale [B, T, 1], each token's query scaling (an input, computed by the host
    like the tables)."""

    cos: str
    sin: str
    positions: str
    query_scale: str | None = None

    @classmethod
    def declare(cls, g: "Graph", key: str = "", positions: str | None = None,
                query_scale: str | None = None) -> "Rope":
        table = ["slots", "half"]
        positions = positions or g.input("positions", ["batch", "tokens"], TensorProto.INT64)
        return cls(g.input(f"cos{key}", table), g.input(f"sin{key}", table), positions,
                   query_scale)

    @staticmethod
    def query_scale_input(g: "Graph", b: BlockWeights) -> str | None:
        return g.input("qscale", ["batch", "tokens", 1]) if b.query_scaled else None


@attrs.frozen
class LayerInputs:
    """The names of one layer's attention inputs: its whole cache [B, Hkv, capacity, hd] and
    bias [B, 1, T, total], additive (0 or -inf: padding, holes, windows, future slots); in a
    graph with a causal branch, `masked` (bool scalar) chooses between that bias and plain
    causal attention over the slots (else ""); and the
    step's lengths, one pair per graph: seqlens (int32 [B], every row total-1) and total (int32
    scalar: the slots a step reads)."""

    past_k: str
    past_v: str
    bias: str
    masked: str
    seqlens: str
    total: str

    @staticmethod
    def lengths(g: "Graph") -> tuple[str, str]:
        return (g.input("seqlens", ["batch"], TensorProto.INT32),
                g.input("total", [], TensorProto.INT32))

    @classmethod
    def declare(cls, g: "Graph", b: BlockWeights, lengths: tuple[str, str],
                suffix: str = "") -> "LayerInputs":
        cache = ["batch", b.kv_heads, "capacity", b.head_dim]
        return cls(g.input(f"past_k{suffix}", cache), g.input(f"past_v{suffix}", cache),
                   g.input(f"bias{suffix}", ["batch", 1, "tokens", "total"]),
                   g.input(f"masked{suffix}", [], TensorProto.BOOL) if g.causal_branch else "",
                   *lengths)


def block(b: BlockWeights, causal_branch: bool = False) -> onnx.ModelProto:
    """(h, Rope, LayerInputs) -> (h_out, mid, present_k, present_v).

    mid [B, 1, D]: the last token's state between the attention and MLP sub-blocks."""
    g = Graph(causal_branch)
    h = g.input("h", ["batch", "tokens", "hidden"])
    layer = LayerInputs.declare(g, b, LayerInputs.lengths(g))
    h, mid = decoder_layer(h, OnnxLayer(g, b, Rope.declare(
        g, query_scale=Rope.query_scale_input(g, b)), layer))
    g.output(h, "h_out")
    last = g.const(np.array([-1], dtype=np.int64))
    g.output(g.op("Slice", mid, last, g.const(np.array([np.iinfo(np.int64).max], np.int64)),
                  g.shape(1)), "mid")
    return g.model()


def tail(blocks: list[BlockWeights], rope_keys: list[str],
         causal_branch: bool = False) -> onnx.ModelProto:
    """Several blocks in a row as one graph (the stand-ins of layers start..L-1, one session
    run for a token's whole exit river): h, positions, seqlens, total, then per block j its
    cache and bias and the outputs present_k, present_v, suffixed _j; one cos/sin pair per
    rotary table, named cos<key>, sin<key>."""
    g = Graph(causal_branch)
    h = g.input("h", ["batch", "tokens", "hidden"])
    positions = g.input("positions", ["batch", "tokens"], TensorProto.INT64)
    lengths = LayerInputs.lengths(g)
    qscale = Rope.query_scale_input(g, blocks[0])
    ropes = {key: Rope.declare(g, key, positions, qscale) for key in dict.fromkeys(rope_keys)}
    for j, (b, key) in enumerate(zip(blocks, rope_keys)):
        layer = LayerInputs.declare(g, b, lengths, f"_{j}")
        h, _ = decoder_layer(h, OnnxLayer(g, b, ropes[key], layer, f"_{j}"))
    g.output(h, "h_out")
    return g.model()


def kv_projection(b: BlockWeights) -> onnx.ModelProto:
    """(h, Rope) -> (k, v) [B, Hkv, T, hd]: the layer's K/V of a state that does not run the
    layer."""
    g = Graph()
    h = g.input("h", ["batch", "tokens", "hidden"])
    keys_values(h, OnnxLayer(g, b, Rope.declare(g)))
    return g.model()


def embedding(table: np.ndarray, scale: float) -> onnx.ModelProto:
    """ids [B, T] -> h [B, T, D]."""
    g = Graph()
    h = g.op("Gather", g.const(table.astype(np.float32)), g.input("ids", ["batch", "tokens"],
                                                                   TensorProto.INT64))
    if scale != 1.0:
        h = g.op("Mul", h, g.const(np.float32(scale)))
    g.output(h, "h_out")
    return g.model()


def head(norm: Norm, weight: np.ndarray | NBits, softcap: float | None) -> onnx.ModelProto:
    """Final norm and LM head (or its stand-in: `weight` quantized): h [B, T, D] -> logits
    [B, T, vocab]."""
    g = Graph()
    x = g.rms_norm(g.input("h", ["batch", "tokens", "hidden"]), norm)
    y = g.linear(x, Linear(weight))
    if softcap is not None:
        cap = g.const(np.float32(softcap))
        y = g.op("Mul", g.op("Tanh", g.op("Div", y, cap)), cap)
    g.output(y, "logits")
    return g.model()
