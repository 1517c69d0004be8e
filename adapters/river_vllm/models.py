"""River's exit mode inside vLLM's batched step.

A River class is vLLM's own model class for the family (its weights, loader, attention layers
and paged KV cache untouched) with one forward of River's own: the batch's tokens go through
the layers as one [tokens, hidden] state; after each layer the exit policy from `river_core`
lets decoding tokens leave; from then on those rows run the layer's stand-in (River's 4-bit
copy, from the model package and its cache: the same weights `river generate` uses). At every
layer the Q/K/V of all rows, backbone and stand-in alike, go through the layer's one vLLM
attention call, which writes each row's K/V into the paged cache through the step's slot
mapping: the river's K/V lands where the backbone's would, and the block tables, prefix
caching and the scheduler never know. Prompt (prefill) tokens always run full depth. With a
speculative config (lossless mode) the forward runs every layer, since it verifies, and
`river_walk` serves River's drafter (drafter.py) instead.

Settings come from the model config's `river` entry (`--hf-overrides`): `policy` and
`options` as for `river generate`, and `bits` of the stand-ins. vLLM's model sees tokens, not
requests, so policies that keep state per sequence or read the early logits are refused, and
each token's predictor starts fresh every step.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.forward_context import get_forward_context
from vllm.logger import init_logger
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

from river_core import ConfigError, ExitConfig, ModelShape, QuantSpec, RowView
from river_core import default_registry, resolve
from river_core.predictor import TransitionPredictor
from river_hf.blocks import Block, mlp, packed
from river_models import open_model, stand_ins

from . import CAPABILITIES, repairs

logger = init_logger(__name__)
REPORT_EVERY = 64   # decode steps between exit statistics in the log


class RiverExits:
    """The forward of River's exit mode, mixed into a vLLM *ForCausalLM class."""

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        config = vllm_config.model_config.hf_config
        river = dict(getattr(config, "river", None) or {})
        self.river_folder = vllm_config.model_config.model
        self.river_quant = QuantSpec(bits=int(river.pop("bits", 4)))
        exit_config = ExitConfig(policy=river.pop("policy", "settled"),
                                 options=river.pop("options", {}))
        if river:
            raise ConfigError(f"unknown River settings {sorted(river)} in the model config; "
                              f"it takes policy, options and bits")
        shape = ModelShape(config.num_hidden_layers, config.max_position_embeddings)
        self.river_plan = resolve(exit_config, default_registry(), CAPABILITIES, shape, "vllm")
        policy = self.river_plan.policy
        if policy.needs.logits or policy.needs.recheck or policy.new_row() is not None:
            raise ConfigError(f"the {exit_config.policy!r} policy reads logits, rechecks or "
                              f"keeps state per sequence, which vLLM's model step cannot give "
                              f"it; use settled, similarity or fixed")
        self.river_stand_ins: list[Block] = []
        self.river_head = None
        self.river_eps: list[float] = []
        self.river_stats = {"steps": 0, "tokens": 0, "layers": 0}
        # lossless mode (a speculative config, River's drafter): the backbone verifies, so
        # this forward runs every layer and the river only drafts (drafter.py)
        self.river_verifies = vllm_config.speculative_config is not None
        self.river_step = None   # the last forward's attention metadata, for the drafter
        if self.river_verifies and (repaired := repairs.repair()):
            logger.info("River: repaired vLLM's rejection sampler for sampled requests (%s; "
                        "river_vllm/repairs.py)", ", ".join(repaired))

    def load_weights(self, weights) -> set[str]:
        loaded = super().load_weights(weights)
        checkpoint = open_model(str(self.river_folder))
        quantized = stand_ins(checkpoint, self.river_quant)
        dtype = next(self.parameters()).dtype
        self.river_stand_ins = [Block.build(i, layer, checkpoint.spec, dtype, torch.device("cpu"),
                                            quantized.layers[i])
                                for i, layer in enumerate(checkpoint.weights.layers)]
        self.river_eps = list(quantized.errors)
        self.river_head = packed(quantized.head, None, dtype, torch.device("cpu"))   # drafts
        logger.info("River: %d stand-ins (%s), policy %s", len(self.river_stand_ins),
                    self.river_quant.label, self.river_plan.config.policy)
        return loaded

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors=None, inputs_embeds: torch.Tensor | None = None,
                **_: Any) -> torch.Tensor:
        model = self.model
        x = inputs_embeds if inputs_embeds is not None else model.embed_input_ids(input_ids)
        self.river_step = _attention_metadata()
        leaving = [] if self.river_verifies or not self.river_stand_ins else \
            _decoding_tokens(self.river_step, x.shape[0])
        x, ran = self.river_walk(x, positions, leaving, lambda i: model.layers[i].self_attn.attn)
        if leaving:
            self.river_count(ran)
        return x

    def river_walk(self, x: torch.Tensor, positions: torch.Tensor, leaving: list[int],
                   attention) -> tuple[torch.Tensor, dict[int, int]]:
        """Every layer over the rows of `x`; after each, the policy may let a row in `leaving`
        exit, and from then on it runs the stand-ins. `attention(i)` is layer i's attention
        (vLLM's, or the drafter's). Returns the normed state and the layers each leaving row
        ran."""
        model = self.model
        x = x.clone()
        deep = torch.ones(x.shape[0], dtype=torch.bool)
        ran = {t: len(model.layers) for t in leaving}
        # one predictor per leaving token and step (vLLM's model sees tokens, not requests)
        prior = [1.0] * len(self.river_eps)
        predictors = {t: TransitionPredictor(self.river_eps, prior) for t in leaving}
        for i, layer in enumerate(model.layers):
            mid, out = self._layer(i, layer, positions, x, deep, attention(i))
            deciding = [t for t in leaving if deep[t]] if i < len(model.layers) - 1 else []
            if deciding:
                similarity = torch.minimum(_cosine(x, mid), _cosine(mid, out)).tolist()
            for t in deciding:
                predictors[t].observe(i, similarity[t])
                if self.river_plan.policy.should_exit(RowView(i, 0, predictors[t], None,
                                                              _no_logits)):
                    deep[t] = False
                    ran[t] = i + 1
            x = out
        return model.norm(x), ran

    def _layer(self, i: int, layer, positions, x: torch.Tensor, deep: torch.Tensor,
               attention):
        """Layer i for every row, backbone or stand-in; one attention call for all rows.
        Returns the state after attention and after the MLP."""
        attn, stand_in = layer.self_attn, self.river_stand_ins[i] if self.river_stand_ins \
            else None
        gone = ~deep if stand_in is not None else torch.zeros_like(deep)
        by_row = lambda backbone, river, h: _rows(backbone, river, h, deep, gone)
        n = layer.input_layernorm(x)
        qkv = by_row(lambda h: attn.qkv_proj(h)[0], stand_in and stand_in.proj["qkv"], n)
        q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        if hasattr(attn, "q_norm"):   # Qwen3: per-head norms, kept by the stand-ins
            q = attn.q_norm(q.reshape(*q.shape[:-1], -1, attn.head_dim)).reshape(q.shape)
            k = attn.k_norm(k.reshape(*k.shape[:-1], -1, attn.head_dim)).reshape(k.shape)
        q, k = attn.rotary_emb(positions, q, k)
        a = attention(q, k, v)
        mid = x + by_row(lambda h: attn.o_proj(h)[0], stand_in and stand_in.proj["o"], a)
        m = layer.post_attention_layernorm(mid)
        return mid, mid + by_row(layer.mlp, stand_in and (lambda h: mlp(stand_in, h)), m)

    def river_count(self, ran: dict[int, int]) -> None:
        s = self.river_stats
        s["steps"] += 1
        s["tokens"] += len(ran)
        s["layers"] += sum(ran.values())
        if s["steps"] % REPORT_EVERY == 0:
            logger.info("River: %d exit-river tokens ran %.2f of %d backbone layers on average",
                        s["tokens"], s["layers"] / s["tokens"], len(self.model.layers))


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
    starts = starts.tolist()
    return [a for a, b in zip(starts, starts[1:]) if b - a == 1 and a < num_tokens]


def _rows(backbone, river, h: torch.Tensor, deep: torch.Tensor,
          gone: torch.Tensor) -> torch.Tensor:
    """`backbone(h)` for the deep rows and `river(h)` for the rows that left, in row order."""
    if not gone.any():
        return backbone(h)
    if not deep.any():
        return river(h)
    first = backbone(h[deep])
    out = first.new_empty((h.shape[0], first.shape[-1]))
    out[deep] = first
    out[gone] = river(h[gone])
    return out


def _cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)


def _no_logits():
    raise ConfigError("inside vLLM, exit policies cannot read the early logits")


class RiverLlamaForCausalLM(RiverExits, LlamaForCausalLM):
    """Llama (and the embedded SmolLM2) with River's exits."""


class RiverQwen2ForCausalLM(RiverExits, Qwen2ForCausalLM):
    """Qwen2 with River's exits."""


class RiverQwen3ForCausalLM(RiverExits, Qwen3ForCausalLM):
    """Qwen3 with River's exits."""
