"""FedAvg-IC (Lee et al.) and HierFAVG (Liu et al. 2020): hierarchical FL with groups.

One covey round is τ1 local SGD steps on every participating node followed by a group
aggregation (sample-weighted inside each group, Alg. 1 lines 6-9); every τ2-th
*grouped* round ends with a global aggregation over all nodes instead, broadcast to
every group (Eq. 4, Alg. 1 lines 10-12). The defaults are the paper's experiments,
(τ1, τ2) = (1, 5) (Sec. 6.1, Table 4).

FedAvg-IC starts ungrouped with τ1 = τ2 = 1 (Alg. 1 line 1): round 1 is one local
SGD step and a global aggregation; its updates stand in for the local gradients
(``∇F_i ≈ -(w_i - w) / η``), and NODE_GROUPING (:mod:`server.grouping.fedavg_ic`) groups the
nodes by IID and communication cost over the context's distance matrix (measured RTT;
without one only the IID cost counts, FedAvg-I). Grouping happens once (line 13-14),
with at most ``max_steady_steps`` iterations of lines 19-21: 1 by default, as in the
paper's experiments ("the number of maximum steady steps was set to 1", Sec. 6.1).
From then on (τ1, τ2) apply (line 15) and global aggregations are counted from the
first grouped round: grouped round ``i`` (round 2 is grouped round 1) is global when
``i mod τ2 = 0``. That is Alg. 1 line 10's ``(t - 1) mod τ1τ2 = 0``: grouped round
``i`` ends at step ``t = 1 + i τ1``, after the one-step ungrouped start. Local
training is Table 4's (batch 128, η = 0.1 decayed by 0.99 a round, :attr:`paper_train`)
unless the run sets its own.

HierFAVG groups by network alone, from round 1: on a site with edges (``covey site
add-edge``), one group per edge and one of the devices behind none, which is the
paper's client-edge-cloud hierarchy (such groups run at their edge, ``server/edge/``);
otherwise the same k-medoids on the distance matrix with the IID weight set to zero,
run to convergence by default since it stands in for the fixed network edges HierFAVG
groups by, or a random partition when no distances are known.

The output of both methods is the global model (Alg. 1: ``OUTPUT: w(T)``); group models
are intermediate. Clients are therefore scored with the last global aggregate
(:meth:`FedAvgIC.model_for`), so a "best accuracy over rounds" only ever picks a model
the method actually outputs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from server.aggregation.hierarchical import HierarchicalSchedule
from server.errors import StrategyError
from server.grouping.baselines import random_groups
from server.grouping.fedavg_ic import ASSIGNMENTS, ICAssignment, fedavg_ic_groups, largest_group_share
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

log = logging.getLogger("covey.server")
DEGENERATE_SHARE = 0.5  # a grouping whose largest group holds more of the devices is reported
BALANCED_RESTARTS = 10  # NODE_GROUPING runs of the balanced variant (FedAvgIC's ``restarts``)


class FedAvgIC(GroupModelStrategy):
    """FedAvg-IC (Alg. 1).

    Parameters
    ----------
    n_groups: |K|, the number of node groups.
    clients_per_round: nodes per round; ``None`` (default): every node, as in Alg. 1.
    train: local training settings; a grouped round runs ``tau1`` SGD steps.
    tau1, tau2: local steps per group aggregation, group aggregations per global one
        (defaults (1, 5), Sec. 6.1).
    alpha_iid, alpha_comm: weights of the IID and communication costs (Eq. 12).
    max_steady_steps: the most iterations of Alg. 1 lines 19-21 (1, Sec. 6.1).
    assignment: how NODE_GROUPING (re)assigns nodes (:data:`~server.grouping.fedavg_ic.ICAssignment`):
        ``"balanced"`` (default: covey's variant, groups within one node of equal size),
        ``"paper"`` (Alg. 1 as written) or ``"descent"`` (one node at a time). The paper's
        and the descent's groups can collapse into one big group and singletons; a
        grouping whose largest group holds over :data:`DEGENERATE_SHARE` of the nodes is
        logged as a warning and recorded (``largest_group_share`` in the round's summary).
    restarts: runs of NODE_GROUPING from independent random starts, keeping the one of
        lowest combined cost (:func:`~server.grouping.fedavg_ic.fedavg_ic_groups`).
        ``None`` (default): 1 for ``"paper"`` (Alg. 1 runs once) and
        :data:`BALANCED_RESTARTS` for ``"balanced"``: with one steady step, a start whose
        medoids share a site splits two sites between two groups and cannot leave that
        (three rooms of four boards: rooms a and b mixed, 2 of 2 field runs).
    """

    summary = "FedAvg-IC: k-medoids on IID + communication cost, τ1/τ2 hierarchy (Lee et al.)"
    name = "fedavg_ic"
    # Table 4's defaults (bold): batch 128, η = 0.1, decayed 0.99 a round; one round is
    # τ1 local steps (max_steps), so ``epochs`` only bounds a client with few batches
    paper_train = TrainConfig(epochs=1, batch_size=128, lr=0.1, lr_decay=0.99)
    paper_settings = "FedAvg-IC (Lee et al. 2020) Sec. 6.1 and Table 4: batch 128, η = 0.1, decay 0.99, τ1 = 1, τ2 = 5"

    def __init__(
        self,
        n_groups: int = 5,
        clients_per_round: int | None = None,
        train: TrainConfig | None = None,
        tau1: int = 1,
        tau2: int = 5,
        alpha_iid: float = 1.0,
        alpha_comm: float = 1.0,
        max_steady_steps: int = 1,
        assignment: ICAssignment = "balanced",
        restarts: int | None = None,
    ) -> None:
        super().__init__(n_groups, clients_per_round or 1, train, "none")
        if assignment not in ASSIGNMENTS:
            raise StrategyError(f"assignment must be one of {', '.join(ASSIGNMENTS)}, got {assignment!r}")
        if restarts is not None and (isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 1):
            raise StrategyError(f"restarts must be a positive integer, got {restarts!r}")
        if restarts is not None and restarts > 1 and assignment == "descent":
            raise StrategyError("restarts apply to assignment 'paper' or 'balanced', not 'descent'")
        self.restarts = restarts if restarts is not None else (BALANCED_RESTARTS if assignment == "balanced" else 1)
        self.assignment_rule: ICAssignment = assignment
        self.grouping_share: float | None = None  # the largest group's share, once grouped
        if isinstance(max_steady_steps, bool) or not isinstance(max_steady_steps, int) or max_steady_steps < 1:
            raise StrategyError(f"max_steady_steps must be a positive integer, got {max_steady_steps!r}")
        self.all_clients = clients_per_round is None
        self.schedule = HierarchicalSchedule(tau1, tau2)
        self.alpha_iid, self.alpha_comm = alpha_iid, alpha_comm
        self.max_steady_steps = max_steady_steps
        self.first_grouped_round: int | None = None
        self._first_updates: dict[str, np.ndarray] = {}

    def min_clients(self) -> int:
        return 1 if self.all_clients else self.sampler.k

    def _train_config(self) -> TrainConfig:
        t = self.train
        return replace(t, max_steps=self.schedule.tau1)

    def _chosen(self, rnd: int) -> list[str]:
        if self.all_clients:
            return self.candidates()
        return self.sampler.select(rnd, self.candidates(), self.rng, at_most=bool(self.unavailable))

    def _group(self, ctx: RoundContext) -> None:
        """NODE_GROUPING over the measured distances. With α_iid = 0 (HierFAVG) only the
        network counts, and without distances the nodes are split at random."""
        ids = sorted(self.clients)
        edges = ctx.site_edges()
        if self.alpha_iid == 0 and edges:
            # HierFAVG's edge servers (Liu et al., client-edge-cloud) are the site's edges: one
            # group per edge, and one of the devices that reach the central broker directly
            names = sorted({edges[c] for c in ids if c in edges})
            self._set_groups(ids, np.array([names.index(edges[c]) if c in edges else len(names) for c in ids]))
            return
        k = min(self.n_groups, len(ids))
        measured = ctx.distance_matrix()
        has_dist = measured is not None and bool(measured.any())
        # measured RTTs differ a little by direction (server/links.py); the cost is per pair
        dist = (measured + measured.T) / 2 if measured is not None and has_dist else np.zeros((len(ids), len(ids)))
        if self.alpha_iid == 0 and not has_dist:
            labels = np.empty(len(ids), np.int64)
            for g, members in enumerate(random_groups(len(ids), k, self.rng)):
                labels[members] = g
            self._set_groups(ids, labels)
            return
        assert self.global_weights is not None
        n = np.array([self.clients[c].n_samples for c in ids], np.float64)
        zero = np.zeros_like(self.global_weights)
        grads = np.stack([-self._first_updates.get(c, zero) for c in ids]).astype(np.float32)
        res = fedavg_ic_groups(
            grads,
            n,
            dist,
            k,
            alpha_iid=self.alpha_iid,
            alpha_comm=self.alpha_comm if has_dist else 0.0,
            max_iter=self.max_steady_steps,
            random_state=self.rng,
            assignment=self.assignment_rule,
            restarts=self.restarts,
        )
        self._set_groups(ids, res.labels)
        share = largest_group_share(res.labels)
        self.grouping_share = share
        if k > 1 and share > DEGENERATE_SHARE:
            log.warning(
                "%s's grouping degenerated: its largest group holds %d of %d devices (%.0f %%; assignment %r); "
                "`--set assignment=balanced` keeps groups within one device of equal size",
                self.name,
                round(share * len(ids)),
                len(ids),
                100 * share,
                self.assignment_rule,
            )

    def _set_groups(self, ids: Sequence[str], labels: np.ndarray) -> None:
        assert self.global_weights is not None
        self.assignment = {c: int(g) for c, g in zip(ids, labels, strict=True)}
        self.group_models = [self.global_weights.copy() for _ in range(int(labels.max()) + 1)]

    def model_for(self, client_id: str) -> np.ndarray:
        """The last global aggregate: the method's output (Alg. 1), never a group model."""
        assert self.global_weights is not None
        return self.global_weights

    def plan_round(self, rnd: int, ctx: RoundContext) -> RoundPlan:
        assert self.global_weights is not None
        chosen = self._chosen(rnd)
        if not self.assignment and (rnd > 1 or self.alpha_iid == 0):
            self._group(ctx)  # the IID cost needs round 1's updates; the network alone does not
        if not self.assignment:  # round 1: ungrouped, τ1 = τ2 = 1 (Alg. 1 line 1): one step, then global
            return RoundPlan(
                rnd,
                (GroupPlan(0, tuple(chosen), "parallel", "global"),),
                {"global": self.global_weights},
                replace(self.train, max_steps=1),
            )
        if self.first_grouped_round is None:
            self.first_grouped_round = rnd
        # a grouped round uses each group's sample-weighted mean alone (group and global
        # aggregation, Eq. 4-5), so an edge may average its room's group (server/edge/);
        # a robust rule needs every member's model
        plan = self.parallel_plan(rnd, chosen, mean_only=self.aggregation == "mean")
        return RoundPlan(plan.round, plan.groups, plan.models, self._train_config())

    def aggregate(self, rnd: int, plan: RoundPlan, results: Sequence[GroupResult]) -> RoundSummary:
        members = returned(results)
        models, sizes = [w for _, w in members], [m.n_samples for m, _ in members]
        if not self.assignment:
            assert self.global_weights is not None
            for m, w in members:
                self._first_updates[m.client_id] = w - self.global_weights
            if members:  # else nobody returned a model: it stays as it was
                self.global_weights = self.average(models, sizes)
            return RoundSummary(rnd, 1, [list(plan.participants)], mean_loss(results), {"global_aggregation": 1.0})
        self.fedavg_groups(results)
        first = rnd if self.first_grouped_round is None else self.first_grouped_round
        is_global = self.schedule.is_global_round(rnd - first + 1)
        if is_global and members:
            self.global_weights = self.average(models, sizes)
            self.group_models = [self.global_weights.copy() for _ in self.group_models]
        extra = {"global_aggregation": float(is_global)}
        if rnd == first and self.grouping_share is not None:  # the round the groups were formed for
            extra["largest_group_share"] = self.grouping_share
        return RoundSummary(
            rnd,
            len(self.group_models),
            self.groups_as_lists(),
            mean_loss(results),
            extra,
            aggregation="leader" if is_global else "leader_only",
        )


class HierFAVG(FedAvgIC):
    """HierFAVG: FedAvg-IC's schedule over groups formed by network distance alone.

    ``max_steady_steps`` defaults to 50: the k-medoids on distances stands in for the
    network edges HierFAVG groups by, so it runs to convergence.
    """

    summary = "HierFAVG: groups by network edge / RTT, τ1/τ2 hierarchy (Liu et al. 2020)"
    name = "hierfavg"
    paper_settings = "HierFAVG as Lee et al. 2020 evaluate it (FedAvg-IC's Table 4): batch 128, η 0.1, decay 0.99"

    def __init__(
        self,
        n_groups: int = 5,
        clients_per_round: int | None = None,
        train: TrainConfig | None = None,
        tau1: int = 1,
        tau2: int = 5,
        max_steady_steps: int = 50,
    ) -> None:
        super().__init__(
            n_groups,
            clients_per_round,
            train,
            tau1,
            tau2,
            alpha_iid=0.0,
            alpha_comm=1.0,
            max_steady_steps=max_steady_steps,
            assignment="descent",  # the network's own groups, whatever their sizes
        )
