"""A parallel group whose members sit behind several edges (or some behind none): each
part runs where its members are, and the parts' outcomes make the group's.

A group planned ``mean_only`` with the ``sample_mean`` rule needs only the
sample-weighted mean of its members' models, and that mean is the sample-weighted mean
of its parts' means. So when a strategy's group spans rooms (FedAvg-IC groups by data
and links, not by room), each room's edge may still average its own members and send
one model up: :class:`SplitGroupManager` runs one manager per part (an edge's proxy, or
the coordinator's own manager for the members behind no edge) and combines their
results. Screening then sees each edge's mean as one member's update, held to a
member's bound (a lying edge costs only its own part), and the members run here one by
one; strategies see each edge's mean as one member with its members' samples. A rule that is not a mean of
means (DSC's angle weights need every member's update at once) never splits.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from device.protocol import Payload, TrainResult
from server.execution.manager import GroupManager
from server.strategies.base import EdgeMean, GroupPlan, GroupResult


def splittable(group: GroupPlan) -> bool:
    """Whether ``group``'s outcome is a mean of its parts' means."""
    return group.mode == "parallel" and group.mean_only and group.group_rule == "sample_mean"


class SplitGroupManager(GroupManager):
    """Group ``plan`` run as ``parts`` (each a manager of some of its members, every
    member in exactly one); done when every part is."""

    def __init__(self, plan: GroupPlan, parts: Sequence[GroupManager]) -> None:
        # no sender of its own: the parts send (GroupManager's state is theirs)
        self.plan, self.parts = plan, list(parts)
        self.round = self.parts[0].round
        self.handoff = "relay"
        self.members = [m for p in self.parts for m in p.members]

    @property
    def done(self) -> bool:  # type: ignore[override]
        return all(p.done for p in self.parts)

    @property
    def deadline(self) -> float:  # type: ignore[override]
        waiting = [p.deadline for p in self.parts if not p.done]
        return min(waiting) if waiting else float("inf")

    def start(self, now: float) -> None:
        for p in self.parts:
            p.start(now)

    def resend_outstanding(self, now: float) -> None:
        for p in self.parts:
            p.resend_outstanding(now)

    def release(self) -> None:
        for p in self.parts:
            p.release()

    @property
    def resends(self) -> int:
        return sum(p.resends for p in self.parts)

    @property
    def bytes_sent(self) -> int:
        return sum(p.bytes_sent for p in self.parts)

    def owns(self, device: str) -> bool:
        return any(p.owns(device) for p in self.parts)

    def knows(self, device: str, task_id: str | None) -> bool:
        return any(p.knows(device, task_id) for p in self.parts)

    def model_sources(self, device: str, task_id: str) -> frozenset[str]:
        return frozenset().union(*(p.model_sources(device, task_id) for p in self.parts))

    @property
    def task_ids(self) -> dict[str, str]:
        return {d: t for p in self.parts for d, t in p.task_ids.items()}

    def on_result(self, device: str, result: TrainResult, now: float) -> bool:
        return any(p.owns(device) and p.on_result(device, result, now) for p in self.parts)

    def on_frame(self, payload: Payload, weights: np.ndarray, now: float) -> bool:
        return any(p.on_frame(payload, weights, now) for p in self.parts)

    def on_edge(self, edge: str, body: object, weights: np.ndarray | None, now: float) -> bool:
        return any(p.on_edge(edge, body, weights, now) for p in self.parts)

    def knows_edge(self, edge: str, body: object) -> bool:
        return any(p.knows_edge(edge, body) for p in self.parts)

    def on_refused(self, device: str, task_id: str, why: str, now: float) -> bool:
        return any(p.owns(device) and p.on_refused(device, task_id, why, now) for p in self.parts)

    def tick(self, now: float) -> None:
        for p in self.parts:
            p.tick(now)

    def result(self) -> GroupResult:
        return combine_parts(self.plan.group_id, [p.result() for p in self.parts])

    @property
    def trained_members(self) -> list[str]:
        return [d for p in self.parts for d in p.trained_members]


def combine_parts(group_id: int, parts: Sequence[GroupResult]) -> GroupResult:
    """One group's result from its parts': every member, the models of those run here,
    and each edge's mean of its part (``edge_means``; an edge whose mean did not come
    adds none).

    Parameters
    ----------
    group_id : the group.
    parts : the parts' results (edge parts carry ``group_mean``).

    Returns
    -------
    GroupResult
        Each edge mean is weighed by its members' samples once the round driver has
        bounded their claims, and screened on its own (:mod:`server.screening`).
    """
    means = tuple(
        EdgeMean(str(r.managed_by), tuple(m.client_id for m in r.members), r.group_mean)
        for r in parts
        if r.group_mean is not None and r.members
    )
    return GroupResult(
        group_id,
        tuple(m for r in parts for m in r.members),
        None,
        tuple(d for r in parts for d in r.skipped),
        tuple(d for r in parts for d in r.refused),
        edge_means=means,
    )
