"""River inside vLLM (extra `vllm`): a real vLLM engine, and a real `vllm serve` on loopback
queried by the openai client, on tiny random models whose heads vLLM's CPU kernels take (a
Llama, and one of each family River's vLLM classes run)."""

import json
import os
import re
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # engines in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")           # GiB, not most of the RAM

import pytest  # noqa: E402

# vLLM's own package (benchmarks/vllm.py, last on sys.path once test_benchmarks ran, is not)
pytest.importorskip("vllm.entrypoints", reason="River inside vLLM needs the vllm extra (README)")

from river_core import ConfigError, ExitConfig, GenerationConfig, RiverModel  # noqa: E402
from river_conformance.fixtures import tiny  # noqa: E402
from river_models.families import ministral3, phi3  # noqa: E402

PROMPTS = [[1, 20, 21, 22], [1, 30, 31], [1, 40, 41, 42, 43, 44]]
NEW = 12
EXITING = {"policy": "settled", "options": {"tau": -1.0, "min_layer": 1}}   # all leave after 1
FULL_DEPTH = {"policy": "settled", "options": {"tau": 1.0}}   # River's walk, nobody leaving
# past the tiny models' switches: Phi-3's LongRoPE (48) and Ministral 3's query scaling (16)
PAST_SWITCH = [[1, *range(20, 60)]]
CONTEXT = 256
# vLLM's Phi-3 rotary takes LongRoPE's long table at every position once max_model_len exceeds
# the original context (transformers and River's own engines: once a sequence passes it), so
# a comparison with River's own engine keeps a Phi-3 context within the original one
OWN_ENGINES_CONTEXT = {"phi3": phi3.SWITCH}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """family -> a tiny random model whose heads vLLM's CPU kernels take, as a folder."""
    from river_conformance.fixtures import tiny

    made = {}

    def save(family: str) -> str:
        if family not in made:
            path = tmp_path_factory.mktemp(f"tiny-serving-{family}")
            tiny.model(family, serving=True).save_pretrained(path)
            tokenizer = tiny.tokenizer()
            tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
            tokenizer.save_pretrained(path)
            made[family] = str(path)
        return made[family]
    return save


@pytest.fixture(scope="module")
def folder(folders):
    return folders("llama")


def _model_config(folder) -> dict:
    return json.loads(Path(folder, "config.json").read_text())


def _own_engines_context(folder) -> int:
    return OWN_ENGINES_CONTEXT.get(_model_config(folder)["model_type"], CONTEXT)


def _vllm_tokens(folder, overrides, prompts=PROMPTS, context=None) -> list[list[int]]:
    """Greedy tokens of `prompts` from a vLLM engine given `overrides` (hf_overrides) and
    max_model_len `context` (default: one within which River's own engines agree)."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=folder, dtype="float32", enforce_eager=True, hf_overrides=overrides or None,
              max_model_len=context or _own_engines_context(folder))
    try:
        out = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(max_tokens=NEW, temperature=0.0))
        return [list(o.outputs[0].token_ids) for o in out]
    finally:
        llm.llm_engine.engine_core.shutdown()


def _vllm_greedy(folder, river=None, prompts=PROMPTS, context=None):
    """vLLM plain (`river` None) or River inside vLLM with the settings `river`, each given
    the model as its config defines it (Ministral 3's query scaling spelled out for vLLM)."""
    from river_vllm import model_overrides, query_scaling

    config = _model_config(folder)
    overrides = query_scaling(config) if river is None else \
        {**model_overrides(config), "river": river}
    return _vllm_tokens(folder, overrides, prompts, context)


def _river_greedy(folder, config, prompts=PROMPTS):
    model = RiverModel.from_pretrained(folder)
    return model.generate_ids(prompts, config, GenerationConfig(max_new_tokens=NEW)).tokens


@pytest.mark.parametrize("family", ["llama", "phi3", "ministral3"])
def test_vllm_plain_and_river_full_depth_agree(folders, family):
    folder = folders(family)
    assert _vllm_greedy(folder) == _river_greedy(folder, ExitConfig(kv="full"))


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "phi3", "ministral3"])
def test_river_inside_vllm_exits_as_rivers_own_engine_does(folders, family):
    """Every decoding token leaves after layer 1 and runs the stand-ins, whose K/V go into
    vLLM's paged cache: the same tokens as River's hf engine with the same stand-ins."""
    folder = folders(family)
    inside = _vllm_greedy(folder, EXITING)
    river = _river_greedy(folder, ExitConfig(**EXITING))
    assert all(_keeps_to(folder, prompt, got, want)
               for prompt, got, want in zip(PROMPTS, inside, river))
    assert inside != _river_greedy(folder, ExitConfig(kv="full"))   # the exits changed it


def _keeps_to(folder, prompt, got, want) -> bool:
    """vLLM's CPU kernels and torch's round differently (by the CPU's vector units), and the
    stand-ins' int4 kernel takes bfloat16 activations, so greedy tokens may part where River's
    own engine had a near tie within bfloat16's rounding (2^-8): the kit's rule
    (`Precision.keeps_to`) over River's own logits, teacher-forced along its own tokens. Seen
    on an AMD EPYC (AVX2): ministral3's last token, top two logits 0.0034 apart of 3.69."""
    import attrs

    from river_conformance.kit import FLOAT32

    model = RiverModel.from_pretrained(folder)
    forced = lambda: model.teacher_force([prompt], [want], ExitConfig(**EXITING))[0].logits
    return attrs.evolve(FLOAT32, near_ties=True).keeps_to(got, want, forced, 2 ** -8)


