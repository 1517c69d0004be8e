"""The family records (river_models.families) agree with each other, with transformers' own
models and with docs/models.md's table; vLLM's classes are the ones named for each family."""

import re
from pathlib import Path

import pytest

from river_models.families import BY_MODEL_TYPE, BY_NAME, FAMILIES, WRAPPERS

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_each_name_model_type_and_architecture_reads_as_one_family():
    assert len(BY_NAME) == len(FAMILIES)
    assert sum(len(f.model_types) for f in FAMILIES) == len(BY_MODEL_TYPE)
    for arch in {f.gguf.arch for f in FAMILIES}:   # every written architecture reads back
        assert sum(f.gguf.reads_back for f in FAMILIES if f.gguf.arch == arch) == 1, arch
    assert set(WRAPPERS.values()) <= set(BY_MODEL_TYPE)
    for f in FAMILIES:   # one architecture, one vLLM class (a variant serves as its base)
        assert {g.vllm for g in FAMILIES if g.architecture == f.architecture} == {f.vllm}


def test_each_record_names_what_its_readers_and_writers_know():
    from river_models.gguf_convention import KEYS
    from river_models.gguf_tokenizer import SPM_KINDS

    for f in FAMILIES:
        assert set(f.gguf.keys) <= set(KEYS), f.name
        assert f.gguf.tokenizer in SPM_KINDS, f.name
        assert f.vllm is None or re.fullmatch(r"\w+:\w+", f.vllm), f.name
        assert not f.gguf.sliding_period or "rope.freq_base_swa" in f.gguf.defaults, f.name


@pytest.mark.parametrize("name", list(BY_NAME))
def test_each_record_describes_its_tiny_transformers_model(name):
    """What the GGUF side takes from the record (the block's quirks no key holds) is what
    transformers' own model of the family does."""
    pytest.importorskip("transformers")
    from river_conformance.fixtures import tiny

    family, model = BY_NAME[name], tiny.model(name)
    spec, layer = tiny.checkpoint(name).spec, tiny.checkpoint(name).weights.layers[0]
    assert type(model).__name__ == family.architecture
    assert type(model.config).__name__ == family.config_class
    assert BY_MODEL_TYPE[model.config.model_type].config_class == family.config_class
    assert (spec.activation, spec.norm_offset, spec.sandwich, spec.qk_norm) == \
        (family.activation, family.norm_offset, family.sandwich, family.qk_norm)
    assert (spec.embed_scale != 1.0, bool(layer.biases), spec.query_scale is not None) == \
        (family.embed_scaled, family.qkv_bias, family.query_scale)
    assert hasattr(model.model.layers[0].self_attn, "qkv_proj") == family.fused
    assert (set(spec.rope_keys) != {""}) == family.rope_per_layer_type


def _table() -> list[list[str]]:
    """docs/models.md's family table: its rows' cells, the header's first."""
    text = (DOCS / "models.md").read_text().split("## Families and engines", 1)[1]
    lines = [line for line in text.split("\n\n") if line.startswith("| family")][0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines.splitlines()]
    return [rows[0]] + rows[2:]


def test_the_docs_family_table_is_the_registrys():
    """One row a family (or several, comma-separated), named by model type (a variant without
    one by its name); "no" inside vLLM where the family has no vLLM class; llama.cpp named
    under ggml where it computes the tiny model as transformers does."""
    header, *rows = _table()
    vllm, ggml = header.index("inside vLLM"), header.index("ggml")
    named = {}
    for row in rows:
        for name in row[0].split("(")[0].split(","):
            named[name.strip()] = row
    assert set(named) == {n for f in FAMILIES for n in f.model_types or (f.name,)}
    for f in FAMILIES:
        row = named[(f.model_types or (f.name,))[0]]
        assert (row[vllm] == "no") == (f.vllm is None), f.name
        assert ("llama.cpp" in row[ggml]) == (f.llamacpp_differs is None), f.name


def test_vllms_river_classes_keep_their_names():
    """The classes a server names in --hf-overrides (docs/usage.md, docs/scaling.md)."""
    from river_vllm import ARCHITECTURES

    assert ARCHITECTURES == {
        "LlamaForCausalLM": "RiverLlamaForCausalLM", "Qwen2ForCausalLM": "RiverQwen2ForCausalLM",
        "Qwen3ForCausalLM": "RiverQwen3ForCausalLM", "Phi3ForCausalLM": "RiverPhi3ForCausalLM",
        "Ministral3ForCausalLM": "RiverMinistral3ForCausalLM"}
