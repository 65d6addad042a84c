"""Group managers: the in-process virtual nodes of FedGSP Sec. 3.2 that run one group
of one round.

Chain mode. Every member gets its ``train`` request at once (its position,
predecessor and where its output goes); the manager sends the start model to the
first member. With *direct* hand-offs each member publishes its model straight to
its successor (``device/<next>/frames/from/<me>``); with *relay* hand-offs every
model comes to the manager, which forwards it. The last member always returns the
chain's model to the manager.

Results and frames may arrive in any order: a member that waited for the broker to
acknowledge its hand-off before sending its ``result`` message is not penalised when
its successor reports first (the chain advances past every member that reported).

Deadlines. If the member whose turn it is does not report in time it is skipped and
the chain continues from the last good model: the manager holds it (relay), asks the
last good member to send it again (direct; once, however many silent members follow
it), or uses the start model (first member). A member that reported but whose model
never reached the manager is first asked once to send it again. Nothing already
trained is thrown away.

Parallel mode. Every member trains from the group's start model and returns its model
to the manager; members that miss the deadline are skipped. The start model is
published once as a shared, retained model (``server/execution/shared.py``).

What goes out, in which codec, and the shared broadcast:
:mod:`server.execution.group_sender`.
"""

from __future__ import annotations

import logging

import numpy as np

from device.protocol import SERVER_ID, DeviceHop, ManagerHop, Payload, Publish, Topics, TrainResult, WireCodec
from server.downlink import DownlinkModels
from server.execution.group_sender import GroupSender, Handoff, Member
from server.execution.shared import SharedModels
from server.hops import HopBound
from server.strategies.base import GroupPlan, GroupResult, MemberResult, TrainConfig

log = logging.getLogger("covey.server")


