"""A link's receive queue, bounded in messages and bytes, and per lane.

Whatever delivers messages (paho's network thread in :mod:`device.mqtt`, or an
in-process bus) puts them here without blocking; the owner takes them with a timeout.
A message that does not fit is dropped and counted (``dropped``), with one log line
when a burst starts and one with its count when there is room again. With
``lane_of``, the owner names the *lane* of each topic (a device's messages to the
coordinator, one peer's hand-offs to a device); one lane may hold at most
``lane_max_messages`` messages and ``lane_max_bytes`` bytes of the queue, so a flood
on one lane is dropped (counted in ``dropped_by_lane``) while the others keep room.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("device.mqtt")
QUEUE_FULL = "%s: receive queue full (%d); dropping messages"
QUEUE_ROOM = "%s: receive queue has room again; %d message(s) dropped"


@dataclass(frozen=True)
class Incoming:
    topic: str
    payload: bytes
    retain: bool
    received_at: float = 0.0  # time.monotonic() when the delivering thread took it (transfer timing)
    lane: str | None = None  # the owner's lane for its topic (``lane_of``), None: no lane


LaneOf = Callable[[str], "str | None"]


class ReceiveQueue:
    """Messages waiting for their owner, bounded as the module says.

    Parameters
    ----------
    name : the owner, for log lines.
    max_queue : messages the queue holds at most.
    max_queue_bytes : payload bytes it holds at most (None: no limit).
    lane_of : a topic's lane, or None for no lane (called on the delivering thread: cheap).
    lane_max_messages, lane_max_bytes : what one lane may hold (bytes: None, no limit;
        the owner may lower it later, once it knows its model's size).
    """

    def __init__(
        self,
        name: str,
        *,
        max_queue: int = 10_000,
        max_queue_bytes: int | None = None,
        lane_of: LaneOf | None = None,
        lane_max_messages: int = 2_000,
        lane_max_bytes: int | None = None,
    ) -> None:
        self.name = name
        self._queue: queue.Queue[Incoming] = queue.Queue(max_queue)
        self._lock = threading.Lock()
        self.dropped = 0  # messages lost to a full queue (the owner reports them)
        self._burst = 0
        self.max_queue_bytes = max_queue_bytes
        self._queued_bytes = 0
        self.lane_of = lane_of
        self.lane_max_messages = lane_max_messages
        self.lane_max_bytes = lane_max_bytes
        self._lanes: dict[str, list[int]] = {}  # lane -> [messages, bytes] in the queue
        self.dropped_by_lane: dict[str, int] = {}  # lane -> messages dropped because it was full
        self._lane_bursts: dict[str, int] = {}

    def offer(self, topic: str, payload: bytes, retain: bool) -> None:
        """Queue a message, or drop and count it (never blocks). Safe from any number of
        delivering threads: counts change under the lock, log lines are written after."""
        size = len(payload)
        lane = self.lane_of(topic) if self.lane_of is not None else None
        lines: list[tuple[str, tuple[object, ...]]] = []
        with self._lock:
            if lane is not None:
                held = self._lanes.setdefault(lane, [0, 0])
                over_bytes = self.lane_max_bytes is not None and held[1] + size > self.lane_max_bytes
                if held[0] >= self.lane_max_messages or over_bytes:
                    self._lane_full(lane, lines)
                    lane = None  # dropped: nothing more to note
                    size = -1
            if size >= 0:
                fits = self.max_queue_bytes is None or self._queued_bytes + size <= self.max_queue_bytes
                try:
                    if not fits:
                        raise queue.Full
                    self._queue.put_nowait(Incoming(topic, payload, retain, time.monotonic(), lane))
                except queue.Full:  # counted in `dropped`; logged when a burst starts and when it ends
                    self.dropped += 1
                    self._burst += 1
                    if self._burst == 1:
                        lines.append(
                            ("%s: receive queue full (%d); dropping messages", (self.name, self._queue.maxsize))
                        )
                else:
                    self._queued_bytes += size
                    if lane is not None:
                        held[0] += 1
                        held[1] += size
                    if self._burst:
                        lines.append(
                            ("%s: receive queue has room again; %d message(s) dropped", (self.name, self._burst))
                        )
                        self._burst = 0
                    if lane is not None and self._lane_bursts.get(lane):
                        n = self._lane_bursts.pop(lane)
                        lines.append(("%s: lane %s has room again; %d of its message(s) dropped", (self.name, lane, n)))
        for line, args in lines:
            log.warning(line, *args)

    def _lane_full(self, lane: str, lines: list[tuple[str, tuple[object, ...]]]) -> None:
        """Count a message dropped because its lane is full (the lock is held); one log
        line when a burst starts and one with its count when the lane has room again."""
        self.dropped_by_lane[lane] = self.dropped_by_lane.get(lane, 0) + 1
        burst = self._lane_bursts.get(lane, 0) + 1
        if len(self._lane_bursts) < 1024 or lane in self._lane_bursts:
            self._lane_bursts[lane] = burst
        if burst == 1:
            lines.append(
                (
                    "%s: lane %s holds %d messages or %s bytes already; dropping its messages",
                    (self.name, lane, self.lane_max_messages, self.lane_max_bytes),
                )
            )

    def get(self, timeout: float) -> Incoming | None:
        """The next message, or None when none arrives within ``timeout`` seconds."""
        try:
            item = self._queue.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None
        with self._lock:
            self._queued_bytes -= len(item.payload)
            if item.lane is not None:
                held = self._lanes[item.lane]
                held[0] -= 1
                held[1] -= len(item.payload)
                if held[0] == 0:
                    del self._lanes[item.lane]
        return item


class QueuedLink:
    """What a link with a :class:`ReceiveQueue` (``self._rx``) offers its owner: the next
    message, the drop counts, and the lanes' byte bound (which an owner may lower once
    it knows its model's size). ``MqttLink`` and the loopback broker's links share it."""

    _rx: ReceiveQueue

    def receive(self, timeout: float) -> Incoming | None:
        return self._rx.get(timeout)

    @property
    def dropped(self) -> int:
        """Messages lost to a full receive queue (the owner reports them)."""
        return self._rx.dropped

    @dropped.setter
    def dropped(self, value: int) -> None:
        self._rx.dropped = value

    @property
    def dropped_by_lane(self) -> dict[str, int]:
        """Lane -> messages dropped because it was full."""
        return self._rx.dropped_by_lane

    @property
    def lane_max_bytes(self) -> int | None:
        return self._rx.lane_max_bytes

    @lane_max_bytes.setter
    def lane_max_bytes(self, value: int | None) -> None:
        self._rx.lane_max_bytes = value
