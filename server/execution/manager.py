"""Group managers: the in-process virtual nodes of FedGSP Sec. 3.2 that run one group
of one round, whatever bus carries their messages (:mod:`server.execution.ports`).

:class:`GroupManager` is what every group does: its members' task ids, their result
messages, the deadline, the group's result. :class:`ParallelManager` runs a parallel
group: every member trains from the group's start model (published once as a shared,
retained model, ``server/execution/shared.py``) and returns its model to the manager;
members that miss the deadline are skipped. A chain's manager is
:class:`~server.execution.chain.ChainManager`. What goes out, in which codec:
:mod:`server.execution.group_sender`.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from device.protocol import SERVER_ID, Payload, Publish, Topics, TrainResult, WireCodec
from server.downlink import DownlinkModels
from server.execution.group_sender import GroupSender, Handoff, Member
from server.execution.shared import SharedModels
from server.hops import HopBound
from server.strategies.base import GroupPlan, GroupResult, MemberResult, TrainConfig

log = logging.getLogger("covey.server")


class GroupManager:
    """What every group's manager does; a subclass decides what a frame, a refusal and
    a passed deadline mean for its mode.

    Parameters
    ----------
    plan, round_, start_weights, train : the group, its round, its start model and the
        members' local training.
    topics, publish : where and how to send (:class:`GroupSender`).
    handoff : how a chain's models move (``direct`` or ``relay``; parallel groups relay).
    deadline_s : how long a member whose output is awaited may take.
    seed, max_chunk, task_prefix : the requests' seed, the frames' size, the task ids' prefix.
    shared, codec, bases, downlinks : see :class:`GroupSender`.
    hop : the bound a chain's relayed hand-offs are screened against
        (:class:`~server.execution.chain.ChainManager`; parallel members are screened by
        the round driver).
    """

    def __init__(
        self,
        plan: GroupPlan,
        round_: int,
        start_weights: np.ndarray,
        train: TrainConfig,
        *,
        topics: Topics,
        publish: Publish,
        handoff: Handoff,
        deadline_s: float,
        seed: int,
        max_chunk: int,
        task_prefix: str,
        shared: SharedModels | None = None,
        codec: WireCodec = "fp32",
        bases: dict[str, np.ndarray] | None = None,
        downlinks: DownlinkModels | None = None,
        hop: HopBound | None = None,
    ) -> None:
        self.plan, self.round, self.topics, self.publish = plan, round_, topics, publish
        self.handoff: Handoff = handoff
        self.deadline_s = deadline_s
        self.downlinks = downlinks
        self.members = [Member(d, f"{task_prefix}-r{round_}-g{plan.group_id}-p{i}") for i, d in enumerate(plan.members)]
        self.sender = GroupSender(
            plan,
            round_,
            self.members,
            start_weights,
            train,
            topics=topics,
            publish=publish,
            handoff=self.handoff,
            seed=seed,
            max_chunk=max_chunk,
            shared=shared,
            codec=codec,
            bases=bases,
            downlinks=downlinks,
        )
        self.hop = hop
        self.final: np.ndarray | None = None  # a chain's model
        self.done = False
        self.deadline = float("inf")

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, now: float) -> None:
        self.sender.send_start()
        self.deadline = now + self.deadline_s

    def resend_outstanding(self, now: float) -> None:
        """After the coordinator's connection came back (a broker restart may have lost
        what was in flight): every member still to report gets its request again, and
        the models awaited go again (:meth:`_resend_models`). Task ids are the same, so
        nothing is done twice."""
        if self.done:
            return
        for i, m in enumerate(self.members):
            if not (m.reported or m.skipped):
                self.sender.send_request(m, i)
        self._resend_models()
        self.deadline = max(self.deadline, now + self.deadline_s / 2)

    def _resend_models(self) -> None:
        raise NotImplementedError

    @property
    def resends(self) -> int:
        """Requests and models sent again, and outputs asked for again, so far."""
        return self.sender.resends

    @property
    def bytes_sent(self) -> int:
        """Model payload bytes sent so far (:attr:`GroupSender.bytes_sent`)."""
        return self.sender.bytes_sent

    def release(self) -> None:
        """Clear the group's shared start model from the broker (the round is over)."""
        self.sender.release()

    # -- what arrives --------------------------------------------------------------------
    def _member(self, device: str, task_id: str | None) -> Member | None:
        return next((m for m in self.members if m.device == device and m.task_id == task_id), None)

    def owns(self, device: str) -> bool:
        return any(m.device == device for m in self.members)

    def knows(self, device: str, task_id: str | None) -> bool:
        """Whether ``task_id`` is ``device``'s task in this group (a late or repeated
        delivery of it is a duplicate, not an error)."""
        return self._member(device, task_id) is not None

    def model_sources(self, device: str, task_id: str) -> frozenset[str]:
        """Who may have sent ``device`` the model of ``task_id`` (empty: not this
        group's task): the server."""
        return frozenset({SERVER_ID}) if self.knows(device, task_id) else frozenset()

    @property
    def task_ids(self) -> dict[str, str]:
        return {m.device: m.task_id for m in self.members}

    def on_result(self, device: str, result: TrainResult, now: float) -> bool:
        """A member's result message; False if it is not one this manager expects."""
        member = self._member(device, result.task_id)
        if member is None or member.reported or member.skipped:
            return False
        member.reported, member.n_samples, member.loss = True, result.n_samples, result.loss
        if self.downlinks is not None:
            self.downlinks.confirm(device, member.task_id)
        self._reported(now)
        self._check_done()
        return True

    def _reported(self, now: float) -> None:
        """A member's result came (a direct chain moves on)."""

    def on_frame(self, payload: Payload, weights: np.ndarray, now: float) -> bool:
        """A ``result`` frame from a member; False if it is not expected."""
        raise NotImplementedError

    def on_edge(self, edge: str, body: object, weights: np.ndarray | None, now: float) -> bool:
        """A report or group model from a site's edge: only a group run there expects one
        (:class:`~server.edge.proxy.EdgeGroupProxy`)."""
        return False

    def knows_edge(self, edge: str, body: object) -> bool:
        """Whether ``body`` from ``edge`` is about this group (one that came again)."""
        return False

    def on_refused(self, device: str, task_id: str, why: str, now: float) -> bool:
        """``device``'s output for ``task_id`` was refused (not finite), or it reported that
        its training failed: the group goes on without it at once instead of waiting for
        its deadline. False if it is not this group's task whose output is awaited."""
        member = self._member(device, task_id)
        if member is None or member.skipped or member.weights is not None or not self._may_refuse(member):
            return False
        self._refuse(member, why, now)
        return True

    def _may_refuse(self, member: Member) -> bool:
        return True

    def _refuse(self, member: Member, why: str, now: float) -> None:
        """The group goes on without ``member``'s output: not credited, listed as refused."""
        member.skipped = member.refused = True
        log.warning(
            "round %d group %d: %s: %s; going on without it", self.round, self.plan.group_id, member.device, why
        )
        self._went_on_without(member, now)
        self._check_done()

    def _went_on_without(self, member: Member, now: float) -> None:
        """What follows a refused member (a chain sends its successor a model)."""

    def _check_done(self) -> None:
        raise NotImplementedError

    def tick(self, now: float) -> None:
        raise NotImplementedError

    # -- the outcome ---------------------------------------------------------------------
    def result(self) -> GroupResult:
        chain = self.plan.mode == "chain"
        members = tuple(
            MemberResult(m.device, m.n_samples, m.loss, None if chain else m.weights)
            for m in self.members
            if m.reported and not m.skipped
        )
        skipped = tuple(m.device for m in self.members if m.skipped and not m.refused)
        refused = tuple(m.device for m in self.members if m.refused)
        return GroupResult(self.plan.group_id, members, self.final if chain else None, skipped, refused)

    @property
    def trained_members(self) -> list[str]:
        return [m.device for m in self.members if m.reported and not m.skipped]


class ParallelManager(GroupManager):
    """A parallel group (module docstring): every output comes to the manager, so its
    members upload in the upload codec whatever ``handoff`` says."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "handoff": "relay"})

    def _resend_models(self) -> None:
        self.sender.resend_start()

    def on_frame(self, payload: Payload, weights: np.ndarray, now: float) -> bool:
        h = payload.header
        member = self._member(h.sender, h.extra.task_id)
        if member is None or member.skipped or member.weights is not None:
            return False
        self.sender.arrived(member)  # no resend of its model will be needed
        member.weights = weights
        self._check_done()
        return True

    def _check_done(self) -> None:
        self.done = all((m.reported and m.weights is not None) or m.skipped for m in self.members)

    def tick(self, now: float) -> None:
        if self.done or now < self.deadline:
            return
        for m in self.members:
            if not (m.reported and m.weights is not None):
                m.skipped = True
                log.warning(
                    "round %d group %d: %s missed its deadline; skipped", self.round, self.plan.group_id, m.device
                )
        self.done = True
