"""River: training-free token-level early exit with a KV-shared exit river.

The method, read in this order: predictor.py (when a token's state has settled), policy.py
(when to exit), kv.py (what exiting must leave in the cache), backend.py (what a backend
supplies), layout.py and cache.py (where tokens sit, the cache that owns them),
layer_engine.py (the bookkeeping every layer-by-layer backend shares), decode.py (the loop and
the one walk through the layers), speculative.py (lossless mode), plan.py (settings resolved
once), model.py (`RiverModel`).
"""

from .backend import (Backend, Capabilities, Layered, MasksEntries, Measured, ModelShape,
                      Pass, Prefill, ProjectsKV, RecomputesSpans, StandIns, Step, Tokenizer,
                      Verifies)
from .cache import KVCache
from .config import ExitConfig, GenerationConfig, QuantSpec
from .decode import DecodeResult, Forced, Run, Token, Walk
from .layer_engine import LayerEngine
from .errors import CapabilityError, ConfigError, ModelError, NonFiniteError, RiverError
from .footprint import Footprint
from .hookspecs import (BackendPlugin, KVStrategyPlugin, PolicyPlugin, PredictorPlugin,
                        hookimpl)
from .kv import KVStrategy
from .model import Completion, RiverModel, TokenStream
from .plan import Plan, resolve
from .plugins import Registry, default_registry
from .policy import ExitPolicy, Needs, Policy, RowView
from .predictor import SimilarityPredictor

__all__ = ["Backend", "BackendPlugin", "CapabilityError", "Capabilities", "Completion",
           "ConfigError", "DecodeResult", "ExitConfig", "ExitPolicy", "Footprint", "Forced",
           "GenerationConfig", "KVCache", "KVStrategy", "KVStrategyPlugin", "LayerEngine",
           "Layered", "MasksEntries", "Measured", "ModelError", "ModelShape", "Needs",
           "NonFiniteError", "Pass", "Plan", "PolicyPlugin", "Policy", "PredictorPlugin",
           "Prefill", "ProjectsKV", "QuantSpec", "RecomputesSpans", "Registry", "RiverError",
           "RiverModel", "RowView", "Run", "SimilarityPredictor", "StandIns", "Step", "Token",
           "TokenStream", "Tokenizer", "Verifies", "Walk", "default_registry", "hookimpl",
           "resolve"]
