"""The ggml engine (river_ggml) on tiny GGUFs written as llama.cpp's converter writes them:
parity with transformers, its stand-ins carry River's own quantization, one graph per shape,
and bad input named in one line. The conformance kit runs it as the `ggml` subject."""

import numpy as np
import pytest

pytest.importorskip("ggml")
torch = pytest.importorskip("torch")

from river_core.contract.backend import Step  # noqa: E402
from river_core.settings.config import QuantSpec  # noqa: E402
from river_core.settings.errors import ModelError  # noqa: E402
from river_conformance.fixtures import tiny  # noqa: E402
from river_models.quant import quantize  # noqa: E402
from river_conformance.fixtures.tiny_gguf import gguf_file  # noqa: E402

from river_ggml.lib import MappedGGUF, g  # noqa: E402
from river_ggml.plugin import tiny_backend  # noqa: E402
from river_llamacpp.plugin import DIFFERS  # noqa: E402
from river_ggml.stand_ins import q4_0, q4_1, q8_0  # noqa: E402

PROMPT = [5, 9, 23, 40, 7, 11, 3, 30]
# long enough that ggml's flash attention takes its tiled path for the prompt, which reads the
# hidden slots of the key bucket too
LONG = np.random.default_rng(0).integers(3, 90, 80).tolist()
# float16 K/V and flash attention's float16 products, against transformers' float32 (the
# kit's float16 precision bounds logits at 3e-2 of their norm)
RTOL = 3e-2


