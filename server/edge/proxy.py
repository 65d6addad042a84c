"""The coordinator's side of a site's edges: which group runs where, and a proxy manager
for each group an edge runs.

:class:`EdgeBook` is the coordinator's :class:`~server.execution.round.Placement`. A group
runs at an edge when every member sits behind that edge (the site's layout,
``DIR/edges/<name>/edge.toml``), the edge is online (its retained status), and only the
group's one model is needed: a chain (its last model), or a parallel group the strategy
planned ``mean_only`` (FedAvg-IC's and HierFAVG's grouped rounds). Any other group runs
here as before, its members' messages relayed by the edge (:mod:`server.edge.host`).
The start model goes to the edge whole (float32) and the group's model comes back in
the run's codec (:mod:`server.edge.uplink`: an ``int8`` or ``int4`` delta against that
start, which the proxy lists in the round's delta ``bases``). The members then hold the
model the edge sent them, not one the coordinator knows: their next start model from
the coordinator goes whole (the proxy forgets them in the run's ``downlinks``).

:class:`EdgeGroupProxy` stands in the round's execution for such a group: it sends the
edge the task (and the start model unless the edge holds it: the model it sent up last
round, unchanged by screening, is the next round's start of a group that did not meet
globally), and waits within the group's deadline for the edge's report and the group's
model. What the edge says is checked like what a device says: members that are not the
group's are refused, the model is checked on receipt, and the round driver screens it
(a chain's final model, or the group mean held to a member's bound,
``server/screening.py``) and bounds each member's claimed samples (``server/claims.py``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from device.errors import ProtocolError
from device.protocol import (
    SERVER_ID,
    FrameExtra,
    FrameHeader,
    Payload,
    Publish,
    Topics,
    WireCodec,
    payload_key,
    send_model,
)
from server.downlink import DownlinkModels
from server.edge.messages import EdgeReport, EdgeTask, HopLimits, encode_edge
from server.execution.group_sender import Handoff
from server.execution.manager import GroupManager
from server.hops import HopBound
from server.strategies.base import GroupPlan, GroupResult, MemberResult, TrainConfig

log = logging.getLogger("covey.server")
HELD_MODELS = 8  # start models an edge keeps (server/edge/host.py), the most recent first
EDGE_PREFIX = "edge."


def edge_user(name: str) -> str:
    return f"{EDGE_PREFIX}{name}"


def model_key(weights: np.ndarray) -> str:
    """The sha256 of a float32 model: how the coordinator and an edge name a start model."""
    return payload_key(np.asarray(weights, np.float32))


def edge_topics(topics: Topics, name: str) -> tuple[str, str]:
    """What the coordinator writes to edge ``name``: its tasks and its start models."""
    return f"{topics.root}/edge/{name}/tasks", f"{topics.root}/edge/{name}/models"


@dataclass
class EdgeBook:
    """The site's edges as the coordinator knows them (see the module docstring).

    Parameters
    ----------
    edges : edge name -> the devices behind it (the site's layout).
    topics, publish : the run's topics and the coordinator's publish.
    deadline_s, max_chunk, codec : the run's (``CoordinatorConfig``).
    bases : the round's delta bases (the coordinator's): a group's start model goes in
        when the edge runs it, for its int8/int4 model to decode against.
    downlinks : what each device holds (int8/int4 runs): a group's members are
        forgotten when the edge runs it.
    """

    edges: Mapping[str, frozenset[str]]
    topics: Topics
    publish: Publish
    deadline_s: float
    max_chunk: int
    codec: WireCodec
    bases: dict[str, np.ndarray] | None = None
    downlinks: DownlinkModels | None = None
    online: dict[str, bool] = field(default_factory=dict)
    held: dict[str, deque[str]] = field(default_factory=dict)

    def edge_of(self, members: tuple[str, ...]) -> str | None:
        """The edge every one of ``members`` sits behind, if there is one."""
        for name, devices in self.edges.items():
            if all(m in devices for m in members):
                return name
        return None

    def on_status(self, user: str, payload: bytes) -> None:
        """An edge's retained status (``online`` or ``offline``, as a device's); an edge that
        comes online holds no model the coordinator may count on."""
        name = self._name(user)
        if payload not in (b"online", b"offline", b""):
            raise ProtocolError(f"status of {user} is neither online nor offline")
        online = payload == b"online"
        if online and not self.online.get(name):
            self.held.pop(name, None)
            log.info("edge %s is online: its room's groups run there", name)
        elif not online and self.online.get(name):
            log.warning("edge %s went offline: its room's groups run here until it is back", name)
        self.online[name] = online

    def _name(self, user: str) -> str:
        name = user[len(EDGE_PREFIX) :]
        if not user.startswith(EDGE_PREFIX) or name not in self.edges:
            raise ProtocolError(f"{user} is not an edge of this site")
        return name

    def holds(self, name: str, key: str) -> bool:
        return key in self.held.get(name, ())

    def note_held(self, name: str, key: str) -> None:
        held = self.held.setdefault(name, deque(maxlen=HELD_MODELS))
        if key in held:
            held.remove(key)
        held.appendleft(key)

    def parts_of(self, group: GroupPlan) -> dict[str, tuple[str, ...]]:
        """For a group that spans rooms: each online edge's members of it, where it has
        two or more (one member's mean is its own model: nothing saved), in the group's
        order; the rest run at the coordinator (:mod:`server.execution.split`)."""
        parts = {
            name: tuple(m for m in group.members if m in devices)
            for name, devices in self.edges.items()
            if self.online.get(name)
        }
        return {name: members for name, members in parts.items() if len(members) >= 2}

    def manager_for(
        self,
        group: GroupPlan,
        round_: int,
        start: np.ndarray,
        train: TrainConfig,
        *,
        task_prefix: str,
        seed: int,
        hop: HopBound | None,
        handoff: Handoff,
    ) -> GroupManager | None:
        """A proxy when ``group`` runs at an edge (module docstring), else None."""
        if not (group.mode == "chain" or group.mean_only):
            return None
        name = self.edge_of(group.members)
        if name is None or not self.online.get(name):
            return None
        limits = None if hop is None else HopLimits(_finite(hop.reference), hop.norm_factor, hop.clip_factor)
        task = EdgeTask(
            round_,
            group.group_id,
            group.members,
            group.mode,
            task_prefix,
            train.to_wire(),
            self.deadline_s,
            seed,
            self.max_chunk,
            handoff if group.mode == "chain" else "relay",
            model_key(start),
            limits,
            group.group_rule,
            self.codec,
        )
        return EdgeGroupProxy(group, round_, start, train, book=self, edge=name, task=task, topics=self.topics)


def _finite(value: float) -> float | None:
    return value if np.isfinite(value) else None


class EdgeGroupProxy(GroupManager):
    """A group run by edge ``edge`` (module docstring): done when its report and its
    model (if any came back) arrived, or at its deadline (every member then skipped)."""

    def __init__(
        self,
        plan: GroupPlan,
        round_: int,
        start: np.ndarray,
        train: TrainConfig,
        *,
        book: EdgeBook,
        edge: str,
        task: EdgeTask,
        topics: Topics,
    ) -> None:
        super().__init__(
            plan,
            round_,
            start,
            train,
            topics=topics,
            publish=book.publish,
            handoff="relay",
            deadline_s=book.deadline_s,
            seed=task.seed,
            max_chunk=book.max_chunk,
            task_prefix=task.task_prefix,
        )
        self.book, self.edge, self.task, self.start_weights = book, edge, task, start
        self.user = edge_user(edge)
        self.report: EdgeReport | None = None
        self.model: np.ndarray | None = None
        # a chain's members train one after another; the group's model then crosses the uplink
        self.span_s = book.deadline_s * ((len(plan.members) if plan.mode == "chain" else 1) + 1)
        self._resends = 0  # the task or the start model sent to the edge again
        self._bytes_sent = 0  # the start model to the edge

    def start(self, now: float) -> None:
        if self.book.bases is not None:  # the group's model may come back as a delta against it
            self.book.bases[self.task.model] = np.asarray(self.start_weights, np.float32)
        if self.book.downlinks is not None:  # they will hold what the edge sends them
            for member in self.plan.members:
                self.book.downlinks.forget(member)
        if not self.book.holds(self.edge, self.task.model):
            self._send_model()
        self._send_task()
        self.deadline = now + self.span_s
        log.info(
            "round %d group %d: run by edge %s (%d members)",
            self.round,
            self.plan.group_id,
            self.edge,
            len(self.members),
        )

    def _send_task(self) -> None:
        tasks, _ = edge_topics(self.topics, self.edge)
        self.publish(tasks, encode_edge(self.task, self.topics.run), False)

    def _send_model(self) -> None:
        _, models = edge_topics(self.topics, self.edge)
        weights = np.asarray(self.start_weights, np.float32)
        self._bytes_sent += int(weights.nbytes)
        send_model(
            self.publish,
            models,
            weights,
            kind="model",
            run=self.topics.run,
            round=self.round,
            group=self.plan.group_id,
            sender=SERVER_ID,
            max_chunk=self.book.max_chunk,
            extra=FrameExtra(self.task.key),
        )
        self.book.note_held(self.edge, self.task.model)

    def resend_outstanding(self, now: float) -> None:
        """The coordinator's link came back: the task again (an edge runs a task once and
        answers a repeat with its report)."""
        if not self.done:
            self._resends += 1
            self._send_task()

    @property
    def resends(self) -> int:
        return self._resends

    @property
    def bytes_sent(self) -> int:
        return self._bytes_sent

    def release(self) -> None:
        """Nothing of this group's is on the central broker."""

    def owns(self, device: str) -> bool:
        return False  # its members report to the edge

    def on_frame(self, payload: Payload, weights: np.ndarray, now: float) -> bool:
        return False  # a member's model stays at the edge (one that got here is a duplicate)

    def on_edge(self, edge: str, body: object, weights: np.ndarray | None, now: float) -> bool:
        if edge != self.user or self.done:
            return False
        if isinstance(body, EdgeReport):
            return self._on_report(body, now)
        if isinstance(body, FrameHeader) and weights is not None:
            if body.extra.task_id != self.task.key or self.model is not None:
                return False
            self.model = weights
            self.book.note_held(self.edge, model_key(weights))
            self._check_done()
            return True
        return False

    def knows_edge(self, edge: str, body: object) -> bool:
        if edge != self.user:
            return False
        if isinstance(body, EdgeReport):
            return body.key == self.task.key
        return isinstance(body, FrameHeader) and body.extra.task_id == self.task.key

    def _on_report(self, report: EdgeReport, now: float) -> bool:
        if report.key != self.task.key:
            return False
        if report.status == "missing_model":
            log.info(
                "round %d group %d: edge %s lacks the start model; sending it", self.round, report.group_id, self.edge
            )
            self._resends += 2  # the model and the task again, one message each as GroupSender counts
            self._send_model()
            self._send_task()
            self.deadline = max(self.deadline, now + self.span_s)
            return True
        named = [m.device for m in report.members] + list(report.skipped) + list(report.refused)
        strangers = sorted(set(named) - set(self.plan.members))
        if strangers or len(named) != len(set(named)):
            raise ProtocolError(f"{self.user} reported members {strangers or 'twice'} for group {report.group_id}")
        self.report = report
        self._check_done()
        return True

    def _check_done(self) -> None:
        r = self.report
        self.done = r is not None and (r.model is None or (self.model is not None and model_key(self.model) == r.model))
        if r is not None and self.model is not None and r.model != model_key(self.model):
            log.warning(
                "round %d group %d: edge %s sent a model its report does not name", self.round, r.group_id, self.edge
            )
            self.model = None

    def tick(self, now: float) -> None:
        if self.done or now < self.deadline:
            return
        log.warning(
            "round %d group %d: edge %s did not report within %.0f s; its members are skipped",
            self.round,
            self.plan.group_id,
            self.edge,
            self.span_s,
        )
        self.report, self.model = None, None
        self.done = True

    def result(self) -> GroupResult:
        r, gid = self.report, self.plan.group_id
        if r is None or (self.model is None and r.model is not None):
            return GroupResult(gid, (), skipped=self.plan.members, managed_by=self.edge)
        members = tuple(MemberResult(m.device, m.n_samples, m.loss) for m in r.members)
        chain = self.plan.mode == "chain"
        return GroupResult(
            gid,
            members,
            self.model if chain else None,
            r.skipped,
            r.refused,
            group_mean=None if chain else self.model,
            managed_by=self.edge,
        )

    @property
    def task_ids(self) -> dict[str, str]:
        return {m.device: m.task_id for m in self.members}
