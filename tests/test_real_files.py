"""River's ggml engine on GGUFs as users have them (issue 58): every family, at its real shape's
quirks in widths K-quants fill (river_conformance.fixtures.real_gguf), written with the metadata llama.cpp's
converter writes, in the types llama-quantize makes (river_models.gguf_quantize), loaded as
`river generate --model FILE` loads it; checked per position against River's torch engine on
gguf-py's float32 dequantization of the same file, and against llama.cpp itself on the same
file where llama-cpp-python is installed. The real shapes run in `river bench real_files`."""

import functools
import re

import numpy as np
import pytest

pytest.importorskip("ggml")
pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

from river_conformance.agreement import Agreement, first_difference  # noqa: E402
from river_conformance.scripted import forced_logits, scripted_run  # noqa: E402
from river_core.settings.config import GenerationConfig  # noqa: E402
from river_core.loop.decode import generate_ids  # noqa: E402
from river_core.method.kv import Full  # noqa: E402
from river_conformance.fixtures import real_gguf  # noqa: E402
from river_models import gguf_quantize  # noqa: E402

# every family in llama.cpp's most common type; every type on a tied family with biases
# (Qwen2: the embedding is the head, Q6_K) and an untied one (Llama: the embedding in the
# file's own type, repacked where it is Q4_0, Q4_K or IQ4_NL)
TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "IQ4_NL", "IQ4_XS",
         "Q3_K_M", "Q2_K", "F16", "BF16")
CELLS = [(f, "Q4_K_M") for f in real_gguf.FAMILIES] + \
        [(f, t) for f in ("qwen2", "llama") for t in TYPES if t != "Q4_K_M"]
# against llama.cpp's greedy text: every family, and the types on the family whose embedding
# is the head; fewer cells, each a llama.cpp load and four runs
GREEDY = [(f, t) for f, t in CELLS if t == "Q4_K_M" or f == "qwen2"]
# prefill then decode, teacher-forced on fixed random tokens: 8 + 48 positions
PROMPT = np.random.default_rng(1).integers(3, 512, 8).tolist()
CONTINUATION = np.random.default_rng(2).integers(3, 512, 48).tolist()
# measured over the matrix on an AMD EPYC (AVX2): logits within 2.5e-2 of the float32
# reference (quantized activations: Q8_0/Q8_K blocks; a float16 cache), KL below 3e-3 nats;
# a wrong kernel or layout: 0.5 and more
RTOL = 5e-2
KL = 1e-2
MIN_TOP1 = 0.8


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("real-files")

    @functools.cache
    def source(family: str):
        return real_gguf.write(family, "small", folder / f"{family}-converted.gguf")

    @functools.cache
    def made(family: str, file_type: str):
        path = folder / f"{family}-{file_type}.gguf"
        return path, gguf_quantize.quantize(source(family), path, file_type)
    return made


def reference(path):
    """River's torch engine on the file's float32 dequantization (no stand-ins run)."""
    from river_core.settings.config import QuantSpec
    from river_torch.backend import TorchBackend
    from river_models import gguf_weights
    from river_models.quant import stand_ins

    checkpoint = gguf_weights.checkpoint(path)
    unused = stand_ins(checkpoint, QuantSpec(bits=8, group_size=64, method="rtn"), cache=False)
    return TorchBackend(checkpoint, unused, torch.float32)


def ggml(path):
    from river_ggml.plugin import load

    return load(str(path))


@pytest.mark.parametrize("family,file_type", CELLS)
def test_full_depth_follows_the_float32_reference_on_the_same_file(files, family, file_type):
    path, kinds = files(family, file_type)
    got = forced_logits(ggml(path), PROMPT, CONTINUATION, Full())
    want = forced_logits(reference(path), PROMPT, CONTINUATION, Full())
    a = Agreement.of(got, want)
    assert a.rel_max < RTOL and a.kl_mean < KL, a.line()
    assert not a.beyond and a.top1 >= MIN_TOP1, a.line()


def test_a_q4_k_m_file_holds_what_llama_quantize_makes(files):
    """The mix: the tied embedding Q6_K, attn_v and ffn_down Q6_K on the layers that get more
    bits (of two: the last), the rest Q4_K (the type ggml repacks: the embedding never is)."""
    _, kinds = files("qwen2", "Q4_K_M")
    assert kinds["token_embd.weight"] == "Q6_K"
    assert [kinds[f"blk.{i}.{t}.weight"] for i in (0, 1) for t in ("attn_v", "ffn_down")] == \
        ["Q4_K", "Q4_K", "Q6_K", "Q6_K"]
    assert kinds["blk.0.attn_q.weight"] == kinds["blk.1.ffn_gate.weight"] == "Q4_K"
    assert kinds["blk.0.attn_norm.weight"] == kinds["blk.0.attn_q.bias"] == "F32"
    _, untied = files("llama", "Q4_0")
    assert untied["token_embd.weight"] == "Q4_0" and untied["output.weight"] == "Q6_K"


def test_the_gemma_3_file_carries_no_sliding_pattern_and_runs(files):
    """llama.cpp's converter writes Gemma 3's window but not which layers slide; the loader
    takes five in six, and so does River (the file ran, refused, before issue 58)."""
    from river_models.gguf_header import read_header

    path, _ = files("gemma3", "Q4_K_M")
    meta = read_header(path).metadata
    assert "gemma3.attention.sliding_window" in meta
    assert not any("sliding_window_pattern" in k for k in meta)
    assert ggml(path).windows == (16, 16, 16, 16, 16, None)


