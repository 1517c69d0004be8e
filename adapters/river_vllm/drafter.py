"""River's lossless mode inside vLLM: the exit river drafts, vLLM's speculative decoding verifies.

`RiverDrafter` is a vLLM custom proposer (speculative method "custom_class", the class path
as its model; `river_vllm.draft_config()` writes that). vLLM hands it the target model once
(`load_model`): River's own model class, which then runs every layer, because the backbone
verifies. After each step, `propose` drafts the next tokens of the decoding requests with the
exit river, all rows together, through the core's walk (the plan's policy and predictor, as
in River's own lossless mode): each draft token runs backbone layers until the policy lets it
leave, then the stand-ins, and the head's stand-in picks it (greedy: vLLM takes no draft
probabilities from a custom proposer and verifies each draft as certain, which is exact only
for a draft that is a function of its context). vLLM verifies the drafts in its next step over
the backbone (greedy: the longest agreeing prefix; sampling: its rejection sampler, which
repairs.py makes right on the CPU), so the output is the backbone's. With `adaptive` the draft
length follows the kept drafts of the batch as River's `DraftLength` does for one sequence.

Attention while drafting reads the context's K/V from the target's own paged cache (the
blocks of the step just verified), once per round and layer; the drafts' own K/V stay in a
scratch of `num_speculative_tokens` positions, because vLLM reserves no slots past the
verified range for a custom proposer (its drafters with their own model get
`num_lookahead_tokens`). With those slots the drafts would write into the pages and attend with
vLLM's own kernel; the verification overwrites them either way.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from vllm.distributed import get_tp_group

from river_core import ConfigError
from river_core.contract.layout import window_slots
from river_core.method.draft_length import DraftLength, Round

from .models import RiverExits, to_host
from .pages import Reader


class RiverDrafter:
    """vLLM's custom proposer for River's lossless mode."""

    def __init__(self, vllm_config) -> None:
        self.most = vllm_config.speculative_config.num_speculative_tokens
        self.max_len = vllm_config.model_config.max_model_len
        self.model: RiverExits | None = None
        self.window: int | None = None
        self.length = DraftLength(self.most)
        self.drafted: list[int] = []   # per row of the last proposal, the drafts it made
        # per row of the last proposal, its tokens then; None where it is no round to learn
        # from (vLLM's warm-up, a step aside: the length chose neither way)
        self.counts: list[int] | None = None
        self.drafting = 0.0            # seconds the last proposal drafted
        self.proposed: float | None = None   # when it ended

    def load_model(self, model) -> None:
        if not isinstance(model, RiverExits):
            raise ConfigError(f"River's drafter drafts with River's model class; this engine "
                              f"runs {type(model).__name__} (serve with `river serve --mode "
                              f"speculative`, or set the River architecture in --hf-overrides)")
        self.model = model
        config = model.river_plan.config
        self.length = DraftLength(self.most, config.adaptive)
        self.window = model.river_plan.draft_window

    @torch.inference_mode()
    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec, token_ids_cpu,
                slot_mappings=None) -> list[list[int]]:
        start = time.perf_counter()
        step = self.model.river_step
        counts = [int(n) for n in num_tokens_no_spec[:len(sampled_token_ids)]]
        self._learn(sampled_token_ids, counts, start)
        drafts = [[] for _ in sampled_token_ids]
        self.counts = None
        if step is None:   # vLLM's warm-up: no attention metadata, nothing in the pages
            return drafts
        count = self._next_length()
        rows = [row for row, sampled in enumerate(sampled_token_ids)
                if sampled and counts[row] + count <= self.max_len]
        aside = self.model.river_run.steps_aside(len(rows))
        self.counts = None if aside else counts
        # a plain step (count 0) reads no pages: DraftKV copies every layer's context
        if count and rows and not aside:
            # the sampled token is the last of a row's tokens: it drafts from its position
            made = self.draft([sampled_token_ids[r][-1] for r in rows],
                              [counts[r] - 1 for r in rows],
                              [step.block_table[r] for r in rows], count)
            for r, tokens in zip(rows, made):
                drafts[r] = tokens
        self.drafted = [len(d) for d in drafts]
        self.proposed = time.perf_counter()
        self.drafting = self.proposed - start
        return drafts

    def _next_length(self) -> int:
        """The next round's draft length, as the first rank chooses it. The length follows
        each rank's own clock, while under tensor parallelism every rank must draft the same
        rounds: a rank that drafted while another stepped plainly would pair its drafting
        layers' all-reduces with the other's verification, and both would decode garbage."""
        tp = get_tp_group()
        return tp.broadcast_object(self.length.next() if tp.rank_in_group == 0 else None)

    def _learn(self, sampled_token_ids: list[list[int]], counts: list[int], now: float) -> None:
        """The last proposal as one round of the whole batch: the drafts vLLM kept per row (a
        row's sampled tokens are its kept drafts and the backbone's own), every token the step
        gave, the drafting's time and the verifying step's (since the proposal ended). Only a
        step that went on with the same rows, each by the tokens it sampled, is such a round:
        one that also prefilled a new request, or came after the server sat idle between
        requests, would be timed as a step several times a decode step's (at one request,
        every request's first step)."""
        if self.counts is None or not self._continued(sampled_token_ids, counts):
            return
        tokens = sum(len(s) for s in sampled_token_ids)
        pairs = [(d, len(s) - 1) for d, s in zip(self.drafted, sampled_token_ids) if d and s]
        drafted, kept = (sum(x) / len(pairs) for x in zip(*pairs)) if pairs else (0, 0)
        self.length.update(Round([0] * tokens, round(drafted), round(kept), [], self.drafting,
                                 now - self.proposed))

    def _continued(self, sampled_token_ids: list[list[int]], counts: list[int]) -> bool:
        return len(counts) == len(self.counts) and all(
            then + len(sampled) == now
            for then, sampled, now in zip(self.counts, sampled_token_ids, counts))

    def draft(self, tokens: list[int], positions: list[int], blocks: list[torch.Tensor],
              count: int) -> list[list[int]]:
        """`count` tokens after each of `tokens` at `positions`, whose contexts fill `blocks`:
        the rows draft together, one walk per draft position, attention batched over them."""
        model = self.model
        device = blocks[0].device
        kv = DraftKV(model, torch.stack(blocks), positions, count, model.river_pages, self.window)
        out = [[] for _ in tokens]
        for j in range(count):
            x = model.model.embed_input_ids(torch.tensor(tokens, device=device))
            at = torch.tensor([p + j for p in positions], device=device)
            p = model.river_pass(at, lambda i, j=j: kv.attention(i, j))
            h, walk = model.river_walk(p, x, list(range(len(tokens))))
            tokens = to_host(model.river_head(model.model.norm(h)).argmax(-1)).tolist()
            for row, token in zip(out, tokens):
                row.append(token)
            model.river_count([k + 1 for k in walk.exits])
        return out


