"""An in-process broker: the real coordinator and agents in one process, no network.

:class:`LoopbackBroker` routes what its links publish to every link subscribed to a
matching filter (MQTT's ``+`` and ``#``), keeps retained messages (an empty retained
payload clears one) and hands them to new subscribers, and publishes a link's will
when it goes away without closing. Each :class:`LoopbackLink` has the surface of
:class:`~device.mqtt.MqttLink` (:class:`device.transport.Link`), including its bounded
receive queue with lanes (:mod:`device.receive_queue`), so covey's agent and
coordinator run on it unchanged: ``Agent(..., link_factory=broker.link)`` and
``Coordinator(..., link_factory=broker.link)``.

What it does not model: a network (delivery is immediate, in publish order per
publisher), ACLs and passwords (anyone may publish anything), QoS (nothing is lost but
what a full receive queue drops), persistent sessions (what arrives for a disconnected
client is lost, not queued), packet size limits, and a client id taken over: the link
that lost its session stays down, where paho would reconnect and the two would take
turns (mosquitto may also publish the old connection's will). Like paho, a link
queues what it publishes while disconnected and sends it on reconnecting, and gets the
retained messages of its subscriptions again. Tests of those behaviours run a real
mosquitto.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path

from device.agent import Agent, AgentConfig
from device.data import Dataset
from device.errors import TransportError
from device.mqtt import TlsFiles, Will
from device.receive_queue import LaneOf, QueuedLink, ReceiveQueue

log = logging.getLogger("covey.server")


def topic_matches(pattern: str, topic: str) -> bool:
    """Whether the subscription filter ``pattern`` matches ``topic`` (MQTT 3.1.1,
    4.7: ``+`` one level, ``#`` this level and all below, as the last level)."""
    want, have = pattern.split("/"), topic.split("/")
    for i, level in enumerate(want):
        if level == "#":
            return True
        if i >= len(have) or (level != "+" and level != have[i]):
            return False
    return len(want) == len(have)


class LoopbackBroker:
    """Routes messages among the links it made (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._links: dict[str, LoopbackLink] = {}
        self._retained: dict[str, bytes] = {}

    def link(
        self,
        client_id: str,
        host: str = "loopback",
        port: int = 0,
        *,
        username: str | None = None,
        password: str | None = None,
        tls: TlsFiles | None = None,
        will: Will | None = None,
        clean_session: bool = False,
        max_queue: int = 10_000,
        max_queue_bytes: int | None = None,
        lane_of: LaneOf | None = None,
        lane_max_messages: int = 2_000,
        lane_max_bytes: int | None = None,
        keepalive: int = 30,
    ) -> LoopbackLink:
        """A link with ``MqttLink``'s arguments (the broker's address and credentials are
        not used: there is one broker and it lets everyone in)."""
        rx = ReceiveQueue(
            client_id,
            max_queue=max_queue,
            max_queue_bytes=max_queue_bytes,
            lane_of=lane_of,
            lane_max_messages=lane_max_messages,
            lane_max_bytes=lane_max_bytes,
        )
        return LoopbackLink(self, client_id, rx, will)

    # -- what links do (every change and every delivery under the one lock: as mosquitto,
    # which handles one packet at a time, a new subscriber's retained copy can never
    # arrive after a newer live message; ReceiveQueue.offer never blocks) --------------------
    def _connect(self, link: LoopbackLink) -> None:
        with self._lock:
            old = self._links.get(link.client_id)
            self._links[link.client_id] = link
            if old is not None and old is not link:  # the same client id takes the session over
                old._connected = False
                old.disconnects += 1
            link._connected = True
            link.connections += 1
            self._deliver_retained(link, tuple(link._subscriptions))  # resubscribed, as MqttLink does
            pending, link._pending = link._pending, []
        for topic, payload, retain in pending:  # what paho queued while the link was down
            self.publish(topic, payload, retain=retain)

    def _disconnect(self, link: LoopbackLink, *, graceful: bool) -> None:
        with self._lock:
            link._connected = False
            if self._links.get(link.client_id) is link:
                del self._links[link.client_id]
        if not graceful and link.will is not None:
            self.publish(link.will.topic, link.will.payload, retain=link.will.retain)

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        with self._lock:
            if retain:
                if payload:
                    self._retained[topic] = payload
                else:
                    self._retained.pop(topic, None)
            for link in self._links.values():
                if link._connected and any(topic_matches(f, topic) for f in link._subscriptions):
                    link._rx.offer(topic, payload, False)

    def _subscribe(self, link: LoopbackLink, patterns: tuple[str, ...]) -> None:
        with self._lock:
            link._subscriptions.update(patterns)
            if link._connected:
                self._deliver_retained(link, patterns)

    def _unsubscribe(self, link: LoopbackLink, patterns: tuple[str, ...]) -> None:
        with self._lock:
            link._subscriptions.difference_update(patterns)

    def _deliver_retained(self, link: LoopbackLink, patterns: tuple[str, ...]) -> None:
        """Hand ``link`` the retained messages ``patterns`` match (the lock is held)."""
        for topic, payload in self._retained.items():
            if any(topic_matches(f, topic) for f in patterns):
                link._rx.offer(topic, payload, True)


class LoopbackLink(QueuedLink):
    """One client of a :class:`LoopbackBroker`, with ``MqttLink``'s surface. Its state is
    the broker's to change, under the broker's lock."""

    def __init__(self, broker: LoopbackBroker, client_id: str, rx: ReceiveQueue, will: Will | None) -> None:
        self.broker, self.client_id, self._rx, self.will = broker, client_id, rx, will
        self.connections = 0
        self.disconnects = 0
        self._subscriptions: set[str] = set()
        self._pending: list[tuple[str, bytes, bool]] = []  # published while disconnected
        self._connected = False
        self._closed = False

    def connect(self, timeout: float = 10.0) -> None:
        if self._closed:
            raise TransportError(f"{self.client_id}: the link was closed")
        self.broker._connect(self)

    def subscribe(self, *topics: str, wait: float | None = None) -> None:
        if not topics:
            return
        if wait is not None and not self._connected:
            raise TransportError(f"subscribing to {list(topics)} failed (not connected)")
        self.broker._subscribe(self, topics)

    def unsubscribe(self, *topics: str) -> None:
        self.broker._unsubscribe(self, topics)

    def publish(self, topic: str, payload: bytes, *, retain: bool = False, wait: float | None = None) -> None:
        with self.broker._lock:  # _connect swaps _pending under this lock: nothing queued is lost
            connected = self._connected
            if not connected and wait is None and not self._closed:
                self._pending.append((topic, bytes(payload), retain))  # as paho: sent on reconnecting
        if not connected:
            if wait is not None:
                raise TransportError(f"publish to {topic} not acknowledged: not connected to the loopback broker")
            return
        self.broker.publish(topic, bytes(payload), retain=retain)

    @property
    def connected(self) -> bool:
        return self._connected

    def close(self) -> None:
        """Leave gracefully (no will), as ``MqttLink.close``; never raises."""
        if self._closed:
            return
        self._closed = True
        self._pending.clear()
        if self._connected:
            self.broker._disconnect(self, graceful=True)

    def drop(self) -> None:
        """Vanish without closing: the broker publishes the will (a board switched off)."""
        if self._connected:
            self.disconnects += 1
            self.broker._disconnect(self, graceful=False)


class LoopbackFleet:
    """Agents on a :class:`LoopbackBroker`, each request loop in a thread of its own (as it
    would run on its board): the in-process counterpart of ``server.fleet.start_fleet``.

    Parameters
    ----------
    broker : the broker the agents and the coordinator share.
    devices : device id -> (train, test) data.
    run : the run id.
    state_dir : the agents' state folders go under it, one per device.
    threads : interpreter threads per agent.
    """

    def __init__(
        self,
        broker: LoopbackBroker,
        devices: Mapping[str, tuple[Dataset, Dataset | None]],
        *,
        run: str,
        state_dir: Path,
        threads: int = 1,
    ) -> None:
        self.broker = broker
        self.agents = [
            Agent(
                # normal priority: beside the coordinator and whatever else this machine
                # runs, idle-priority training (a board's default, on its own CPU) starves
                # under load and misses deadlines that test protocol, not scheduling
                AgentConfig(device, run, "loopback", 0, state_dir / device, threads=threads, train_priority="normal"),
                train,
                test,
                link_factory=broker.link,
            )
            for device, (train, test) in devices.items()
        ]
        self._threads: list[threading.Thread] = []
        for agent in self.agents:
            agent.start()
            thread = threading.Thread(target=agent.run_forever, name=f"agent-{agent.me}", daemon=True)
            thread.start()
            self._threads.append(thread)

    @property
    def device_ids(self) -> list[str]:
        return [a.me for a in self.agents]

    def stop(self, timeout: float = 10.0) -> None:
        """End every agent's loop (within ``timeout`` each) and close its link."""
        for agent in self.agents:
            agent.running = False
        for thread in self._threads:
            thread.join(timeout=timeout)
        for agent in self.agents:
            agent.close()

    def __enter__(self) -> LoopbackFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
