"""The coordinator's side of MQTT: who sent what, once, and what was not used.

:class:`DeviceBus` owns the coordinator's :class:`~device.mqtt.MqttLink` and does for
every message what does not depend on the round: the sender is the device its topic
names (``from/<id>/...``), never what the payload claims; a device's frames are
reassembled into whole payloads within byte bounds; a message that arrives twice
(QoS 1, a result redelivered after a restart) is used once; every message or frame
covey does not use is counted by reason, and against the registered device that sent
it (:class:`Drops`). What the coordinator does with a message is its own business.

Memory stays bounded whatever arrives: the link's receive queue holds at most
``max_queue_bytes`` of payloads, each device's own topics are a lane of at most
``lane_max_messages`` messages and two models' worth of bytes (a device that floods
the coordinator fills its own lane, never the others' results), partial payloads are
held at most two models' worth per sender and ``max_pending_bytes`` in all, and the
message ids remembered for de-duplication are the last 20,000.
"""

from __future__ import annotations

import logging
from collections.abc import Container
from dataclasses import dataclass, field

from device.errors import TransportError
from device.mqtt import Incoming, MqttLink, TlsFiles, Will
from device.protocol import Message, Payload, Reassembler, Topics, decode_message
from device.transport import Link, LinkFactory

log = logging.getLogger("covey.server")
LOGGED_DROPS = 20  # drops logged per reason and round; every one is counted
REMEMBERED_IDS = 20_000  # message ids kept for de-duplication, oldest forgotten first
# messages a device may have waiting in its lane of the coordinator's receive queue
DEVICE_LANE_MESSAGES = 1000


@dataclass
class Drops:
    """What covey did not use this round: counted by reason and, for what a registered
    device sent, per device; a few lines logged per reason and round."""

    by_reason: dict[str, int] = field(default_factory=dict)
    by_device: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str, detail: str, device: str | None = None, quiet: bool = False) -> None:
        """Count and log one; ``quiet`` for expected ones (duplicates of what already
        arrived), which are neither held against the device nor logged above info."""
        n = self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        if quiet:
            log.info("dropped: %s (%s)", reason, detail)
            return
        if device is not None:
            self.by_device[device] = self.by_device.get(device, 0) + 1
        if n <= LOGGED_DROPS:  # a flood is counted in full but logs a few lines per reason and round
            log.warning("dropped: %s (%s)%s", reason, detail, " [more are counted, not logged]" * (n == LOGGED_DROPS))

    def add(self, reason: str, n: int, device: str | None = None) -> None:
        """Count ``n`` drops the link counted (not logged here: the link logs them)."""
        self.by_reason[reason] = self.by_reason.get(reason, 0) + n
        if device is not None:
            self.by_device[device] = self.by_device.get(device, 0) + n

    def take(self) -> tuple[dict[str, int], dict[str, int]]:
        """This round's counts, by reason and by device; the next round starts at zero."""
        out = (self.by_reason, self.by_device)
        self.by_reason, self.by_device = {}, {}
        return out


@dataclass(frozen=True)
class BusSettings:
    """Where the broker is and how much the coordinator holds (``CoordinatorConfig``)."""

    run: str
    host: str
    port: int
    username: str | None = None
    password: str | None = None
    tls: TlsFiles | None = None
    max_queue_bytes: int = 2048 * 2**20
    max_pending_bytes: int = 4096 * 2**20
    max_chunk: int = 900_000