@pytest.mark.parametrize("family,file_type", CELLS)
def test_llama_quantizes_each_tensor_as_river_does(files, family, file_type, tmp_path):
    """River's mix against llama.cpp's own quantizer (llama_model_quantize) on the same F16
    file: the same type for every tensor."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from gguf import GGUFReader

    path, kinds = files(family, file_type)
    ours = tmp_path / "llama.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{file_type}")
    params.nthread = 2
    source = path.parent / f"{family}-converted.gguf"
    assert llama_cpp.llama_model_quantize(str(source).encode(), str(ours).encode(),
                                          params) == 0
    theirs = {t.name: t.tensor_type.name for t in GGUFReader(ours).tensors}
    assert theirs == kinds


@pytest.mark.parametrize("family,file_type", GREEDY)
def test_greedy_text_is_llama_cpps_on_the_same_file(files, family, file_type):
    """32 greedy tokens from River's ggml engine and from llama.cpp (a float16 cache through
    flash attention, as llama.cpp's tools run), both a token a step from a one-token prompt
    (llama.cpp's binding evaluates one token at a time here): the same text, its logits
    within each other's noise at every position. On this project's AMD EPYC the two are
    bitwise equal; another CPU's kernels may round apart, so a parting at a near tie is
    allowed and the logits' bound is RTOL."""
    pytest.importorskip("llama_cpp")
    from river_llamacpp.backend import LlamaCppBackend
    from river_llamacpp.plugin import open_llama

    path, _ = files(family, file_type)
    llm, layers = open_llama(path, 256, exact=False)
    engines = (ggml(path), LlamaCppBackend(llm, layers, path))
    config = GenerationConfig(max_new_tokens=32, ignore_eos=True)
    ours, theirs = (generate_ids(b, [PROMPT[:1]], config, scripted_run(Full(), [])).tokens[0]
                    for b in engines)
    at = first_difference(ours, theirs)
    forced = theirs[:-1] if at is None else theirs[:at]
    a = Agreement.of(*(forced_logits(b, PROMPT[:1], forced, Full()) for b in engines))
    assert a.rel_max < RTOL and not a.beyond, a.line()
    assert at is None or a.near_ties, f"parted at token {at}: {a.line()}"


def _patched(source, target, name: str, field: str, value: int):
    """`source` copied to `target` with tensor `name`'s info changed: `field` "row" (its
    first dimension) or "offset" (where its bytes start, relative to the data)."""
    import struct

    data = bytearray(source.read_bytes())
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.index(key) + len(key)
    dims = struct.unpack_from("<I", data, at)[0]
    where = at + 4 if field == "row" else at + 4 + 8 * dims + 4
    struct.pack_into("<Q", data, where, value)
    target.write_bytes(bytes(data))
    return target


def _rekeyed(source, target, key: str, value):
    """`source` rewritten to `target` with metadata `key` set to `value` (its type as
    gguf-py writes a Python value of that type)."""
    import gguf

    reader = gguf.GGUFReader(source)
    arch = value if key == "general.architecture" else \
        reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(target, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        if field.name == key:
            w.add_key_value(key, value, gguf.GGUFValueType.get_type(value))
        else:
            w.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    for t in reader.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return target


@pytest.mark.parametrize("damage,message", [
    ("row", r"tensor blk\.0\.attn_q\.weight has rows of 48 values, not whole blocks of 32"),
    ("offset", r"bad\.gguf: tensor \S+ \(\d+ bytes by its type and shape\) runs into tensor "
               r"\S+: damaged"),
    ("key", r"qwen2\.block_count is 'two', not an integer"),
    ("arch", r"general\.architecture 'mamba' is not one River runs from a GGUF"),
])
def test_a_damaged_or_foreign_file_is_named_in_one_line_and_nothing_is_cached(
        files, tmp_path, monkeypatch, capsys, damage, message):
    from river_cli.main import main

    path, _ = files("qwen2", "Q4_0")
    bad = tmp_path / "bad.gguf"
    if damage in ("row", "offset"):
        _patched(path, bad, "blk.0.attn_q.weight", damage, 48 if damage == "row" else 0)
    else:
        _rekeyed(path, bad, *(("qwen2.block_count", "two") if damage == "key"
                              else ("general.architecture", "mamba")))
    cache = tmp_path / "cache"
    monkeypatch.setenv("RIVER_CACHE", str(cache))
    assert main(["generate", "hi", "--model", str(bad), "--kv", "full"]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and len(err.strip().splitlines()) == 1, err
    assert not [p for p in cache.rglob("*") if p.is_file() and ".locks" not in p.parts]


def test_the_load_self_check_names_a_layout_read_wrong(files, monkeypatch):
    """The bug of issue 58 put back (the embedding repacked, then read by get_rows): the
    load's self-check names it in one line, before any answer."""
    from river_core.settings.errors import ModelError
    from river_ggml import lib

    path, _ = files("llama", "Q4_0")   # an untied embedding in Q4_0, a type ggml repacks
    lib.MappedGGUF(path).self_check()
    monkeypatch.setattr(lib, "EMBEDDING", "no tensor")   # placed as any other weight
    broken = lib.MappedGGUF(path)
    monkeypatch.undo()
    with pytest.raises(ModelError, match=r"^llama-Q4_0\.gguf: ggml's q4_0 row read \(as stored"
                                         r"\) on token_embd\.weight is off the type's own "
                                         r"dequantization by (nan|\d)"):
        broken.self_check()
