"""Exit-policy plugins that ship with River, registered like any third-party plugin (entry
point `policies` in group `river_core`): one module a policy."""

from river_core.hookspecs import hookimpl

from .budget import DepthBudget, budget
from .cascade import Cascade, cascade
from .confidence import Confident, confidence, entropy_policy
from .fixed import FixedDepth, fixed

__all__ = ["Cascade", "Confident", "DepthBudget", "FixedDepth"]


@hookimpl
def river_exit_policies():
    return {"fixed": fixed, "cascade": cascade, "confidence": confidence,
            "entropy": entropy_policy, "budget": budget}
