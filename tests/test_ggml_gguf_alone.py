"""The ggml engine starts from the GGUF alone: spec and tokenizer read from its header into the
cache, no float32 conversion, no torch or transformers; its stand-ins sit below the backbone's
precision, never beside it, or exit mode is refused in one line while lossless mode and full
depth run (issue 52)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("ggml")

from river_core import RiverModel  # noqa: E402
from river_core.settings.config import ExitConfig, GenerationConfig  # noqa: E402
from river_core.settings.errors import CapabilityError, ModelError  # noqa: E402
from river_models.cache import entries  # noqa: E402
from river_conformance.fixtures.tiny_gguf import gguf_file  # noqa: E402

from river_ggml.lib import MappedGGUF  # noqa: E402
from river_ggml.stand_ins import Choice, choose  # noqa: E402
from river_ggml.wide import random_gguf  # noqa: E402


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RIVER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_first_ggml_call_reads_the_gguf_alone(cache):
    """No converted folder, no torch or transformers, even on the first call."""
    model = str(gguf_file(0, "llama3"))
    job = ("import sys; from river_core import RiverModel; "
           f"m = RiverModel.from_pretrained({model!r}, backend='ggml'); "
           "m.generate('hi', max_new_tokens=2); "
           "print(sorted({'torch', 'transformers'} & set(sys.modules)))")
    first = subprocess.run([sys.executable, "-c", job], capture_output=True, text=True,
                           env=dict(os.environ))
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.strip() == "[]", first.stderr[-2000:]
    assert sorted({e.kind for e in entries()}) == ["ggml-stand-ins", "spec"]


def test_the_gguf_entry_is_read_back_without_reading_the_gguf_again(cache, monkeypatch):
    from river_models import gguf_spec, source

    path = gguf_file(0, "qwen2", "bpe")
    folder, spec = source.gguf_entry(path)
    assert sorted(p.name for p in folder.iterdir()) == [
        "river-cache.json", "spec.json", "tokenizer.json", "tokenizer_config.json"]
    monkeypatch.setattr(gguf_spec, "gguf_spec", None)   # a second call builds nothing
    assert source.gguf_entry(path) == (folder, spec)


@pytest.mark.parametrize("kind, want", [("F32", "Q4_0"), ("Q8_0", "Q4_0"), ("Q6_K", "Q4_0"),
                                        ("Q5_K", "Q4_0"), ("Q5_0", "Q4_0"), ("Q4_1", "Q4_0"),
                                        ("Q4_0", "Q3_K"), ("Q4_K", "Q3_K")])
def test_the_stand_ins_type_is_below_the_backbones(kind, want, tmp_path):
    path = random_gguf(tmp_path / f"{kind}.gguf", kind, 256, 512)
    assert choose(MappedGGUF(path), 2) == Choice(want, kind)


@pytest.mark.parametrize("kind", ["Q4_0", "Q3_K", "Q2_K"])
def test_where_no_lower_type_fits_exit_mode_is_refused_and_says_why(kind, tmp_path):
    hidden = 64 if kind == "Q4_0" else 256   # rows of 64: no type below 4 bits holds them
    choice = choose(MappedGGUF(random_gguf(tmp_path / "m.gguf", kind, hidden, 512)), 2)
    assert choice.kind == "Q4_0"   # still drafts for lossless mode
    why = "rows of 64 weights are not a multiple of 256" if kind == "Q4_0" else \
        f"River makes none below {'3.44' if kind == 'Q3_K' else '2.62'} bits a weight"
    assert why in choice.refused and "--mode speculative" in choice.refused


def test_a_4_bit_backbone_runs_exit_mode_on_3_bit_stand_ins(cache, tmp_path):
    model = RiverModel.from_pretrained(str(random_gguf(tmp_path / "q4.gguf", "Q4_0", 256, 512)),
                                       backend="ggml")
    stand_ins = model.backend.stand_ins.weights
    assert {stand_ins.kind(n) for n in stand_ins.tensors if n.startswith("blk.")} == {"Q3_K"}
    assert all(0.05 < e < 0.5 for e in model.backend.stand_in_error)
    assert model.generate("hello world", max_new_tokens=3).stats.num_layers == 2


def test_exit_mode_refused_lossless_and_full_depth_run(cache, tmp_path):
    model = RiverModel.from_pretrained(str(random_gguf(tmp_path / "q4.gguf", "Q4_0", 64, 128)),
                                       backend="ggml")
    with pytest.raises(CapabilityError, match=r"^exit mode needs stand-ins below the backbone's "
                                              r"Q4_0 \(4.50 bits a weight\) and its rows of 64"):
        model.generate("hello world", max_new_tokens=3)
    from river_core.plan import resolve
    from river_core.plugins import default_registry
    from river_ggml import CAPABILITIES

    # a plan resolved before the model loaded, as the CLI resolves it
    plan = resolve(ExitConfig(), default_registry(), CAPABILITIES, model.shape, "ggml")
    with pytest.raises(CapabilityError, match="^exit mode needs stand-ins below"):
        model.generate_ids([[1, 5]], plan, GenerationConfig(max_new_tokens=2))
    full = model.generate("hello world", max_new_tokens=3, kv="full").texts
    lossless = model.generate("hello world", max_new_tokens=3, mode="speculative",
                              policy="fixed", layer=-1).texts
    assert lossless == full


def test_a_truncated_gguf_is_named_and_leaves_nothing_in_the_cache(cache, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gguf_file(0, "qwen2").read_bytes()[:-1000])
    with pytest.raises(ModelError, match="truncated GGUF"):
        RiverModel.from_pretrained(str(cut), backend="ggml")
    assert [e for e in entries() if e.kind != ".locks"] == []


def test_an_interrupted_first_call_resumes_cleanly(cache):
    """A first call killed mid-build leaves only its partial folder, which the next call
    removes before building the entry whole."""
    from river_models import source

    path = gguf_file(0, "qwen2", "bpe")
    folder, spec = source.gguf_entry(path)
    partial = folder.with_name(f".partial-{folder.name}-12345")
    folder.rename(partial)   # as a killed build leaves it: no manifest's seal, not in place
    (partial / "tokenizer.json").write_text("{")
    assert source.gguf_entry(path) == (folder, spec)
    assert not partial.exists()
    assert [e.problem for e in entries() if e.kind == "spec"] == [None]