def test_past_phi3s_switch_river_inside_vllm_follows_vllms_longrope_rule(folders):
    """With a context longer than the original one, vLLM's Phi-3 rotary takes the long table
    at every position, short prompts included, where transformers and River's own engines
    take the short one until a sequence passes the original context: River's walk inside vLLM
    takes vLLM's rotary, so its full depth is vLLM plain's, not River's own engine's."""
    folder = folders("phi3")
    prompts = PROMPTS + PAST_SWITCH
    plain = _vllm_greedy(folder, prompts=prompts, context=CONTEXT)
    assert _vllm_greedy(folder, FULL_DEPTH, prompts, CONTEXT) == plain
    assert plain != _river_greedy(folder, ExitConfig(kv="full"), prompts)


def test_past_ministral3s_original_context_river_inside_vllm_scales_queries(folders):
    """Ministral 3's query scaling grows from the original context on. vLLM ignores it in a
    Hugging Face config (so vLLM plain given the folder as it is differs from transformers
    there); River's overrides spell it out, and River's exits inside vLLM then give River's own
    engine's tokens past it, as vLLM plain then gives full depth's."""
    folder = folders("ministral3")
    full = _river_greedy(folder, ExitConfig(kv="full"), PAST_SWITCH)
    assert _vllm_tokens(folder, None, PAST_SWITCH) != full
    assert _vllm_greedy(folder, prompts=PAST_SWITCH) == full
    assert _vllm_greedy(folder, EXITING, PAST_SWITCH) == \
        _river_greedy(folder, ExitConfig(**EXITING), PAST_SWITCH)


def test_river_scales_queries_by_vllms_rule():
    """River's forward scales Ministral 3's queries by River's rule (`query_factors`), not by
    calling vLLM's private `MistralAttention._get_llama_4_attn_scale`; this fails when vLLM's
    method changes or moves, so that River's copy is checked again."""
    from types import SimpleNamespace

    import torch
    from vllm.model_executor.models.mistral import MistralAttention

    from river_models.spec import QueryScale
    from river_compute.torch_blocks import query_factors

    qs, positions = QueryScale(0.1, 16), torch.arange(0, 300)
    attention = SimpleNamespace(llama_4_scaling_beta=qs.beta,
                                llama_4_scaling_original_max_position_embeddings=qs.period)
    assert torch.equal(query_factors(qs, positions).unsqueeze(-1),
                       MistralAttention._get_llama_4_attn_scale(attention, positions))


HONOURED = {"fixed after layer 2": {"policy": "fixed", "options": {"layer": 2}},
            "the paper's rule from layer 3": {"policy": "settled",
                                              "options": {"tau": -1.0, "min_layer": 3}},
            "confidence (early logits)": {"policy": "confidence",
                                          "options": {"threshold": 0.05, "min_layer": 1}}}


def test_river_inside_vllm_walks_the_cores_walk_with_every_policy_it_allows(folder):
    """One walk for every engine: a policy and its options change vLLM's exits as they change
    River's own engine's (its output, token for token, over the same stand-ins), the early
    logits included."""
    outputs = [_vllm_greedy(folder, river) for river in HONOURED.values()]
    for river, inside in zip(HONOURED.values(), outputs):
        assert inside == _river_greedy(folder, ExitConfig(**river)), river
    assert len({json.dumps(o) for o in outputs}) == len(outputs)   # each option mattered


@pytest.mark.parametrize("river, message", [
    ({"policy": "budget"}, "keeps state per sequence"),
    ({"kv": "monotonic"}, "keeps state per sequence"),
    ({"options": {"momentum": 0.5}}, "momentum of the 'transition' predictor would have no "
                                     "effect"),
    ({"policy": "cascade"}, "reruns doubtful tokens"),
    ({"kv": "propagate"}, "does not support the 'propagate' kv strategy"),
    ({"bitz": 4}, "unknown River settings ['bitz']"),
    ({"exit_head": "stand-in"}, "gives every token the model's own head"),
])
def test_what_vllm_cannot_honour_is_refused_before_it_starts(river, message):
    """Refused by the same resolution as in River's own engines, against vLLM's declared
    capabilities (no state per sequence, no rerun of chosen rows): never silently dropped."""
    from river_core import ModelShape, default_registry, resolve

    from river_vllm import CAPABILITIES, settings

    with pytest.raises(Exception, match=re.escape(message)):
        exit_config, _ = settings(river)
        resolve(exit_config, default_registry(), CAPABILITIES, ModelShape(6, 256), "vllm")


PORT, LOSSLESS_PORT = 8791, 8792


def _serve(folder, port: int, args: list[str], log: Path):
    """`river serve` on loopback with `args`, its engine in its own process, as a user runs
    it: the (command, port, log, env) river_bench.evaluate.servers starts."""
    import sys

    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    return ([sys.executable, "-m", "river_cli.main", "serve", folder, *args, "--vllm",
             f"--host 127.0.0.1 --port {port} --max-model-len 256"], port, log, env)


