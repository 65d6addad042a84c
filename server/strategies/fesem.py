"""FeSEM (Xie et al. 2020, multi-center FL): ℓ2 stochastic expectation maximisation.

Selected clients train from their current centre's model; the E-step assigns each
trained local model to the nearest centre in parameter space (ℓ2); the M-step makes
each centre the mean of the local models assigned to it. Centres start as distinct
perturbations of the initial model; a client never seen uses the global mean."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from server.grouping.baselines import fesem_assign, fesem_centres
from server.strategies.base import (
    ClientInfo,
    GroupPlan,
    GroupResult,
    RoundContext,
    RoundPlan,
    RoundSummary,
    TrainConfig,
    mean_loss,
    returned,
)
from server.strategies.clustered import GroupModelStrategy


class FeSEM(GroupModelStrategy):
    summary = "FeSEM: l2 stochastic EM over model centres (Xie et al. 2020)"
    name = "fesem"
    distinct_starts = True

    def __init__(
        self, n_groups: int = 5, clients_per_round: int = 20, train: TrainConfig | None = None, warmup: str = "none"
    ) -> None:
        super().__init__(n_groups, clients_per_round, train, warmup)

    def setup(self, clients: Sequence[ClientInfo], initial_weights: np.ndarray, rng: np.random.Generator) -> None:
        super().setup(clients, initial_weights, rng)
        ids = sorted(self.clients)
        start = rng.integers(self.n_groups, size=len(ids))
        self.start_group = {c: int(g) for c, g in zip(ids, start, strict=True)}

    def plan_round(self, rnd: int, ctx: RoundContext) -> RoundPlan:
        chosen = self.sampler.select(rnd, self.candidates(), self.rng, at_most=bool(self.unavailable))
        by_group: dict[int, list[str]] = {}
        for c in chosen:
            by_group.setdefault(self.assignment.get(c, self.start_group.get(c, 0)), []).append(c)
        models = {f"group{g}": self.group_models[g] for g in by_group}
        plans = tuple(GroupPlan(g, tuple(m), "parallel", f"group{g}") for g, m in sorted(by_group.items()))
        return RoundPlan(rnd, plans, models, self.train)

    def aggregate(self, rnd: int, plan: RoundPlan, results: Sequence[GroupResult]) -> RoundSummary:
        members = returned(results)
        if members:
            local = np.stack([w for _, w in members])
            labels = fesem_assign(local, np.stack(self.group_models))
            self.group_models = list(fesem_centres(local, labels, np.stack(self.group_models)))
            for (m, _), g in zip(members, labels, strict=True):
                self.assignment[m.client_id] = int(g)
        self.refresh_global()
        return RoundSummary(rnd, self.n_groups, self.groups_as_lists(), mean_loss(results))
