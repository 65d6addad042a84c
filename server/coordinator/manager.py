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
published once as a shared, retained model (``server/coordinator/shared.py``).

Codecs (``device/protocol/codecs.py``). The manager sends models in the run's
downlink codec (float32, or float16 in ``fp16``, ``int8`` and ``int4`` runs; in the last
two a whole model goes as ``q8`` to a device that lists it, and a shared broadcast as
``q8`` when most of its members do, the others getting their own frame) and asks
members for their output in the upload codec: an ``int8`` parallel member sends a
delta against the start model it received, which the coordinator adds to its own
float32 start model (``bases``: payload sha256 -> model), so the rounding of the
downlink (fp16, q8) never reaches the aggregate. ``int4`` runs are ``int8`` runs with 4-bit
deltas; everything said of ``int8`` here holds for them. In an ``int8`` run a start model goes to a
device as a delta against the model it holds when the coordinator knows it
(``server/downlink.py``, ``downlinks``): then by its own frame, not the shared
broadcast.

Chain hand-offs in ``int8`` runs go through the manager (relay; the ``auto`` hand-off
mode picks it, ``server/coordinator/execution.py``): a member uploads its output as an
``int8`` delta against the model it received, the manager adds it to the float32 model
it sent (so that member's downlink error never enters the chain's model), and sends
the sum on to the successor as a downlink delta against the model the successor holds.
The chain's model thus carries only each member's upload quantisation error (with that
member's error feedback), never a re-quantised downlink error. A *direct* hand-off
goes device to device in the downlink codec (``fp16``): the two devices hold no common
model a delta could name. Why relay rather than the brief's deltas against a common
start model sent to every member: that start model costs every member a download too,
and measured in bytes it saves less (docs/results.md, "Wire codecs").
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from device.protocol import (
    SERVER_ID,
    DeviceHop,
    FrameCodec,
    FrameExtra,
    Hop,
    ManagerHop,
    Message,
    Payload,
    ResendRequest,
    Topics,
    TrainRequest,
    TrainResult,
    WireCodec,
    downlink_codec,
    encode_float,
    payload_key,
    send_model,
    upload_codec,
)
from server.coordinator.shared import SharedModels
from server.downlink import DownlinkModels
from server.hops import HopBound
from server.strategies.base import GroupPlan, GroupResult, MemberResult, TrainConfig

log = logging.getLogger("covey.server")

Publish = Callable[[str, bytes, bool], None]
Handoff = Literal["direct", "relay"]


@dataclass
class _Member:
    device: str
    task_id: str
    n_samples: int = 0
    loss: float = float("nan")
    reported: bool = False
    weights: np.ndarray | None = field(default=None, repr=False)
    skipped: bool = False
    refused: bool = False  # its output refused (screening, not finite) or its training failed


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
        self.deadline_s, self.seed, self.max_chunk = deadline_s, seed, max_chunk
        self.train = train
        self.start_weights = start_weights
        self.downlink = downlink_codec(codec)
        # A member whose output comes to the manager (parallel, relay hand-offs) sends it in
        # the run's upload codec: in int8 runs a delta against the model it received, which
        # the manager holds as float32 (``bases``). A direct hand-off goes to a device that
        # holds no common base, so it goes as a full model in the downlink codec.
        self.upload = upload_codec(codec) if self.handoff == "relay" else self.downlink
        self.start_payload = encode_float(start_weights, self.downlink)
        self.bases = bases
        if bases is not None:  # int8 deltas against this start model decode with the float32 original
            bases[payload_key(self.start_payload)] = start_weights
        self.downlinks = downlinks
        self.delta_members: frozenset[str] = frozenset()
        self.own_frames: frozenset[str] = frozenset()  # members sent their start model by their own frame
        self.shared = shared
        self.shared_key: str | None = None
        self.broadcast_codec: FrameCodec = self.downlink  # set at start()
        self.members = [
            _Member(d, f"{task_prefix}-r{round_}-g{plan.group_id}-p{i}") for i, d in enumerate(plan.members)
        ]
        self.current = 0
        self.last_good: np.ndarray = start_weights
        self.last_good_index = -1  # -1: the start model
        self.held_index = -1  # whose output ``last_good`` is (-1: the start model's)
        self.final: np.ndarray | None = None
        self.done = False
        self.deadline = float("inf")
        self.waiting_resend = False
        self.resends = 0
        self.clipped: list[str] = []  # members whose relayed hand-off was clipped (server/hops.py)
        self._asked_again: set[str] = set()  # tasks whose output was asked for again after a missed deadline
        # task id -> (model, payload, codec, base) last sent for it, for a resend of the same model
        self._sent: dict[str, tuple[np.ndarray, np.ndarray, FrameCodec, str | None]] = {}

    # -- helpers -------------------------------------------------------------------------
    def _next_hop(self, index: int) -> Hop:
        if self.plan.mode == "chain" and self.handoff == "direct" and index + 1 < len(self.members):
            successor = self.members[index + 1]
            return DeviceHop(successor.device, successor.task_id)
        return ManagerHop(self.plan.group_id)

    def model_sources(self, device: str, task_id: str) -> frozenset[str]:
        """Who may have sent ``device`` the model of ``task_id``: the server, and with
        direct hand-offs its predecessor (empty: not this group's task)."""
        for i, m in enumerate(self.members):
            if m.device == device and m.task_id == task_id:
                direct = self.plan.mode == "chain" and self.handoff == "direct" and i > 0
                return frozenset({SERVER_ID, self.members[i - 1].device} if direct else {SERVER_ID})
        return frozenset()

    def _ask_resend(self, member: _Member, to: Hop) -> None:
        """Ask ``member`` to send the output it holds for its task again, to ``to``."""
        msg = Message.of(ResendRequest(member.task_id, to), run=self.topics.run, sender=SERVER_ID, round=self.round)
        self.publish(self.topics.inbox(member.device), msg.encode(), False)
        self.resends += 1

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

    def _awaiting_output(self) -> _Member | None:
        """The member asked again for an output that never reached the manager, if any."""
        if self.plan.mode != "chain":
            return None
        late = self.members[min(self.current, len(self.members) - 1)]
        pending = late.task_id in self._asked_again and late.reported and late.weights is None
        return late if pending and not late.skipped else None

    def _own_frame(self, member: _Member) -> bool:
        """Whether ``member`` gets its start model by its own frame rather than the shared
        broadcast: it held a model the server knows when the round started (a delta), or
        it does not decode the broadcast's codec."""
        return member.device in self.own_frames

    def _start_unchanged(self) -> AbstractContextManager[None]:
        """While the start model goes to every member: the downlink cache compares it
        with its last model once (``DownlinkModels.unchanged``), not once per member."""
        return self.downlinks.unchanged(self.start_weights) if self.downlinks is not None else nullcontext()

    def _send_request(self, member: _Member, index: int) -> None:
        direct = self.plan.mode == "chain" and self.handoff == "direct"
        predecessor = self.members[index - 1].device if direct and index > 0 else SERVER_ID
        request = TrainRequest(
            task_id=member.task_id,
            group=self.plan.group_id,
            position=index,
            mode=self.plan.mode,
            predecessor=predecessor,
            next=self._next_hop(index),
            train=self.train.to_wire(),
            seed=self.seed,
            shared=(self.shared_key,) if self.shared_key is not None and not self._own_frame(member) else (),
            codec=self.upload,
            discard_start=self.downlinks is None,  # no int8 downlink delta will name this start model
        )
        msg = Message.of(request, run=self.topics.run, sender=SERVER_ID, round=self.round)
        self.publish(self.topics.inbox(member.device), msg.encode(), False)

    def _send_model(self, weights: np.ndarray, member: _Member, position: int) -> None:
        codec, base = self.downlink, None
        again = self._sent.get(member.task_id)
        if again is not None and again[0] is weights:
            # the same model for the same task again (a resend): the same payload, so the
            # key the server records is the one the device may already hold (a new
            # encoding would be a full model under another key; server/downlink.py)
            _, payload, codec, base = again
        elif self.downlinks is not None:  # the start model, or a relayed hand-off (int8 runs)
            down = self.downlinks.encode(member.device, weights)
            payload, codec, base = down.payload, down.codec, down.base
            if self.bases is not None:  # its output's delta decodes against the float32 original
                self.bases[down.key] = weights
        else:
            payload = self.start_payload if weights is self.start_weights else encode_float(weights, self.downlink)
        if self.downlinks is not None:
            self.downlinks.sent(member.device, member.task_id, payload_key(payload))
        self._sent[member.task_id] = (weights, payload, codec, base)  # until its output is in
        send_model(
            self.publish,
            self.topics.frames(member.device),
            payload,
            kind="model",
            run=self.topics.run,
            round=self.round,
            group=self.plan.group_id,
            sender=SERVER_ID,
            max_chunk=self.max_chunk,
            extra=FrameExtra(member.task_id, position=position),
            codec=codec,
            base=base,
        )

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, now: float) -> None:
        if self.downlinks is not None:  # decided once: a later encode may evict a member's base
            self.delta_members = frozenset(m.device for m in self.members if self.downlinks.base_of(m.device))
        self.own_frames = self.delta_members
        full = [m for m in self.members if not self._own_frame(m)]
        if self.downlinks is not None and full:
            # the broadcast goes in the codec most of its members decode (q8 on a tie, in int8
            # and int4 runs; server/downlink.py); a member that decodes another (an agent from
            # before q8) gets its own frame in that codec, so one old agent costs one frame
            codec_of = {m.device: self.downlinks.full_codec(m.device) for m in full}
            counts = Counter(codec_of.values())
            self.broadcast_codec = max(counts, key=lambda c: (counts[c], c != self.downlink))
            others = {d for d, c in codec_of.items() if c != self.broadcast_codec}
            self.own_frames = self.delta_members | others
            full = [m for m in full if m.device not in others]
        broadcast = self.plan.mode == "parallel" and self.shared is not None and len(full) > 1
        if broadcast:
            assert self.shared is not None
            payload = self.start_payload
            if self.broadcast_codec != self.downlink and self.downlinks is not None:
                payload = self.downlinks.encode(full[0].device, self.start_weights, self.broadcast_codec).payload
                if self.bases is not None:  # the members' uploads are deltas against it
                    self.bases[payload_key(payload)] = self.start_weights
            # published before the requests, retained: a member that subscribes on its
            # request is sure to find it
            self.shared_key = self.shared.publish(
                payload,
                round_=self.round,
                group=self.plan.group_id,
                label=f"g{self.plan.group_id}",
                codec=self.broadcast_codec,
            )
        for i, m in enumerate(self.members):
            self._send_request(m, i)
        if self.plan.mode == "chain":
            self._send_model(self.start_weights, self.members[0], 0)
        else:
            with self._start_unchanged():
                for i, m in enumerate(self.members):
                    if not broadcast or self._own_frame(m):
                        self._send_model(self.start_weights, m, i)
                    elif self.downlinks is not None:  # the device will hold the broadcast model
                        down = self.downlinks.encode(m.device, self.start_weights, self.broadcast_codec)
                        self.downlinks.sent(m.device, m.task_id, down.key)
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
                self._send_request(m, i)
        if self.plan.mode == "parallel":
            with self._start_unchanged():
                for i, m in enumerate(self.members):
                    if (self.shared_key is None or self._own_frame(m)) and m.weights is None and not m.skipped:
                        self._send_model(self.start_weights, m, i)
        elif (late := self._awaiting_output()) is not None:  # the request for its output may be lost
            self._ask_resend(late, ManagerHop(self.plan.group_id))
        elif self.current < len(self.members):
            nxt = self.members[self.current]
            if self.handoff == "direct" and self.last_good_index >= 0 and self.held_index != self.last_good_index:
                src = self.members[self.last_good_index]
                if self.current - 1 == self.last_good_index:  # nxt expects src's hand-off: straight to it
                    self._ask_resend(src, DeviceHop(nxt.device, nxt.task_id))
                else:  # nxt's predecessor was skipped (nxt would refuse src's frame): through the manager
                    self._ask_resend(src, ManagerHop(self.plan.group_id))
                    self.waiting_resend = True
            else:  # the manager holds the last good model (or it is the start model)
                self._send_model(self.last_good, nxt, self.current)
        elif self.waiting_resend and self.last_good_index >= 0:  # the chain's end awaits that resend
            self._ask_resend(self.members[self.last_good_index], ManagerHop(self.plan.group_id))
        self.deadline = max(self.deadline, now + self.deadline_s / 2)

    def release(self) -> None:
        """Clear the group's shared start model from the broker (the round is over)."""
        if self.shared is not None and self.shared_key is not None:
            self.shared.clear(self.shared_key)
            self.shared_key = None

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
        self._sent.pop(member.task_id, None)  # its model arrived: no resend of it will be needed
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
                self._send_model(weights, self.members[self.current], self.current)
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

    def _refuse(self, member: _Member, why: str, now: float) -> None:
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
                self._send_model(self.last_good, self.members[self.current], self.current)
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
            self._ask_resend(late, ManagerHop(self.plan.group_id))
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
            self._ask_resend(self.members[self.last_good_index], ManagerHop(self.plan.group_id))
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
        self._send_model(self.last_good, nxt, self.current)
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
