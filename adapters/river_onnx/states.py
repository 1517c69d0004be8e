"""Hidden states on the sessions' device, for the onnx engine off the CPU.

On the CPU an engine's states are numpy arrays: ONNX Runtime's CPU tensors are numpy's memory,
so nothing is copied. On a GPU that would send every layer's input to the host and back
(PCIe, twice a layer a token), so there the states are `States`, OrtValues on the device,
bound from one layer's output straight to the next layer's input, and the engine's array
work on them (a subset of rows, the last token, rows put back, arrays joined, the cosines an
exit policy reads) runs as one-node graphs on the same device (`DeviceOps`). The host reads
only what a decision needs, through `host` (LayerEngine's one place): logits and cosines.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from .graphs import IR_VERSION, OPSET

FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64


class States:
    """Hidden states [batch, tokens, hidden] (or [rows, hidden]) held on the device."""

    __slots__ = ("value", "ops")

    def __init__(self, value: ort.OrtValue, ops: "DeviceOps") -> None:
        self.value, self.ops = value, ops

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape())

    def __getitem__(self, key) -> "States":
        return self.ops.take(self, key)

    def reshape(self, *shape: int) -> "States":
        return self.ops.reshape(self, shape)


def _graph(nodes, inputs, outputs, initializers=()) -> bytes:
    graph = helper.make_graph(nodes, "river_states", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             ir_version=IR_VERSION).SerializeToString()


def _tensor(name: str, elem: int, rank: int | None) -> onnx.ValueInfoProto:
    """A typed input or output, of `rank` named dimensions (None: any shape)."""
    shape = None if rank is None else [f"{name}_{d}" for d in range(rank)]
    return helper.make_tensor_value_info(name, elem, shape)


# what OrtValue.data_type() says of the float types states and logits have (bfloat16 is not
# bound yet: export.DTYPES)
ELEMENT_OF_VALUE = {"tensor(float)": FLOAT, "tensor(float16)": TensorProto.FLOAT16}


def _element(x: States) -> int:
    return ELEMENT_OF_VALUE[x.value.data_type()]


def bind_inputs(binding: ort.IOBinding, feeds: dict) -> None:
    """Binds `feeds`: `States` as the device values they are, anything else from the host."""
    for name, value in feeds.items():
        if isinstance(value, States):
            binding.bind_ortvalue_input(name, value.value)
        else:
            binding.bind_cpu_input(name, np.ascontiguousarray(value))


class DeviceOps:
    """The one-node graphs that index, join and compare states on `device`, each session made
    on first use (per float type, per count of inputs)."""

    def __init__(self, device: str, make_session) -> None:
        """`make_session(model_bytes)`: a session on `device` (the engine's options)."""
        self.device, self._make = device, make_session
        self._sessions: dict = {}

    def _run(self, model: str, feeds: dict, *key) -> ort.OrtValue:
        session = self._session(model, *key)
        binding = session.io_binding()
        bind_inputs(binding, feeds)
        binding.bind_output("y", self.device)
        session.run_with_iobinding(binding)
        return binding.get_outputs()[0]

    def _session(self, model: str, *key) -> ort.InferenceSession:
        if (model, *key) not in self._sessions:
            self._sessions[(model, *key)] = self._make(getattr(self, f"_{model}_graph")(*key))
        return self._sessions[(model, *key)]

    # -- the graphs ---------------------------------------------------------------------

    def _take_graph(self, elem: int) -> bytes:
        nodes = [helper.make_node("Gather", ["x", "rows"], ["r"], axis=0),
                 helper.make_node("Slice", ["r", "start", "end", "axis"], ["s"]),
                 helper.make_node("Reshape", ["s", "shape"], ["y"])]
        inputs = [_tensor("x", elem, 3), _tensor("rows", INT64, 1),
                  *(_tensor(n, INT64, 1) for n in ("start", "end", "axis", "shape"))]
        return _graph(nodes, inputs, [_tensor("y", elem, None)])

    def _reshape_graph(self, elem: int) -> bytes:
        return _graph([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                      [_tensor("x", elem, None), _tensor("shape", INT64, 1)],
                      [_tensor("y", elem, None)])

    def _scatter_graph(self, elem: int) -> bytes:
        return _graph([helper.make_node("ScatterND", ["x", "rows", "update"], ["y"])],
                      [_tensor("x", elem, 3), _tensor("rows", INT64, 2),
                       _tensor("update", elem, 3)], [_tensor("y", elem, 3)])

    def _concat_graph(self, elem: int, count: int, axis: int) -> bytes:
        names = [f"x{j}" for j in range(count)]
        return _graph([helper.make_node("Concat", names, ["y"], axis=axis)],
                      [_tensor(n, elem, None) for n in names], [_tensor("y", elem, None)])

    def _cosines_graph(self, elem: int, count: int) -> bytes:
        """Pairs (a_j, b_j) [..., hidden] -> [..., count] cosines along hidden, in float32."""
        nodes, parts = [], []
        axis = helper.make_tensor("axis", INT64, [1], [-1])
        for j in range(count):
            a, b = f"a{j}", f"b{j}"
            nodes += [helper.make_node("Cast", [a], [f"{a}f"], to=FLOAT),
                      helper.make_node("Cast", [b], [f"{b}f"], to=FLOAT)]
            for name, (x, y) in {"ab": (a, b), "aa": (a, a), "bb": (b, b)}.items():
                nodes += [helper.make_node("Mul", [f"{x}f", f"{y}f"], [f"{name}{j}"]),
                          helper.make_node("ReduceSum", [f"{name}{j}", "axis"],
                                           [f"{name}{j}s"], keepdims=1)]
            nodes += [helper.make_node("Mul", [f"aa{j}s", f"bb{j}s"], [f"n{j}"]),
                      helper.make_node("Sqrt", [f"n{j}"], [f"r{j}"]),
                      helper.make_node("Add", [f"r{j}", "tiny"], [f"m{j}"]),
                      helper.make_node("Div", [f"ab{j}s", f"m{j}"], [f"c{j}"])]
            parts.append(f"c{j}")
        nodes.append(helper.make_node("Concat", parts, ["y"], axis=-1))
        inputs = [_tensor(f"{x}{j}", elem, None) for j in range(count) for x in "ab"]
        return _graph(nodes, inputs, [_tensor("y", FLOAT, None)],
                      [axis, helper.make_tensor("tiny", FLOAT, [], [1e-30])])

    # -- the operations -----------------------------------------------------------------

    def take(self, x: States, key) -> States:
        """x[key] for the keys the engine uses on [batch, tokens, hidden]: rows (an index
        array or `:`, or one row, which drops the axis), then tokens (`:`, a slice, or -1,
        which drops the axis)."""
        rows, tokens = key if isinstance(key, tuple) else (key, slice(None))
        batch, length, hidden = x.shape
        shape = []
        if isinstance(rows, (int, np.integer)):
            rows = [rows]
        else:
            rows = np.arange(batch)[rows] if isinstance(rows, slice) else np.asarray(rows)
            shape.append(len(rows))
        if isinstance(tokens, (int, np.integer)):
            start = tokens % length
            end = start + 1
        else:
            start, end, _ = tokens.indices(length)
            shape.append(end - start)
        shape.append(hidden)
        return States(self._run("take", {
            "x": x, "rows": np.asarray(rows, np.int64), "start": np.array([start]),
            "end": np.array([end]), "axis": np.array([1]),
            "shape": np.array(shape, np.int64)}, _element(x)), self)

    def reshape(self, x: States, shape: Sequence[int]) -> States:
        return States(self._run("reshape", {"x": x, "shape": np.array(shape, np.int64)},
                                _element(x)), self)

    def scatter(self, h: States, rows: np.ndarray, update: States) -> States:
        return States(self._run("scatter", {"x": h, "rows": np.asarray(rows)[:, None],
                                            "update": update}, _element(h)), self)

    def concat(self, arrays: Sequence[States], axis: int) -> States:
        feeds = {f"x{j}": a for j, a in enumerate(arrays)}
        return States(self._run("concat", feeds, _element(arrays[0]), len(arrays), axis),
                      self)

    def cosines(self, pairs) -> States:
        feeds = {}
        for j, (a, b) in enumerate(pairs):
            feeds.update({f"a{j}": a, f"b{j}": b})
        return States(self._run("cosines", feeds, _element(pairs[0][0]), len(pairs)), self)


class DeviceArrays:
    """`LayerEngine`'s array members over `States` (the onnx engine's `_ops` on its device):
    the same members `NumpyArrays` gives the engine on the CPU."""

    _ops: DeviceOps

    def make_index(self, rows: Sequence[int]) -> np.ndarray:
        return np.asarray(rows, dtype=np.int64)

    def scatter(self, h: States, idx, rows_out: States) -> States:
        return self._ops.scatter(h, idx, rows_out)

    def concat(self, arrays, axis: int) -> States:
        return self._ops.concat(arrays, axis)

    def cosines(self, pairs) -> States:
        return self._ops.cosines(pairs)

    @staticmethod
    def host(array) -> np.ndarray:
        """The one place a step reads the device."""
        return array.value.numpy() if isinstance(array, States) else np.asarray(array)
