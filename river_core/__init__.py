"""River: training-free token-level early exit with a KV-shared exit river.

Read in this order: predictor.py (when to exit), policy.py, kv.py (what exiting must leave in
the cache), backend.py (the primitives a backend supplies), decode.py (the loop).
"""

from .config import ExitConfig, GenerationConfig, RiverSpec
from .decode import Generation
from .errors import CapabilityError, ConfigError, ModelError, RiverError
from .model import Completion, RiverModel

__all__ = ["CapabilityError", "Completion", "ConfigError", "ExitConfig", "Generation",
           "GenerationConfig", "ModelError", "RiverError", "RiverModel", "RiverSpec"]
