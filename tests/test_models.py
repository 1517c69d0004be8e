"""The paper's models' special fields, each where it changes the result: Llama 3's rope scaling
and tied embeddings, Phi-3's fused projections, partial rotary and LongRoPE switch, Ministral
3's YaRN and query scaling. Full depth on each engine against transformers' own model; the
conformance kit (test_conformance.py) runs these families like the others."""

import attrs
import numpy as np
import pytest
import torch

from river_core.settings.config import GenerationConfig
from river_core.settings.errors import ModelError
from river_core.loop.decode import generate_ids
from river_core.method.kv import Full
from river_core.method.predictor import relative_error
from river_conformance.kit import FULL_DEPTH_RTOL
from river_conformance.scripted import forced_logits, scripted_run
from river_conformance.fixtures import tiny
from river_models.families import llama3, ministral3, phi3

PAPER_FAMILIES = ("llama3", "phi3", "ministral3")
ENGINES = ("hf", "onnx")
rng = np.random.default_rng(0)
# longer than Phi-3's LongRoPE switch, and several of Ministral 3's query-scaling periods
LONG_PROMPT = [1] + rng.integers(3, tiny.VOCAB, 2 * phi3.SWITCH).tolist()


def _backend(engine: str, family: str, checkpoint=None):
    from river_core.plugins import default_registry

    if checkpoint is None:
        return default_registry().get("conformance backend", engine)(family, 0, 8)
    from river_torch.backend import TorchBackend

    return TorchBackend(checkpoint, tiny.stand_ins(checkpoint, 8), torch.float32)


