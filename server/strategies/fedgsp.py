"""FedGSP (Zeng et al. 2022) and its ablations NaiveGSP and NaiveGSP+ICG.

* ``fedgsp``: ICG groups whose number grows with the round (STP: f(r) from Eq. 1-3),
  κ of them train as sequential chains in parallel with each other (Alg. 1). Dynamic:
  the clients are regrouped and every chain order reshuffled each round (Sec. 3.1).
* ``naivegsp``: random groups of a fixed number β, chains (Astraea-style).
* ``naivegsp_icg``: ICG groups of a fixed number β, chains.

The two ablations are *static* (Sec. 4.1-4.2: clients "are randomly assigned to a
fixed number of groups"; "the training mode of NaiveGSP+ICG is static, it may learn
the client order"): their groups and each group's chain order are formed once, in the
first round, and kept; which κ of the groups train is still drawn every round. A
client registering later (:meth:`FedGSP.add_client`) is appended to the end of the
chain of the smallest group; among equally small groups NaiveGSP takes the first and
NaiveGSP+ICG the one whose class distribution the newcomer brings closest to the
global one (the rule ICG uses for its leftover clients).

``icg_draw`` picks ICG's draw of one client per cluster into each group (FedGSP
Alg. 2 line 6): ``"balanced"`` (default, covey's min-cost placement) or ``"random"``
(the paper's random draw); see :mod:`server.grouping.icg`.

Aggregation is the
sample-weighted mean of the chains that trained (``weighted=False``: plain mean);
see :mod:`server.grouping.stp` for why this departs from Alg. 1 line 14.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from server.errors import StrategyError
from server.grouping.baselines import random_groups
from server.grouping.icg import DRAWS, IcgDraw, icg_groups
from server.grouping.stp import STPSchedule, aggregate_chains
from server.metrics import pairwise_cpd
from server.strategies.base import (
    ClientInfo,
    GroupPlan,
    GroupResult,
    RoundContext,
    RoundPlan,
    RoundSummary,
    Strategy,
    TrainConfig,
    mean_loss,
)


class FedGSP(Strategy):
    summary = "FedGSP: ICG groups growing by f(r), sequential chains, κ sampling (Zeng et al. 2022)"
    name = "fedgsp"
    paper_train = TrainConfig(epochs=1, batch_size=5, lr=0.01)
    paper_settings = (
        "FedGSP (Zeng et al. 2022) Sec. 4.1: batch 5, 1 local epoch, η = 0.01, κ = 0.3, LOG, α = 2, β = 10; "
        "ICG τ = 10 (Sec. 3.3)"
    )
    # ICG's τ = 10 iterations: Sec. 3.3; ICG and STP's growth are the method itself
    paper_params = frozenset({"growth", "alpha", "beta", "kappa", "icg_iterations", "grouping", "grow"})
    static = False  # True: groups and chain orders are formed once and kept (the ablations)

    def __init__(
        self,
        train: TrainConfig | None = None,
        growth: str = "log",
        alpha: float = 2.0,
        beta: int = 10,
        kappa: float = 0.3,
        grouping: str = "icg",
        grow: bool = True,
        weighted: bool = True,
        icg_iterations: int = 10,
        icg_draw: IcgDraw = "balanced",
    ) -> None:
        super().__init__(train)
        if grouping not in ("icg", "random"):
            raise StrategyError(f"grouping must be 'icg' or 'random', got {grouping!r}")
        if icg_draw not in DRAWS:
            raise StrategyError(f"icg_draw must be one of {', '.join(DRAWS)}, got {icg_draw!r}")
        self.icg_draw: IcgDraw = icg_draw
        self.schedule = STPSchedule(growth, alpha, beta, kappa)
        self.grouping, self.grow, self.weighted = grouping, grow, weighted
        self.icg_iterations = icg_iterations
        self.last_groups: list[list[str]] = []
        self.last_cpd: float = float("nan")
        # f(r) when the round was planned (Eq. 11), and the groups ICG formed for it: on a
        # small site Algorithm 2's layout may form more (3 boards, f(r) = 2: three groups
        # of one), of which κ train
        self.last_f_r = self.last_formed = 0
        self.fixed_groups: list[list[str]] = []  # static strategies: the chains, in order

    def n_groups(self, rnd: int) -> int:
        n = len(self.candidates())
        return self.schedule.n_groups(rnd, n) if self.grow else min(self.schedule.beta, n)

    def _groups(self, rnd: int) -> list[list[str]]:
        ids = self.candidates()
        k = self.last_f_r = self.n_groups(rnd)
        counts = np.array([self.clients[c].class_counts for c in ids], np.float64)
        if self.grouping == "icg":
            idx, _, _ = icg_groups(counts, k, max_iter=self.icg_iterations, draw=self.icg_draw, random_state=self.rng)
        else:
            idx = random_groups(len(ids), k, self.rng)
        self.last_cpd = float(np.median(pairwise_cpd(counts, idx))) if len(idx) > 1 else 0.0
        self.last_formed = len(idx)
        return [[ids[i] for i in g] for g in idx]

    def plan_round(self, rnd: int, ctx: RoundContext) -> RoundPlan:
        assert self.global_weights is not None
        if self.static:
            if not self.fixed_groups:
                self.fixed_groups = [[str(c) for c in self.rng.permutation(g)] for g in self._groups(rnd)]
            chains = [tuple(c for c in g if c not in self.unavailable) for g in self.fixed_groups]
            open_groups = [g for g, chain in enumerate(chains) if chain]  # all of them unless retrying
            if not open_groups:
                raise StrategyError("no group has a client left to train")
            chosen = [open_groups[i] for i in self.schedule.sample_groups(len(open_groups), self.rng)]
            plans = tuple(GroupPlan(int(g), chains[g], "chain", "global") for g in chosen)
        else:
            if not self.candidates():
                raise StrategyError("no client left to train")
            groups = self._groups(rnd)
            sampled = self.schedule.sample_groups(len(groups), self.rng)
            plans = tuple(
                GroupPlan(int(g), tuple(self.rng.permutation(groups[g]).tolist()), "chain", "global") for g in sampled
            )
        self.last_groups = [list(p.members) for p in plans]
        return RoundPlan(rnd, plans, {"global": self.global_weights}, self.train)

    def _round_extra(self, rnd: int) -> dict[str, float]:
        """f(r) and the groups formed as the round was planned (a newcomer that registered
        since changes neither); a strategy restored from a checkpoint older than these
        fields, or a static one, falls back to f(r) now and its fixed groups."""
        f_r = getattr(self, "last_f_r", 0) or self.n_groups(rnd)
        formed = getattr(self, "last_formed", 0) or len(self.fixed_groups) or f_r
        return {"median_cpd": self.last_cpd, "f_r": float(f_r), "groups_formed": float(formed)}

    def add_client(self, client: ClientInfo) -> None:
        """A newcomer. Dynamic FedGSP groups it from the next round on; a static strategy
        appends it to the end of the smallest group's chain (see the module docstring)."""
        super().add_client(client)
        if self.static and self.fixed_groups and all(client.client_id not in g for g in self.fixed_groups):
            self.fixed_groups[self._newcomer_group(client)].append(client.client_id)

    def _newcomer_group(self, client: ClientInfo) -> int:
        sizes = np.array([len(g) for g in self.fixed_groups])
        smallest = np.flatnonzero(sizes == sizes.min())
        if self.grouping != "icg" or len(smallest) == 1:
            return int(smallest[0])
        total = np.sum([c.class_counts for c in self.clients.values()], axis=0).astype(np.float64)
        target = total / max(float(total.sum()), 1e-12)

        def distance(g: int) -> float:
            counts = np.sum([self.clients[c].class_counts for c in self.fixed_groups[g]], axis=0) + client.class_counts
            return float((((counts / max(float(counts.sum()), 1e-12)) - target) ** 2).sum())

        return min((int(g) for g in smallest), key=distance)

    def aggregate(self, rnd: int, plan: RoundPlan, results: Sequence[GroupResult]) -> RoundSummary:
        done = [(r.final_weights, r.n_samples) for r in results if r.final_weights is not None and r.n_samples > 0]
        if not done:  # no chain trained (the driver already retried): the model stays as it was
            pass
        elif self.aggregation == "mean":
            self.global_weights = aggregate_chains([w for w, _ in done], [n for _, n in done], weighted=self.weighted)
        else:  # a robust rule over the chains' models
            self.global_weights = self.average([w for w, _ in done])
        return RoundSummary(
            rnd,
            len(plan.groups),
            self.last_groups,
            mean_loss(results),
            self._round_extra(rnd),
        )


class NaiveGSP(FedGSP):
    summary = "NaiveGSP: random fixed groups trained as chains (FedGSP ablation)"
    name = "naivegsp"
    static = True

    def __init__(
        self, train: TrainConfig | None = None, beta: int = 10, kappa: float = 0.3, weighted: bool = True
    ) -> None:
        super().__init__(train, beta=beta, kappa=kappa, grouping="random", grow=False, weighted=weighted)


class NaiveGSPICG(FedGSP):
    summary = "NaiveGSP+ICG: fixed ICG groups trained as chains (FedGSP ablation)"
    name = "naivegsp_icg"
    static = True

    def __init__(
        self,
        train: TrainConfig | None = None,
        beta: int = 10,
        kappa: float = 0.3,
        weighted: bool = True,
        icg_draw: IcgDraw = "balanced",
    ) -> None:
        super().__init__(
            train, beta=beta, kappa=kappa, grouping="icg", grow=False, weighted=weighted, icg_draw=icg_draw
        )
