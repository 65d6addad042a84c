"""FeSEM (Xie et al. 2020, "Multi-center federated learning"): ℓ2 stochastic expectation
maximisation over model centres.

The E-step assigns a client to the centre nearest its model in parameter space (ℓ2);
the M-step makes each centre the mean of its clients' trained models. Where the
papers leave the order open, covey follows the public code that FlexCFL's Table 3
(FeSEM 77.0 < FlexCFL 85.6 on Synthetic(1, 1)) was measured with, ``flearn/trainer/
fesem.py`` in Duan et al.'s FlexCFL repository (:data:`FeSEMVariant`):

* ``"public"`` (the default): every centre starts as an *independent* random model
  (the public code re-initialises the model with a seed per group), and each round
  assigns the selected clients *before* they train, from their previous parameters:
  the model a client last trained to, or the initial model for one that never trained.
  All clients start from the same initial model, so the first assignment puts every
  client of round 1 in the one centre nearest it; clients then move only as the
  centres drift. covey draws an independent start by shuffling each tensor of the
  initial model (:func:`independent_copies`): the same distribution per entry as a
  fresh initialiser draw (Glorot-uniform kernels, zero biases), without the model
  builder on the server.
* ``"perturbed"`` (covey's earlier variant, kept by name): centres start as 1 %
  perturbations of the initial model, the selected clients train from their current
  centre (a new client from a centre drawn at random) and are assigned *after*
  training from the model they trained to. It lets every centre learn from round 1
  and so beats FlexCFL on ``flexcfl-synthetic``, the reverse of the paper's order
  (issue 29).

A centre is its members' sample-weighted mean in ``"public"`` (the public code's
groups average as FedAvg does) and their plain mean in ``"perturbed"`` (Eq. 6's
M-step); a centre no member chose keeps its model. The global model is the plain mean of the centres
(FedGroup Alg. 2 l. 11); in the public variant only of centres that have trained, so
an untouched random start never enters it. ``"public"`` keeps each trained client's
last model: memory of one model per client that has trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Literal

import numpy as np

from server.aggregation.fedavg import weighted_average
from server.errors import StrategyError
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
from server.strategies.clustered import GroupModelStrategy, perturbed_copies

FeSEMVariant = Literal["public", "perturbed"]
VARIANTS: tuple[FeSEMVariant, ...] = ("public", "perturbed")


def independent_copies(
    weights: np.ndarray, tensor_sizes: Sequence[int], n: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """``n`` models drawn independently of ``weights`` and of each other, each tensor a
    random permutation of that tensor's initial values.

    Parameters
    ----------
    weights : the initial flat float32 model (one initialiser draw).
    tensor_sizes : the sizes of its tensors, in order; empty or not summing to
        ``len(weights)``: the whole vector is one tensor.
    n : how many models.
    rng : the run's generator.

    Returns
    -------
    list of np.ndarray
        ``n`` float32 vectors. A permuted Glorot-uniform kernel is an exchangeable draw
        from the same per-entry distribution; zero biases stay zero, as a fresh
        initialiser leaves them.
    """
    flat = np.asarray(weights, np.float32)
    sizes = [int(s) for s in tensor_sizes]
    if not sizes or sum(sizes) != flat.size:
        sizes = [flat.size]
    bounds = np.cumsum([0, *sizes])
    out = []
    for _ in range(n):
        parts = [rng.permutation(flat[a:b]) for a, b in pairwise(bounds)]
        out.append(np.concatenate(parts).astype(np.float32))
    return out


class FeSEM(GroupModelStrategy):
    """FeSEM with the order of :data:`FeSEMVariant` (module docstring).

    Parameters
    ----------
    n_groups : the number of centres K.
    clients_per_round : clients sampled per round.
    train : local training (FlexCFL's Sec. 5 settings by default, as every baseline there).
    warmup : client sampling warm-up (:class:`~server.strategies.fedavg.ClientSampler`).
    variant : ``"public"`` (FlexCFL's public code) or ``"perturbed"`` (covey's earlier order).
    """

    summary = "FeSEM: l2 stochastic EM over model centres (Xie et al. 2020)"
    name = "fesem"
    code_params = frozenset({"variant"})
    code_settings = "FeSEM as FlexCFL's public code runs it (morningD/FlexCFL, flearn/trainer/fesem.py)"
    distinct_starts = False  # the variant decides how centres start (setup)

    def __init__(
        self,
        n_groups: int = 5,
        clients_per_round: int = 20,
        train: TrainConfig | None = None,
        warmup: str = "none",
        variant: FeSEMVariant = "public",
    ) -> None:
        if variant not in VARIANTS:
            raise StrategyError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
        super().__init__(n_groups, clients_per_round, train, warmup)
        self.variant: FeSEMVariant = variant
        self.last_local: dict[str, np.ndarray] = {}  # "public": each client's last trained model
        self.trained_groups: set[int] = set()

    def setup(self, clients: Sequence[ClientInfo], initial_weights: np.ndarray, rng: np.random.Generator) -> None:
        super().setup(clients, initial_weights, rng)
        assert self.global_weights is not None
        self.initial = self.global_weights.copy()
        if self.variant == "public":
            self.group_models = independent_copies(self.initial, self.tensor_sizes, self.n_groups, rng)
        else:
            self.group_models = perturbed_copies(self.initial, self.n_groups, rng)
        ids = sorted(self.clients)
        start = rng.integers(self.n_groups, size=len(ids))
        self.start_group = {c: int(g) for c, g in zip(ids, start, strict=True)}

    def _assign_before_training(self, chosen: Sequence[str]) -> None:
        """The public code's ``schedule_clients``: each chosen client to the centre
        nearest its previous parameters."""
        previous = np.stack([self.last_local.get(c, self.initial) for c in chosen])
        for c, g in zip(chosen, fesem_assign(previous, np.stack(self.group_models)), strict=True):
            self.assignment[c] = int(g)

    def plan_round(self, rnd: int, ctx: RoundContext) -> RoundPlan:
        chosen = self.sampler.select(rnd, self.candidates(), self.rng, at_most=bool(self.unavailable))
        if self.variant == "public":
            self._assign_before_training(chosen)
            return self.parallel_plan(rnd, chosen)
        by_group: dict[int, list[str]] = {}
        for c in chosen:
            by_group.setdefault(self.assignment.get(c, self.start_group.get(c, 0)), []).append(c)
        models = {f"group{g}": self.group_models[g] for g in by_group}
        plans = tuple(GroupPlan(g, tuple(m), "parallel", f"group{g}") for g, m in sorted(by_group.items()))
        return RoundPlan(rnd, plans, models, self.train)

    def aggregate(self, rnd: int, plan: RoundPlan, results: Sequence[GroupResult]) -> RoundSummary:
        if self.variant == "public":
            self.trained_groups.update(self.fedavg_groups(results))
            for m, w in returned(results):
                self.last_local[m.client_id] = np.asarray(w, np.float32).copy()
            trained = [self.group_models[g] for g in sorted(self.trained_groups)]
            if trained:
                self.global_weights = weighted_average(trained)
        else:
            members = returned(results)
            if members:
                local = np.stack([w for _, w in members])
                labels = fesem_assign(local, np.stack(self.group_models))
                self.group_models = list(fesem_centres(local, labels, np.stack(self.group_models)))
                for (m, _), g in zip(members, labels, strict=True):
                    self.assignment[m.client_id] = int(g)
            self.refresh_global()
        return RoundSummary(rnd, self.n_groups, self.groups_as_lists(), mean_loss(results))
