"""How a group manager's models and requests go out.

:class:`GroupSender` sends a group's ``train`` requests, its start model (each
member's own frame, or one shared, retained broadcast for a parallel group:
``server/execution/shared.py``), the models a relayed chain hands on, and requests to
send an output again; it keeps what it sent for each task, so a resend is the same
payload. :class:`~server.execution.manager.GroupManager` decides when.

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
mode picks it, ``server/execution/round.py``): a member uploads its output as an
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

from collections import Counter
from collections.abc import Sequence
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
    Publish,
    ResendRequest,
    Topics,
    TrainRequest,
    WireCodec,
    downlink_codec,
    encode_float,
    payload_key,
    send_model,
    upload_codec,
)
from server.downlink import DownlinkModels
from server.execution.shared import SharedModels
from server.strategies.base import GroupPlan, TrainConfig

Handoff = Literal["direct", "relay"]


@dataclass
class Member:
    """One member's task in a group, and what the manager heard of it."""

    device: str
    task_id: str
    n_samples: int = 0
    loss: float = float("nan")
    reported: bool = False
    weights: np.ndarray | None = field(default=None, repr=False)
    skipped: bool = False
    refused: bool = False  # its output refused (screening, not finite) or its training failed


class GroupSender:
    """What one group of one round sends (see the module docstring).

    Parameters
    ----------
    plan, round_ : the group and its round.
    members : the group's tasks, in plan order (shared with the manager).
    start_weights : the group's start model (float32).
    train : the members' training settings.
    topics, publish : where and how to send.
    handoff : a chain's hand-offs (``direct`` device to device, or ``relay``).
    seed, max_chunk : the run's seed, and the largest frame chunk.
    shared : the shared start models on the broker (``None``: every member its frame).
    codec : the run's codec.
    bases : this round's start models by payload sha256 (what int8 deltas may name).
    downlinks : what each device holds (int8/int4 runs), else None.
    """

    def __init__(
        self,
        plan: GroupPlan,
        round_: int,
        members: Sequence[Member],
        start_weights: np.ndarray,
        train: TrainConfig,
        *,
        topics: Topics,
        publish: Publish,
        handoff: Handoff,
        seed: int,
        max_chunk: int,
        shared: SharedModels | None,
        codec: WireCodec,
        bases: dict[str, np.ndarray] | None,
        downlinks: DownlinkModels | None,
    ) -> None:
        self.plan, self.round, self.members, self.topics, self.publish = plan, round_, members, topics, publish
        self.handoff, self.seed, self.max_chunk, self.train = handoff, seed, max_chunk, train
        self.start_weights = start_weights
        self.downlink = downlink_codec(codec)
        # A member whose output comes to the manager (parallel, relay hand-offs) sends it in
        # the run's upload codec: in int8 runs a delta against the model it received, which
        # the manager holds as float32 (``bases``). A direct hand-off goes to a device that
        # holds no common base, so it goes as a full model in the downlink codec.
        self.upload = upload_codec(codec) if handoff == "relay" else self.downlink
        self.start_payload = encode_float(start_weights, self.downlink)
        self.bases = bases
        if bases is not None:  # int8 deltas against this start model decode with the float32 original
            bases[payload_key(self.start_payload)] = start_weights
        self.downlinks = downlinks
        self.delta_members: frozenset[str] = frozenset()
        self.own_frames: frozenset[str] = frozenset()  # members sent their start model by their own frame
        self.shared = shared
        self.shared_key: str | None = None
        self.broadcast_codec: FrameCodec = self.downlink  # set by send_start()
        # task id -> (model, payload, codec, base) last sent for it, for a resend of the same model
        self._sent: dict[str, tuple[np.ndarray, np.ndarray, FrameCodec, str | None]] = {}
        self._requested: set[str] = set()  # task ids whose request went out
        # what went again: a request or a model sent again, or a member asked to send its
        # output again (for people: the dashboard's resends per round)
        self.resends = 0
        # model payload bytes the manager sent (a shared broadcast once): the coordinator's
        # link, for people (the record's extra["server_bytes_sent"], the dashboard)
        self.bytes_sent = 0

    @property
    def direct(self) -> bool:
        """Whether the group's hand-offs go device to device."""
        return self.plan.mode == "chain" and self.handoff == "direct"

    def next_hop(self, index: int) -> Hop:
        """Where the member at ``index`` sends its output."""
        if self.direct and index + 1 < len(self.members):
            successor = self.members[index + 1]
            return DeviceHop(successor.device, successor.task_id)
        return ManagerHop(self.plan.group_id)

    def ask_resend(self, member: Member, to: Hop) -> None:
        """Ask ``member`` to send the output it holds for its task again, to ``to``."""
        self.resends += 1
        msg = Message.of(ResendRequest(member.task_id, to), run=self.topics.run, sender=SERVER_ID, round=self.round)
        self.publish(self.topics.inbox(member.device), msg.encode(), False)

    def own_frame(self, member: Member) -> bool:
        """Whether ``member`` gets its start model by its own frame rather than the shared
        broadcast: it held a model the server knows when the round started (a delta), or
        it does not decode the broadcast's codec."""
        return member.device in self.own_frames

    def arrived(self, member: Member) -> None:
        """``member``'s output is in: no resend of its model will be needed."""
        self._sent.pop(member.task_id, None)

    def _start_unchanged(self) -> AbstractContextManager[None]:
        """While the start model goes to every member: the downlink cache compares it
        with its last model once (``DownlinkModels.unchanged``), not once per member."""
        return self.downlinks.unchanged(self.start_weights) if self.downlinks is not None else nullcontext()

    def send_request(self, member: Member, index: int) -> None:
        if member.task_id in self._requested:
            self.resends += 1
        self._requested.add(member.task_id)
        predecessor = self.members[index - 1].device if self.direct and index > 0 else SERVER_ID
        request = TrainRequest(
            task_id=member.task_id,
            group=self.plan.group_id,
            position=index,
            mode=self.plan.mode,
            predecessor=predecessor,
            next=self.next_hop(index),
            train=self.train.to_wire(),
            seed=self.seed,
            shared=(self.shared_key,) if self.shared_key is not None and not self.own_frame(member) else (),
            codec=self.upload,
            discard_start=self.downlinks is None,  # no int8 downlink delta will name this start model
        )
        msg = Message.of(request, run=self.topics.run, sender=SERVER_ID, round=self.round)
        self.publish(self.topics.inbox(member.device), msg.encode(), False)

    def send_model(self, weights: np.ndarray, member: Member, position: int) -> None:
        codec, base = self.downlink, None
        again = self._sent.get(member.task_id)
        if again is not None and again[0] is weights:
            # the same model for the same task again (a resend): the same payload, so the
            # key the server records is the one the device may already hold (a new
            # encoding would be a full model under another key; server/downlink.py)
            _, payload, codec, base = again
            self.resends += 1
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
        self.bytes_sent += int(payload.nbytes)
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

    def send_start(self) -> None:
        """Every member's request, and the start model: to a chain's first member, to
        each member of a parallel group (one shared broadcast where it serves more
        than one)."""
        if self.downlinks is not None:  # decided once: a later encode may evict a member's base
            self.delta_members = frozenset(m.device for m in self.members if self.downlinks.base_of(m.device))
        self.own_frames = self.delta_members
        full = [m for m in self.members if not self.own_frame(m)]
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
            self.bytes_sent += int(payload.nbytes)
            self.shared_key = self.shared.publish(
                payload,
                round_=self.round,
                group=self.plan.group_id,
                label=f"g{self.plan.group_id}",
                codec=self.broadcast_codec,
            )
        for i, m in enumerate(self.members):
            self.send_request(m, i)
        if self.plan.mode == "chain":
            self.send_model(self.start_weights, self.members[0], 0)
            return
        with self._start_unchanged():
            for i, m in enumerate(self.members):
                if not broadcast or self.own_frame(m):
                    self.send_model(self.start_weights, m, i)
                elif self.downlinks is not None:  # the device will hold the broadcast model
                    down = self.downlinks.encode(m.device, self.start_weights, self.broadcast_codec)
                    self.downlinks.sent(m.device, m.task_id, down.key)

    def resend_start(self) -> None:
        """A parallel group's start model again to each member still training from it
        that does not get it from the shared broadcast (retained on the broker)."""
        with self._start_unchanged():
            for i, m in enumerate(self.members):
                if (self.shared_key is None or self.own_frame(m)) and m.weights is None and not m.skipped:
                    self.send_model(self.start_weights, m, i)

    def release(self) -> None:
        """Clear the group's shared start model from the broker (the round is over)."""
        if self.shared is not None and self.shared_key is not None:
            self.shared.clear(self.shared_key)
            self.shared_key = None
