"""The onnx backend's CUDA path, proven on the CPU as far as it can be without a GPU: every node
of the float16 export has a CUDA kernel in onnxruntime-gpu 1.31.1 (the float32 export has not:
GroupQueryAttention), CUDA sessions refuse to run a node on the CPU, and that refusal reaches
the user as one line naming the graph. Nothing here has run on a GPU (docs/backends.md)."""

import numpy as np
import onnx
import onnx.defs
import pytest
from onnx import TensorProto

from river_core import CapabilityError
from river_conformance.fixtures import tiny
from river_models.families import BY_NAME

FLOATS = {"float", "float16", "bfloat16", "double"}
ANY = FLOATS | {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool"}

# ONNX Runtime's CUDA kernels for the ops River's graphs use: (domain, op) -> rows of (first
# opset, last opset or None: open-ended, {input index: the types that input may have}). The
# rows that may cover opset 21 (River's graphs'; for Identity, If and ScatterND all of them,
# matched as `registered` says). Opsets: every registration of these ops in the CUDA provider
# of the onnxruntime-gpu 1.31.1 wheel (libonnxruntime_providers_cuda.so), read off each
# kernel's KernelDefBuilder calls (SetName, SetDomain, SinceVersion) disassembled with objdump
# (2026-11-28): since ONNX Runtime PR #27728 (merged 2026-03) Identity and If are registered
# [19, 20], [21, 22], [23, 24] and 25+, where the generated docs/OperatorKernels.md this table
# was first taken from (microsoft/onnxruntime commit 001d12d2, the newest copy the search tool
# holds) has both open-ended from 19, which no opset-21 node matches. Types: that
# OperatorKernels.md ("Operators implemented by CUDAExecutionProvider"); the com.microsoft
# rows' float types checked against the kernel classes compiled into the same library (type
# names GroupQueryAttention<MLFloat16|BFloat16, ...>, MatMulNBits<float|MLFloat16|BFloat16>,
# RotaryEmbedding<float|MLFloat16|BFloat16>).
CUDA_KERNELS = {
    ("", "Add"): [(14, None, {0: ANY - {"bool"}})],
    ("", "Cast"): [(21, 22, {0: ANY})],
    ("", "Concat"): [(13, None, {0: ANY})],
    ("", "Div"): [(14, None, {0: ANY - {"bool"}})],
    ("", "Gather"): [(13, None, {0: ANY, 1: {"int32", "int64"}})],
    ("", "Gelu"): [(20, None, {0: FLOATS})],
    ("", "Identity"): [(25, None, {0: ANY}), (23, 24, {0: ANY}), (21, 22, {0: ANY}),
                       (19, 20, {0: ANY}), (14, 18, {0: ANY}), (13, 13, {0: ANY}),
                       (1, 12, {0: ANY})],
    ("", "MatMul"): [(13, None, {0: FLOATS})],
    ("", "Mul"): [(14, None, {0: ANY - {"bool"}})],
    ("", "Pow"): [(15, None, {0: FLOATS | {"int32", "int64"}})],
    ("", "ReduceMean"): [(18, None, {0: {"double", "float", "float16", "int32"}})],
    ("", "ReduceSum"): [(13, None, {0: FLOATS | {"int32", "int64"}})],
    ("", "Reshape"): [(21, 22, {0: ANY})],
    ("", "ScatterND"): [(18, None, {0: ANY, 1: {"int64"}}), (16, 17, {0: ANY, 1: {"int64"}}),
                        (13, 15, {0: ANY, 1: {"int64"}}), (11, 12, {0: ANY, 1: {"int64"}})],
    ("", "Sigmoid"): [(13, None, {0: FLOATS})],
    ("", "Slice"): [(13, None, {0: ANY})],
    ("", "Split"): [(18, None, {0: ANY})],
    ("", "Sqrt"): [(13, None, {0: FLOATS})],
    ("", "Sub"): [(14, None, {0: ANY - {"bool"}})],
    ("", "Transpose"): [(21, 22, {0: ANY})],
    # a contrib op in the ONNX domain (version 1): onnxruntime/contrib_ops/cuda/layer_norm.cc
    # registers it for T = float, double, MLFloat16 and BFloat16 (core/providers/cuda/nn/
    # layer_norm.cc instantiates LayerNorm<BFloat16, float, BFloat16, simplified=true>)
    ("", "SimplifiedLayerNormalization"): [(1, None, {0: FLOATS, 1: FLOATS})],
    # core/providers/cuda/controlflow/if.cc: 'cond' on the host (a bool scalar River feeds),
    # outputs of every fixed-size type; each branch's nodes are checked as the graph's
    ("", "If"): [(25, None, {0: {"bool"}}), (23, 24, {0: {"bool"}}), (21, 22, {0: {"bool"}}),
               (19, 20, {0: {"bool"}}), (13, 18, {0: {"bool"}}), (11, 12, {0: {"bool"}}),
               (1, 10, {0: {"bool"}})],
    ("com.microsoft", "GroupQueryAttention"): [
        (1, None, {0: {"float16", "bfloat16"}, 3: {"float16", "bfloat16", "int8"},
                   5: {"int32"}})],
    ("com.microsoft", "MatMulNBits"): [
        (1, None, {0: {"float", "float16", "bfloat16"}, 1: {"uint8"},
                   3: {"float", "float16", "bfloat16", "uint8"}})],
    ("com.microsoft", "RotaryEmbedding"): [
        (1, None, {0: {"float", "float16", "bfloat16"}, 1: {"int64"}})],
}


def _type(elem: int) -> str:
    return TensorProto.DataType.Name(elem).lower()   # float, float16, int64, ...


def _no_cuda_kernel(path) -> list[str]:
    """'graph: op(input types)' for each node of the graph at `path` (its If branches' too) no
    CUDA kernel takes. Types are carried from the graph's inputs and weights through the
    nodes: every op River uses gives its outputs its first input's type, but Cast and If."""
    model = onnx.load(str(path), load_external_data=False)
    opsets = {o.domain: o.version for o in model.opset_import}
    g = model.graph
    types = {v.name: _type(v.type.tensor_type.elem_type) for v in g.input}
    types.update({t.name: _type(t.data_type) for t in g.initializer})
    missing = []
    _check_nodes(g, types, opsets, f"{path.stem}", missing)
    return missing


def registered(lo: int, hi: int | None, since: int) -> bool:
    """Whether a kernel registered for opsets lo..hi (None: open-ended, "lo+" in the table)
    runs a node whose op schema dates from opset `since`, as ONNX Runtime's kernel registry
    decides (core/framework/kernel_registry.cc, VerifyKernelDef): a versioned kernel covers
    its range; an open-ended one only its own start, so that a schema newer than the newest
    kernel finds none (Identity and If at opset 21 against kernels from 19, before ONNX
    Runtime PR #27728)."""
    return since == lo if hi is None else lo <= since <= hi


def test_an_open_ended_kernel_covers_only_its_own_start():
    assert registered(19, None, 19) and not registered(19, None, 21)
    assert registered(14, 18, 16) and not registered(14, 18, 19)
    assert registered(21, 22, 21)


def _check_nodes(g, types: dict, opsets: dict, where: str, missing: list) -> None:
    for node in g.node:
        seen = {i: types[name] for i, name in enumerate(node.input) if name}
        since = onnx.defs.get_schema(node.op_type, opsets[""]).since_version \
            if node.domain == "" and onnx.defs.has(node.op_type) else 1   # else a contrib op
        rows = CUDA_KERNELS.get((node.domain, node.op_type), [])
        if not any(registered(lo, hi, since)
                   and all(seen.get(i) in allowed for i, allowed in inputs.items())
                   for lo, hi, inputs in rows):
            missing.append(f"{where}: {node.op_type}({', '.join(seen.values())})")
        if node.op_type == "If":
            outs = set()
            for branch in (a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH):
                inner = dict(types)
                _check_nodes(branch, inner, opsets, f"{where}/{branch.name}", missing)
                outs.add(tuple(inner[o.name] for o in branch.output))
            assert len(outs) == 1, f"{where}: If's branches give different types {outs}"
            types.update(zip(node.output, outs.pop()))
            continue
        out = _type(next(a.i for a in node.attribute if a.name == "to")) \
            if node.op_type == "Cast" else seen[0]
        types.update({name: out for name in node.output if name})


def _state_graphs(tmp_path, floats: str) -> list:
    """Every one-node graph `OnnxDeviceBackend` runs on its states, for `floats`, saved."""
    from onnx import TensorProto
    from river_onnx.states import DeviceOps

    elem = {"float16": TensorProto.FLOAT16, "float32": TensorProto.FLOAT}[floats]
    ops = DeviceOps("cuda", None)
    made = {"take": ops._take_graph(elem), "scatter": ops._scatter_graph(elem),
            "reshape": ops._reshape_graph(elem), "concat": ops._concat_graph(elem, 3, 1),
            "cosines": ops._cosines_graph(elem, 2)}
    paths = []
    for name, model in made.items():
        paths.append(tmp_path / f"states_{name}.onnx")
        paths[-1].write_bytes(model)
    return paths


def test_every_node_of_the_device_states_graphs_has_a_cuda_kernel(tmp_path):
    """The graphs that index, join and compare hidden states on the device (issue 43)."""
    assert [m for path in _state_graphs(tmp_path, "float16") for m in _no_cuda_kernel(path)] \
        == []


def _export(tmp_path, family: str, floats: str):
    from river_onnx.export import export_model

    checkpoint = tiny.checkpoint(family, 0)
    folder = tmp_path / f"{family}-{floats}"
    folder.mkdir()
    export_model(checkpoint, tiny.stand_ins(checkpoint, 4), folder, floats=floats)
    return sorted(folder.glob("*.onnx"))


@pytest.mark.parametrize("floats", ["float16", "bfloat16"])
@pytest.mark.parametrize("family", tiny.FAMILIES)
def test_every_node_of_the_half_exports_has_a_cuda_kernel(tmp_path, family, floats):
    """Identity and If too, at opset 21 (issue 53 found them uncovered by the kernel list of
    the time; onnxruntime-gpu 1.31.1 registers both for [21, 22])."""
    paths = _export(tmp_path, family, floats)
    assert [m for path in paths for m in _no_cuda_kernel(path)] == []


def test_the_bfloat16_export_norms_in_one_node_each_and_holds_no_float16(tmp_path):
    """CUDA's ReduceMean takes no bfloat16: each RMS norm (input, pre-MLP, the final one) is
    one SimplifiedLayerNormalization with the norm's epsilon, and no tensor is float16."""
    paths = {p.stem: p for p in _export(tmp_path, "llama", "bfloat16")}
    layer = onnx.load(str(paths["layer_0"]), load_external_data=False)
    ops = [n.op_type for n in layer.graph.node]
    assert "ReduceMean" not in ops and ops.count("SimplifiedLayerNormalization") == 2
    eps = {a.f for n in layer.graph.node if n.op_type == "SimplifiedLayerNormalization"
           for a in n.attribute if a.name == "epsilon"}
    assert len(eps) == 1
    assert eps.pop() == pytest.approx(tiny.checkpoint("llama", 0).spec.norm_eps)
    types = {v.type.tensor_type.elem_type for v in (*layer.graph.input, *layer.graph.output)}
    types |= {t.data_type for t in layer.graph.initializer}
    assert TensorProto.BFLOAT16 in types and TensorProto.FLOAT16 not in types
    head = onnx.load(str(paths["head"]), load_external_data=False)
    assert [n.op_type for n in head.graph.node].count("SimplifiedLayerNormalization") == 1


def test_the_float32_export_would_run_its_attention_on_the_cpu(tmp_path):
    """The bug of issue 34: ONNX Runtime's CUDA provider has no float32 GroupQueryAttention,
    so every attention node of a float32 export would fall back to the CPU."""
    missing = [m for path in _export(tmp_path, "llama", "float32")
               for m in _no_cuda_kernel(path)]
    assert missing and all("GroupQueryAttention(float" in m for m in missing)
    assert {m.split(":")[0] for m in missing} >= {"layer_0", "stand_in_0", "tail_0"}


def test_onnx_defaults_to_float32_on_the_cpu_and_float16_on_cuda():
    from river_onnx.export import default_dtype

    assert default_dtype("cpu") == "float32" and default_dtype("cuda") == "float16"


def test_cuda_sessions_refuse_a_silent_cpu_fallback():
    from river_onnx.sessions import session_options

    key = "session.disable_cpu_ep_fallback"
    assert session_options("cuda").get_session_config_entry(key) == "1"
    with pytest.raises(RuntimeError, match="does not have configuration"):
        session_options("cpu").get_session_config_entry(key)   # unset: the CPU is the CPU


def test_a_node_the_device_cannot_run_is_a_one_line_error_naming_its_graph(tmp_path,
                                                                          monkeypatch):
    """ONNX Runtime's own refusal, provoked on the CPU: its Azure provider runs no node, so
    a session on it alone with CPU fallback disabled fails as a CUDA one would."""
    import onnxruntime as ort

    from river_onnx import backend

    if "AzureExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime has no AzureExecutionProvider to stand in for CUDA")
    path = _export(tmp_path, "llama", "float16")[0]
    monkeypatch.setitem(backend.PROVIDERS, "cuda", "AzureExecutionProvider")
    with pytest.raises(CapabilityError) as refused:
        backend.sessions_for("cuda")(path)
    message = str(refused.value)
    assert path.name in message and "AzureExecutionProvider" in message
    assert "\n" not in message


