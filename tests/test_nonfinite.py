"""No silent wrong answer: a model whose activations overflow fails its generation with one
line naming the model, the engine and the first layer whose output went non-finite. Before
(issue 43), hf and onnx both returned token 0 at every step, with no error."""

import attrs
import numpy as np
import pytest

from river_core import ExitConfig, GenerationConfig, NonFiniteError, RiverModel
from river_core.loop.finite import checked
from river_conformance.fixtures import tiny

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
    from river_torch.backend import TorchBackend

    c = overflowing()
    return TorchBackend(c, tiny.stand_ins(c, 8))


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


def past_float16(scale: float = 1e4):
    """The tiny Llama with layer BAD's MLP output scaled `scale` times: finite in float32,
    past float16's 65,504 (Gemma 3's fault in float16)."""
    c = tiny.checkpoint("llama", 0)
    layers = list(c.weights.layers)
    p = dict(layers[BAD].projections)
    p["down"] = p["down"] * np.float32(scale)
    layers[BAD] = attrs.evolve(layers[BAD], projections=p)
    return attrs.evolve(c, key=c.key + "-past-float16",
                        weights=attrs.evolve(c.weights, layers=tuple(layers)))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_float16_export_past_float16s_range_is_refused_naming_the_layer(device, tmp_path):
    """The export measures each layer's activations in float32 (issue 43); a float16 export
    whose peak passes float16's range with 2x headroom does not load: on the CPU it would
    decode NaN, and on cuda, where the onnx engine runs only float16, the same."""
    from river_core.settings.errors import ConfigError
    from river_onnx.backend import OnnxBackend
    from river_onnx.export import export_model

    c = past_float16()
    manifest = export_model(c, tiny.stand_ins(c, 8), tmp_path, floats="float16")
    peaks = manifest.activations
    assert all(np.isfinite(peaks)) and max(peaks[:BAD]) < 100 < 65504 / 2 < peaks[BAD]
    with pytest.raises(ConfigError, match=f"reach .* in layer {BAD} of {tiny.LAYERS}"):
        OnnxBackend(tmp_path, manifest, c.tokenizer, device)


def test_without_the_refusal_that_export_decodes_nan(tmp_path):
    """What the refusal prevents: the same float16 graphs, run anyway, give non-finite
    logits; the float32 export of the same model decodes."""
    from river_onnx.backend import OnnxBackend
    from river_onnx.export import export_model

    c = past_float16()
    for name in ("half", "full"):
        (tmp_path / name).mkdir()
    manifest = export_model(c, tiny.stand_ins(c, 8), tmp_path / "half", floats="float16")
    run = GenerationConfig(max_new_tokens=3)
    half = OnnxBackend(tmp_path / "half", attrs.evolve(manifest, activations=None),
                       c.tokenizer)
    with pytest.raises(NonFiniteError):
        RiverModel(half).generate_ids([[1, 20, 21, 22]], ExitConfig(kv="full"), run)
    full = export_model(c, tiny.stand_ins(c, 8), tmp_path / "full")
    assert full.activations is None
    RiverModel(OnnxBackend(tmp_path / "full", full, c.tokenizer)).generate_ids(
        [[1, 20, 21, 22]], ExitConfig(kv="full"), run)