class DraftKV:
    """The K/V of a drafting round for all rows at once: per layer, each row's context read
    from the target's pages (all of it, or with `window` its first SINKS positions and its last
    `window`, as River's own engines read it: verification keeps the output exact whatever the
    drafts attend) by `read`, the cache layout's reader (pages.py), into one padded buffer with
    room for the drafts; one batched attention per layer and draft position. Every tensor
    lives on the block tables' device."""

    def __init__(self, model: RiverExits, blocks: torch.Tensor, contexts: list[int], room: int,
                 read: Reader, window: int | None = None):
        self.layers = [layer.self_attn for layer in model.model.layers]
        kept = [np.arange(c)[window_slots(0, c, window)].tolist() for c in contexts]
        width = max(len(k) for k in kept)
        on = {"device": blocks.device}
        positions = torch.tensor([k + [0] * (width - len(k)) for k in kept], **on)
        self.kept = torch.tensor([len(k) for k in kept], **on)
        self.rows = torch.arange(len(contexts), **on)
        self.k, self.v = [], []
        for attn in self.layers:
            k, v = read(attn.attn.kv_cache, blocks, positions)
            pad = k.new_zeros((*k.shape[:2], room, k.shape[3]))
            self.k.append(torch.cat([k, pad], 2))
            self.v.append(torch.cat([v, pad.clone()], 2))

    def attention(self, i: int, j: int):
        """Layer i's attention for the rows' `j`th drafts, as the walk's numerics take it."""
        attn, keys, values = self.layers[i], self.k[i], self.v[i]
        columns = self.kept + j

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            rows, heads = q.shape[0], keys.shape[1]
            keys[self.rows, :, columns] = k.view(rows, heads, attn.head_dim)
            values[self.rows, :, columns] = v.view(rows, heads, attn.head_dim)
            # a query head per group of its kv head: [rows, kv_heads, group, head_dim] (plain
            # batched matmuls: at one query, SDPA's own GQA path costs several times more)
            query = q.view(rows, heads, -1, attn.head_dim) * attn.scaling
            scores = query @ keys.transpose(2, 3)
            visible = torch.arange(keys.shape[2], device=keys.device)[None] <= columns[:, None]
            scores = scores.masked_fill(~visible[:, None, None], float("-inf"))
            return (torch.softmax(scores, -1) @ values).reshape(rows, -1)
        return attend

