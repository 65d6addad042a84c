"""What the agent and the coordinator need of a link to a broker: the port.

:class:`~device.mqtt.MqttLink` (paho, a real broker) is the link boards use; an
in-process broker (``server/loopback.py``) offers links with the same surface, so
the real agent and coordinator code run against either. A :class:`LinkFactory` makes
one link; ``MqttLink`` itself is one.
"""

from __future__ import annotations

from typing import Protocol

from device.mqtt import TlsFiles, Will
from device.receive_queue import Incoming, LaneOf


class Link(Protocol):
    """A connected client: publish, subscribe, and a bounded receive queue."""

    connections: int  # successful connects so far: more than one means it reconnected
    dropped: int  # messages lost to a full receive queue
    lane_max_bytes: int | None

    @property
    def dropped_by_lane(self) -> dict[str, int]: ...

    @property
    def connected(self) -> bool: ...

    def connect(self, timeout: float = 10.0) -> None: ...

    def subscribe(self, *topics: str, wait: float | None = None) -> None: ...

    def unsubscribe(self, *topics: str) -> None: ...

    def publish(self, topic: str, payload: bytes, *, retain: bool = False, wait: float | None = None) -> None: ...

    def receive(self, timeout: float) -> Incoming | None: ...

    def close(self) -> None: ...


class LinkFactory(Protocol):
    """Makes a link as ``MqttLink(...)`` does (the same arguments)."""

    def __call__(
        self,
        client_id: str,
        host: str,
        port: int,
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
    ) -> Link: ...
