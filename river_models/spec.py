"""What every engine needs to know about a model, read once: `ModelSpec` and its weights.

`ModelSpec` is plain numbers and names (JSON-serialisable, hashable): the shapes, the per-layer
attention windows and rotary tables, and the family's quirks. `Weights` holds the float32
arrays, named by role rather than by any framework's parameter names. A backend is built from a
`Checkpoint` (spec, weights, tokenizer) and needs nothing else from the model's files.
"""

from __future__ import annotations

from pathlib import Path

from typing import Mapping, Sequence

import attrs
import numpy as np

PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")
# Projections of the same input run as one matmul (outputs concatenated): fewer, larger calls,
# which is what decides speed at small widths.
FUSED = {"qkv": ("q", "k", "v"), "o": ("o",), "gate_up": ("gate", "up"), "down": ("down",)}
# a layer's norms (`LayerWeights`' fields) and their tensors' names in a GGUF (blk.N.<name>.weight)
GGUF_NORMS = {"input_norm": "attn_norm", "pre_mlp_norm": "ffn_norm",
              "post_attn_norm": "post_attention_norm", "post_mlp_norm": "post_ffw_norm",
              "q_norm": "attn_q_norm", "k_norm": "attn_k_norm"}
NORMS = tuple(GGUF_NORMS)
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


@attrs.frozen
class Rotary:
    """One rotary table: cos/sin(position * inv_freq) * scaling, halves concatenated. It
    covers the first 2 * len(inv_freq) dimensions of a head (a partial rotary: the rest pass
    through). LongRoPE has a second table, `long_inv_freq`, for a sequence longer
    than `switch` (its original context): a row's table is chosen by the last position it
    reaches in the step, as transformers chooses it by the forward pass's last position."""

    inv_freq: tuple[float, ...]
    scaling: float = 1.0
    long_inv_freq: tuple[float, ...] = ()
    switch: int = 0

    def is_long(self, positions: np.ndarray) -> np.ndarray:
        """positions [rows, tokens] -> [rows] bool: the row takes the long table."""
        return np.asarray(positions).max(-1) + 1 > self.switch if self.long_inv_freq else \
            np.zeros(len(positions), bool)

    def angles(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """positions [rows, tokens] -> (cos, sin) [rows, tokens, rotary dims] float32."""
        positions = np.asarray(positions)
        freq = np.where(self.is_long(positions)[:, None],
                        np.asarray(self.long_inv_freq or self.inv_freq, np.float32),
                        np.asarray(self.inv_freq, np.float32))[:, None]
        freqs = positions.astype(np.float32)[..., None] * freq
        emb = np.concatenate([freqs, freqs], axis=-1)
        return np.cos(emb) * np.float32(self.scaling), np.sin(emb) * np.float32(self.scaling)


@attrs.frozen
class QueryScale:
    """A position-dependent query scaling (transformers: llama_4_scaling_beta):
    q *= 1 + beta * log(1 + floor(position / period)), after the rotary."""

    beta: float
    period: int

    def factors(self, positions: np.ndarray) -> np.ndarray:
        """positions [...] -> [...] float32."""
        return (1 + self.beta * np.log1p(np.floor(np.asarray(positions) / self.period))
                ).astype(np.float32)


@attrs.frozen
class ModelSpec:
    family: str                        # the Hugging Face model_type
    num_layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_positions: int
    eos_ids: tuple[int, ...]
    windows: tuple[int | None, ...]    # per layer: sliding-window length, None = full attention
    rope_keys: tuple[str, ...]         # per layer: which rotary table ("" when there is one)
    rotary: Mapping[str, Rotary] = attrs.field(converter=lambda d: dict(sorted(d.items())),
                                               eq=False)
    activation: str = "silu"
    norm_eps: float = 1e-6
    norm_offset: bool = False          # x * (1 + w), computed in float32
    sandwich: bool = False             # norms after attention and after the MLP too
    qk_norm: bool = False              # a per-head norm of q and k
    attn_scale: float = 0.0            # softmax scale of q.k
    embed_scale: float = 1.0           # embeddings times this (sqrt(hidden) in some families)
    final_softcap: float | None = None
    query_scale: QueryScale | None = None

    @property
    def group(self) -> int:
        """Query heads per K/V head."""
        return self.heads // self.kv_heads

    @property
    def switch_at(self) -> int | None:
        """LongRoPE's switch: a sequence longer than this rotates every position on
        the long table, those already in its cache too (`LayerEngine.switch_at`)."""
        switches = [r.switch for r in self.rotary.values() if r.long_inv_freq]
        return min(switches) if switches else None

    def norm_scale(self, w: np.ndarray) -> np.ndarray:
        """A norm's weight as the norm multiplies by it, float32: 1 + w with `norm_offset` (the one
        place `norm_offset` changes a weight; GGUF files store it so)."""
        w = np.asarray(w, np.float32)
        return w + np.float32(1) if self.norm_offset else w

    def to_json(self) -> dict:
        d = attrs.asdict(self, recurse=False)
        d["rotary"] = {k: attrs.asdict(r) for k, r in self.rotary.items()}
        d["query_scale"] = self.query_scale and attrs.asdict(self.query_scale)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "ModelSpec":
        d = dict(d)
        d["rotary"] = {k: Rotary(tuple(r["inv_freq"]), r["scaling"],
                                 tuple(r.get("long_inv_freq", ())), r.get("switch", 0))
                       for k, r in d["rotary"].items()}
        d["query_scale"] = d.get("query_scale") and QueryScale(**d["query_scale"])
        for name in ("eos_ids", "windows", "rope_keys"):
            d[name] = tuple(d[name])
        return cls(**d)


@attrs.frozen(eq=False)
class LayerWeights:
    """One decoder block. Projections are [out, in] (y = x W^T + b). Norm weights are raw:
    with `norm_offset` the effective scale is 1 + w."""

    input_norm: np.ndarray
    pre_mlp_norm: np.ndarray
    projections: Mapping[str, np.ndarray]          # PROJECTIONS
    biases: Mapping[str, np.ndarray] = {}          # q, k, v where the family has them
    post_attn_norm: np.ndarray | None = None       # sandwich
    post_mlp_norm: np.ndarray | None = None
    q_norm: np.ndarray | None = None               # qk_norm
    k_norm: np.ndarray | None = None

    def projection_bytes(self, names: Sequence[str] = PROJECTIONS) -> int:
        return sum(self.projections[n].nbytes for n in names)

    def fused(self, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray | None]:
        """(weight, bias) of several projections of the same input as one, rows concatenated
        (a missing bias is zeros when another of them has one)."""
        weight = np.concatenate([self.projections[n] for n in names])
        if not any(n in self.biases for n in names):
            return weight, None
        return weight, np.concatenate([self.biases.get(n, np.zeros(len(self.projections[n]),
                                                                    np.float32)) for n in names])


@attrs.frozen(eq=False)
class Weights:
    embed: np.ndarray                  # [vocab, hidden]
    final_norm: np.ndarray
    head: np.ndarray                   # [vocab, hidden]; the embedding itself when tied
    layers: tuple[LayerWeights, ...]


@attrs.frozen(eq=False)
class Checkpoint:
    """A model ready for any engine. `key` identifies its content, for caches derived from
    it; `source` is the folder it was read from (None: made in memory)."""

    name: str
    key: str
    spec: ModelSpec
    weights: Weights
    tokenizer: object                  # river_models.tokenizer.Tokenizer
    source: Path | None = None