class GroupManager:
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
        self.handoff: Handoff = handoff if plan.mode == "chain" else "relay"
        # each relayed hand-off is screened on arrival (server/hops.py); a direct one is never seen
        self.hop = hop if plan.mode == "chain" and self.handoff == "relay" else None
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
        self.current = 0
        self.last_good: np.ndarray = start_weights
        self.last_good_index = -1  # -1: the start model
        self.held_index = -1  # whose output ``last_good`` is (-1: the start model's)
        self.final: np.ndarray | None = None
        self.done = False
        self.deadline = float("inf")
        self.waiting_resend = False
        self.clipped: list[str] = []  # members whose relayed hand-off was clipped (server/hops.py)
        self._asked_again: set[str] = set()  # tasks whose output was asked for again after a missed deadline

    # -- helpers -------------------------------------------------------------------------
    def model_sources(self, device: str, task_id: str) -> frozenset[str]:
        """Who may have sent ``device`` the model of ``task_id``: the server, and with
        direct hand-offs its predecessor (empty: not this group's task)."""
        for i, m in enumerate(self.members):
            if m.device == device and m.task_id == task_id:
                direct = self.plan.mode == "chain" and self.handoff == "direct" and i > 0
                return frozenset({SERVER_ID, self.members[i - 1].device} if direct else {SERVER_ID})
        return frozenset()

    def _advance(self, now: float) -> bool:
        """Direct hand-offs: move the chain past every member that reported (its model
        went on to its successor); whether it moved."""
        moved = False
        while self.current < len(self.members) and self.members[self.current].reported:
            self.last_good_index = self.current
            self.current += 1
            moved = True
        if moved:  # a model reached the chain's next member: no resend is awaited
            self.deadline = now + self.deadline_s
            self.waiting_resend = False
        return moved

    def _awaiting_output(self) -> Member | None:
        """The member asked again for an output that never reached the manager, if any."""
        if self.plan.mode != "chain":
            return None
        late = self.members[min(self.current, len(self.members) - 1)]
        pending = late.task_id in self._asked_again and late.reported and late.weights is None
        return late if pending and not late.skipped else None

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, now: float) -> None:
        self.sender.send_start()
        self.deadline = now + self.deadline_s

    def resend_outstanding(self, now: float) -> None:
        """After the coordinator's connection came back (a broker restart may have lost
        what was in flight): every member still to report gets its request again, and
        the member whose turn it is its model (from the manager, or by asking the last
        good member to resend). Task ids are the same, so nothing is done twice."""
        if self.done:
            return
        for i, m in enumerate(self.members):
            if not (m.reported or m.skipped):
                self.sender.send_request(m, i)
        if self.plan.mode == "parallel":
            self.sender.resend_start()
        elif (late := self._awaiting_output()) is not None:  # the request for its output may be lost
            self.sender.ask_resend(late, ManagerHop(self.plan.group_id))
        elif self.current < len(self.members):
            nxt = self.members[self.current]
            if self.handoff == "direct" and self.last_good_index >= 0 and self.held_index != self.last_good_index:
                src = self.members[self.last_good_index]
                if self.current - 1 == self.last_good_index:  # nxt expects src's hand-off: straight to it
                    self.sender.ask_resend(src, DeviceHop(nxt.device, nxt.task_id))
                else:  # nxt's predecessor was skipped (nxt would refuse src's frame): through the manager
                    self.sender.ask_resend(src, ManagerHop(self.plan.group_id))
                    self.waiting_resend = True
            else:  # the manager holds the last good model (or it is the start model)
                self.sender.send_model(self.last_good, nxt, self.current)
        elif self.waiting_resend and self.last_good_index >= 0:  # the chain's end awaits that resend
            self.sender.ask_resend(self.members[self.last_good_index], ManagerHop(self.plan.group_id))
        self.deadline = max(self.deadline, now + self.deadline_s / 2)

    def release(self) -> None:
        """Clear the group's shared start model from the broker (the round is over)."""
        self.sender.release()

    def owns(self, device: str) -> bool:
        return any(m.device == device for m in self.members)

    def knows(self, device: str, task_id: str | None) -> bool:
        """Whether ``task_id`` is ``device``'s task in this group (a late or repeated
        delivery of it is a duplicate, not an error)."""
        return any(m.device == device and m.task_id == task_id for m in self.members)

    @property
    def task_ids(self) -> dict[str, str]:
        return {m.device: m.task_id for m in self.members}

    def on_result(self, device: str, result: TrainResult, now: float) -> bool:
        """A member's result message; False if it is not one this manager expects."""
        member = next((m for m in self.members if m.device == device and m.task_id == result.task_id), None)
        if member is None or member.reported or member.skipped:
            return False
        member.reported, member.n_samples, member.loss = True, result.n_samples, result.loss
        if self.downlinks is not None:
            self.downlinks.confirm(device, member.task_id)
        if self.plan.mode == "chain" and self.handoff == "direct":
            self._advance(now)
        self._check_done()
        return True

    def on_frame(self, payload: Payload, weights: np.ndarray, now: float) -> bool:
        """A ``result`` frame from a member; False if it is not expected."""
        h = payload.header
        src = self.members[self.last_good_index] if self.last_good_index >= 0 else None
        if self.waiting_resend and src is not None and (h.sender, h.extra.task_id) == (src.device, src.task_id):
            self.waiting_resend = False
            self.last_good, self.held_index = weights, self.last_good_index
            self._continue_after_skip(now)
            return True
        member = next((m for m in self.members if m.device == h.sender and m.task_id == h.extra.task_id), None)
        if member is None or member.skipped or member.weights is not None:
            return False
        self.sender.arrived(member)  # no resend of its model will be needed
        index = self.members.index(member)
        if self.plan.mode == "chain":
            last = len(self.members) - 1
            expected = last if self.handoff == "direct" else self.current
            if index != expected:
                return False
            if self.hop is not None:
                checked, verdict = self.hop.check(self.last_good, weights)
                if checked is None:
                    self._refuse(member, f"its hand-off is {verdict} by screening", now)
                    return True
                if verdict == "clipped":
                    self.clipped.append(member.device)
                weights = checked
            member.weights = weights
            self.last_good, self.last_good_index = weights, max(self.last_good_index, index)
            self.held_index = index
            if index == last:
                self.final = weights
            elif self.handoff == "relay":
                self.current = index + 1
                self.sender.send_model(weights, self.members[self.current], self.current)
                self.deadline = now + self.deadline_s
        else:
            member.weights = weights
        self._check_done()
        return True

    def on_refused(self, device: str, task_id: str, why: str, now: float) -> bool:
        """``device``'s output for ``task_id`` was refused (not finite), or it reported that
        its training failed: the group goes on without it at once instead of waiting for
        its deadline (a relayed chain from its input, a parallel group without it).
        False if it is not this group's task whose output is awaited."""
        member = next((m for m in self.members if m.device == device and m.task_id == task_id), None)
        if member is None or member.skipped or member.weights is not None:
            return False
        if self.plan.mode == "chain":
            index = self.members.index(member)
            if self.handoff != "relay" or index != self.current:
                return False  # a direct chain's model is not the manager's to replace
        self._refuse(member, why, now)
        return True

    def _refuse(self, member: Member, why: str, now: float) -> None:
        """The group goes on without ``member``'s output: not credited, listed as refused."""
        member.skipped = member.refused = True
        log.warning(
            "round %d group %d: %s: %s; going on without it", self.round, self.plan.group_id, member.device, why
        )
        if self.plan.mode == "chain":
            index = self.members.index(member)
            if index == len(self.members) - 1:
                self.final = self.last_good
            else:
                self.current = index + 1
                self.sender.send_model(self.last_good, self.members[self.current], self.current)
                self.deadline = now + self.deadline_s
        self._check_done()

    def _check_done(self) -> None:
        if self.plan.mode == "chain":
            last = self.members[-1]
            self.done = self.done or (self.final is not None and (last.reported or last.skipped))
        else:
            self.done = all((m.reported and m.weights is not None) or m.skipped for m in self.members)

    def tick(self, now: float) -> None:
        if self.done or now < self.deadline:
            return
        if self.plan.mode == "parallel":
            for m in self.members:
                if not (m.reported and m.weights is not None):
                    m.skipped = True
                    log.warning(
                        "round %d group %d: %s missed its deadline; skipped", self.round, self.plan.group_id, m.device
                    )
            self.done = True
            return
        if self.waiting_resend:  # the last good member did not resend either: use what we hold
            self.waiting_resend = False
            self._continue_after_skip(now)
            return
        late = self.members[min(self.current, len(self.members) - 1)]
        if late.reported and late.task_id not in self._asked_again:
            # it trained (its result came) but its model did not reach the manager (a relayed
            # member, or a direct chain's last): it holds its output until the round is
            # acknowledged, so ask for it once more
            self._asked_again.add(late.task_id)
            self.sender.ask_resend(late, ManagerHop(self.plan.group_id))
            self.deadline = now + self.deadline_s
            return
        if self.current >= len(self.members):
            # every member reported, but the chain's model never reached the manager
            before = [i for i, m in enumerate(self.members[:-1]) if m.reported and not m.skipped]
            self.last_good_index = before[-1] if before else -1
        else:
            self.current += 1
        late.skipped = True
        log.warning(
            "round %d group %d: %s missed its deadline; the chain goes on without it",
            self.round,
            self.plan.group_id,
            late.device,
        )
        if self.handoff == "direct" and self._advance(now):
            return  # the members after it reported: its hand-off reached them after all
        if self.handoff == "direct" and self.last_good_index >= 0 and self.held_index != self.last_good_index:
            # the last good model sits on the last good member: ask for it again (once: after
            # a second silent member in a row the manager holds it from the first resend)
            self.sender.ask_resend(self.members[self.last_good_index], ManagerHop(self.plan.group_id))
            self.waiting_resend = True
            self.deadline = now + self.deadline_s
            return
        self._continue_after_skip(now)

    def _continue_after_skip(self, now: float) -> None:
        if self.current >= len(self.members):
            self.final = self.last_good
            self.done = True
            return
        if self.handoff == "direct" and self._advance(now):
            return  # the next members reported: they had the model already
        nxt = self.members[self.current]
        # the successor was told to expect its predecessor; a model from the server is
        # always accepted, so the manager forwards the last good model itself
        self.sender.send_model(self.last_good, nxt, self.current)
        self.deadline = now + self.deadline_s

    def result(self) -> GroupResult:
        members = tuple(
            MemberResult(m.device, m.n_samples, m.loss, m.weights if self.plan.mode == "parallel" else None)
            for m in self.members
            if m.reported and not m.skipped
        )
        skipped = tuple(m.device for m in self.members if m.skipped and not m.refused)
        refused = tuple(m.device for m in self.members if m.refused)
        final = self.final if self.plan.mode == "chain" else None
        return GroupResult(self.plan.group_id, members, final, skipped, refused)

    @property
    def trained_members(self) -> list[str]:
        return [m.device for m in self.members if m.reported and not m.skipped]
