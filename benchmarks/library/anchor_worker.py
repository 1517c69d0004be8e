"""One engine of `river bench anchors`, in a process of its own so that its peak resident
memory is its own. Not run by hand: the driver starts it as

    python -m river_bench.library.anchor_worker river CONFIG DTYPE PREFILL_EXIT QUANTIZER MODEL
    python anchor_worker.py llamacpp FILE.gguf   # the anchors' environment (no River there)
    python anchor_worker.py genai FOLDER         # the same, an ONNX Runtime GenAI model

and then writes one JSON request per line, {"ids": [...], "tokens": N}; the worker answers each
with one line, {"tokens": [...], "decode_seconds": S, "peak_rss_mb": M}: greedy ids after the
prompt, and the wall time of decoding, every token after the first (which comes from prefill).
A line {"ready": true, "loaded_rss_mb": M} comes first, once the engine is loaded.
"""

from __future__ import annotations

import json
import os
import sys
import time


def river(config: str, dtype: str, prefill_exit: str, quantizer: str, model: str = ""):
    """CONFIG as `river bench tasks` names them; PREFILL_EXIT "none" or a layer; QUANTIZER
    the stand-ins' (QuantSpec.method); MODEL a folder or GGUF ("": the embedded model). Runs
    as a module of the benchmarks' package, in the project's environment."""
    import attrs

    from river_core import GenerationConfig, QuantSpec, RiverModel

    from .runs import Config

    exit_config = attrs.evolve(Config.parse(config).exit_config,
                               prefill_exit=None if prefill_exit == "none" else int(prefill_exit))
    model = RiverModel.from_pretrained(model or None, backend="onnx", dtype=dtype,
                                       quant=QuantSpec(method=quantizer))

    def generate(ids: list[int], tokens: int) -> tuple[list[int], float]:
        out = model.generate_ids([ids], exit_config, GenerationConfig(max_new_tokens=tokens))
        return out.tokens[0], sum(out.step_seconds)
    return generate


def llamacpp(path: str):
    import llama_cpp

    # llama.cpp as its users run it: default (float16) K/V, every core
    llm = llama_cpp.Llama(path, n_ctx=4096, n_threads=os.cpu_count(), verbose=False)

    def generate(ids: list[int], tokens: int) -> tuple[list[int], float]:
        llm.reset()
        stream = llm.generate(ids, temp=0.0, reset=True)
        out = [next(stream)]   # prefill and the first token
        start = time.perf_counter()
        while len(out) < tokens:
            out.append(next(stream))
        return out, time.perf_counter() - start
    return generate


def rss_mb(field: str) -> float:
    """This process's resident memory now (VmRSS) or at its peak (VmHWM: unlike getrusage's
    maxrss, it does not carry the parent's peak over the exec that started the worker)."""
    line = next(l for l in open("/proc/self/status") if l.startswith(f"{field}:"))
    return int(line.split()[1]) / 1024


def genai(folder: str):
    import onnxruntime_genai as og

    model = og.Model(folder)

    def generate(ids: list[int], tokens: int) -> tuple[list[int], float]:
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(ids) + tokens)
        generator = og.Generator(model, params)
        generator.append_tokens(ids)   # prefill: the first token needs no further forward
        generator.generate_next_token()
        out = [int(generator.get_next_tokens()[0])]
        start = time.perf_counter()
        while len(out) < tokens and not generator.is_done():
            generator.generate_next_token()
            out.append(int(generator.get_next_tokens()[0]))
        return out, time.perf_counter() - start
    return generate


ENGINES = {"river": river, "llamacpp": llamacpp, "genai": genai}


def main() -> None:
    generate = ENGINES[sys.argv[1]](*sys.argv[2:])
    print(json.dumps({"ready": True, "loaded_rss_mb": rss_mb("VmRSS")}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        tokens, seconds = generate(request["ids"], request["tokens"])
        print(json.dumps({"tokens": [int(t) for t in tokens], "decode_seconds": seconds,
                          "peak_rss_mb": rss_mb("VmHWM")}), flush=True)


if __name__ == "__main__":
    main()
