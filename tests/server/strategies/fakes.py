"""A fake :class:`RoundContext` and fabricated round results, so strategies can be
driven round by round without models, data or a simulator."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from server.strategies.base import ClientInfo, GroupResult, MemberResult, RoundPlan, Strategy


class FakeContext:
    """Answers a strategy's questions from plain arrays.

    ``counts``: client id -> current class-count vector (mutable: shift it between rounds).
    ``updates``: client id -> pre-training update (a fixed vector per client).
    ``distance``: optional distance matrix over the sorted client ids.
    ``count_calls`` records the ids of every ``class_counts`` call.
    """

    def __init__(
        self,
        counts: dict[str, np.ndarray],
        updates: dict[str, np.ndarray] | None = None,
        *,
        distance: np.ndarray | None = None,
        seed: int = 0,
    ) -> None:
        self.rng = np.random.default_rng(seed)
        self.counts = {c: np.asarray(v, np.float64).copy() for c, v in counts.items()}
        self.updates = updates or {}
        self.distance = distance
        self.count_calls: list[list[str]] = []

    def clients(self) -> Sequence[ClientInfo]:
        return [info(c, v) for c, v in sorted(self.counts.items())]

    def pretrain(self, client_ids: Sequence[str], weights: np.ndarray, steps: int) -> dict[str, np.ndarray]:
        return {c: self.updates[c].astype(np.float32) for c in client_ids}

    def losses(self, client_ids: Sequence[str], models: Sequence[np.ndarray]) -> np.ndarray:
        return np.zeros((len(client_ids), len(models)))

    def class_counts(self, client_ids: Sequence[str]) -> dict[str, np.ndarray]:
        self.count_calls.append(list(client_ids))
        return {c: self.counts[c].copy() for c in client_ids}

    def snr_matrix(self) -> np.ndarray | None:
        return None

    def distance_matrix(self) -> np.ndarray | None:
        return self.distance

    def site_edges(self) -> dict[str, str]:
        return {}


def info(client_id: str, counts: np.ndarray) -> ClientInfo:
    counts = np.asarray(counts, np.float64)
    return ClientInfo(client_id, int(counts.sum()), counts, 1)


def parallel_results(plan: RoundPlan, trained: Callable[[str, np.ndarray], np.ndarray]) -> list[GroupResult]:
    """Every member of every parallel group returns ``trained(client, start_model)``."""
    out = []
    for g in plan.groups:
        start = plan.models[g.start_model]
        members = tuple(MemberResult(c, 10, 1.0, trained(c, start).astype(np.float32)) for c in g.members)
        out.append(GroupResult(g.group_id, members))
    return out


def chain_results(plan: RoundPlan) -> list[GroupResult]:
    """Every chain returns its start model plus 0.01 per member."""
    out = []
    for g in plan.groups:
        members = tuple(MemberResult(c, 10, 1.0) for c in g.members)
        final = (plan.models[g.start_model] + 0.01 * len(members)).astype(np.float32)
        out.append(GroupResult(g.group_id, members, final))
    return out


def play_round(
    strategy: Strategy, rnd: int, ctx: FakeContext, trained: Callable[[str, np.ndarray], np.ndarray]
) -> tuple[RoundPlan, dict[str, float]]:
    """Plan, fabricate the members' results and aggregate one round."""
    plan = strategy.plan_round(rnd, ctx)
    summary = strategy.aggregate(rnd, plan, parallel_results(plan, trained))
    return plan, summary.extra
