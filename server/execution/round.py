"""Running one round's plan over a bus (boards or the simulator's): a group manager per planned group.

Each group's hand-off mode is chosen here (``direct``, ``relay``, alternating
``mixed`` for tests, or ``auto``, which relays every chain so that its manager can
screen each hand-off, ``server/hops.py``). Every member's
assignment is published retained; the managers send requests and models, and the
coordinator's receive loop feeds them results until every group is done or its
deadline passed. When the round driver plans a round again (every sampled device
failed), the new plan's task ids carry the attempt (``<epoch>a2-r<round>-...``), so no
late reply to the first plan can pass for one to the second.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

import numpy as np

from device.errors import ProtocolError
from device.protocol import SERVER_ID, Assignment, Message, Payload, Topics, TrainResult, WireCodec
from server.downlink import DownlinkModels
from server.execution.chain import ChainManager
from server.execution.group_sender import Handoff
from server.execution.manager import GroupManager, ParallelManager
from server.execution.ports import Clock, ExecutionBus
from server.execution.shared import SharedModels
from server.execution.split import SplitGroupManager, splittable
from server.hops import HopBound
from server.strategies.base import GroupPlan, GroupResult, RoundPlan, TrainConfig

Outcome = Literal["accepted", "duplicate", "unexpected"]


class Placement(Protocol):
    """Where a group's manager runs: a manager for a group run elsewhere (a proxy for a
    site's edge, :mod:`server.edge.proxy`), or None to run it here."""

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
        """The manager of ``group`` when it runs elsewhere, else None."""

    def parts_of(self, group: GroupPlan) -> dict[str, tuple[str, ...]]:
        """Members of ``group`` worth running elsewhere as parts of it, by where (the
        rest run here; :mod:`server.execution.split`); empty: no split."""


@dataclass(frozen=True)
class ExecutionSettings:
    """The run's settings a plan's execution needs (from ``CoordinatorConfig``)."""

    run: str
    handoff: str  # auto | direct | relay | mixed
    deadline_s: float
    max_chunk: int
    codec: WireCodec