def test_no_tail_session_is_built_off_the_cpu():
    """Each tail session would hold its own copy of the stand-ins on the GPU: on CUDA an exit
    river runs stand-in by stand-in instead (the same math: the kit's tail test)."""
    from river_onnx.backend import tail_sessions
    from river_onnx.export import Manifest

    manifest = Manifest(tiny.checkpoint("llama", 0).spec, (0.1,) * tiny.LAYERS, (0, 1), "float16")
    assert tail_sessions(manifest, "cpu") == (0, 1)
    assert tail_sessions(manifest, "cuda") == ()


def test_drafts_read_the_whole_context_off_the_cpu_and_a_window_is_refused():
    """A windowed draft runs on a host copy of the window's slots, a whole layer at a time:
    on CUDA that is PCIe traffic per layer per draft, so the engine promises no windows there;
    lossless mode's plan then gives drafts the whole context, and an explicit window is
    refused in one line."""
    from river_core import ModelShape, default_registry, resolve
    from river_core.settings.config import DRAFT_WINDOW, ExitConfig
    from river_onnx.backend import capabilities

    assert capabilities("cpu").windowed_drafts and not capabilities("cuda").windowed_drafts
    shape, registry = ModelShape(tiny.LAYERS, 256), default_registry()
    lossless = ExitConfig(mode="speculative")
    assert resolve(lossless, registry, capabilities("cpu"), shape, "onnx").draft_window == \
        DRAFT_WINDOW
    assert resolve(lossless, registry, capabilities("cuda"), shape, "onnx").draft_window is None
    with pytest.raises(CapabilityError, match="cannot give drafts a window"):
        resolve(ExitConfig(mode="speculative", draft_window=64), registry,
                capabilities("cuda"), shape, "onnx")


