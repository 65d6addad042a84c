"""Shared machinery of strategies that keep one model per group (clustered FL)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from server.aggregation.fedavg import weighted_average
from server.strategies.base import (
    ClientInfo,
    GroupPlan,
    GroupResult,
    RoundPlan,
    Strategy,
    TrainConfig,
    returned,
)
from server.strategies.fedavg import ClientSampler


class GroupModelStrategy(Strategy):
    """Group models plus a client -> group assignment; clients use their group's model.

    ``distinct_starts``: start every group model as a distinct perturbation of the
    initial model (IFCA and FeSEM; their papers initialise cluster models independently).
    """

    distinct_starts = False

    def __init__(self, n_groups: int, clients_per_round: int, train: TrainConfig | None, warmup: str = "none") -> None:
        super().__init__(train)
        self.n_groups = n_groups
        self.sampler = ClientSampler(clients_per_round, warmup)
        self.group_models: list[np.ndarray] = []
        self.assignment: dict[str, int] = {}

    def setup(self, clients: Sequence[ClientInfo], initial_weights: np.ndarray, rng: np.random.Generator) -> None:
        super().setup(clients, initial_weights, rng)
        if self.distinct_starts:
            assert self.global_weights is not None
            self.group_models = perturbed_copies(self.global_weights, self.n_groups, rng)

    def min_clients(self) -> int:
        return self.sampler.k

    def model_for(self, client_id: str) -> np.ndarray:
        g = self.assignment.get(client_id)
        if g is None or not self.group_models:
            assert self.global_weights is not None
            return self.global_weights
        return self.group_models[g]

    def group_of(self, client_id: str) -> int | None:
        return self.assignment.get(client_id)

    def groups_as_lists(self) -> list[list[str]]:
        out: list[list[str]] = [[] for _ in range(len(self.group_models))]
        for c, g in sorted(self.assignment.items()):
            out[g].append(c)
        return out

    def parallel_plan(self, rnd: int, chosen: Sequence[str], *, mean_only: bool = False) -> RoundPlan:
        """Each selected, assigned client trains from its group's model; ``mean_only``:
        the strategy uses only each group's sample-weighted mean (:class:`GroupPlan`)."""
        by_group: dict[int, list[str]] = {}
        for c in chosen:
            if c in self.assignment:
                by_group.setdefault(self.assignment[c], []).append(c)
        models = {f"group{g}": self.group_models[g] for g in by_group}
        plans = tuple(
            GroupPlan(g, tuple(m), "parallel", f"group{g}", mean_only=mean_only) for g, m in sorted(by_group.items())
        )
        return RoundPlan(rnd, plans, models, self.train)

    def fedavg_groups(self, results: Sequence[GroupResult], *, weighted: bool = True) -> list[int]:
        """Replace each group's model by its members' mean and return the groups that
        changed: sample-weighted (FedAvg, the default) or, with ``weighted=False``, the
        plain mean (IFCA's model averaging, Ghosh et al. 2020 Alg. 2); a robust rule
        when the driver set one (:meth:`Strategy.average`)."""
        changed = []
        for r in results:
            members = returned([r])
            if members:
                sizes = [m.n_samples for m, _ in members] if weighted else None
                self.group_models[r.group_id] = self.average([w for _, w in members], sizes)
                changed.append(r.group_id)
        return changed

    def refresh_global(self) -> None:
        """The global model is the plain mean of the group models (FedGroup Alg. 2 l. 11)."""
        if self.group_models:
            self.global_weights = weighted_average(self.group_models)


def perturbed_copies(weights: np.ndarray, n: int, rng: np.random.Generator, scale: float = 0.01) -> list[np.ndarray]:
    """``n`` distinct starting models around ``weights`` (IFCA and FeSEM need distinct
    cluster models; their papers initialise them independently at random)."""
    std = float(np.std(weights)) or 1.0
    return [(weights + rng.normal(0.0, scale * std, weights.shape)).astype(np.float32) for _ in range(n)]
