"""The model package: read a model once into a `ModelSpec` and weights that every engine
builds from. Backends import this package, never each other.

- spec.py: `ModelSpec`, `Weights`, `Checkpoint`
- families/: each model family's facts, one module a family, and their registry
- from_transformers.py: a transformers model as a spec and weights (every transformers detail)
- source.py: the embedded default, HF folders, GGUF conversion; `open_model`
- quant.py: the stand-ins' weight quantization, in one engine-neutral form
- cache.py: the user cache and its atomic builds
- gguf_*.py: GGUF files read and written as llama.cpp's loader, converter and quantizer do

The tests' tiny random models are the conformance kit's (river_conformance/fixtures); the
decoder layer the engines share is river_compute's.
"""

from .cache import cache_root
from .quant import QuantWeight, StandInWeights, stand_ins
from .source import default_gguf, locate, open_model
from .spec import FUSED, PROJECTIONS, Checkpoint, LayerWeights, ModelSpec, Rotary, Weights

__all__ = ["FUSED", "PROJECTIONS", "Checkpoint", "LayerWeights", "ModelSpec", "QuantWeight", "Rotary",
           "StandInWeights", "Weights", "cache_root", "default_gguf", "locate", "open_model",
           "stand_ins"]
