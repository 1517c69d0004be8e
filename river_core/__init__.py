"""River: training-free token-level early exit with a KV-shared exit river.

Four layers, each importing only those below it, and the registry on top:
- settings/: what a run is asked to do (config.py, options.py, errors.py);
- contract/: what a backend supplies (backend.py, hookspecs.py), where tokens sit and the
  cache that owns them (layout.py, cache.py), the bookkeeping every layer-by-layer engine
  shares (layer_engine.py);
- method/: the paper's method, read in this order: predictor.py (when a token's state has
  settled), policy.py (when to exit), kv.py (what exiting must leave in the cache);
- loop/: decode.py (the loop and the one walk through the layers), speculative.py (lossless
  mode) and its n-gram drafts (ngram.py);
- on top: the plugin registry (plugins.py; builtins.py registers River's own plugins exactly as
  a third party's), plan.py (settings resolved once against it), arguments.py (the settings on
  a command line) and model.py (`RiverModel`).
"""

from .contract.backend import (Backend, Capabilities, Layered, MasksEntries, Measured, ModelShape,
                               Pass, Prefill, ProjectsKV, RecomputesSpans, StandIns, Step,
                               Tokenizer, Verifies)
from .contract.cache import KVCache
from .settings.config import ExitConfig, GenerationConfig, QuantSpec
from .loop.decode import DecodeResult, Forced, Run, Token, Walk
from .contract.layer_engine import LayerEngine
from .settings.errors import CapabilityError, ConfigError, ModelError, NonFiniteError, RiverError
from .contract.footprint import Footprint
from .contract.hookspecs import (BackendPlugin, KVStrategyPlugin, PolicyPlugin, PredictorPlugin,
                                 hookimpl)
from .method.kv import KVStrategy
from .model import Completion, RiverModel, TokenStream
from .plan import Plan, resolve
from .plugins import Registry, default_registry
from .method.policy import ExitPolicy, Needs, Policy, RowView
from .method.predictor import SimilarityPredictor

__all__ = ["Backend", "BackendPlugin", "CapabilityError", "Capabilities", "Completion",
           "ConfigError", "DecodeResult", "ExitConfig", "ExitPolicy", "Footprint", "Forced",
           "GenerationConfig", "KVCache", "KVStrategy", "KVStrategyPlugin", "LayerEngine",
           "Layered", "MasksEntries", "Measured", "ModelError", "ModelShape", "Needs",
           "NonFiniteError", "Pass", "Plan", "PolicyPlugin", "Policy", "PredictorPlugin",
           "Prefill", "ProjectsKV", "QuantSpec", "RecomputesSpans", "Registry", "RiverError",
           "RiverModel", "RowView", "Run", "SimilarityPredictor", "StandIns", "Step", "Token",
           "TokenStream", "Tokenizer", "Verifies", "Walk", "default_registry", "hookimpl",
           "resolve"]
