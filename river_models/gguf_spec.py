"""A GGUF's `ModelSpec`, read from its own header as llama.cpp reads it: no conversion, no torch,
no transformers (the ggml engine runs the file itself, so it needs nothing else).

The spec equals the one River derives from the same file converted through transformers
(tests/test_gguf_spec.py checks it on every family's tiny GGUF), rotary tables included:
- plain rope from `rope.freq_base` over `rope.dimension_count` (a partial rotary) or the
  head; `rope.scaling.type` linear divides the frequencies by `rope.scaling.factor`;
- Llama 3's scaling, which llama.cpp's converter keeps only as each frequency's divisor
  (tensor `rope_freqs`);
- LongRoPE from its factor tensors (`rope_factors_short/long`), its switch
  `rope.scaling.original_context_length` and `rope.scaling.attn_factor`;
- one table per attention type where the family has them (`rope.freq_base_swa` for the
  sliding layers);
- YaRN from `rope.scaling.*` and Llama 4's query scale from `attention.temperature_scale`.
What llama.cpp's converter leaves out, its loader assumes, and so does this reader: each
family's record says it (river_models.families: the sliding pattern, the defaults of optional
keys, the query scale, the block's quirks no key holds); a written window no pattern applies
is not applied; a missing `rope.freq_base` is 10000.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from river_core.settings.errors import ModelError

from .families import BY_ARCH, Family
from .gguf_header import Header, float_tensor
from .spec import ModelSpec, QueryScale, Rotary

# the ids that end generation besides EOS, as llama.cpp's vocabulary counts them (end of turn,
# end of message)
END_IDS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
           "tokenizer.ggml.eom_token_id")


def eos_ids(meta: dict[str, Any]) -> tuple[int, ...]:
    return tuple(sorted({int(meta[k]) for k in END_IDS if meta.get(k) is not None}))


def _get(meta: dict[str, Any], arch: str, key: str, gguf: str, default: Any = ...) -> Any:
    value = meta.get(f"{arch}.{key}", default)
    if value is ...:
        raise ModelError(f"{gguf}: no {arch}.{key} in its metadata")
    return value


def _number(meta: dict[str, Any], arch: str, key: str, gguf: str, default: Any = ...,
            kind: type = float) -> Any:
    """A numeric field as `kind` (int or float); ModelError naming it where the file holds
    something else (a string, a per-layer array River does not run)."""
    value = _get(meta, arch, key, gguf, default)
    if value is None and default is None:   # an optional field the file leaves out
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or (kind is int and float(value) != int(value)):
        what = "an array (one value per layer)" if isinstance(value, tuple) else repr(value)
        wanted = "an integer" if kind is int else "a number"
        raise ModelError(f"{gguf}: {arch}.{key} is {what}, not {wanted}")
    return kind(value)


def _int(meta: dict[str, Any], arch: str, key: str, gguf: str, default: Any = ...) -> int:
    return _number(meta, arch, key, gguf, default, int)


def _plain(base: float, dims: int) -> np.ndarray:
    """1 / base^(2i / dims) in float32, as transformers computes its default table."""
    exponent = np.arange(0, dims, 2, dtype=np.int64).astype(np.float32) / np.float32(dims)
    return (1.0 / np.power(np.float32(base), exponent, dtype=np.float32)).astype(np.float32)


def _floats(a: np.ndarray) -> tuple[float, ...]:
    return tuple(float(x) for x in np.asarray(a, np.float32))


def _rotary(meta: dict[str, Any], header: Header, path: Path, family: Family, head_dim: int,
            base: float) -> Rotary:
    gguf, arch = path.name, family.gguf.arch
    dims = _int(meta, arch, "rope.dimension_count", gguf, head_dim)
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    yarn = family.gguf.yarn or family.gguf.longrope   # LongRoPE's factors may be called yarn
    if kind not in ("none", "linear", "longrope") and not (kind == "yarn" and yarn):
        raise ModelError(f"{gguf}: {arch}.rope.scaling.type {kind!r}; River reads none, "
                         f"linear, llama3 (rope_freqs), longrope and (where the family has "
                         f"it) yarn")
    inv_freq = _plain(base, dims)
    if kind == "linear":
        inv_freq = inv_freq / np.float32(_number(meta, arch, "rope.scaling.factor", gguf))
    if kind == "yarn" and family.gguf.yarn:
        return _yarn(meta, arch, gguf, base, dims)
    divisors = float_tensor(path, header, "rope_freqs.weight")
    if divisors is not None:   # Llama 3: each frequency's divisor
        if len(divisors) != len(inv_freq):
            raise ModelError(f"{gguf}: rope_freqs has {len(divisors)} factors for "
                             f"{len(inv_freq)} rotary frequencies")
        return Rotary(_floats(_plain(base, dims).astype(np.float64) / divisors))
    short = float_tensor(path, header, "rope_factors_short.weight")
    long = float_tensor(path, header, "rope_factors_long.weight")
    if short is None or long is None:
        return Rotary(_floats(inv_freq))
    switch = _int(meta, arch, "rope.scaling.original_context_length", gguf)
    scaling = _number(meta, arch, "rope.scaling.attn_factor", gguf, None)
    if scaling is None:   # transformers' LongRoPE default, from the two contexts
        factor = _int(meta, arch, "context_length", gguf) / switch
        scaling = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(switch))
    exponent = np.arange(0, dims, 2, dtype=np.int64).astype(np.float32) / np.float32(dims)
    powers = np.power(np.float32(base), exponent, dtype=np.float32)
    table = lambda factors: _floats(1.0 / (factors.astype(np.float32) * powers))
    return Rotary(table(short), float(scaling), table(long), switch)


def _yarn(meta: dict[str, Any], arch: str, gguf: str, base: float, dims: int) -> Rotary:
    """YaRN's table as transformers computes it from the same parameters: each
    frequency blended between interpolated (divided by the factor) and extrapolated, by a
    linear ramp between the correction dimensions of beta_fast and beta_slow rotations over
    the original context; cos/sin scaled by mscale(factor, 1) / mscale(factor, log_mul), as
    llama.cpp nets it out (1 where the multiplier is 1)."""
    factor = _number(meta, arch, "rope.scaling.factor", gguf)
    original = _int(meta, arch, "rope.scaling.original_context_length", gguf)
    fast = _number(meta, arch, "rope.scaling.yarn_beta_fast", gguf, 32.0)
    slow = _number(meta, arch, "rope.scaling.yarn_beta_slow", gguf, 1.0)
    log_mul = _number(meta, arch, "rope.scaling.yarn_log_multiplier", gguf, 0.0)

    def correction(rotations: float) -> float:
        return dims * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction(fast)), 0)
    high = min(math.ceil(correction(slow)), dims - 1)
    ramp = np.clip((np.arange(dims // 2, dtype=np.float32) - low) / max(high - low, 1e-3), 0, 1)
    extrapolated = _plain(base, dims)
    interpolated = extrapolated / np.float32(factor)
    keep = 1 - ramp   # the share of each frequency left as trained (extrapolated)
    table = interpolated * (1 - keep) + extrapolated * keep

    def mscale(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    scaling = mscale(1.0) / mscale(log_mul) if log_mul else mscale(1.0)
    return Rotary(_floats(table), float(scaling))


def _query_scale(meta: dict[str, Any], arch: str, gguf: str) -> QueryScale | None:
    """Llama 4's query scale, as llama.cpp applies it after the rotary."""
    beta = _number(meta, arch, "attention.temperature_scale", gguf, None)
    if not beta:
        return None
    return QueryScale(float(beta),
                      _int(meta, arch, "rope.scaling.original_context_length", gguf))