def _client(port: int):
    from openai import OpenAI

    return OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def served(folder, tmp_path_factory):
    """River's exit mode served (every token leaving after layer 1), and its lossless mode
    (drafts leaving after layer 1, vLLM verifying), both started at once (their starts overlap
    on two cores: the suite's time)."""
    from river_bench.evaluate import servers

    log = tmp_path_factory.mktemp("serve")
    # a fixed draft length: the adaptive one follows timing, and with it how many random draws
    # a seeded request's verification takes, so seeded samples would not repeat
    lossless = ["--mode", "speculative", "--policy", "settled", "-o", "tau=-1", "-o",
                "min_layer=1", "--no-adaptive-draft", "--step-aside-above", "64"]
    with servers([_serve(folder, PORT, ["-o", "tau=-1", "-o", "min_layer=1"],
                         log / "exits.log"),
                  _serve(folder, LOSSLESS_PORT, lossless, log / "lossless.log")]):
        yield _client(PORT), _client(LOSSLESS_PORT)


@pytest.fixture(scope="module")
def client(served):
    return served[0]


def _complete(client, prompt, **settings):
    model = client_model(client)
    return client.completions.create(model=model, prompt=prompt,
                                     **{"max_tokens": NEW, "temperature": 0.0, **settings})


def test_served_completions_are_rivers_own_engines(client, folder):
    model = RiverModel.from_pretrained(folder)
    ours = model.generate_ids(model.encode("abc", chat=False), ExitConfig(**EXITING),
                              GenerationConfig(max_new_tokens=NEW)).tokens[0]
    served = _complete(client, "abc", extra_body={"return_token_ids": True}).choices[0]
    assert served.token_ids == ours


