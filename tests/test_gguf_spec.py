"""A GGUF's ModelSpec read from its own header (river_models.gguf_spec) is the one River derives
from the same file converted through transformers, on every family's tiny GGUF; what River
cannot read is named in one line (issue 52)."""

import attrs
import numpy as np
import pytest

from river_core.settings.errors import ModelError
from river_models.gguf_header import read_header
from river_models.gguf_spec import gguf_spec
from river_conformance.fixtures.tiny_gguf import gguf_file

FAMILIES = ["llama", "mistral", "llama3", "qwen2", "qwen3", "gemma3", "phi3"]


def spec_of(path):
    return gguf_spec(path, read_header(path))


def assert_same_spec(ours, converted):
    """Equal, but for float32's rounding of a GGUF's floats (the converted ones are read back
    from the same file)."""
    def floats(value):
        if isinstance(value, float):
            return pytest.approx(value, rel=1e-6)
        if attrs.has(type(value)):
            return {k: floats(v) for k, v in attrs.asdict(value).items()}
        return value

    for field in attrs.fields(type(ours)):
        if field.name != "rotary":
            assert floats(getattr(ours, field.name)) == \
                floats(getattr(converted, field.name)), field.name
    assert ours.rotary.keys() == converted.rotary.keys()
    for key, rotary in ours.rotary.items():
        other = converted.rotary[key]
        assert (rotary.scaling, rotary.switch) == pytest.approx((other.scaling, other.switch))
        for table in ("inv_freq", "long_inv_freq"):
            np.testing.assert_allclose(getattr(rotary, table), getattr(other, table), rtol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_spec_read_from_the_gguf_is_the_converted_ones(family):
    pytest.importorskip("transformers")
    from river_models.source import open_model

    path = gguf_file(0, family)
    assert_same_spec(spec_of(path), open_model(str(path)).spec)


def test_ministral_3s_spec_read_from_its_gguf_is_its_models():
    """transformers reads no mistral3 GGUF: the reference is the tiny model itself (its YaRN
    table, its query scale)."""
    pytest.importorskip("transformers")
    from river_conformance.fixtures import tiny

    assert_same_spec(spec_of(gguf_file(0, "ministral3")), tiny.checkpoint("ministral3").spec)


def _rewritten(tmp_path, changes: dict, drop: tuple = ()):
    """The tiny llama GGUF with metadata `changes` made and keys `drop` left out."""
    import gguf
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(gguf_file(0, "llama"))
    arch = changes.get("general.architecture", "llama")
    path = tmp_path / "changed.gguf"
    writer = gguf.GGUFWriter(path, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture" \
                or field.name in drop:
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name.replace("llama.", f"{arch}.", 1), field.contents(),
                             field.types[0], sub_type=sub)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.asarray(tensor.data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_an_architecture_river_does_not_run_is_named_in_one_line(tmp_path):
    path = _rewritten(tmp_path, {"general.architecture": "mamba"})
    with pytest.raises(ModelError, match=r"^changed.gguf: general.architecture 'mamba' is not "
                                         r"one River runs from a GGUF; it runs llama, qwen2"):
        spec_of(path)


def test_a_missing_field_is_named(tmp_path):
    path = _rewritten(tmp_path, {}, drop=("llama.block_count",))
    with pytest.raises(ModelError, match=r"^changed.gguf: no llama.block_count in its metadata$"):
        spec_of(path)


