"""A model family as one value: every fact a reader, a writer or an engine asks of it.

Each module of this package defines one `Family`; the registry (the package itself) indexes
them. Facts, not code, but for what transformers' GGUF loader drops and a family needs put
back (`Gguf.restore`). docs/families.md: adding a family.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import attrs

# the keys llama.cpp's converter writes for every architecture, in its order (each key's
# value: river_models.gguf_convention.KEYS)
COMMON_KEYS = ("context_length", "embedding_length", "feed_forward_length", "block_count",
               "attention.head_count", "attention.head_count_kv",
               "attention.layer_norm_rms_epsilon", "rope.freq_base", "general.file_type")
# what it writes where the published config holds `head_dim`
HEAD_DIM_KEYS = ("attention.key_length", "attention.value_length")
# the scaling keys the config's rope type calls for (linear: type, factor; yarn: its own too)
ROPE_SCALING = "rope.scaling.type"

# (config, the GGUF's metadata, its rope_* tensors): fills in transformers' config what its
# GGUF loader left out
Restore = Callable[[Any, Mapping[str, Any], Mapping[str, Any]], None]


@attrs.frozen
class Gguf:
    """The family as llama.cpp's converter writes it and its loader reads it."""

    arch: str                          # general.architecture
    keys: tuple[str, ...]              # the metadata keys the converter writes, in its order
    neox: bool = True                  # llama.cpp's rotation; False: normal, Q/K rows permuted
    reads_back: bool = True            # a file of `arch` reads as this family (False: another's)
    tokenizer: str = "metaspace"       # its SentencePiece vocabulary's kind (gguf_tokenizer)
    yarn: bool = False                 # rope.scaling.type yarn: YaRN's table from rope.scaling.*
    longrope: bool = False             # LongRoPE's factors as tensors (a file may call it yarn)
    # what llama.cpp's loader assumes where no file holds it
    sliding_period: int | None = None  # layer i slides iff i % period < period - 1 (None: none)
    defaults: Mapping[str, float] = {}   # an optional key the converter leaves out
    wide_query_layers: tuple[int, ...] = ()   # block counts scaling queries by hidden / heads
    restore: Restore | None = None


@attrs.frozen
class Family:
    """A model family: how transformers and llama.cpp hold it, its block's quirks, its test
    models and what each engine needs to know."""

    name: str                          # River's name: its tiny model's, its test shapes'
    # transformers' model types read as this family, the first naming its specs (none: a test
    # variant of another family, whose type its configs carry)
    model_types: tuple[str, ...]
    architecture: str                  # transformers' *ForCausalLM (config.json's)
    config_class: str                  # transformers' config class, for the test configs
    gguf: Gguf
    # the block: what a GGUF's reader and writer take from here, a config naming its own
    activation: str = "silu"
    norm_offset: bool = False          # norms scale by 1 + w (a GGUF holds 1 + w)
    sandwich: bool = False             # norms after attention and after the MLP too
    qk_norm: bool = False              # per-head norms of q and k
    qkv_bias: bool = False             # biases on q, k and v
    fused: bool = False                # q, k, v stored as one matrix, gate and up as one
    embed_scaled: bool = False         # embeddings times sqrt(hidden)
    windowed: bool = False             # config.sliding_window on every layer (no layer_types)
    rope_per_layer_type: bool = False  # one rotary table per attention type
    query_scale: bool = False          # Llama 4's query scale (llama_4_scaling_beta)
    # text-and-vision checkpoints whose text model is this family, by model type, and the
    # fields of the tiny one (beside its text config)
    wrappers: tuple[str, ...] = ()
    tiny_wrapper: Mapping[str, Any] = {}
    # test models: the tiny config's fields beside river_conformance.fixtures.tiny.COMMON; the serving
    # form's beside those and tiny.SERVING (heads 32 wide; None: no serving form); the
    # published model's config fields and its quirks at widths K-quants fill (real_gguf)
    tiny: Mapping[str, Any] = {}
    serving: Mapping[str, Any] | None = None
    hub: str = ""
    real: Mapping[str, Any] = {}
    small: Mapping[str, Any] = {}
    # engines: the vLLM class River's extends ("module:Class" in vllm.model_executor.models;
    # None: not served) and why llama.cpp computes the tiny model otherwise than transformers
    vllm: str | None = None
    llamacpp_differs: str | None = None