class DeviceBus:
    """The coordinator's MQTT link, with identity, reassembly, de-duplication and drops.

    Parameters
    ----------
    settings : the broker and the bounds.
    topics : the run's topics.
    model_bytes : one float32 model, the largest payload of the run.
    will : what the broker publishes when the coordinator vanishes (its stopped status).
    registered : the registry's devices; drops are held against these only (any id can be
        written on an open broker). (Which senders' frames are reassembled at all is the
        coordinator's call: ``Registry.known`` before :meth:`reassemble`.)
    link_factory : how to reach the broker (``MqttLink``; an in-process broker's links
        in ``server/loopback.py``).
    """

    def __init__(
        self,
        settings: BusSettings,
        topics: Topics,
        *,
        model_bytes: int,
        will: Will,
        registered: Container[str],
        link_factory: LinkFactory = MqttLink,
    ) -> None:
        self.topics, self.registered = topics, registered
        self.drops = Drops()
        self.link: Link = link_factory(
            f"covey-{settings.run}-server",
            settings.host,
            settings.port,
            username=settings.username,
            password=settings.password,
            tls=settings.tls,
            # persistent: what devices send while the coordinator restarts waits for it
            clean_session=False,
            will=will,
            max_queue_bytes=settings.max_queue_bytes,
            lane_of=self._lane_of,
            lane_max_messages=DEVICE_LANE_MESSAGES,
            lane_max_bytes=2 * model_bytes + 2 * settings.max_chunk + 2**20,
        )
        self._frames = Reassembler(
            max_bytes=model_bytes,
            max_pending_bytes=settings.max_pending_bytes,
            max_pending_per_sender=2 * model_bytes,
        )
        self._recent_ids: dict[str, None] = {}  # message ids used lately, oldest first
        self._connections = 0
        self._queue_dropped = 0  # the link's queue-full count already counted
        self._lane_dropped: dict[str, int] = {}  # the link's per-lane counts already counted

    # -- the link ----------------------------------------------------------------------------
    def connect(self, timeout: float, *filters: str) -> None:
        self.link.connect(timeout)
        self._connections = self.link.connections
        self.link.subscribe(*filters)

    def publish(self, topic: str, data: bytes, retain: bool = False) -> None:
        self.link.publish(topic, data, retain=retain)

    def reconnected(self) -> bool:
        """True once after each time the link came back from losing the broker."""
        if self.link.connections > self._connections:
            self._connections = self.link.connections
            return True
        return False

    def receive(self, timeout: float) -> Incoming | None:
        return self.link.receive(timeout)

    def _lane_of(self, topic: str) -> str | None:
        """A device's own topics (``from/<id>/...``) are its lane (network thread: cheap)."""
        found = self.topics.device_of(topic)
        return found[0] if found is not None else None

    # -- per message ---------------------------------------------------------------------------
    def sender(self, item: Incoming) -> str | None:
        """The registered device a message came from (by its topic), else None."""
        who = self.topics.device_of(item.topic)
        return who[0] if who is not None and who[0] in self.registered else None

    def reassemble(self, device: str, item: Incoming) -> Payload | None:
        """Add a frame from ``device``; the whole payload once its last chunk arrived."""
        evicted, expired = self._frames.evicted, self._frames.expired
        payload = self._frames.add(item.payload, sender=device, received_at=item.received_at or None)
        if self._frames.evicted > evicted or self._frames.expired > expired:
            self.drops.drop("partial payload evicted or expired", f"from {device}")
        return payload

    def decode_once(self, device: str, item: Incoming) -> Message | None:
        """The message ``item`` carries, or None (counted) when it was used before."""
        msg = decode_message(item.payload)
        if msg.id in self._recent_ids:  # QoS 1 and redelivered results may bring a message twice
            self.drops.drop("duplicate message", f"{msg.type} {msg.id} from {device}", quiet=True)
            return None
        return msg

    def used(self, msg: Message) -> None:
        """``msg`` was used: a copy of it is a duplicate from now on. (A message refused
        before it was used, such as a result of a round not yet resumed, may come again
        and count.)"""
        self._recent_ids[msg.id] = None
        if len(self._recent_ids) > REMEMBERED_IDS:
            self._recent_ids.pop(next(iter(self._recent_ids)))

    # -- per round ----------------------------------------------------------------------------
    def take_drops(self) -> tuple[dict[str, int], dict[str, int]]:
        """This round's drops by reason and by registered device, the link's own (receive
        queue full, a device's lane full) included; counting starts again at zero."""
        queue_full, self._queue_dropped = self.link.dropped - self._queue_dropped, self.link.dropped
        if queue_full:  # lost before anyone could read them (device/mqtt.py logs each burst)
            self.drops.add("receive queue full", queue_full)
        for device, total in list(self.link.dropped_by_lane.items()):
            new, self._lane_dropped[device] = total - self._lane_dropped.get(device, 0), total
            if new:  # a device that sent more than its lane holds: counted against it
                self.drops.add("device lane full", new, device if device in self.registered else None)
        return self.drops.take()

    def close(self, last_status: bytes | None = None) -> None:
        """Publish ``last_status`` on the server status topic (retained) if connected, then close."""
        if last_status is not None and self.link.connected:
            try:
                self.link.publish(self.topics.server_status, last_status, retain=True, wait=5.0)
            except TransportError:
                log.warning("could not mark the run stopped on the broker")
        self.link.close()