def test_served_chat_and_streaming(client):
    model = client.models.list().data[0].id
    chat = client.chat.completions.create(model=model, max_tokens=NEW, temperature=0.0,
                                          messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.content
    whole = _complete(client, "abc").choices[0].text
    assert "".join(c.choices[0].text for c in _complete(client, "abc", stream=True)) == whole


def test_concurrent_requests_each_get_their_own_answer(client):
    """As many as River serves without stepping aside (STEP_ASIDE_ABOVE), so every step runs
    River's exits whichever requests share it."""
    from concurrent.futures import ThreadPoolExecutor

    from river_vllm import STEP_ASIDE_ABOVE

    prompts = [f"abc{i}" for i in range(STEP_ASIDE_ABOVE["exit"])]
    alone = {p: _complete(client, p).choices[0].text for p in prompts}
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = dict(zip(prompts, pool.map(lambda p: _complete(client, p).choices[0].text,
                                              prompts)))
    assert together == alone


def test_a_client_that_leaves_mid_stream_and_bad_requests_leave_the_server_serving(client):
    import openai

    stream = _complete(client, "abc", stream=True, max_tokens=200)
    next(iter(stream))
    stream.close()                                  # the client goes away mid-stream
    with pytest.raises(openai.BadRequestError, match="max_model_len"):
        _complete(client, "abc", max_tokens=10_000)  # more than the context holds
    assert _complete(client, "abc").choices[0].text   # still serving


def test_river_serve_refuses_a_bad_option_before_starting(folder):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "river_cli.main", "serve", folder, "-o",
                          "treshold=1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "unknown option 'treshold'" in out.stderr


def test_river_serve_refuses_a_text_and_vision_checkpoint_in_one_line(tmp_path):
    """A "mistral3" (Ministral-3-8B's hub form) is multimodal to vLLM: refused by name, with
    what to serve instead, before vLLM starts."""
    from river_core import ConfigError, ExitConfig, QuantSpec
    from river_conformance.fixtures import tiny
    from river_vllm.serve import overrides

    folder = tiny.save_wrapped(tmp_path / "mistral3", "ministral3")
    with pytest.raises(ConfigError, match="serve a folder of its text model alone"):
        overrides(folder, ExitConfig(), QuantSpec())


def test_river_serve_runs_each_family_with_its_river_class(folders, tmp_path):
    """`river serve`'s overrides name the family's River class (spelling out Ministral 3's
    query scaling, which vLLM reads only from a Mistral-format config); a family without one
    is refused in one line."""
    from river_core import ConfigError, QuantSpec

    from river_vllm.serve import overrides

    served = {f: overrides(folders(f), ExitConfig(), QuantSpec())
              for f in ("llama", "qwen2", "qwen3", "phi3", "ministral3")}
    assert {f: o["architectures"] for f, o in served.items()} == {
        "llama": ["RiverLlamaForCausalLM"], "qwen2": ["RiverQwen2ForCausalLM"],
        "qwen3": ["RiverQwen3ForCausalLM"], "phi3": ["RiverPhi3ForCausalLM"],
        "ministral3": ["RiverMinistral3ForCausalLM"]}
    assert served["ministral3"]["llama_4_scaling"] == {
        "beta": ministral3.TINY_ROPE["llama_4_scaling_beta"],
        "original_max_position_embeddings": ministral3.PERIOD}
    assert not any("llama_4_scaling" in served[f] for f in ("llama", "phi3"))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MistralForCausalLM"]}))
    with pytest.raises(ConfigError, match="this model is MistralForCausalLM"):
        overrides(str(tmp_path), ExitConfig(), QuantSpec())


def test_nan_logits_inside_vllm_end_that_request_as_an_error_and_the_engine_serves_on(
        tmp_path, monkeypatch):
    """A token whose embedding is infinite makes its request's logits NaN: River's scheduler
    (what `river serve` runs) ends that request as a request error, while the requests beside
    it and after it are answered as before. Plain vLLM 0.32 returns token 0 at each step."""
    import torch
    import vllm.envs
    from vllm import LLM, SamplingParams

    from river_vllm import model_overrides
    from river_vllm.nonfinite import ENV
    from river_core import QuantSpec
    from river_vllm.serve import SCHEDULER, command

    m = tiny.model("llama", serving=True)
    with torch.no_grad():
        m.model.embed_tokens.weight[50] = float("inf")
    m.save_pretrained(tmp_path)
    tiny.tokenizer().save_pretrained(tmp_path)
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    if hasattr(vllm.envs.__getattr__, "cache_clear"):   # an earlier engine cached them
        vllm.envs.__getattr__.cache_clear()
    llm = LLM(model=str(tmp_path), dtype="float32", enforce_eager=True, max_model_len=256,
              hf_overrides={**model_overrides(_model_config(tmp_path)), "river": FULL_DEPTH},
              scheduler_cls=SCHEDULER)
    greedy = SamplingParams(max_tokens=4, temperature=0.0)
    try:
        out = llm.generate([{"prompt_token_ids": p} for p in ([1, 20, 21], [1, 50, 51],
                                                              [1, 30, 31])], greedy)
        after = llm.generate([{"prompt_token_ids": [1, 20, 21]}], greedy)
    finally:
        llm.llm_engine.engine_core.shutdown()
    assert [o.outputs[0].finish_reason for o in out] == ["length", "error", "length"]
    assert list(after[0].outputs[0].token_ids) == list(out[0].outputs[0].token_ids)
    served = command(str(tmp_path), ExitConfig(), QuantSpec(), [])
    assert served[served.index("--scheduler-cls") + 1] == SCHEDULER


def test_river_serve_quantizes_the_stand_ins_before_vllm_starts_and_takes_bfloat16_on_cuda(
        folder, monkeypatch, capsys):
    """What vLLM's weight loading then finds in the cache: the stand-ins, quantized by `river
    serve` itself with a progress bar (an 8B model's could pass vLLM's 600 s start timeout);
    the backbone in bfloat16 where CUDA is, float32 on the CPU."""
    import torch

    from river_cli.main import main
    from river_core import QuantSpec
    from river_models import open_model, stand_ins
    from river_models.cache import cache_root
    from river_vllm.serve import command

    started = []
    monkeypatch.setattr(os, "execve", lambda path, argv, env: started.append(
        (list((cache_root() / "stand-ins").glob("*")), argv, env)))
    main(["serve", folder, "--bits", "8"])
    (cached, argv, env), = started
    assert cached and "stand-ins" in capsys.readouterr().err.lower()
    assert stand_ins(open_model(folder), QuantSpec(bits=8)).spec.bits == 8   # a cache hit
    # once cached, the next start finds them without loading the model (an 8B one in float32
    # took minutes and 32 GB just to be keyed)
    import river_models
    monkeypatch.setattr(river_models, "open_model", lambda *a, **k: pytest.fail("loaded"))
    main(["serve", folder, "--bits", "8"])
    assert len(started) == 2
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert env["VLLM_COMPUTE_NANS_IN_LOGITS"] == "1"
    assert "VLLM_USE_V2_MODEL_RUNNER" not in env   # exit mode: vLLM's choice (V2 on CUDA)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    served = command(folder, ExitConfig(), QuantSpec(), [])
    assert served[served.index("--dtype") + 1] == "bfloat16"


def test_river_serve_pins_lossless_mode_to_vllms_v1_runner_with_a_notice(folder, monkeypatch,
                                                                         capsys):
    """vLLM 0.32's Model Runner V2 takes no custom_class speculator (River's drafter)."""
    from river_cli.main import main

    started = []
    monkeypatch.setattr(os, "execve", lambda path, argv, env: started.append(env))
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    main(["serve", folder, "--mode", "speculative"])
    assert started[0]["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    notice = [l for l in capsys.readouterr().err.splitlines() if "V1 model runner" in l]
    assert len(notice) == 1


def _paged(layer, block: int, length: int):
    """Positions [0, length) of one block of one layer of vLLM's paged cache, as numpy (K, V)
    [kv_heads, length, head_dim], read as the drafter reads them."""
    import torch

    from river_vllm.pages import gather_cpu, read_pages

    return [t.numpy() for t in read_pages(gather_cpu, layer, torch.tensor([block]), length)]


def test_the_river_kv_in_vllms_paged_cache_stays_within_the_kits_bound(folder):
    """The conformance kit's bound, inside vLLM: read the paged cache blocks back after a
    River generation and compare, layer by layer, with full depth's K/V of the same tokens
    (River's own engine teacher-forced) and with River's own engine at the same exits."""
    import numpy as np
    from vllm import LLM, SamplingParams

    from river_core.method.predictor import STAND_IN_BOUND_C, relative_error
    from river_conformance.kit import CROSS_ENGINE_STAND_IN_RTOL, FULL_DEPTH_RTOL

    prompt = PROMPTS[0]
    llm = LLM(model=folder, dtype="float32", enforce_eager=True, max_model_len=256,
              hf_overrides={"architectures": ["RiverLlamaForCausalLM"], "river": EXITING})
    try:
        tokens = list(llm.generate([{"prompt_token_ids": prompt}], SamplingParams(
            max_tokens=NEW, temperature=0.0))[0].outputs[0].token_ids)
        blocks = llm.collective_rpc(lambda w: [t[:4].clone() for t in
                                               w.model_runner.kv_caches])[0]
    finally:
        llm.llm_engine.engine_core.shutdown()
    model = RiverModel.from_pretrained(folder)
    b, written = model.backend, len(prompt) + len(tokens) - 1
    model.teacher_force([prompt], [tokens[:-1]], ExitConfig(kv="full"))
    full = [b.read_kv(i) for i in range(b.num_layers)]
    model.teacher_force([prompt], [tokens[:-1]], ExitConfig(**EXITING))
    ours = [b.read_kv(i) for i in range(b.num_layers)]
    # the request's block: where layer 0 holds full depth's keys of the prompt
    block = next(n for n in range(4) if np.allclose(
        _paged(blocks[0], n, len(prompt))[0], full[0][0][0, :, :len(prompt)],
        atol=1e-4))
    for j in range(b.num_layers):
        paged = _paged(blocks[j], block, written)
        for w in (0, 1):
            got, want, river = paged[w], full[j][w][0], ours[j][w][0]
            assert relative_error(got[:, :len(prompt)], want[:, :len(prompt)]) <= FULL_DEPTH_RTOL
            for pos in range(len(prompt), written):   # every decoding token left after layer 1
                if j <= 1:
                    assert relative_error(got[:, pos], want[:, pos]) <= FULL_DEPTH_RTOL
                else:
                    bound = STAND_IN_BOUND_C * b.stand_in_error[j] * (j - 1)
                    assert relative_error(got[:, pos], want[:, pos]) <= bound
                    assert relative_error(got[:, pos], river[:, pos]) <= \
                        CROSS_ENGINE_STAND_IN_RTOL * (j - 1)


LOSSLESS_JOB = """
import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM, SamplingParams
from river_vllm import draft_config

folder, prompts, new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
model, context = json.loads(sys.argv[5]), int(sys.argv[6])
out = {}
for name, river in json.loads(sys.argv[4]).items():
    llm = LLM(model=folder, dtype="float32", enforce_eager=True, max_model_len=context,
              disable_log_stats=False, speculative_config=draft_config(4),
              hf_overrides={**model, "river": river})
    done = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=new, temperature=0.0))
    counts = {m.name.split(":")[-1]: getattr(m, "value", None) for m in llm.get_metrics()}
    out[name] = {"tokens": [list(d.outputs[0].token_ids) for d in done],
                 "drafted": counts["spec_decode_num_draft_tokens"],
                 "accepted": counts["spec_decode_num_accepted_tokens"]}
    llm.llm_engine.engine_core.shutdown()
print("RESULT " + json.dumps(out))
"""


def _jobs(commands: dict[str, list[str]], timeout: int = 600, env: dict | None = None) -> dict:
    """name -> the JSON a job printed after "RESULT ", or the tail of its stderr where it
    printed none: each command a fresh process, all started at once (their imports and loads
    overlap on two cores: the suite's time)."""
    import subprocess

    jobs = {name: subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=env)
            for name, command in commands.items()}
    out = {}
    for name, job in jobs.items():
        stdout, stderr = job.communicate(timeout=timeout)
        line = [l for l in stdout.splitlines() if l.startswith("RESULT ")]
        out[name] = json.loads(line[0][len("RESULT "):]) if line else stderr[-3000:]
    return out


# phi3's and ministral3's rotary paths under `-m reliability` (the suite's budget,
# tests/conftest.py): each a vLLM engine more, and test_vllm's default tests run them in exit
# mode past their switches
LOSSLESS_FAMILIES = ("llama", pytest.param("phi3", marks=pytest.mark.reliability),
                     pytest.param("ministral3", marks=pytest.mark.reliability))


@pytest.fixture(scope="module")
def lossless_runs(folders, request):
    """family -> what LOSSLESS_JOB's engines gave for the families the run selected: one fresh
    process per family (vLLM-CPU 0.32 starts no further engine in a process after
    speculative ones), all started at once."""
    import sys

    from river_vllm import model_overrides

    lossless = {"mode": "speculative", "step_aside_above": None}
    settings = {"exits": {**EXITING, **lossless}, "full depth": {**FULL_DEPTH, **lossless}}
    return _jobs({family: [sys.executable, "-c", LOSSLESS_JOB, folders(family),
                           json.dumps(PROMPTS), str(3 * NEW), json.dumps(settings),
                           json.dumps(model_overrides(_model_config(folders(family)))),
                           str(_own_engines_context(folders(family)))]
                  for family in {item.callspec.params["family"] for item in
                                 request.session.items if item.originalname ==
                                 "test_lossless_inside_vllm_is_vllm_plains_output_and_drafts_"
                                 "from_the_targets_pages"}})


@pytest.mark.parametrize("family", LOSSLESS_FAMILIES)
def test_lossless_inside_vllm_is_vllm_plains_output_and_drafts_from_the_targets_pages(
        folders, lossless_runs, family):
    """River's drafter under vLLM's speculative decoding: the output is the backbone's, the
    drafts read the context's K/V from vLLM's paged cache (drafting at full depth, nearly every
    draft is kept: only the head's stand-in may pick otherwise), and drafts that leave after
    layer 1 are partly kept."""
    out = lossless_runs[family]
    assert isinstance(out, dict), out   # else the job's error
    model = RiverModel.from_pretrained(folders(family))
    plain = model.generate_ids(PROMPTS, ExitConfig(kv="full"),
                               GenerationConfig(max_new_tokens=3 * NEW)).tokens
    for name, r in out.items():
        assert r["tokens"] == plain, name
    full, exits = out["full depth"], out["exits"]
    assert full["accepted"] >= 0.9 * full["drafted"] > 0
    assert 0 < exits["accepted"] < exits["drafted"]


SAMPLING_JOB = """
import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM, SamplingParams
import river_vllm.repairs
from river_vllm import draft_config

folder, prompt, n, tokens, settings, engine = sys.argv[1:7]
river = {"architectures": ["RiverLlamaForCausalLM"], "river": json.loads(sys.argv[7])}
if engine == "unrepaired":   # lossless mode over vLLM-CPU's own rejection sampler
    river_vllm.repairs.repair = lambda: []
lossless = engine != "plain"
llm = LLM(model=folder, dtype="float32", enforce_eager=True, max_model_len=256,
          speculative_config=draft_config(4) if lossless else None,
          hf_overrides=river if lossless else None)
out = {}
for i, (name, sampling) in enumerate(json.loads(settings).items()):
    seed = i + (1000 if lossless else 0)   # n children take seed, seed + 1, ...: disjoint
    done = llm.generate([{"prompt_token_ids": json.loads(prompt)}], SamplingParams(
        n=int(n), max_tokens=int(tokens), seed=seed, **sampling))
    out[name] = [list(c.token_ids) for c in done[0].outputs]
llm.llm_engine.engine_core.shutdown()
print("RESULT " + json.dumps(out))
"""
VLLM_SAMPLED = {"temperature 1.0": {"temperature": 1.0},
                "temperature 0.7, top-p 0.9": {"temperature": 0.7, "top_p": 0.9},
                "temperature 0.8, top-k 12": {"temperature": 0.8, "top_k": 12}}


def _vllm_samples(folder, engines: dict[str, dict]) -> dict[str, dict[str, list[list[int]]]]:
    """engine -> seeded samples of the kit's prompt under each of its settings, from vLLM
    `engine` (plain, lossless: River's drafter, unrepaired: the same over vLLM-CPU's own
    rejection sampler), each in a fresh process, all started at once."""
    import sys

    from river_conformance.kit import SAMPLED_PROMPT, SAMPLED_TOKENS, SAMPLES

    out = _jobs({engine: [sys.executable, "-c", SAMPLING_JOB, folder, json.dumps(SAMPLED_PROMPT),
                          str(SAMPLES), str(SAMPLED_TOKENS), json.dumps(settings), engine,
                          json.dumps(DRAFTING)]
                 for engine, settings in engines.items()})
    for result in out.values():
        assert isinstance(result, dict), result   # else the job's error
    return out


def _sampled_comparisons(folder, plain, other, settings=VLLM_SAMPLED):
    from river_conformance.distribution import compare
    from river_conformance.kit import SAMPLED_POSITIONS, SAMPLED_PROMPT, scored

    backend = RiverModel.from_pretrained(folder).backend   # the plain model scores both
    out = {}
    for name, sampling in settings.items():
        gen = GenerationConfig(**sampling)
        out[name] = compare(scored(backend, SAMPLED_PROMPT, plain[name], gen),
                            scored(backend, SAMPLED_PROMPT, other[name], gen), SAMPLED_POSITIONS)
    return out


# drafts of stand-ins only, at any number of rows (the checks need drafts to verify)
DRAFTING = {"mode": "speculative", "policy": "fixed", "options": {"layer": -1},
            "step_aside_above": None}


def test_sampled_lossless_inside_vllm_draws_vllm_plains_distribution(folder):
    """The kit's sampled-exactness test, through the real engine: River's drafter under vLLM's
    rejection sampler (with River's repairs of vLLM-CPU's, river_vllm/repairs.py) against vLLM
    plain, at temperature 1.0, with top-p and with top-k, n samples of one request (n > 1,
    seeded)."""
    got = _vllm_samples(folder, {"plain": VLLM_SAMPLED, "lossless": VLLM_SAMPLED})
    comparisons = _sampled_comparisons(folder, got["plain"], got["lossless"])
    for name, comparison in comparisons.items():
        assert comparison.same, f"{name}: {comparison.summary()}"


@pytest.mark.reliability
def test_vllm_cpus_own_rejection_sampler_breaks_sampled_verification(folder):
    """Why River repairs it: over vLLM-CPU 0.32's own expand kernel the same test fails (the
    verification's temperature is uninitialised memory), at temperature 1.0 and with top-p
    (with top-k the engine dies first: repairs.py). What that memory holds differs from one
    machine to the next (on an AMD EPYC, 26 November 2026, temperature 1.0 drew right and
    top-p did not, at this commit and the one before), so at least one setting must show it.
    Once vLLM fixes them this test fails, and the repairs can go: run it (`-m reliability`)
    when the vllm-cpu pin moves; under the pin it can only repeat itself, so the suite leaves it
    out."""
    settings = {k: v for k, v in VLLM_SAMPLED.items() if "top_k" not in v}
    got = _vllm_samples(folder, {"plain": settings, "unrepaired": settings})
    comparisons = _sampled_comparisons(folder, got["plain"], got["unrepaired"], settings)
    assert not all(c.same for c in comparisons.values()), \
        {name: c.summary() for name, c in comparisons.items()}


def test_the_repairs_follow_vllms_contract_and_apply_only_where_a_fault_shows():
    """Each repair against the contract of what it replaces, and against vLLM-CPU itself (in
    a fresh process, after the platform's own kernels): the faults show, and are gone after."""
    import subprocess
    import sys

    import torch

    from river_vllm.repairs import _skipping_empty, expand

    for values in (torch.tensor([0.7, 0.0, 0.2]), torch.tensor([5, 0, 9], dtype=torch.int32)):
        out = values.new_full((6,), -1)
        expand(out, values, torch.tensor([2, 3, 5], dtype=torch.int32), 0, 1)
        assert out.tolist() == [values[0], values[0], 1, values[2], values[2], -1]
    empty = torch.empty(0, 4)
    assert _skipping_empty(lambda *a: pytest.fail("called"))(empty, None, None) is empty
    job = ("from vllm.platforms import current_platform as c; c.import_kernels(); "
           "c.register_triton_kernel_overrides(); from river_vllm import repairs as r; "
           "print('RESULT', r.expand_works(), r.top_k_works(), r.repair(), r.repair())")
    done = subprocess.run([sys.executable, "-c", job], capture_output=True, text=True,
                          timeout=300)
    assert "RESULT False False ['expand', 'top_k'] []" in done.stdout, done.stderr[-2000:]


@pytest.fixture(scope="module")
def lossless_client(served):
    return served[1]


def test_served_lossless_mode_answers_with_the_plain_models_text(lossless_client, folder):
    from concurrent.futures import ThreadPoolExecutor

    model = RiverModel.from_pretrained(folder)
    prompts = [f"abc{i}" for i in range(4)]
    plain = [model.generate_ids(model.encode(p, chat=False), ExitConfig(kv="full"),
                                GenerationConfig(max_new_tokens=NEW)).tokens[0] for p in prompts]
    ask = lambda p: _complete(lossless_client, p, extra_body={"return_token_ids": True})
    with ThreadPoolExecutor(4) as pool:
        served = [r.choices[0].token_ids for r in pool.map(ask, prompts)]
    assert served == plain
    streamed = "".join(c.choices[0].text for c in _complete(lossless_client, "abc0",
                                                             stream=True))
    assert streamed == _complete(lossless_client, "abc0").choices[0].text


def test_served_lossless_sampling_draws_the_plain_models_distribution(lossless_client, folder):
    """Once through `river serve --mode speculative` and the openai client: sampled
    completions (four concurrent requests of n continuations each, seeded) against the plain
    model's own samples (River's hf engine at full depth)."""
    from concurrent.futures import ThreadPoolExecutor

    import attrs

    from river_conformance.distribution import compare
    from river_conformance.kit import (SAMPLED_POSITIONS, SAMPLED_PROMPT, SAMPLED_TOKENS, SAMPLES,
                                       plain_samples, scored)

    gen = GenerationConfig(max_new_tokens=SAMPLED_TOKENS, temperature=1.0)
    model = client_model(lossless_client)
    ask = lambda seed: [c.token_ids for c in lossless_client.completions.create(
        model=model, prompt=SAMPLED_PROMPT, n=SAMPLES // 4, max_tokens=SAMPLED_TOKENS,
        temperature=1.0, seed=seed, extra_body={"return_token_ids": True}).choices]
    with ThreadPoolExecutor(4) as pool:
        served = [s for part in pool.map(ask, [1000 * i for i in range(4)]) for s in part]
    backend = RiverModel.from_pretrained(folder).backend
    plain = plain_samples(backend, SAMPLED_PROMPT, attrs.evolve(gen, seed=7), SAMPLES)
    comparison = compare(scored(backend, SAMPLED_PROMPT, plain, gen),
                         scored(backend, SAMPLED_PROMPT, served, gen), SAMPLED_POSITIONS)
    assert comparison.same, comparison.summary()


def test_served_lossless_mode_keeps_seeds_stop_strings_and_refuses_what_vllm_cannot_verify(
        lossless_client):
    """Seeded sampled requests repeat; a stop string cuts the text (the plain model's tokens,
    test_served_lossless_mode_answers_with_the_plain_models_text) where it first occurs; min_p
    and logit_bias, which vLLM's rejection sampler does not apply, are refused with a 400,
    never silently dropped."""
    import openai

    twice = [_complete(lossless_client, "abc", temperature=1.0, seed=11).choices[0].text
             for _ in range(2)]
    assert twice[0] == twice[1]
    whole = _complete(lossless_client, "abc").choices[0].text
    stop = whole[3:5]
    served = _complete(lossless_client, "abc", stop=[stop]).choices[0].text
    assert served == whole[:whole.index(stop)]
    for refused in ({"min_p": 0.1}, {"logit_bias": {"40": 5}}):
        with pytest.raises(openai.BadRequestError, match="speculative decoding"):
            _complete(lossless_client, "abc", temperature=1.0, **(
                {"extra_body": refused} if "min_p" in refused else refused))


def client_model(client) -> str:
    return client.models.list().data[0].id


def test_river_settings_in_a_request_are_refused_not_dropped(client):
    """extra_body={"river": {...}}: a 400 that says River's settings are the server's; the
    server keeps serving."""
    import openai

    with pytest.raises(openai.BadRequestError, match="River settings are per server"):
        _complete(client, "abc", extra_body={"river": {"options": {"tau": 0.5}}})
    with pytest.raises(openai.BadRequestError, match="River settings are per server"):
        client.chat.completions.create(model=client_model(client), max_tokens=4,
                                       messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"river": {"policy": "fixed"}})
    assert _complete(client, "abc").choices[0].text