def gguf_spec(path: Path, header: Header) -> ModelSpec:
    """The spec of the GGUF at `path` from its `header`; ModelError naming the field River
    cannot read or the architecture it does not run."""
    path = Path(path)
    meta, gguf = header.metadata, path.name
    arch = meta.get("general.architecture")
    if arch is None:
        raise ModelError(f"{gguf}: no general.architecture in its metadata (damaged, or not a "
                         f"model's GGUF)")
    if arch not in BY_ARCH:
        raise ModelError(f"{gguf}: general.architecture {arch!r} is not one River runs from a "
                         f"GGUF; it runs {', '.join(BY_ARCH)}")
    family = BY_ARCH[arch]
    layers = _int(meta, arch, "block_count", gguf)
    hidden = _int(meta, arch, "embedding_length", gguf)
    heads = _int(meta, arch, "attention.head_count", gguf)
    kv_heads = _int(meta, arch, "attention.head_count_kv", gguf, heads)
    head_dim = _int(meta, arch, "attention.key_length", gguf, hidden // heads)
    embed = header.tensors.get("token_embd.weight")
    if embed is None:
        raise ModelError(f"{gguf}: no tensor token_embd.weight")
    base = _number(meta, arch, "rope.freq_base", gguf, 10000.0)
    window = _int(meta, arch, "attention.sliding_window", gguf, 0)
    period = family.gguf.sliding_period
    if period and window:
        slides = [i % period < period - 1 for i in range(layers)]
        keys = tuple("sliding_attention" if s else "full_attention" for s in slides)
        windows = tuple(window if s else None for s in slides)
        local = _number(meta, arch, "rope.freq_base_swa", gguf,
                        family.gguf.defaults["rope.freq_base_swa"])
        rotary = {"full_attention": _rotary(meta, header, path, family, head_dim, base),
                  "sliding_attention": Rotary(_floats(_plain(local, head_dim)))}
    else:   # without a window every layer global, on the global table
        keys = ("full_attention" if family.rope_per_layer_type else "",) * layers
        windows = (None,) * layers   # llama.cpp applies no window without a sliding pattern
        rotary = {keys[0]: _rotary(meta, header, path, family, head_dim, base)}
    softcap = _number(meta, arch, "final_logit_softcapping", gguf, None)
    return ModelSpec(
        family=family.model_types[0], num_layers=layers, hidden=hidden,
        intermediate=_int(meta, arch, "feed_forward_length", gguf), heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, vocab=int(embed.dims[1]),
        max_positions=_int(meta, arch, "context_length", gguf), eos_ids=eos_ids(meta),
        windows=windows, rope_keys=keys, rotary=rotary,
        activation=family.activation,
        norm_eps=_number(meta, arch, "attention.layer_norm_rms_epsilon", gguf),
        norm_offset=family.norm_offset, sandwich=family.sandwich,
        qk_norm="blk.0.attn_q_norm.weight" in header.tensors,
        attn_scale=(hidden / heads if layers in family.gguf.wide_query_layers
                    else head_dim) ** -0.5,
        embed_scale=hidden ** 0.5 if family.embed_scaled else 1.0,
        final_softcap=softcap,
        query_scale=_query_scale(meta, arch, gguf))