def _reference_logits(family: str, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return tiny.model(family)(torch.tensor([ids])).logits[0].numpy()


def _full_depth_logits(backend, ids: list[int]) -> np.ndarray:
    """Logits after every position: the prompt's first token prefilled, the rest fed."""
    return np.concatenate([l.reshape(-1, tiny.VOCAB)[-1:] for l in
                           forced_logits(backend, ids[:1], ids[1:], Full())])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("family", PAPER_FAMILIES)
def test_full_depth_matches_transformers_past_every_switch(engine, family):
    """A prompt longer than the LongRoPE switch, prefilled whole (transformers then runs every
    position on the long table), then greedy decoding: the same tokens, logits within the
    kit's tolerance."""
    n = 8
    ref = tiny.model(family).generate(torch.tensor([LONG_PROMPT]), do_sample=False,
                                      max_new_tokens=n)[0]
    b = _backend(engine, family)
    ours = generate_ids(b, [LONG_PROMPT], GenerationConfig(max_new_tokens=n),
                        scripted_run(Full(), []))
    assert ours.tokens[0] == ref[len(LONG_PROMPT):].tolist()
    got = forced_logits(b, LONG_PROMPT, ref[len(LONG_PROMPT):].tolist(), Full())
    want = _reference_logits(family, ref.tolist())[len(LONG_PROMPT) - 1:]
    for step, g in enumerate(got):
        assert relative_error(g.reshape(-1, tiny.VOCAB)[-1], want[step]) <= FULL_DEPTH_RTOL


def test_longrope_switches_to_the_long_table_past_the_original_context():
    """Without its long table Phi-3 matches transformers up to the switch and not past it."""
    checkpoint = tiny.checkpoint("phi3")
    rotary = checkpoint.spec.rotary[""]
    assert rotary.switch == phi3.SWITCH and rotary.long_inv_freq != rotary.inv_freq
    assert 2 * len(rotary.inv_freq) == 12 < checkpoint.spec.head_dim   # partial rotary, 0.75
    short_only = attrs.evolve(checkpoint, spec=attrs.evolve(
        checkpoint.spec, rotary={"": attrs.evolve(rotary, long_inv_freq=())}))
    within = LONG_PROMPT[:phi3.SWITCH]
    b = _backend("hf", "phi3", short_only)
    assert relative_error(forced_logits(b, within, [], Full())[0].reshape(-1),
                          _reference_logits("phi3", within)[-1]) <= FULL_DEPTH_RTOL
    past = LONG_PROMPT[:phi3.SWITCH + 1]
    assert relative_error(forced_logits(b, past, [], Full())[0].reshape(-1),
                          _reference_logits("phi3", past)[-1]) > 100 * FULL_DEPTH_RTOL


def test_ministral3_query_scaling_changes_the_logits_from_its_first_period():
    """Without its query scaling Ministral 3 matches transformers for positions below the
    scaling's period (factor 1) and departs from it from there on."""
    checkpoint = tiny.checkpoint("ministral3")
    assert checkpoint.spec.query_scale.period == ministral3.PERIOD
    b = _backend("hf", "ministral3", attrs.evolve(
        checkpoint, spec=attrs.evolve(checkpoint.spec, query_scale=None)))
    got = _full_depth_logits(b, LONG_PROMPT[:3 * ministral3.PERIOD])
    want = _reference_logits("ministral3", LONG_PROMPT[:3 * ministral3.PERIOD])
    errors = [relative_error(g, w) for g, w in zip(got, want)]
    assert max(errors[:ministral3.PERIOD]) <= FULL_DEPTH_RTOL
    assert min(errors[ministral3.PERIOD:]) > 10 * FULL_DEPTH_RTOL


@pytest.mark.parametrize("family", ["llama3", "phi3"])
def test_tied_embeddings_are_read_as_one_matrix(family):
    w = tiny.checkpoint(family).weights
    assert w.head is w.embed


def test_llama3_rope_scaling_stretches_the_low_frequencies():
    """Llama 3.1's rope: the long wavelengths divided by the factor, the short ones kept."""
    inv_freq = np.asarray(tiny.checkpoint("llama3").spec.rotary[""].inv_freq)
    plain = 1.0 / llama3.TINY_ROPE["rope_theta"] ** (np.arange(0, 16, 2) / 16)
    assert np.isclose(inv_freq[0], plain[0])
    assert np.isclose(inv_freq[-1], plain[-1] / llama3.TINY_ROPE["factor"])


def test_phi3_fused_projections_split_into_river_projections():
    m, w = tiny.model("phi3"), tiny.checkpoint("phi3").weights
    attn = m.model.layers[0].self_attn
    fused = np.concatenate([w.layers[0].projections[n] for n in ("q", "k", "v")])
    assert np.array_equal(fused, attn.qkv_proj.weight.detach().numpy())
    gate_up = np.concatenate([w.layers[0].projections[n] for n in ("gate", "up")])
    assert np.array_equal(gate_up, m.model.layers[0].mlp.gate_up_proj.weight.detach().numpy())


@pytest.mark.parametrize("family", ["phi3", "llama3"])
def test_a_gguf_reads_back_the_rotary_transformers_gguf_loader_drops(family):
    """Phi-3's partial rotary and LongRoPE factors, Llama 3's rope frequency factors: written as
    llama.cpp's converter writes them, dropped by transformers' GGUF config, read back by River,
    so the converted model runs as the one it came from, past the LongRoPE switch."""
    from transformers import AutoConfig

    from river_conformance.fixtures.tiny_gguf import gguf_file
    from river_models.source import open_model

    path = gguf_file(0, family)
    dropped = AutoConfig.from_pretrained(path.parent, gguf_file=path.name).rope_parameters
    assert dropped["rope_type"] == "default"   # what River would have run without its reader
    converted, original = open_model(str(path)), tiny.checkpoint(family)
    assert converted.spec.rotary == original.spec.rotary
    # Phi-3's window, written, is dropped as llama.cpp's loader drops it (the tiny one's
    # 262,144 positions reach past its context: the same attention)
    assert converted.spec.windows == ((None,) * tiny.LAYERS if family == "phi3"
                                      else original.spec.windows)
    got = forced_logits(_backend("hf", family, converted), LONG_PROMPT, [], Full())[0]
    assert relative_error(got.reshape(-1), _reference_logits(family, LONG_PROMPT)[-1]) \
        <= FULL_DEPTH_RTOL


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_a_gguf_reads_back_the_head_width_and_sliding_layers_transformers_drop(family):
    """Qwen3's key_length (transformers' GGUF config takes hidden / heads) and Gemma 3's
    per-layer sliding pattern (it assumes five in six), read back by River."""
    from river_conformance.fixtures.tiny_gguf import gguf_file
    from river_models.source import open_model

    converted, original = open_model(str(gguf_file(0, family))), tiny.checkpoint(family)
    for field in ("head_dim", "windows", "rope_keys", "attn_scale", "norm_offset"):
        assert getattr(converted.spec, field) == getattr(original.spec, field), field
    got = forced_logits(_backend("hf", family, converted), LONG_PROMPT, [], Full())[0]
    assert relative_error(got.reshape(-1), _reference_logits(family, LONG_PROMPT)[-1]) \
        <= FULL_DEPTH_RTOL


def test_a_ministral_3_gguf_is_refused_in_one_line_naming_the_reader():
    """transformers reads no `mistral3` GGUF, so River has no ModelSpec for one."""
    from river_core.settings.errors import ModelError
    from river_models.source import open_model
    from river_conformance.fixtures.tiny_gguf import gguf_file

    with pytest.raises(ModelError, match="architecture mistral3 is not supported"):
        open_model(str(gguf_file(0, "ministral3")))


def test_rope_frequency_factors_that_are_no_llama3_scaling_are_refused():
    from river_core.settings.errors import ModelError
    from river_models.gguf_rope import _llama3

    config = tiny.model("llama3").config
    with pytest.raises(ModelError, match="match no llama3 rope scaling"):
        _llama3(config, np.linspace(1.0, 3.0, 8), None)


@pytest.mark.parametrize("method", ["hqq", "rtn"])
@pytest.mark.parametrize("bits", [4, 8])
def test_phi3_stand_ins_are_its_fused_matrices_quantized_whole(bits, method):
    """The stand-ins quantize q, k, v (and gate, up) as parts and stack them; that is the
    checkpoint's fused qkv_proj (gate_up_proj) quantized as stored, code for code: scales, zero
    points and HQQ's steps are per group of a row's inputs, and HQQ's early stop (the one
    whole-matrix reading) stops at the same step."""
    from river_core.settings.config import QuantSpec
    from river_models import FUSED, QuantWeight
    from river_models.quant import build_stand_ins, quantize

    checkpoint = tiny.checkpoint("phi3")
    spec = QuantSpec(bits=bits, group_size=32, method=method)
    stand_ins = build_stand_ins(checkpoint, spec)
    for layer, quantized in zip(checkpoint.weights.layers, stand_ins.layers):
        for names in (FUSED["qkv"], FUSED["gate_up"]):
            whole = quantize(np.concatenate([layer.projections[n] for n in names]), spec)
            stacked = QuantWeight.stack([quantized[n] for n in names])
            for field in ("codes", "scale", "zero"):
                assert np.array_equal(getattr(stacked, field), getattr(whole, field))


def test_a_mistral3_checkpoint_runs_its_ministral3_text_model(tmp_path):
    """Ministral-3-8B's hub checkpoint ("mistral3": text and vision) is read as its language
    model: the same spec and weights as the ministral3 model alone, full depth equal to the
    checkpoint's own transformers model on text."""
    from transformers import AutoModelForImageTextToText

    from river_models.source import model_shape, open_model

    folder = tiny.save_wrapped(tmp_path / "mistral3", "ministral3")
    checkpoint, alone = open_model(folder), tiny.checkpoint("ministral3")
    assert checkpoint.spec == alone.spec
    assert all(np.array_equal(a.projections[n], b.projections[n])
               for a, b in zip(checkpoint.weights.layers, alone.weights.layers)
               for n in a.projections)
    assert model_shape(folder).num_layers == tiny.LAYERS
    wrapper = AutoModelForImageTextToText.from_pretrained(folder)
    with torch.no_grad():
        want = wrapper(input_ids=torch.tensor([LONG_PROMPT])).logits[0, -1].numpy()
    got = forced_logits(_backend("hf", "ministral3", checkpoint), LONG_PROMPT, [], Full())[0]
    assert relative_error(got.reshape(-1), want) <= FULL_DEPTH_RTOL


@pytest.mark.parametrize("engine", ENGINES)
def test_decoding_across_the_longrope_switch_recomputes_the_sequence_on_the_long_table(engine):
    """A prompt just short of Phi-3's switch, decoded past it: every step's logits are those of
    transformers' model run on the whole sequence so far (past the switch, every position on
    the long table), because River recomputes its cache where the sequence first passes the
    switch. (transformers' own generate means to do the same, but at that step feeds only the
    newest token with no cache at all (5.19), so it is not the reference here.)"""
    prompt, n = LONG_PROMPT[:phi3.SWITCH - 3], 8
    b = _backend(engine, "phi3")
    tokens = generate_ids(b, [prompt], GenerationConfig(max_new_tokens=n),
                          scripted_run(Full(), [])).tokens[0]
    got = forced_logits(b, prompt, tokens[:-1], Full())
    assert len(prompt) + len(tokens) > phi3.SWITCH + 1   # several steps past the switch
    for step, g in enumerate(got):
        want = _reference_logits("phi3", prompt + tokens[:step])[-1]
        assert relative_error(g.reshape(-1), want) <= FULL_DEPTH_RTOL
        assert int(np.argmax(want)) == tokens[step]


@pytest.mark.parametrize("engine", ENGINES)
def test_lossless_mode_across_the_longrope_switch_gives_full_depths_tokens(engine):
    """Drafts and verification that carry the sequence past Phi-3's switch: full depth's tokens
    (the recompute runs wherever the step that first passes it is a draft or a verification)."""
    from river_core.method.kv import River
    from river_core.method.draft_length import DraftLength
    from river_core.loop.speculative import speculative_ids

    prompt, n = LONG_PROMPT[:phi3.SWITCH - 4], 8
    b = _backend(engine, "phi3")
    want = generate_ids(b, [prompt], GenerationConfig(max_new_tokens=n),
                        scripted_run(Full(), [])).tokens
    for gamma in (2, 3):
        got = speculative_ids(b, [prompt], GenerationConfig(max_new_tokens=n),
                              scripted_run(River(), [1] * 40), DraftLength(gamma))
        assert got.tokens == want


CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] | tojson }}: "
                 "{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}"
                 "{{ eos_token }}A:{% endif %}")


def test_a_saved_tokenizer_read_without_transformers_gives_transformers_ids(tmp_path):
    from transformers import AutoTokenizer

    from river_models.tokenizer import FileTokenizer, Tokenizer

    tiny.save(tmp_path)
    hf = AutoTokenizer.from_pretrained(tmp_path)
    hf.chat_template = CHAT_TEMPLATE   # special tokens, tojson, the generation prompt
    hf.save_pretrained(tmp_path)
    hf, mine = Tokenizer(hf, [2]), FileTokenizer(tmp_path, [2])
    for text in ["What is 7 * 8?", "", "  spaced  out  ", "<s> not special"]:
        assert mine.encode(text) == hf.encode(text)
        assert mine.chat(text) == hf.chat(text)
        assert mine.decode(hf.encode(text)) == hf.decode(hf.encode(text))
    assert mine.decode([1, 40, 2, 41]) == hf.decode([1, 40, 2, 41])   # specials skipped


def test_a_folder_without_a_tokenizer_is_refused_in_one_line(tmp_path):
    from river_models.tokenizer import FileTokenizer

    with pytest.raises(ModelError, match="cannot read the tokenizer"):
        FileTokenizer(tmp_path, [2])
