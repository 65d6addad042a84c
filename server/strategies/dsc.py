"""DSC-FL (Sun et al., dual-segment clustering): groups by link quality, then by
labels; intra-group aggregation weighted by gradient angle (Eq. 4), inter-group by data
size (Eq. 3).

Groups are formed once, at the first round, from the SNR matrix the context reports
(without one — e.g. in a simulation with no radio model — every client is in one
primary group, which is the letter's "Setting 2", data-based clustering only). Every
round the clients train in parallel from the global model; a client's gradient is
taken as its update direction ``-(w_k - w)``.

Training is the letter's by default (Sec. IV-A, :attr:`DSC.paper_train`): every client
every round (Alg. 1 aggregates all K), one gradient step on a mini-batch (Eq. 5's
``w - λ ∇F``: a client's one SGD step at rate λ sends ``-λ ∇F_k``, and the weighted
sum of those is Eq. 5's step), λ = 0.06 (MNIST; 0.05 for Fashion-MNIST). The letter's
batch is "0.1" of a client's 400-800 samples; covey's batch is a count, 60. Its
noisy uplinks (Sec. II-B) are the simulator's ``--channel awgn``
(:mod:`server.simulation.channel`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from server.aggregation.dsc_weights import angle_weights, size_weights
from server.errors import StrategyError
from server.grouping.dsc import dsc_groups
from server.strategies.base import (
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


class DSC(GroupModelStrategy):
    """DSC-FL (module docstring).

    Parameters
    ----------
    clients_per_round : clients sampled per round; ``None`` (default): every client,
        as Alg. 1 aggregates all.
    train : local training (the letter's by default).
    snr_similarity : how Γ's rows become the primary segment's similarity
        (:func:`~server.grouping.dsc.snr_similarity_matrix`).
    warmup : client sampling warm-up, with ``clients_per_round``.
    local_steps : mini-batch steps a round (1: Eq. 5's one gradient step; ``None``: the
        run's epochs).
    """

    summary = "DSC: affinity propagation on SNR then labels; angle-weighted aggregation (Sun et al.)"
    name = "dsc"
    paper_train = TrainConfig(epochs=1, batch_size=60, lr=0.06)
    paper_settings = "DSC (Sun et al. 2023) Sec. IV-A: all clients, one gradient step (Eq. 5), λ = 0.06 (MNIST)"
    paper_params = frozenset({"clients_per_round", "local_steps"})

    def __init__(
        self,
        clients_per_round: int | None = None,
        train: TrainConfig | None = None,
        snr_similarity: str = "profile",
        warmup: str = "none",
        local_steps: int | None = 1,
    ) -> None:
        if local_steps is not None and (
            isinstance(local_steps, bool) or not isinstance(local_steps, int) or local_steps < 1
        ):
            raise StrategyError(f"local_steps must be a positive integer or None, got {local_steps!r}")
        super().__init__(0, clients_per_round or 1, train, warmup)
        self.all_clients = clients_per_round is None
        self.snr_similarity = snr_similarity
        self.local_steps = local_steps

    def min_clients(self) -> int:
        return 1 if self.all_clients else self.sampler.k

    def _form_groups(self, ctx: RoundContext) -> None:
        ids = sorted(self.clients)
        counts = np.array([self.clients[c].class_counts for c in ids], np.float64)
        snr = ctx.snr_matrix()
        if snr is None:
            snr = np.zeros((len(ids), len(ids)))
        if snr.shape != (len(ids), len(ids)):
            raise StrategyError(f"SNR matrix is {snr.shape} for {len(ids)} clients")
        # The letter's Γ is one reciprocal channel per pair; measured directions differ a
        # little (server/links.py), so each pair takes the mean of its two directions.
        snr = (snr + snr.T) / 2
        _, labels = dsc_groups(snr, counts, snr_similarity=self.snr_similarity, random_state=self.rng)
        self.assignment = {c: int(g) for c, g in zip(ids, labels, strict=True)}
        self.n_groups = int(labels.max()) + 1

    def plan_round(self, rnd: int, ctx: RoundContext) -> RoundPlan:
        assert self.global_weights is not None
        if not self.assignment:
            self._form_groups(ctx)
        if self.all_clients:
            chosen = self.candidates()
        else:
            chosen = self.sampler.select(rnd, self.candidates(), self.rng, at_most=bool(self.unavailable))
        by_group: dict[int, list[str]] = {}
        for c in chosen:
            by_group.setdefault(self.assignment[c], []).append(c)
        # only each group's Eq. 2/4 aggregate reaches Eq. 3: a group whose members all sit
        # behind one edge may be aggregated there, the edge as the group's leader
        plans = tuple(
            GroupPlan(g, tuple(m), "parallel", "global", mean_only=True, group_rule="dsc_angle")
            for g, m in sorted(by_group.items())
        )
        train = self.train if self.local_steps is None else replace(self.train, max_steps=self.local_steps)
        return RoundPlan(rnd, plans, {"global": self.global_weights}, train)

    def model_for(self, client_id: str) -> np.ndarray:
        assert self.global_weights is not None
        return self.global_weights  # DSC trains one global model

    def aggregate(self, rnd: int, plan: RoundPlan, results: Sequence[GroupResult]) -> RoundSummary:
        assert self.global_weights is not None
        w = self.global_weights.astype(np.float64)
        group_models, group_sizes = [], []
        for r in results:
            members = returned([r])
            if not members:
                continue
            updates = np.stack([wt for _, wt in members]).astype(np.float64) - w
            weights = angle_weights(-updates, np.array([m.n_samples for m, _ in members]))
            group_models.append(w + weights @ updates)
            group_sizes.append(sum(m.n_samples for m, _ in members))
        if group_models:  # else no client returned a model: the global model stays as it was
            inter = size_weights(np.array(group_sizes))
            self.global_weights = (inter @ np.stack(group_models)).astype(np.float32)
        groups: dict[int, list[str]] = {}
        for c, g in sorted(self.assignment.items()):
            groups.setdefault(g, []).append(c)
        return RoundSummary(rnd, self.n_groups, list(groups.values()), mean_loss(results), aggregation="leader")
