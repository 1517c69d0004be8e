"""Exit-policy plugins that ship with River, registered like any third-party plugin (entry
point `policies` in group `river_core`): one module a policy."""

from river_core.contract.hookspecs import PolicyPlugin, hookimpl

from .budget import BudgetOptions, DepthBudget, budget
from .cascade import Cascade, CascadeOptions
from .confidence import (ConfidenceOptions, Confident, EntropyOptions, confidence, entropy_policy)
from .fixed import FixedDepth, FixedOptions, fixed

__all__ = ["Cascade", "Confident", "DepthBudget", "FixedDepth"]


@hookimpl
def river_exit_policies():
    return {"fixed": PolicyPlugin(fixed, FixedOptions),
            "cascade": PolicyPlugin(Cascade, CascadeOptions),
            "confidence": PolicyPlugin(confidence, ConfidenceOptions),
            "entropy": PolicyPlugin(entropy_policy, EntropyOptions),
            "budget": PolicyPlugin(budget, BudgetOptions)}
