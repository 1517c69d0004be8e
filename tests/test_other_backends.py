"""The onnx and llamacpp backends from the user's side: CLI, export cache, clear refusals."""

import importlib.util

import pytest

from river_core import ModelError
from river_cli.main import main


@pytest.fixture(scope="module")
def folder(tiny_folder):
    return tiny_folder("qwen3")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RIVER_CACHE", str(tmp_path))
    return tmp_path


def test_onnx_exports_once_and_generates(folder, cache, capsys):
    args = ["generate", "abc", "--model", folder, "--backend", "onnx", "--no-chat",
            "--max-new-tokens", "4", "-o", "min_layer=1"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "ms/token" in err and "backend onnx on CPUExecutionProvider" in err
    (export,) = (cache / "onnx").iterdir()
    stamp = (export / "manifest.json").stat().st_mtime_ns
    assert main(args + ["--kv", "propagate"]) == 0
    assert [p.name for p in (cache / "onnx").iterdir()] == [export.name]
    assert (export / "manifest.json").stat().st_mtime_ns == stamp   # not exported again
    assert main(args + ["--bits", "8"]) == 0                  # other settings: new export
    assert len(list((cache / "onnx").iterdir())) == 2
    assert not [p for p in (cache / "onnx").iterdir() if p.name.startswith(".partial")]


def test_onnx_keeps_its_optimized_graphs_and_rebuilds_a_damaged_one(folder, cache, capsys):
    """The first load writes ONNX Runtime's optimized graphs into the cache; a later load
    reads them (no optimization) and gives the same tokens; a damaged one is rebuilt with a
    one-line notice. `--json` reports the load's phases."""
    import json

    args = ["generate", "abc", "--model", folder, "--backend", "onnx", "--no-chat",
            "--max-new-tokens", "4", "--kv", "full", "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert set(first["load_phases"]) == {"imports", "export", "tokenizer", "sessions"}
    (optimized,) = (cache / "onnx-optimized").iterdir()
    stamp = (optimized / "head.onnx").stat().st_mtime_ns
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["text"] == first["text"]
    assert (optimized / "head.onnx").stat().st_mtime_ns == stamp   # read, not written again
    graph = optimized / "layer_0.onnx"
    graph.write_bytes(b"\0" * graph.stat().st_size)   # the size check cannot see it
    assert main(args) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["text"] == first["text"]
    notices = [line for line in out.err.splitlines() if "optimized graphs" in line]
    assert len(notices) == 1 and "rebuilding" in notices[0]
    assert main(args) == 0 and "optimized graphs" not in capsys.readouterr().err


def test_onnx_loads_where_the_cache_cannot_take_its_optimized_graphs(folder, cache,
                                                                     monkeypatch):
    """A read-only cache holding the export but not the optimized graphs: the sessions are
    optimized in memory, as before issue 42, instead of the load failing."""
    from river_core import ExitConfig, GenerationConfig
    from river_core.model import RiverModel
    from river_onnx import sessions

    def read_only(target, *args, **named):
        raise ModelError(f"cache at {cache} is read-only and has no {target.name}")
    monkeypatch.setattr(sessions, "cached", read_only)
    model = RiverModel.from_pretrained(folder, backend="onnx")
    out = model.generate_ids([[1, 5, 9]], ExitConfig(kv="full"), GenerationConfig(max_new_tokens=3))
    assert len(out.tokens[0]) == 3 and not (cache / "onnx-optimized").exists()


def test_onnx_int8_backbone_stays_close_and_lossless_mode_keeps_its_output(tmp_path):
    """dtype int8: the backbone's layers in 8 bits, near the float model; lossless mode's
    drafts are then checked by that int8 backbone, so its output is exactly the int8 one."""
    import numpy as np

    from river_core import ExitConfig, GenerationConfig, QuantSpec
    from river_core.model import RiverModel
    from river_conformance.fixtures import tiny
    from river_models.quant import stand_ins
    from river_onnx.backend import OnnxBackend
    from river_onnx.export import export_model

    checkpoint = tiny.checkpoint("llama", 0)
    rivers = tiny.stand_ins(checkpoint, 4)

    def model(name: str, backbone) -> RiverModel:
        manifest = export_model(checkpoint, rivers, tmp_path / name, backbone=backbone)
        return RiverModel(OnnxBackend(tmp_path / name, manifest, checkpoint.tokenizer))

    (tmp_path / "float").mkdir(), (tmp_path / "int8").mkdir()
    float32 = model("float", None)
    int8 = model("int8", stand_ins(checkpoint, QuantSpec(bits=8, group_size=32), cache=False))
    prompt = [[3, 9, 4, 7, 1, 8]]
    x, y = (m.backend.prefill(prompt, 16, None).logits for m in (float32, int8))
    assert 0 < np.abs(x - y).max() < 0.05 * np.abs(x).max()
    gen = GenerationConfig(max_new_tokens=12)
    full = int8.generate_ids(prompt, ExitConfig(kv="full"), gen).tokens
    lossless = ExitConfig(mode="speculative", policy="fixed", options={"layer": 0})
    assert int8.generate_ids(prompt, lossless, gen).tokens == full


def test_onnx_creates_no_session_inside_a_decode(folder, cache, monkeypatch):
    """Every session a plan can need (backbone layers, stand-ins, K/V projections, the tails,
    every verification width and draft window) is built with the model: from the end of the
    load to the end of generate, whatever the mode, no session is created (issue 36)."""
    import onnxruntime as ort

    from river_core import ExitConfig, GenerationConfig
    from river_core.model import RiverModel

    model = RiverModel.from_pretrained(folder, backend="onnx")
    made, session = [], ort.InferenceSession
    monkeypatch.setattr(ort, "InferenceSession",
                        lambda path, *rest, **named: made.append(path) or session(path, *rest,
                                                                                  **named))
    prompt = [[1, 5, 9, 4, 7, 8, 3, 6, 2, 9, 11]]
    speculative = dict(mode="speculative", draft_tokens=4, adaptive=True)
    for config in [ExitConfig(kv="full"), ExitConfig(options={"min_layer": 1}),
                   ExitConfig(kv="propagate", policy="fixed", options={"layer": 0}),
                   ExitConfig(kv="recompute", policy="fixed", options={"layer": 1}),
                   ExitConfig(**speculative),
                   ExitConfig(**speculative, policy="fixed", options={"layer": -1}),
                   ExitConfig(**speculative, policy="fixed", options={"layer": 0},
                              draft_window=2)]:
        rows = prompt * 2 if config.kv in ("full", "river") and config.mode == "exit" else prompt
        model.generate_ids(rows, config, GenerationConfig(max_new_tokens=12))
    assert made == []


def ort_has_cuda() -> bool:
    """onnxruntime-gpu is installed here (its CUDA provider is offered)."""
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.mark.parametrize("args, message", [
    (["--dtype", "bfloat16"], "the onnx backend runs float32 or float16 or int8 backbones"),
    pytest.param(["--device", "cuda"], "CUDAExecutionProvider", marks=pytest.mark.skipif(
        ort_has_cuda(), reason="onnxruntime here has CUDA: nothing to refuse")),
    (["--device", "cuda", "--dtype", "int8"], "runs float16 on cuda, not int8"),
])
def test_onnx_refuses_what_it_cannot_do(folder, cache, capsys, args, message):
    assert main(["generate", "abc", "--model", folder, "--backend", "onnx", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (cache / "onnx").exists()   # refused before exporting anything


needs_llamacpp = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                    reason="llama-cpp-python is not installed")


@needs_llamacpp
def test_llamacpp_runs_full_depth_and_refuses_exits(capsys):
    from river_models import default_gguf

    try:
        default_gguf()
    except ModelError as e:
        pytest.skip(str(e))
    assert main(["generate", "What is 2 + 2?", "--backend", "llamacpp"]) == 2
    assert "cannot exit early; use kv strategy 'full'" in capsys.readouterr().err
    assert main(["generate", "What is 2 + 2?", "--backend", "llamacpp", "--kv", "full",
                 "--max-new-tokens", "16"]) == 0
    out = capsys.readouterr()
    assert "4" in out.out and "ms/token" in out.err


@needs_llamacpp
def test_llamacpp_needs_a_gguf_file(folder, capsys):
    assert main(["generate", "abc", "--model", folder, "--backend", "llamacpp", "--kv",
                 "full"]) == 2
    assert "needs a .gguf file" in capsys.readouterr().err
