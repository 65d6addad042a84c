"""Retained messages from devices: only a device's own status may stay on the broker.

A broker keeps one retained message per topic for every later subscriber, and
mosquitto's ACL cannot tell a retained publish from any other, so a board with valid
credentials could park junk on each topic it may write (``from/<id>/...`` and
``device/<any>/frames/from/<id>``): a hundred 5 MiB messages took the broker to 575 MB
and 551 MB on disk, and a retained junk frame reached the coordinator on every
subscribe. covey's own agent retains nothing but ``from/<id>/status`` (``online`` /
``offline``: its will). So the coordinator clears everything else it finds retained
(an empty retained message deletes it) and counts it against the device:

* on its own subscriptions (``from/+/...``), whenever one arrives flagged retained
  (mosquitto flags a message retained when it comes from the store: on a subscribe);
* on the hand-off topics, which it does not read during a round, by a *sweep* after
  each round: it subscribes to ``device/+/frames/from/+`` (the store delivers what is
  retained there at once), publishes a marker to itself, and unsubscribes once the
  marker is back (a broker delivers a client's messages in order), or at a timeout.

Between two sweeps the broker holds at most what its ``memory_limit`` allows
(``server/site/mosquitto.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from device.mqtt import Incoming
from device.protocol import Publish, Topics

log = logging.getLogger("covey.server")

STATUS_PAYLOADS = (b"online", b"offline")
Drop = Callable[[str, str, "str | None"], None]


@dataclass
class RetainedJunk:
    """Clears what devices retained beyond their status; see the module docstring."""

    topics: Topics
    publish: Publish
    subscribe: Callable[[str], None]
    unsubscribe: Callable[[str], None]
    drop: Drop
    cleared: int = 0
    _sweeps: int = 0
    _marker: str | None = None
    _marker_seen: bool = False
    _echoes: dict[str, int] = field(default_factory=dict)  # topic -> our clears still to come back

    @property
    def handoff_filter(self) -> str:
        return f"{self.topics.root}/device/+/frames/from/+"

    def _marker_topic(self) -> str:
        return self.topics.sweep

    def clear(self, topic: str, device: str | None, what: str) -> None:
        """Delete the retained message on ``topic`` and count it against ``device``."""
        self.publish(topic, b"", True)
        if self.topics.handoff_sender_any(topic) is None and len(self._echoes) < 10_000:
            self._echoes[topic] = self._echoes.get(topic, 0) + 1  # a subscriber of it: it comes back
        self.cleared += 1
        self.drop("retained message from a device", f"{what} on {topic} cleared", device)

    def handles(self, item: Incoming, device: str | None, kind: str | None) -> bool:
        """Whether ``item`` was taken care of here (junk cleared, a sweep's own traffic);
        False: the coordinator handles it as usual. ``device``/``kind``: what the topic
        says (``from/<device>/<kind>``), None for other topics."""
        if self._marker is not None and item.topic == self._marker_topic():
            self._marker_seen = item.payload.decode(errors="replace") == self._marker
            return True
        sender = self.topics.handoff_sender_any(item.topic)
        if sender is not None:  # only a sweep subscribes to hand-off topics
            if item.retain and item.payload:
                self.clear(item.topic, sender, f"{len(item.payload)} bytes")
            return True
        if device is None:
            return False
        if not item.payload and self._echoes.get(item.topic):  # our own clear, delivered back
            self._echoes[item.topic] -= 1
            if not self._echoes[item.topic]:
                del self._echoes[item.topic]
            return True
        if item.retain and not (kind == "status" and item.payload in STATUS_PAYLOADS):
            self.clear(item.topic, device, f"{len(item.payload)} bytes")
            return True
        return False

    def sweep(self, pump: Callable[[float], None], timeout: float = 5.0) -> int:
        """Clear what is retained on the hand-off topics; returns how many were cleared.
        Waits for the marker at most ``timeout`` seconds (a sweep that times out is
        logged; the next one catches up)."""
        before = self.cleared
        self._sweeps += 1
        self._marker, self._marker_seen = f"sweep-{self._sweeps}-{time.time()}", False
        self.subscribe(self._marker_topic())
        self.subscribe(self.handoff_filter)
        self.publish(self._marker_topic(), self._marker.encode(), False)
        deadline = time.monotonic() + timeout
        while not self._marker_seen and time.monotonic() < deadline:
            pump(0.05)
        self.unsubscribe(self.handoff_filter)
        if not self._marker_seen:
            log.warning("the sweep of retained hand-off messages did not finish within %.0f s", timeout)
        self._marker = None
        return self.cleared - before
