"""`budget`: the paper's rule with its threshold steered online to hold a target mean depth."""

import attrs

from river_core.settings.options import between, option
from river_core.method.policy import Exits, Needs, Policy, RowView, WhereOptions, tau_option


@attrs.define
class Steering:
    """One sequence's tau, and what its current token has run so far."""

    tau: float
    step: int = -1
    layers: int | None = None   # backbone layers the last token ran


class DepthBudget(Policy):
    """Exit where both sub-blocks' cosines exceed tau (the paper's rule); after each token,
    tau moves by `rate` * (target - layers it ran) / L, so a token deeper than the budget
    lowers the bar for the next one. Per sequence (a batch row keeps its own tau)."""

    needs = Needs(similarity=True, sub_blocks=True)

    def __init__(self, target: float, rate: float, tau: float, exits: Exits,
                 num_layers: int) -> None:
        self.target, self.rate, self.start = target, rate, tau
        self.exits, self.num_layers = exits, num_layers

    def new_row(self) -> Steering:
        return Steering(self.start)

    def should_exit(self, row: RowView) -> bool:
        s: Steering = row.state
        if s.step != row.step:   # a new token: the last one's depth steers tau
            if s.layers is not None:
                s.tau += self.rate * (self.target - s.layers) / self.num_layers
                s.tau = min(max(s.tau, -1.0), 1.0)
            s.step = row.step
        leave = row.layer in self.exits.open and row.similarity > s.tau
        s.layers = row.layer + 1 if leave else row.layer + 2   # runs on: at least one more layer
        return leave


@attrs.frozen
class BudgetOptions(WhereOptions):
    target: float = option(4.0, "mean number of backbone layers a token should run",
                           between(0.0, 1000.0))
    rate: float = option(0.05, "how fast tau follows the depth error", between(0.0, 1.0))
    tau: float = tau_option(doc="the threshold to start from")


def budget(options: BudgetOptions, num_layers: int) -> DepthBudget:
    """The paper's rule, tau steered online to hold -o target=MEAN backbone layers."""
    return DepthBudget(options.target, options.rate, options.tau, options.where(num_layers),
                       num_layers)
