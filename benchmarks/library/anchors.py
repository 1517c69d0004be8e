"""llama.cpp and ONNX Runtime GenAI as rows of `river bench grid`: their packages in an
environment of their own (made in the benchmark cache on first use: llama-cpp-python compiles
llama.cpp, about 8 minutes here, or given by --anchors-python), the GGUFs and GenAI models they
run on the same weights as River, and each engine in a worker process (anchor_worker.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


from river_models.cache import cache_root
from river_models.gguf_write import write_gguf  # noqa: F401 (first_contact's import)
from river_models.source import locate

from . import anchor_worker

# GenAI's model builder needs torch and transformers; torch on the CPU wheel's pin
ANCHOR_PACKAGES = ("llama-cpp-python==0.3.36", "onnxruntime-genai==0.18.0", "torch==2.13.0",
                   "transformers", "onnx-ir")
GGUF_TYPES = ("F32", "F16", "Q8_0")   # written from the embedded Q4_1 file; Q4_1 is itself
GENAI_PRECISIONS = ("fp32", "int4")


def anchors_python(given: str | None) -> Path:
    """An interpreter with the anchors' packages: the given one, or the benchmark cache's own
    environment, made on first use."""
    if given:
        return Path(given)
    venv = cache_root() / "anchors" / "venv"
    python = venv / "bin" / "python"
    check = "import llama_cpp, onnxruntime_genai, torch, transformers"
    if not python.exists() or subprocess.run([python, "-c", check],
                                             capture_output=True).returncode:
        print(f"installing {' '.join(ANCHOR_PACKAGES)} into {venv} (compiles llama.cpp: about "
              "8 minutes here)", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *ANCHOR_PACKAGES], check=True)
    return python


def genai_model(python: Path, precision: str, model: str | None) -> Path:
    """The model's float weights built for ONNX Runtime GenAI by its own model builder (CPU,
    `precision` fp32 or int4, the builder's defaults otherwise), once per model."""
    folder = locate(model)
    target = cache_root() / "anchors" / f"genai-{folder.name}-{precision}"
    if not (target / "genai_config.json").is_file():
        print(f"building the ONNX Runtime GenAI model ({precision})", file=sys.stderr, flush=True)
        built = subprocess.run([str(python), "-m", "onnxruntime_genai.models.builder", "-i",
                                str(folder), "-o", str(target), "-p", precision, "-e",
                                "cpu", "-c", str(cache_root() / "anchors" / "genai-build")],
                               capture_output=True, text=True)
        if built.returncode:
            raise SystemExit(f"GenAI's model builder failed:\n{built.stderr[-3000:]}")
    return target


class Worker:
    """One anchor engine in a process of its own, in the anchors' environment (the worker is
    a script there: no River), so its peak resident memory is its own."""

    def __init__(self, python: Path, *args: str) -> None:
        self.process = subprocess.Popen([str(python), anchor_worker.__file__, *args],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"the worker {' '.join(args)} did not start (its errors are above)")
        self.loaded_rss_mb = json.loads(line)["loaded_rss_mb"]

    def generate(self, ids: list[int], tokens: int) -> dict:
        self.process.stdin.write(json.dumps({"ids": ids, "tokens": tokens}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit("a worker died (its errors are above)")
        return json.loads(line)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def start(engine: str, python: Path, model: str | None, shape: str | None = None) -> Worker:
    """An anchor engine, `llamacpp:KIND` (Q4_1, the embedded GGUF, or one of GGUF_TYPES
    written from it) or `genai:PRECISION` (GENAI_PRECISIONS), on `model`'s weights; with
    `shape`, llama.cpp on that random shape's GGUF (F16 or Q4_0: shapes.random_gguf)."""
    from river_models import default_gguf

    from . import shapes

    name, _, kind = engine.partition(":")
    if shape is not None:
        if name != "llamacpp":
            raise SystemExit(f"random shapes run on llama.cpp among the anchors, not {name}")
        return Worker(python, "llamacpp", str(shapes.random_gguf(shape, kind or "F16", python)))
    if name == "llamacpp":
        q4 = default_gguf() if model is None else Path(model)
        if q4.suffix != ".gguf":
            raise SystemExit("llama.cpp runs a GGUF: give --model FILE.gguf")
        kind = kind or "Q4_1"
        path = q4 if kind == "Q4_1" else write_gguf(
            q4, cache_root() / "anchors" / f"{q4.stem}.{kind}.gguf", kind)
        return Worker(python, "llamacpp", str(path))
    return Worker(python, "genai", str(genai_model(python, kind or "fp32", model)))