class RoundExecution:
    """Runs plans over a bus. Its collaborators are handed in, so it knows nothing of the
    coordinator or the simulator that owns it.

    Parameters
    ----------
    topics : the run's topics.
    bus : publishes, and while it waits feeds what devices send back here through
        :meth:`on_result`, :meth:`on_frame` and :meth:`on_refused`
        (:mod:`server.execution.ports`).
    clock : the time deadlines are on (the bus's: the wall clock on boards).
    known : the registered devices; a plan naming another is refused.
    shared : the shared start models on the broker.
    bases : this round's start models by payload sha256 (what int8 deltas may name);
        cleared at each plan, filled by the managers, read by the frame check.
    downlinks : what each device holds, in int8/int4 runs (delta downlinks), else None.
    task_prefix : the first plan's task-id prefix (the coordinator's epoch).
    placement : which groups run elsewhere (at a site's edge); None: every group here.
    """

    def __init__(
        self,
        settings: ExecutionSettings,
        *,
        topics: Topics,
        bus: ExecutionBus,
        clock: Clock,
        known: Container[str],
        shared: SharedModels,
        bases: dict[str, np.ndarray],
        downlinks: DownlinkModels | None,
        task_prefix: str,
        placement: Placement | None = None,
    ) -> None:
        self.settings, self.topics, self.bus, self.clock = settings, topics, bus, clock
        self.placement = placement
        self.known, self.shared, self.bases, self.downlinks = known, shared, bases, downlinks
        self.managers: list[GroupManager] = []
        # task ids start with this; a resumed round keeps the prefix it was journaled with
        self.task_prefix = task_prefix
        self._attempts: dict[int, int] = {}  # round -> plans executed
        self._earlier_resends = 0  # this round's earlier plans' (a retried round)
        self._earlier_sent = 0  # likewise, model payload bytes sent
        self._received = 0  # model payload bytes that reached the managers this round

    def next_prefix(self, rnd: int) -> str:
        """The task-id prefix of round ``rnd``'s next plan: a retried plan's tasks are new
        work, never duplicates of the failed attempt's (the journal records this prefix)."""
        attempt = self._attempts.get(rnd, 0) + 1
        return self.task_prefix if attempt == 1 else f"{self.task_prefix}a{attempt}"

    def _handoff_for(self, group_index: int, members: Sequence[str]) -> Handoff:
        mode = self.settings.handoff
        if mode == "mixed":
            return "direct" if group_index % 2 == 0 else "relay"
        if mode in ("direct", "relay"):
            return mode  # type: ignore[return-value]
        # auto: the manager screens each relayed hand-off, so one bad member costs only
        # itself (server/hops.py); a direct one it never sees. (Relayed hand-offs also
        # travel as int8/int4 deltas in those runs, and reach devices that cannot publish
        # to peers.)
        return "relay"

    def run(self, plan: RoundPlan, seed: int, hop: HopBound | None = None) -> list[GroupResult]:
        cfg = self.settings
        unknown = sorted({d for g in plan.groups for d in g.members if d not in self.known})
        if unknown:
            raise ProtocolError(f"plan names unknown devices {unknown}")
        now = self.clock()
        same_round = bool(self.managers) and self.managers[0].round == plan.round
        self._earlier_resends = self.resends() if same_round else 0
        self._earlier_sent = self.payload_bytes()["sent"] if same_round else 0
        if not same_round:
            self._received = 0
        self.managers = []
        self.bases.clear()  # the start models int8 deltas may name: this plan's
        prefix = self.next_prefix(plan.round)
        self._attempts[plan.round] = self._attempts.get(plan.round, 0) + 1
        try:
            for i, g in enumerate(plan.groups):
                start, handoff = plan.models[g.start_model], self._handoff_for(i, g.members)
                placed = self.placement and self.placement.manager_for(
                    g, plan.round, start, plan.train, task_prefix=prefix, seed=seed, hop=hop, handoff=handoff
                )
                if not placed and self.placement and splittable(g):
                    placed = self._split(g, plan.round, start, plan.train, prefix, seed, hop)
                manager = placed or self.make_manager(
                    g, plan.round, start, plan.train, task_prefix=prefix, seed=seed, hop=hop, handoff=handoff
                )
                for d in g.members:
                    msg = Message.of(Assignment(g.group_id), run=cfg.run, sender=SERVER_ID, round=plan.round)
                    self.bus.publish(self.topics.assignment(d), msg.encode(), True)
                self.managers.append(manager)
                manager.start(now)
            while not all(m.done for m in self.managers):
                self.bus.wait(min(m.deadline for m in self.managers if not m.done))
                now = self.clock()
                for m in self.managers:
                    m.tick(now)
        finally:
            for m in self.managers:
                m.release()  # no shared start model outlives its round on the broker
        return [m.result() for m in self.managers]

    def _split(
        self,
        g: GroupPlan,
        round_: int,
        start: np.ndarray,
        train: TrainConfig,
        prefix: str,
        seed: int,
        hop: HopBound | None,
    ) -> GroupManager | None:
        """``g`` as parts where its placement runs some of it elsewhere (each part's task
        ids under a short prefix of its own, ``-e<k>``: positions restart in each part),
        else None."""
        assert self.placement is not None
        away = self.placement.parts_of(g)
        if not away:
            return None
        parts: list[GroupManager] = []
        for k, (where, members) in enumerate(away.items()):
            part = self.placement.manager_for(
                replace(g, members=members),
                round_,
                start,
                train,
                task_prefix=f"{prefix}-e{k}",
                seed=seed,
                hop=hop,
                handoff="relay",
            )
            if part is None:
                return None
            parts.append(part)
        rest = tuple(d for d in g.members if not any(d in m for m in away.values()))
        if rest:
            here = replace(g, members=rest)
            parts.append(
                self.make_manager(here, round_, start, train, task_prefix=prefix, seed=seed, hop=hop, handoff="relay")
            )
        return SplitGroupManager(g, parts) if len(parts) > 1 else None

    def make_manager(
        self,
        g: GroupPlan,
        round_: int,
        start: np.ndarray,
        train: TrainConfig,
        *,
        task_prefix: str,
        seed: int,
        hop: HopBound | None,
        handoff: Handoff,
        deadline_s: float | None = None,
    ) -> GroupManager:
        """The manager that runs group ``g`` here, over this execution's bus (an edge
        makes its groups' managers with this too, :mod:`server.edge.host`)."""
        chain = g.mode == "chain"
        return (ChainManager if chain else ParallelManager)(
            g,
            round_,
            start,
            train,
            topics=self.topics,
            publish=self.bus.publish,
            handoff=handoff if chain else "relay",
            deadline_s=self.settings.deadline_s if deadline_s is None else deadline_s,
            seed=seed,
            max_chunk=self.settings.max_chunk,
            task_prefix=task_prefix,
            shared=self.shared,
            codec=self.settings.codec,
            bases=self.bases,
            downlinks=self.downlinks,
            hop=hop,
        )

    def on_edge(self, edge: str, body: object, weights: np.ndarray | None = None, size: int = 0) -> Outcome:
        """A report or the group model from ``edge`` (:mod:`server.edge.proxy`); ``size``:
        the model's payload bytes as they came (counted as received)."""
        now = self.clock()
        self._received += size
        if any(m.on_edge(edge, body, weights, now) for m in self.managers):
            return "accepted"
        # the bridge delivers at least once: a report or model again after a reconnect
        return "duplicate" if any(m.knows_edge(edge, body) for m in self.managers) else "unexpected"

    def on_result(self, device: str, result: TrainResult) -> Outcome:
        now = self.clock()
        if any(m.owns(device) and m.on_result(device, result, now) for m in self.managers):
            return "accepted"
        return "duplicate" if any(m.knows(device, result.task_id) for m in self.managers) else "unexpected"

    def model_sources(self, device: str, task_id: str) -> frozenset[str]:
        """Who may have sent ``device`` the start model of ``task_id`` this round."""
        return frozenset().union(*(m.model_sources(device, task_id) for m in self.managers))

    def on_refused(self, device: str, task_id: str, why: str) -> bool:
        """A member's output for ``task_id`` was refused (not finite) or its training
        failed: its manager goes on without it at once; whether one did."""
        now = self.clock()
        return any(m.owns(device) and m.on_refused(device, task_id, why, now) for m in self.managers)

    def on_frame(self, payload: Payload, weights: np.ndarray) -> Outcome:
        now = self.clock()
        self._received += int(payload.array.nbytes)  # it crossed the coordinator's link, taken or not
        h = payload.header
        if any(m.plan.group_id == h.group and m.on_frame(payload, weights, now) for m in self.managers):
            return "accepted"
        return "duplicate" if any(m.knows(h.sender, h.extra.task_id) for m in self.managers) else "unexpected"

    def task_ids(self) -> dict[str, list[str]]:
        """Device -> its training tasks this round (acknowledged after the checkpoint)."""
        out: dict[str, list[str]] = {}
        for m in self.managers:
            for device, task_id in m.task_ids.items():
                out.setdefault(device, []).append(task_id)
        return out

    def resend_outstanding(self) -> None:
        now = self.clock()
        for m in self.managers:
            m.resend_outstanding(now)

    def progress(self) -> list[dict[str, object]]:
        """Where this round is, group by group (for people: the live dashboard): each
        member's state in plan order (``done``, ``skipped``, ``refused``, or ``waiting``;
        a chain's first waiting member is the one training) and the seconds left before
        the group's current deadline."""
        now = self.clock()
        out: list[dict[str, object]] = []
        if all(m.done for m in self.managers):  # between rounds: nothing is awaited
            return out
        for m in self.managers:
            states = [
                "skipped" if x.skipped else "refused" if x.refused else "done" if x.reported else "waiting"
                for x in m.members
            ]
            left = m.deadline - now
            out.append(
                {
                    "group": m.plan.group_id,
                    "mode": m.plan.mode,
                    "members": [[x.device, state] for x, state in zip(m.members, states, strict=True)],
                    "done": m.done,
                    "deadline_in_s": round(left) if left != float("inf") and not m.done else None,
                }
            )
        return out

    def resends(self) -> int:
        """This round's requests and models sent again and outputs asked for again
        (after a lost connection or a deadline), over every plan it ran."""
        return self._earlier_resends + sum(m.resends for m in self.managers)

    def payload_bytes(self) -> dict[str, int]:
        """This round's model payloads on the coordinator's link: ``sent`` by its managers
        (start models, relayed hand-offs, resends; a shared broadcast once) and
        ``received`` from devices and edges, over every plan it ran."""
        sent = self._earlier_sent + sum(m.bytes_sent for m in self.managers)
        return {"sent": sent, "received": self._received}

    def handoff_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for m in self.managers:
            if m.plan.mode == "chain":
                counts[m.handoff] = counts.get(m.handoff, 0) + 1
        return counts