def test_no_session_falls_back_to_the_cpu_when_its_provider_fails_at_run_time(monkeypatch):
    """ONNX Runtime's Python `run` answers a provider's failure (EPFail) by moving the session
    to the CPU and retrying, printing only to stdout; every session River makes fails
    instead. Provoked on the CPU: a session whose first run fails as a provider would."""
    from onnxruntime.capi.onnxruntime_pybind11_state import EPFail

    from river_onnx.plugin import tiny_backend

    b = tiny_backend("llama", 0, 4)
    sessions = [b._embed, b._head, b._stand_in_head, *b._layers.values(),
                *b._stand_ins.values(), *b._kv_proj.values(), *b._tails.values()]
    assert not any(s._enable_fallback for s in sessions)

    class FailsOnce:
        def __init__(self, inner):
            self.inner, self.failed = inner, False

        def run(self, *args):
            if not self.failed:
                self.failed = True
                raise EPFail("the provider failed")
            return self.inner.run(*args)

        def run_with_iobinding(self, *args):   # what the engine calls
            return self.run(*args) if not self.failed else \
                self.inner.run_with_iobinding(*args)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    monkeypatch.setattr(b._head, "_sess", FailsOnce(b._head._sess))
    monkeypatch.setattr(b._head, "set_providers", lambda *a, **k: None)   # the CPU already
    with pytest.raises(EPFail):
        b.head(np.zeros((1, 1, b.spec.hidden), np.float32))