def reference(family: str, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return tiny.model(family, 0)(torch.tensor([ids])).logits[0].numpy()


def close(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("family", tiny.FAMILIES)
@pytest.mark.parametrize("prompt", [PROMPT, LONG], ids=["short", "long"])
def test_prefill_and_decode_match_transformers(family, prompt):
    backend = tiny_backend(family, 0, 4)
    want = reference(family, prompt)
    got = backend.prefill([prompt[:-1]], 128).logits[0]
    assert close(got, want[-2]) < RTOL
    assert close(backend.decode([prompt[-1]], Step(len(prompt) - 1))[0], want[-1]) < RTOL


# the tiny families llama.cpp computes as transformers does (river_llamacpp.plugin.DIFFERS)
AS_LLAMA_CPP = [f for f in tiny.FAMILIES if f not in DIFFERS]


@pytest.mark.parametrize("family", AS_LLAMA_CPP)
@pytest.mark.parametrize("prompt", [PROMPT, LONG], ids=["short", "long"])
def test_full_depth_matches_llama_cpps_own_logits_on_the_same_gguf(family, prompt):
    """Both with float16 K/V, llama.cpp token by token: measured at most 6.4e-3 apart (each is
    as far from transformers); a wrong or missing op shows as 0.1 and more."""
    pytest.importorskip("llama_cpp")
    from river_llamacpp.plugin import tiny_backend as llama_cpp

    def full_depth(backend) -> list[np.ndarray]:   # the prompt's last two positions
        return [backend.prefill([prompt[:-1]], 128).logits[0],
                backend.decode([prompt[-1]], Step(len(prompt) - 1))[0]]

    ours = full_depth(tiny_backend(family, 0, 4))
    theirs = full_depth(llama_cpp(family, 0, 4, exact=False))
    assert all(close(a, b) < 1e-2 for a, b in zip(ours, theirs))


@pytest.mark.parametrize("family", tiny.FAMILIES)
def test_extend_matches_decoding_token_by_token(family):
    backend = tiny_backend(family, 0, 4)
    backend.prefill([PROMPT[:3]], 64)
    extended = backend.extend(PROMPT[3:], 3)
    backend.prefill([PROMPT[:3]], 64)
    stepped = [backend.decode([t], Step(3 + k))[0] for k, t in enumerate(PROMPT[3:])]
    assert close(extended, np.stack(stepped)) < 5e-3


@pytest.mark.parametrize("family", ["llama3", "phi3"])
def test_a_batch_prefills_each_row_as_it_runs_alone(family):
    """Rows of different lengths (left-padded) in one graph; Phi-3's rows past and short of
    its LongRoPE switch (48) take different rotary tables, so they run row by row."""
    prompts = [LONG[:60], PROMPT, LONG[:30]]
    batched = tiny_backend(family, 0, 4).prefill(prompts, 128).logits
    alone = tiny_backend(family, 0, 4)
    for row, prompt in enumerate(prompts):
        assert close(batched[row], alone.prefill([prompt], 128).logits[0]) < 5e-3


def test_a_subset_of_rows_runs_row_by_row_as_in_the_whole_batch():
    """Rows that left at other layers: layer i, the stand-ins' tail and the K/V projection on
    some rows, each over its own row of the cache, give those rows what the one graph over
    every row gives them, and leave the others as they were."""
    backend = tiny_backend("qwen2", 0, 4)
    backend.prefill([PROMPT, PROMPT[:5], PROMPT[:3]], 64)
    p = backend.begin([7, 9, 11], Step(len(PROMPT)))
    h = backend.embed(p)
    every, _ = backend.layer(p, 0, h, None)
    some, _ = backend.layer(p, 0, h, [0, 2])
    assert close(some[[0, 2]], every[[0, 2]]) < 1e-6 and np.array_equal(some[1], h[1])
    every = backend.stand_in_tail(p, 1, h, None)
    some = backend.stand_in_tail(p, 1, h, [1])
    assert close(some[1], every[1]) < 1e-6 and np.array_equal(some[[0, 2]], h[[0, 2]])
    backend.project_kv(p, 3, h, None)
    k = backend.cache.k[3].copy()
    backend.cache.k[3, 1] = 0
    backend.project_kv(p, 3, h, [1])
    assert np.array_equal(backend.cache.k[3, 1, :, len(PROMPT)], k[1, :, len(PROMPT)])


def test_graphs_live_as_long_as_their_shape():
    """A graph is built once per shape and kept while steps of that shape run; a prefill
    chunk's wide graph is gone once decoding begins, and decoding's graphs and their memory
    do not grow with the steps or the generations at one context."""
    from river_ggml.backend import KEPT_WIDTH

    backend = tiny_backend("qwen2", 0, 4)

    def generation() -> list[tuple]:
        backend.prefill([LONG[:40]], 64)
        kept = []
        for k in range(6):
            backend.decode([7], Step(40 + k))
            kept.append(sorted(map(str, backend._graphs)))
        return kept

    first = generation()
    assert all(key[0] <= KEPT_WIDTH for key in backend._graphs)   # the prefill's 40 are gone
    assert first[1:] == first[:-1]   # one set of graphs from the first step on
    memory = sum(g.lib.ggml_gallocr_get_buffer_size(graph.alloc, 0)
                 for graph in backend._graphs.values())
    assert generation() == first
    assert sum(g.lib.ggml_gallocr_get_buffer_size(graph.alloc, 0)
               for graph in backend._graphs.values()) == memory
    # full depth decodes as one graph from the ids to the logits (the head's own graph is
    # the prefill's, for its last token)
    assert sorted(key[2] for key in backend._graphs) == ["head", "span"]


def test_a_prefill_in_chunks_is_the_prefill_in_one_pass():
    """The engine prefills in chunks of `prefill_chunk` tokens, each chunk one graph that
    also gives every layer's cosines: the logits, the K/V and the similarities the exit rule
    reads are those of one pass layer by layer."""
    from river_core.contract.layer_engine import LayerEngine

    chunked, whole = tiny_backend("qwen2", 0, 4), tiny_backend("qwen2", 0, 4)
    chunked.prefill_chunk = 16
    whole.prefill_chunk = None
    whole.prefill_layers = lambda p, exit: LayerEngine.prefill_layers(whole, p, exit)
    for prefill_exit in (None, 2):
        a = chunked.prefill([LONG[:50], LONG[10:40]], 64, prefill_exit)
        b = whole.prefill([LONG[:50], LONG[10:40]], 64, prefill_exit)
        assert close(a.logits, b.logits) < 1e-3
        assert np.abs(a.similarity - b.similarity).max() < 1e-4
        assert close(chunked.cache.k[..., :50, :].astype(np.float32),
                     whole.cache.k[..., :50, :].astype(np.float32)) < 1e-3


def test_the_stand_ins_are_rivers_own_quantization_in_ggml_blocks():
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    w = np.random.default_rng(0).standard_normal((16, 128)).astype(np.float32)
    q4 = quantize(w, QuantSpec(bits=4, group_size=64, method="hqq"))
    q8 = quantize(w, QuantSpec(bits=8))
    # the same codes; scales and offsets rounded to float16 (relative 2^-11)
    sym = quantize(w, QuantSpec(bits=4, group_size=64, method="sym"))
    assert close(dequantize(q4_1(q4), Q.Q4_1), q4.dequantize()) < 1e-3
    assert close(dequantize(q8_0(q8), Q.Q8_0), q8.dequantize()) < 1e-3
    assert close(dequantize(q4_0(sym), Q.Q4_0), sym.dequantize()) < 1e-3


def test_its_own_stand_ins_are_q4_0_repacked_as_llama_cpp_loads_them():
    from river_ggml.lib import g, repack_buffer_type

    backend = tiny_backend("llama3", 0, 4, method="sym")
    weights = backend.stand_ins.weights
    kinds = {weights.kind(n) for n in weights.tensors if n.startswith("blk.")}
    assert kinds == {"Q4_0"}
    if repack_buffer_type() is None or not g.ggml_cpu_has_avx2():
        pytest.skip("this CPU's ggml repacks no Q4_0")
    buffers = {g.lib.ggml_backend_buffer_get_type(weights.get(n).contents.buffer)
               for n in weights.tensors if n.startswith("blk.")}
    assert buffers == {repack_buffer_type()}
    # and it runs: the same stand-ins read from the file (the host's copy) agree
    backend.prefill([PROMPT], 64, prefill_exit=-1)
    assert np.isfinite(backend.cache.k[:, :, :, :len(PROMPT)]).all()


@pytest.mark.parametrize("method", ["hqq", "sym"])
def test_a_span_of_layers_in_one_graph_is_those_layers_in_turn(method):
    """The exit river's tail and full depth run as one graph each; the same numbers as the
    layers one by one, and the same K/V written."""
    backend = tiny_backend("qwen2", 0, 4, method=method)
    backend.prefill([PROMPT], 64)
    p = backend.begin([7], Step(len(PROMPT)))
    h = backend.embed(p)
    one_by_one = h
    for i in range(1, backend.num_layers):
        one_by_one = backend.stand_in_layer(p, i, one_by_one, None)
    k = backend.cache.k.copy()
    backend.cache.k[:, :, :, len(PROMPT)] = 0
    spanned = backend.stand_in_tail(p, 1, h, None)
    assert np.array_equal(spanned, one_by_one)
    assert np.array_equal(backend.cache.k, k)


def test_stand_in_errors_are_the_relative_weight_error():
    backend = tiny_backend("llama3", 0, 4)
    assert all(0.01 < e < 0.2 for e in backend.stand_in_error)


def test_a_truncated_gguf_is_named_in_one_line(tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gguf_file(0, "qwen2").read_bytes()[:-1000])
    with pytest.raises(ModelError, match="truncated GGUF"):
        MappedGGUF(cut)


def test_an_architecture_ggml_does_not_run_is_refused(tmp_path):
    from river_ggml.blocks import rope_mode

    with pytest.raises(ModelError, match="runs GGUF architectures llama, qwen2, qwen3"):
        rope_mode("mamba")


def test_a_tensor_type_it_does_not_run_is_named(tmp_path):
    import gguf

    path = tmp_path / "iq.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_tensor("token_embd.weight", np.zeros((4, 66), np.uint8),
                 raw_dtype=gguf.GGMLQuantizationType.TQ2_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match="TQ2_0|tq2_0"):
        MappedGGUF(path)


def test_its_head_stand_in_is_ggml_q8_0_with_a_scale_per_block(tmp_path, monkeypatch):
    """A head's columns differ in range, so a scale per block of 32 (ggml's own Q8_0) holds it
    far closer than one per row. ggml's quantizer makes it from the file's head a slice of
    rows at a time: the blocks gguf-py's reference Q8_0 makes of the whole."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize, quantize as reference_q8_0

    from river_ggml import stand_ins

    w = np.random.default_rng(0).standard_normal((80, 256)).astype(np.float32)
    w[:, 5] *= 30   # one outlying column, as token embeddings have
    path = tmp_path / "head.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("token_embd.weight", w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    monkeypatch.setattr(stand_ins, "HEAD_ROWS", 32)   # three slices
    blocks, kind = stand_ins._head(MappedGGUF(path))
    per_row = q8_0(quantize(w, QuantSpec(bits=8)))
    assert kind == "Q8_0"
    assert close(dequantize(blocks, Q.Q8_0), w) < close(dequantize(per_row, Q.Q8_0), w) / 2
    assert np.allclose(dequantize(blocks, Q.Q8_0), dequantize(reference_q8_0(w, Q.Q8_0), Q.Q8_0),
                       rtol=0, atol=1e-6 * np.abs(w).max())


def test_its_ggml_is_built_as_llama_cpp_builds_it():
    """llamafile's sgemm (the README's install asks for it): the kernel of a product of
    several columns, which prefill and verification are; without it ggml takes its per-dot
    path, which costs more a column."""
    from river_ggml.lib import has_sgemm

    assert has_sgemm()
