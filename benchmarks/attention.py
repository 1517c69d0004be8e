"""One layer's attention over a cache in ONNX Runtime at short and long contexts, for one new
token (a decode step) and for five (a verification of four drafts): ORT's GroupQueryAttention
contrib operator with the cache bound in place (IOBinding, past and present sharing one
buffer, attending only the valid length; what River's onnx graphs use since issue 21) against
the same with the cache stored in 8 bits (one scale per tensor, the kernel's own option; not
used by River yet), and the pattern River's graphs used before (the whole cache fed as an
input, the queries of a K/V head as the rows of one matmul, scores masked additively).

    river bench attention
    river bench attention --positions 64 512 2048 --tokens 1 5

The embedded model's attention shape (9 query heads, 3 K/V heads of 64); one thread; the
median of 300 calls after 20 warm-up calls, the cache hot in the CPU's caches (the best case
for both). Writes attention.{md,json}.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from river_onnx.graphs import IR_VERSION, OPSET

from .library.output import Output, parser
from .library.output import command as run_command
from .library.timing import machine, median_us

FLOAT = TensorProto.FLOAT
HEADS, KV_HEADS, HEAD_DIM, NEW_TOKENS = 9, 3, 64, 96
CALLS = [300]   # per measurement, after 20 warm-up calls (--calls)


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "attention", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION) \
        .SerializeToString()


def _tensor(name, shape, elem=FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def masked_whole_cache() -> bytes:
    """q [1, Hkv, G*T, hd] against the whole cache [1, Hkv, capacity, hd] under a mask."""
    nodes = [helper.make_node("Transpose", ["past_k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Add", ["s", "mask"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "past_v"], ["out"])]
    cache = [1, KV_HEADS, "capacity", HEAD_DIM]
    return _model(nodes, [_tensor("q", [1, KV_HEADS, "rows", HEAD_DIM]),
                          _tensor("past_k", cache), _tensor("past_v", cache),
                          _tensor("mask", [1, 1, "rows", "capacity"])],
                  [_tensor("out", None)])


def group_query_attention(int8: bool = False) -> bytes:
    """int8: the cache stored in 8 bits, one scale per tensor (the kernel's own option)."""
    inputs = ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total"]
    attributes = {}
    if int8:
        inputs += ["", "", "", "", "", "k_scale", "v_scale"]
        attributes = {"k_quant_type": "PER_TENSOR", "v_quant_type": "PER_TENSOR",
                      "kv_cache_bit_width": 8}
    node = helper.make_node("GroupQueryAttention", inputs, ["out", "present_k", "present_v"],
                            domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS,
                            **attributes)
    cache, elem = [1, KV_HEADS, "capacity", HEAD_DIM], TensorProto.INT8 if int8 else FLOAT
    scales = [_tensor("k_scale", [1]), _tensor("v_scale", [1])] if int8 else []
    return _model([node], [_tensor("q", [1, "tokens", HEADS * HEAD_DIM]),
                           _tensor("k", [1, "tokens", KV_HEADS * HEAD_DIM]),
                           _tensor("v", [1, "tokens", KV_HEADS * HEAD_DIM]),
                           _tensor("past_k", cache, elem), _tensor("past_v", cache, elem),
                           _tensor("seqlens_k", [1], TensorProto.INT32),
                           _tensor("total", [], TensorProto.INT32), *scales],
                  [_tensor("out", None), _tensor("present_k", None, elem),
                   _tensor("present_v", None, elem)])


def session(model: bytes) -> ort.InferenceSession:
    """One thread: its own, or the process's global pool where River's onnx engine made one
    (of one thread) before."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    try:
        return ort.InferenceSession(model, options)
    except RuntimeError as e:
        if "global thread pool" not in str(e):
            raise
        options.use_per_session_threads = False
        return ort.InferenceSession(model, options)


def measure(positions: int, tokens: int, rng) -> dict:
    capacity = positions + NEW_TOKENS
    cache = lambda: rng.standard_normal((1, KV_HEADS, capacity, HEAD_DIM), np.float32)
    rows = HEADS // KV_HEADS * tokens
    masked = session(masked_whole_cache())
    q = rng.standard_normal((1, KV_HEADS, rows, HEAD_DIM), np.float32)
    mask = np.zeros((1, 1, rows, capacity), np.float32)
    mask[..., positions + tokens:] = -np.inf
    feeds = {"q": q, "past_k": cache(), "past_v": cache(), "mask": mask}
    whole = median_us(lambda: masked.run(None, feeds), CALLS[0], 20)
    q_rows = rng.standard_normal((1, tokens, HEADS * HEAD_DIM), np.float32)
    new = rng.standard_normal((1, tokens, KV_HEADS * HEAD_DIM), np.float32)

    def in_place(int8: bool) -> float:
        gqa = session(group_query_attention(int8))
        bound = gqa.io_binding()
        stored = (lambda: (cache() * 20).astype(np.int8)) if int8 else cache
        keys, values = (ort.OrtValue.ortvalue_from_numpy(stored()) for _ in "kv")
        bound.bind_cpu_input("q", q_rows)
        bound.bind_cpu_input("k", new)
        bound.bind_cpu_input("v", new)
        bound.bind_ortvalue_input("past_k", keys)
        bound.bind_ortvalue_input("past_v", values)
        bound.bind_cpu_input("seqlens_k", np.array([positions + tokens - 1], np.int32))
        bound.bind_cpu_input("total", np.array(positions + tokens, np.int32))
        if int8:
            for name in ("k_scale", "v_scale"):
                bound.bind_cpu_input(name, np.array([0.05], np.float32))
        bound.bind_ortvalue_output("present_k", keys)
        bound.bind_ortvalue_output("present_v", values)
        bound.bind_output("out")
        return median_us(lambda: gqa.run_with_iobinding(bound), CALLS[0], 20)
    return {"GroupQueryAttention in place": in_place(False),
            "the same, int8 cache": in_place(True), "masked whole cache": whole}


def main(argv: list[str] | None = None) -> None:
    ap = parser("attention", __doc__, model=False)
    ap.add_argument("--positions", type=int, nargs="+", default=[64, 2048])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--calls", type=int, default=CALLS[0])
    args = ap.parse_args(argv)
    out = Output(args)
    CALLS[0] = args.calls
    info, rng = machine(), np.random.default_rng(0)
    us = {f"{n} positions, {t} new": measure(n, t, rng) for n in args.positions
          for t in args.tokens}
    command = run_command("attention", argv)
    payload = {"command": command, "machine": info, "onnxruntime": ort.__version__,
               "us_per_call": us}
    lines = ["# One layer's attention over a cache in ONNX Runtime", "",
             f"Machine: {info['cpu']}, {info['cores']} cores; onnxruntime {ort.__version__}, "
             f"one thread. Command: `{command}`. Median microseconds per call, cache hot.", "",
             "| cache, new tokens | " + " | ".join(next(iter(us.values()))) + " |",
             "|---|---|---|---|"]
    lines += [f"| {n} | " + " | ".join(f"{t:.0f}" for t in r.values()) + " |"
              for n, r in us.items()]
    out.write("attention", payload, "\n".join(lines + [""]))


if __name__ == "__main__":
    main()
