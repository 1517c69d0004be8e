"""River: training-free token-level early exit with a KV-shared exit river.

The method, read in this order: predictor.py (when a token's state has settled), policy.py
(when to exit), kv.py (what exiting must leave in the cache), backend.py (the primitives a
backend supplies), engine.py (the bookkeeping every layer-by-layer backend shares), layout.py
(where tokens sit in the cache), decode.py (the loop), speculative.py (lossless mode), plan.py
(settings resolved once), model.py (`RiverModel`).
"""

from .backend import Backend, Capabilities, ModelShape, Prefill, Tokenizer
from .config import ExitConfig, GenerationConfig, QuantSpec
from .decode import DecodeResult, Forced, Run, Token
from .engine import KVCache, LayerEngine
from .errors import CapabilityError, ConfigError, ModelError, RiverError
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
           "ModelError", "ModelShape", "Needs", "Plan", "PolicyPlugin", "Policy",
           "PredictorPlugin", "Prefill", "QuantSpec", "Registry", "RiverError", "RiverModel",
           "RowView", "Run", "SimilarityPredictor", "Token", "TokenStream", "Tokenizer",
           "default_registry", "hookimpl", "resolve"]