def test_river_steps_aside_above_its_row_threshold(folder):
    """step_aside_above: a step with more decoding rows than that runs vLLM's own full-depth
    step (the three prompts decode together, so 2 steps them aside and 8 does not)."""
    plain = _vllm_greedy(folder)
    assert _vllm_greedy(folder, {**EXITING, "step_aside_above": 2}) == plain
    assert _vllm_greedy(folder, {**EXITING, "step_aside_above": 8}) == \
        _river_greedy(folder, ExitConfig(**EXITING))


def test_without_a_threshold_each_mode_steps_aside_above_its_measured_crossover():
    """Settings that name no step_aside_above take the mode's measured crossover; one that
    names it (None included: never step aside) keeps it."""
    from river_vllm import STEP_ASIDE_ABOVE, settings

    assert settings({})[0].step_aside_above == STEP_ASIDE_ABOVE["exit"]
    assert settings({"mode": "speculative"})[0].step_aside_above == \
        STEP_ASIDE_ABOVE["speculative"]
    assert settings({"step_aside_above": None})[0].step_aside_above is None
    assert settings({"step_aside_above": 9})[0].step_aside_above == 9


def test_vllm_verifies_exactly_in_lossless_mode_and_refuses_a_half_configured_one():
    """Lossless mode is read from River's settings as on every engine; vLLM's speculative
    config must agree: without one nothing would verify the drafts, and with one in exit mode
    River's exits would be verified as if they were the backbone's."""
    from river_vllm import draft_config, verifies

    assert verifies(ExitConfig(mode="speculative"), draft_config())
    assert not verifies(ExitConfig(), None)
    for config, speculative in ((ExitConfig(mode="speculative"), None),
                                (ExitConfig(), draft_config())):
        with pytest.raises(ConfigError, match="both or neither"):
            verifies(config, speculative)


