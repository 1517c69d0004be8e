"""No silent wrong answer: a model whose activations overflow fails its generation with one
line naming the model, the engine and the first layer whose output went non-finite. Before
(issue 43), hf and onnx both returned token 0 at every step, with no error."""

import attrs
import numpy as np
import pytest

from river_core import ExitConfig, GenerationConfig, NonFiniteError, RiverModel
from river_core.finite import checked
from river_models import tiny

BAD = 2   # the layer whose MLP overflows float32


def overflowing():
    """The tiny Llama with layer BAD's MLP scaled past float32's range: its output is inf,
    the next layer's norm makes it NaN, and so do the logits."""
    c = tiny.checkpoint("llama", 0)
    layers = list(c.weights.layers)
    p = dict(layers[BAD].projections)
    p["up"], p["down"] = p["up"] * np.float32(1e10), p["down"] * np.float32(1e30)
    layers[BAD] = attrs.evolve(layers[BAD], projections=p)
    return attrs.evolve(c, key=c.key + "-overflow",
                        weights=attrs.evolve(c.weights, layers=tuple(layers)))


def hf():
    from river_hf.backend import HFBackend

    c = overflowing()
    return HFBackend(c, tiny.stand_ins(c, 8))


def onnx(tmp_path):
    from river_onnx.backend import OnnxBackend
    from river_onnx.export import export_model

    c = overflowing()
    manifest = export_model(c, tiny.stand_ins(c, 8), tmp_path)
    return OnnxBackend(tmp_path, manifest, c.tokenizer)


@pytest.mark.parametrize("engine", ["hf", "onnx"])
@pytest.mark.parametrize("mode", [ExitConfig(kv="full"), ExitConfig(),
                                  ExitConfig(mode="speculative")],
                         ids=["full", "exit", "lossless"])
def test_overflowing_activations_fail_naming_the_model_engine_and_layer(engine, mode, tmp_path):
    backend = hf() if engine == "hf" else onnx(tmp_path)
    with pytest.raises(NonFiniteError) as failed:
        RiverModel(backend).generate_ids([[1, 20, 21, 22]], mode,
                                         GenerationConfig(max_new_tokens=6))
    message = str(failed.value)
    assert "\n" not in message
    assert f"on the {engine} engine" in message and "non-finite logits" in message
    assert f"layer {BAD} of {tiny.LAYERS}" in message
    assert ("tiny-llama" if engine == "hf" else tmp_path.name) in message


def test_an_engine_that_runs_its_own_layers_says_it_cannot_tell_which(monkeypatch):
    """llama.cpp's case: full depth only, no layer to replay."""
    backend = hf()
    backend.capabilities = attrs.evolve(backend.capabilities, exits=False, stand_in=False,
                                        propagate=False, mask=False, recompute=False,
                                        sub_blocks=False, verify=False, windowed_drafts=False)
    with pytest.raises(NonFiniteError, match="cannot tell which layer"):
        RiverModel(backend).generate_ids([[1, 20, 21]], ExitConfig(kv="full"),
                                         GenerationConfig(max_new_tokens=2))


def test_masked_tokens_are_not_a_fault():
    """-inf is how a model masks a token: only NaN or +inf (in a row's maximum) fails."""
    logits = np.array([[0.5, -np.inf, 1.0]], np.float32)
    assert checked(logits, None, lambda r: [], 0) is logits
