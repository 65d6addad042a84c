"""FedAvg (McMahan et al. 2017), FedProx (Li et al. 2020) and the adaptive server
optimizers FedAdagrad / FedAdam / FedYogi (Reddi et al. 2021).

Each round ``clients_per_round`` clients train in parallel from the global model;
the server takes the sample-weighted mean (FedAvg) or feeds the mean update to an
adaptive optimizer. FedProx is FedAvg whose clients use the proximal term (``mu``),
which lives in the model's ``train_prox`` signature.

Client selection: uniform without replacement, or ``warmup="round_robin"`` (what the
FlexCFL code does: the first ceil(N/K) rounds visit every client once, in order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from server.aggregation.server_opt import ServerOptimizer
from server.errors import StrategyError
from server.strategies.base import (
    GroupPlan,
    GroupResult,
    RoundContext,
    RoundPlan,
    RoundSummary,
    Strategy,
    TrainConfig,
    mean_loss,
    returned,
)


class ClientSampler:
    """Uniform sampling, optionally after a round-robin warm-up that visits everyone."""

    def __init__(self, clients_per_round: int, warmup: str = "none") -> None:
        if clients_per_round < 1:
            raise StrategyError("clients_per_round must be at least 1")
        if warmup not in ("none", "round_robin"):
            raise StrategyError(f"warmup must be 'none' or 'round_robin', got {warmup!r}")
        self.k, self.warmup = clients_per_round, warmup

    def select(self, rnd: int, ids: Sequence[str], rng: np.random.Generator, *, at_most: bool = False) -> list[str]:
        """``k`` of ``ids``; with ``at_most`` (a retry without the devices that failed)
        every one of them when fewer than ``k`` are left."""
        ids = sorted(ids)
        k = min(self.k, len(ids)) if at_most else self.k
        if k > len(ids) or k == 0:
            raise StrategyError(f"{self.k} clients per round but only {len(ids)} clients are available")
        n_warm = -(-len(ids) // k)
        if self.warmup == "round_robin" and rnd <= n_warm:
            start = (rnd - 1) * k
            return [ids[(start + i) % len(ids)] for i in range(k)]
        return [ids[i] for i in sorted(rng.choice(len(ids), size=k, replace=False))]


class FedAvg(Strategy):
    summary = "FedAvg: sample-weighted mean of parallel clients (McMahan et al. 2017)"
    name = "fedavg"

    def __init__(self, clients_per_round: int = 10, train: TrainConfig | None = None, warmup: str = "none") -> None:
        super().__init__(train)
        self.sampler = ClientSampler(clients_per_round, warmup)

    def min_clients(self) -> int:
        return self.sampler.k

    def plan_round(self, rnd: int, ctx: RoundContext) -> RoundPlan:
        assert self.global_weights is not None
        chosen = self.sampler.select(rnd, self.candidates(), self.rng, at_most=bool(self.unavailable))
        return RoundPlan(
            rnd, (GroupPlan(0, tuple(chosen), "parallel", "global"),), {"global": self.global_weights}, self.train
        )

    def _average(self, results: Sequence[GroupResult]) -> np.ndarray | None:
        """The members' average (sample-weighted, or the robust rule the driver set), or
        None when no client returned a model (the round driver already retried)."""
        members = returned(results)
        if not members:
            return None
        return self.average([w for _, w in members], [m.n_samples for m, _ in members])

    def aggregate(self, rnd: int, plan: RoundPlan, results: Sequence[GroupResult]) -> RoundSummary:
        mean = self._average(results)
        if mean is not None:  # else the model stays as it was
            self.global_weights = mean
        return RoundSummary(rnd, 1, [list(plan.participants)], mean_loss(results))


class FedProx(FedAvg):
    """FedAvg whose clients minimise ``F_k(w) + μ/2 ||w - w_global||²`` (Li et al. 2020).

    ``mu`` defaults to 0.01, a generic value: the FedProx authors say there is no μ that
    suits every setting and suggest tuning it over {0.001, 0.01, 0.1, 0.5, 1}. For the
    synthetic data sets, Synthetic(1,1) included, their repository (github.com/litian96/FedProx,
    README) runs ``bash run_fedprox.sh synthetic_1_1 0 1``, i.e. μ = 1 (the script's third
    argument; learning rate 0.01, 10 clients per round, batch 10, 20 local epochs, MCLR),
    so use ``mu=1`` to reproduce their Synthetic results.
    """

    summary = "FedProx: FedAvg with the proximal term mu/2 ||w - w_global||^2 (Li et al. 2020)"
    name = "fedprox"

    def __init__(
        self, clients_per_round: int = 10, train: TrainConfig | None = None, mu: float = 0.01, warmup: str = "none"
    ) -> None:
        base = train or type(self).paper_train
        super().__init__(clients_per_round, replace(base, mu=mu), warmup)


class FedOpt(FedAvg):
    """FedAvg with an adaptive server optimizer on the mean update."""

    kind = "adam"

    def __init__(
        self,
        clients_per_round: int = 10,
        train: TrainConfig | None = None,
        server_lr: float = 0.01,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
        warmup: str = "none",
    ) -> None:
        super().__init__(clients_per_round, train, warmup)
        self.optimizer = ServerOptimizer(self.kind, server_lr, beta1, beta2, tau)

    def aggregate(self, rnd: int, plan: RoundPlan, results: Sequence[GroupResult]) -> RoundSummary:
        assert self.global_weights is not None
        mean = self._average(results)
        if mean is not None:  # no update, no optimizer step (its moments stay as they were)
            self.global_weights = self.optimizer.step(self.global_weights, mean - self.global_weights)
        return RoundSummary(rnd, 1, [list(plan.participants)], mean_loss(results))


class FedAdagrad(FedOpt):
    summary = "FedAdagrad: adaptive server optimizer on the mean update (Reddi et al. 2021)"
    name, kind = "fedadagrad", "adagrad"


class FedAdam(FedOpt):
    summary = "FedAdam: adaptive server optimizer on the mean update (Reddi et al. 2021)"
    name, kind = "fedadam", "adam"


class FedYogi(FedOpt):
    summary = "FedYogi: adaptive server optimizer on the mean update (Reddi et al. 2021)"
    name, kind = "fedyogi", "yogi"