PARALLEL_JOB = """
import json, os, sys


def main():
    from vllm import LLM, SamplingParams
    from river_vllm import draft_config

    folder, prompts, new, engines = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), \\
        json.loads(sys.argv[4])
    out = {}
    for name, (parallel, river, lossless) in engines.items():
        llm = LLM(model=folder, dtype="float32", enforce_eager=True, max_model_len=256,
                  distributed_executor_backend="mp", **parallel,
                  speculative_config=draft_config() if lossless else None,
                  hf_overrides=river and {"architectures": ["RiverLlamaForCausalLM"],
                                          "river": river})
        done = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            SamplingParams(max_tokens=new, temperature=0.0))
        out[name] = [list(d.outputs[0].token_ids) for d in done]
        llm.llm_engine.engine_core.shutdown()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
"""


def _parallel_greedy(folder, tmp_path, engines: dict) -> dict:
    """Greedy tokens of PROMPTS from each engine (vLLM's parallel settings, River's settings or
    None, lossless), with one worker process per rank, one core each."""
    import sys

    job = tmp_path / "parallel_job.py"   # vLLM's workers start by spawn: a real main module
    job.write_text(PARALLEL_JOB)
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    result = _jobs({"ranks": [sys.executable, str(job), folder, json.dumps(PROMPTS), str(NEW),
                              json.dumps(engines)]}, timeout=900, env=env)["ranks"]
    assert isinstance(result, dict), result   # else the job's error
    return result


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two ranks need two cores")
def test_river_runs_under_tensor_parallelism_across_two_ranks(folder, tmp_path):
    """--tensor-parallel-size 2: each rank runs its share of the heads, stand-in rows keep
    their rank's Q/K/V and gather every rank's heads back; exit mode gives River's own
    engine's tokens, lossless mode full depth's (River's own engine's, which vLLM plain's
    equal: test_vllm_plain_and_river_full_depth_agree; no plain engine is started here, for
    the suite's time: each start of two ranks takes 25 s on two cores)."""
    tp = {"tensor_parallel_size": 2}
    out = _parallel_greedy(folder, tmp_path, {
        "exits": [tp, {**EXITING, "step_aside_above": None}, False],
        "lossless": [tp, DRAFTING, True]})
    assert out["exits"] == _river_greedy(folder, ExitConfig(**EXITING))
    assert out["lossless"] == _river_greedy(folder, ExitConfig(kv="full"))
