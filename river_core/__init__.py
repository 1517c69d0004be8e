"""River: training-free token-level early exit with a KV-shared exit river.

Read in this order: predictor.py (when to exit), policy.py, kv.py (what exiting must leave in
the cache), backend.py (the primitives a backend supplies), layout.py (where tokens sit in the
cache), decode.py (the loop).
"""

from .config import ExitConfig, GenerationConfig, QuantSpec
from .decode import DecodeResult
from .errors import CapabilityError, ConfigError, ModelError, RiverError
from .model import Completion, RiverModel

__all__ = ["CapabilityError", "Completion", "ConfigError", "DecodeResult", "ExitConfig",
           "GenerationConfig", "ModelError", "QuantSpec", "RiverError", "RiverModel"]