def test_cuda_sessions_share_one_device_allocator_that_grows_by_what_is_asked(monkeypatch):
    """3L+3 sessions, one arena: the sessions take the environment's allocator, registered
    once for the process, growing by the size requested (not powers of two)."""
    import onnxruntime as ort

    from river_onnx import allocator
    from river_onnx.sessions import session_options

    assert session_options("cuda").get_session_config_entry("session.use_env_allocators") == "1"
    with pytest.raises(RuntimeError, match="does not have configuration"):
        session_options("cpu").get_session_config_entry("session.use_env_allocators")
    registered = []
    monkeypatch.setattr(ort, "create_and_register_allocator_v2",
                        lambda *args: registered.append(args))
    allocator.shared_device_allocator.cache_clear()
    allocator.shared_device_allocator()
    allocator.shared_device_allocator()
    (provider, _, options, arena), = registered
    assert provider == "CUDAExecutionProvider" and options == {"device_id": "0"}
    assert arena.arena_extend_strategy == 1
    allocator.shared_device_allocator.cache_clear()


def _masked(p) -> list[bool]:
    """Per layer, whether its graphs run the masked attention branch in pass `p`."""
    return [m is not None for m in p.masks]


def test_attention_takes_a_bias_only_where_the_step_needs_a_mask():
    """A bias, even all zeros, keeps CUDA's GroupQueryAttention off its fused kernels (issue
    43); it is bound only for padding, a window's edge and holes. A prefill, a decode step and
    a verification of one unpadded row over full layers need none."""
    from river_core.contract.backend import Step
    from river_onnx.plugin import tiny_backend

    b = tiny_backend("llama", 0, 4, "float16")   # the export CUDA runs
    b.prefill([[1, 5, 6, 7]], 32)
    assert _masked(b.begin([9], Step(4, 1))) == [False] * tiny.LAYERS
    b.trim(4)
    verify = b._pass(np.array([[9, 10, 11]]), Step(4, 3))
    assert _masked(verify) == [False] * tiny.LAYERS
    b.skip(verify, 2, None)   # the `mask` strategy's hole, at layer 2 only
    assert _masked(b.begin([12], Step(7, 1))) == [i == 2 for i in range(tiny.LAYERS)]

    b.prefill([[1, 5, 6, 7], [1, 8]], 32)   # padded rows
    assert _masked(b.begin([9, 9], Step(4, 1))) == [True] * tiny.LAYERS

    gemma = tiny_backend("gemma3", 0, 4, "float16")   # window 6 on five layers in six
    gemma.prefill([[1, 5, 6, 7]], 32)
    assert _masked(gemma.begin([9], Step(4, 1))) == [False] * tiny.LAYERS
    gemma.prefill([list(range(1, 9))], 32)
    sliding = BY_NAME["gemma3"].tiny["layer_types"]
    assert _masked(gemma.begin([9], Step(8, 1))) == [t == "sliding_attention" for t in sliding]


