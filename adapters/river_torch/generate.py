"""River inside transformers' `generate()`: a `custom_generate` callable.

    from transformers import AutoModelForCausalLM
    from river_core import ExitConfig
    from river_torch.generate import custom_generate

    model = AutoModelForCausalLM.from_pretrained(folder)
    out = model.generate(input_ids, max_new_tokens=64, custom_generate=custom_generate,
                         river=ExitConfig(policy="settled"))

transformers prepares everything as for its own sampling loop (generation config, logits
processors, stopping criteria) and hands it over. River decodes with early exit over its own
cache, built from the model's weights in memory (once per model and river precision: the
stand-ins are quantized then). Every step's logits go through the logits processors; the token
is the argmax, or drawn from their softmax with torch's generator when sampling (as transformers
does); finished rows get the pad token; the generation ends once the stopping criteria (max
length, EOS, stop strings, the caller's own) hold for every row. Exit mode only; no beams.
"""

from __future__ import annotations

import weakref
from pathlib import Path

import numpy as np
import torch

from river_core import ConfigError, ExitConfig, GenerationConfig, QuantSpec, RiverModel
from river_core.plugins import default_registry
from river_models import stand_ins
from river_models.cache import content_key
from river_models.source import checkpoint_of

from .backend import TorchBackend

_BUILT: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # model -> {quant: River}


class _NoTokenizer:
    """River's tokenizer for token ids alone: transformers' generate never needs text."""

    eos_token_id = None


def river_model(model, quant: QuantSpec) -> RiverModel:
    """River over a transformers *ForCausalLM's weights, made once per model and precision.
    A model read from a local folder finds its stand-ins in the user cache, where the CLI
    keeps them for the same folder (quantized once, not in every process)."""
    built = _BUILT.setdefault(model, {})
    if quant not in built:
        name = getattr(model.config, "_name_or_path", "") or "model"
        folder = Path(name).expanduser()
        local = folder.is_dir()
        checkpoint = checkpoint_of(model, _NoTokenizer(), name.rstrip("/").split("/")[-1],
                                   content_key(folder) if local else f"memory-{id(model):x}",
                                   folder if local else None)
        backend = TorchBackend(checkpoint, stand_ins(checkpoint, quant, cache=local), model.dtype,
                            str(model.device))
        built[quant] = RiverModel(backend, default_registry())
    return built[quant]


def custom_generate(model, input_ids: torch.LongTensor, logits_processor, stopping_criteria,
                    generation_config, river: ExitConfig | None = None,
                    river_quant: QuantSpec | None = None, **model_kwargs) -> torch.LongTensor:
    """transformers' decoding-method signature; `river` and `river_quant` come through
    `model.generate(..., river=ExitConfig(...), river_quant=QuantSpec(...))`."""
    config = river or ExitConfig()
    if config.lossless:
        raise ConfigError("inside transformers' generate River runs exit mode (the caller's "
                          "logits processors would break speculative verification)")
    if generation_config.num_beams > 1:
        raise ConfigError("River's custom_generate decodes one beam per sequence")
    mask = model_kwargs.get("attention_mask")
    rows = input_ids.tolist() if mask is None else \
        [row[keep.bool()].tolist() for row, keep in zip(input_ids, mask)]   # drop left padding
    new_tokens = generation_config.max_length - input_ids.shape[1]
    if new_tokens < 1:
        return input_ids
    pad = generation_config._pad_token_tensor   # as transformers' own loop: EOS when unset
    ids = input_ids.clone()
    unfinished = torch.ones(len(rows), dtype=torch.bool, device=ids.device)
    last = {}

    def choose(logits: np.ndarray) -> list[int]:
        nonlocal ids
        scores = logits_processor(ids, torch.from_numpy(logits).to(ids.device, torch.float32))
        if generation_config.do_sample:
            chosen = torch.multinomial(torch.softmax(scores, dim=-1), 1).squeeze(1)
        else:
            chosen = scores.argmax(dim=-1)
        if pad is not None:
            chosen = torch.where(unfinished, chosen, pad)
        ids = torch.cat([ids, chosen[:, None]], dim=-1)
        last["scores"] = scores
        return chosen.tolist()

    stream = river_model(model, river_quant or QuantSpec()).stream_ids(
        rows, config, GenerationConfig(max_new_tokens=new_tokens), sample=choose, eos=())
    for token in stream:
        if token.row == len(rows) - 1:   # every row has this step's token
            unfinished &= ~stopping_criteria(ids, last["scores"])
            if not unfinished.any():
                stream.interrupt()
    return ids
