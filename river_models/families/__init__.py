"""The model families River runs, one module each (a `Family`: base.py), and the one registry
every reader, writer and engine looks a family up in. docs/families.md: adding a family."""

from . import gemma3, llama, llama3, ministral3, mistral, phi3, qwen2, qwen3
from .base import Family, Gguf

# in the order the tests run them
FAMILIES: tuple[Family, ...] = tuple(m.FAMILY for m in (llama, mistral, qwen2, qwen3, gemma3,
                                                        llama3, phi3, ministral3))
BY_NAME = {f.name: f for f in FAMILIES}
BY_MODEL_TYPE = {t: f for f in FAMILIES for t in f.model_types}
BY_ARCH = {f.gguf.arch: f for f in FAMILIES if f.gguf.reads_back}
# a text-and-vision checkpoint's model type -> its text model's, which River runs alone
WRAPPERS = {w: f.model_types[0] for f in FAMILIES for w in f.wrappers}

__all__ = ["BY_ARCH", "BY_MODEL_TYPE", "BY_NAME", "FAMILIES", "WRAPPERS", "Family", "Gguf"]
