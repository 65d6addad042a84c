"""A chain's group manager (FedGSP Sec. 3.2): members train one after another.

Every member gets its ``train`` request at once (its position, predecessor and where
its output goes); the manager sends the start model to the first member. With
*direct* hand-offs each member publishes its model straight to its successor
(``device/<next>/frames/from/<me>``); with *relay* hand-offs every model comes to the
manager, which screens it (``server/hops.py``) and forwards it. The last member always
returns the chain's model to the manager.

Results and frames may arrive in any order: a member that waited for the broker to
acknowledge its hand-off before sending its ``result`` message is not penalised when
its successor reports first (the chain advances past every member that reported).

Deadlines. If the member whose turn it is does not report in time it is skipped and
the chain continues from the last good model: the manager holds it (relay), asks the
last good member to send it again (direct; once, however many silent members follow
it), or uses the start model (first member). A member that reported but whose model
never reached the manager is first asked once to send it again. Nothing already
trained is thrown away.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from device.protocol import SERVER_ID, DeviceHop, ManagerHop, Payload
from server.execution.group_sender import Member
from server.execution.manager import GroupManager

log = logging.getLogger("covey.server")


class ChainManager(GroupManager):
    """A chain (module docstring); parameters as
    :class:`~server.execution.manager.GroupManager`'s (``hop`` bounds each relayed
    hand-off; a direct one the manager never sees)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.last_good: np.ndarray = self.sender.start_weights
        if self.handoff != "relay":
            self.hop = None
        self.current = 0  # the position whose turn it is
        self.last_good_index = -1  # whose output is the last good model (-1: the start model)
        self.held_index = -1  # whose output ``last_good`` holds here (-1: the start model's)
        self.waiting_resend = False  # for the last good member to send its output again
        self.clipped: list[str] = []  # members whose relayed hand-off was clipped (server/hops.py)
        self._asked_again: set[str] = set()  # tasks whose output was asked for again after a missed deadline

    def model_sources(self, device: str, task_id: str) -> frozenset[str]:
        """The server, and with direct hand-offs the predecessor of ``device``."""
        for i, m in enumerate(self.members):
            if m.device == device and m.task_id == task_id:
                direct = self.handoff == "direct" and i > 0
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
        late = self.members[min(self.current, len(self.members) - 1)]
        pending = late.task_id in self._asked_again and late.reported and late.weights is None
        return late if pending and not late.skipped else None

    def _resend_models(self) -> None:
        """The member whose turn it is gets its model (from the manager, or by asking the
        last good member to resend)."""
        if (late := self._awaiting_output()) is not None:  # the request for its output may be lost
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

    def _reported(self, now: float) -> None:
        if self.handoff == "direct":
            self._advance(now)

    def on_frame(self, payload: Payload, weights: np.ndarray, now: float) -> bool:
        h = payload.header
        src = self.members[self.last_good_index] if self.last_good_index >= 0 else None
        if self.waiting_resend and src is not None and (h.sender, h.extra.task_id) == (src.device, src.task_id):
            self.waiting_resend = False
            self.last_good, self.held_index = weights, self.last_good_index
            self._continue_after_skip(now)
            return True
        member = self._member(h.sender, h.extra.task_id)
        if member is None or member.skipped or member.weights is not None:
            return False
        self.sender.arrived(member)  # no resend of its model will be needed
        index = self.members.index(member)
        last = len(self.members) - 1
        if index != (last if self.handoff == "direct" else self.current):
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
        self._check_done()
        return True

    def _may_refuse(self, member: Member) -> bool:
        """Only a relayed member whose turn it is: a direct chain's model is not the
        manager's to replace."""
        return self.handoff == "relay" and self.members.index(member) == self.current

    def _went_on_without(self, member: Member, now: float) -> None:
        index = self.members.index(member)
        if index == len(self.members) - 1:
            self.final = self.last_good
        else:
            self.current = index + 1
            self.sender.send_model(self.last_good, self.members[self.current], self.current)
            self.deadline = now + self.deadline_s

    def _check_done(self) -> None:
        last = self.members[-1]
        self.done = self.done or (self.final is not None and (last.reported or last.skipped))

    def tick(self, now: float) -> None:
        if self.done or now < self.deadline:
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
