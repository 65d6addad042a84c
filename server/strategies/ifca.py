"""IFCA (Ghosh et al., NeurIPS 2020): each selected client evaluates every group model
on its training data and trains the one with the lowest loss; each group model is the
plain mean of the models of the clients that chose it (Alg. 2, model averaging:
``θ_j = Σ_i s_ij θ̃_i / Σ_i s_ij``, not weighted by sample counts); a group no selected
client chose keeps its model. Group models start as distinct perturbations of the
initial model."""

from __future__ import annotations

from collections.abc import Sequence

from server.grouping.baselines import ifca_assign
from server.strategies.base import (
    GroupResult,
    RoundContext,
    RoundPlan,
    RoundSummary,
    TrainConfig,
    mean_loss,
)
from server.strategies.clustered import GroupModelStrategy


class IFCA(GroupModelStrategy):
    summary = "IFCA: clients pick the group model with the lowest loss (Ghosh et al. 2020)"
    name = "ifca"
    distinct_starts = True

    def __init__(
        self, n_groups: int = 5, clients_per_round: int = 20, train: TrainConfig | None = None, warmup: str = "none"
    ) -> None:
        super().__init__(n_groups, clients_per_round, train, warmup)

    def _assign(self, clients: Sequence[str], ctx: RoundContext) -> None:
        labels = ifca_assign(ctx.losses(list(clients), self.group_models))
        for c, g in zip(clients, labels, strict=True):
            self.assignment[c] = int(g)

    def plan_round(self, rnd: int, ctx: RoundContext) -> RoundPlan:
        chosen = self.sampler.select(rnd, self.candidates(), self.rng, at_most=bool(self.unavailable))
        self._assign(chosen, ctx)
        return self.parallel_plan(rnd, chosen)

    def prepare_evaluation(self, ctx: RoundContext) -> None:
        self._assign(sorted(self.clients), ctx)

    def aggregate(self, rnd: int, plan: RoundPlan, results: Sequence[GroupResult]) -> RoundSummary:
        self.fedavg_groups(results, weighted=False)
        self.refresh_global()
        return RoundSummary(rnd, self.n_groups, self.groups_as_lists(), mean_loss(results))