def test_the_causal_branch_computes_what_the_masked_one_does_with_a_causal_bias():
    """The graph's two attention branches, on the same step: no bias, and the bias a causal
    mask makes (what every step bound before)."""
    from river_core.contract.backend import Step
    from river_onnx.feeds import layer_feeds
    from river_onnx.plugin import tiny_backend

    b = tiny_backend("qwen3", 0, 4, "float16")
    b.prefill([[1, 5, 6, 7, 8]], 16)
    p = b._pass(np.array([[9, 10]]), Step(5, 2))
    h = b.embed_ids(p.ids)
    layer = b._layers[1]
    causal = layer_feeds(p, 1, h, None)
    bias = np.where(np.arange(7)[None, :] <= np.arange(5, 7)[:, None], 0, -np.inf)
    masked = dict(causal, masked=np.array(True), bias=bias[None, None].astype(np.float16))
    out = {}
    for name, feeds in (("causal", causal), ("masked", masked)):
        cache = [np.array(b.cache.k[1]), np.array(b.cache.v[1])]
        out[name] = layer.run(["h_out"], dict(feeds, past_k=cache[0], past_v=cache[1]))[0]
    assert not causal["masked"] and np.allclose(out["causal"], out["masked"], atol=1e-2)


def test_the_cpus_float32_graphs_always_take_the_bias():
    """No causal branch where nothing gains from it: the CPU's GroupQueryAttention runs the
    same kernel either way, and the If's subgraph call per layer costs time there."""
    from river_core.contract.backend import Step
    from river_onnx.plugin import tiny_backend

    b = tiny_backend("llama", 0, 4)
    b.prefill([[1, 5, 6, 7]], 32)
    assert _masked(b.begin([9], Step(4, 1))) == [True] * tiny.LAYERS
    assert "masked" not in {i.name for i in b._layers[0].get_inputs()}
