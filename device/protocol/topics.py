"""Topic names of one run, and the identity rule: a sender is named by its topic.

All topics live under ``covey/<run>/``. Everything a device publishes lives under a
topic that carries its own id, so a broker with pattern ACLs (mosquitto's ``%u``)
can refuse any publish in another device's name, and a receiver takes the sender
from the topic, never from the payload (a payload that names someone else is
dropped). Relay hand-offs (through the group manager) remain for sites that forbid
device-to-device writes.

``server/status``                 server, retained   coordinator status and epoch (JSON)
``from/<id>/register``            device -> server   registration
``from/<id>/results``             device -> server   results and pongs
``from/<id>/frames``              device -> server   model frames for the server or a group manager
``from/<id>/status``              device, retained   ``online`` / ``offline`` (last will)
``device/<id>/inbox``             server -> device   requests
``device/<id>/frames``            server -> device   model frames from the server
``device/<id>/frames/from/<p>``   device p -> device direct hand-offs from predecessor p
``device/<id>/assignment``        server, retained   the device's group this round
``artifact/manifest``             server, retained   the model manifest (JSON)
``artifact/chunk/<i>``            server, retained   the ``.tflite`` file in frames
``shared/<key>/chunk/<i>``        server, retained   a model many devices start from
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from device.errors import ProtocolError
from device.protocol.typed import check_identifier

SERVER_ID = "server"  # the coordinator and its group managers

DeviceTopicKind = Literal["register", "results", "frames", "status"]


def check_id(value: str, what: str = "device id") -> str:
    """A device id, run id or another topic level (``what`` names it in the error)."""
    return check_identifier(value, what)


@dataclass(frozen=True)
class Topics:
    """Topic names of one run."""

    run: str

    def __post_init__(self) -> None:
        if not self.run or any(ch in self.run for ch in "/+# ") or len(self.run) > 64 or not self.run.isprintable():
            raise ProtocolError(f"run id {self.run!r} must be 1-64 printable characters without '/', '+', '#', ' '")

    @property
    def root(self) -> str:
        return f"covey/{self.run}"

    # -- what the server publishes --------------------------------------------------------
    @property
    def server_status(self) -> str:
        return f"{self.root}/server/status"

    def inbox(self, device: str) -> str:
        return f"{self.root}/device/{check_id(device)}/inbox"

    def frames(self, device: str) -> str:
        """Model frames the server sends to ``device``."""
        return f"{self.root}/device/{check_id(device)}/frames"

    def assignment(self, device: str) -> str:
        return f"{self.root}/device/{check_id(device)}/assignment"

    @property
    def artifact_manifest(self) -> str:
        return f"{self.root}/artifact/manifest"

    def artifact_chunk(self, index: int) -> str:
        return f"{self.root}/artifact/chunk/{int(index)}"

    @property
    def artifact_filter(self) -> str:
        return f"{self.root}/artifact/chunk/#"

    def shared_chunk(self, key: str, index: int) -> str:
        return f"{self.root}/shared/{check_id(key, 'model key')}/chunk/{int(index)}"

    def shared_filter(self, key: str) -> str:
        """Subscription filter for every chunk of the shared model ``key``."""
        return f"{self.root}/shared/{check_id(key, 'model key')}/chunk/#"

    @property
    def shared_root(self) -> str:
        return f"{self.root}/shared/"

    # -- what a device publishes (its id in the topic) ---------------------------------
    def from_device(self, device: str, kind: DeviceTopicKind) -> str:
        return f"{self.root}/from/{check_id(device)}/{kind}"

    def register(self, device: str) -> str:
        return self.from_device(device, "register")

    def results(self, device: str) -> str:
        return self.from_device(device, "results")

    def uploads(self, device: str) -> str:
        """Frames a device sends to the server or its group manager."""
        return self.from_device(device, "frames")

    def status(self, device: str) -> str:
        return self.from_device(device, "status")

    def handoff(self, to: str, sender: str) -> str:
        """Direct hand-off from ``sender`` to its successor ``to``."""
        return f"{self.root}/device/{check_id(to)}/frames/from/{check_id(sender)}"

    def handoff_filter(self, device: str) -> str:
        return f"{self.root}/device/{check_id(device)}/frames/from/+"

    def from_filter(self, kind: DeviceTopicKind) -> str:
        """What the server subscribes to: ``kind`` from every device."""
        return f"{self.root}/from/+/{kind}"

    @property
    def sweep(self) -> str:
        """The coordinator's marker to itself after a sweep of retained hand-offs
        (``server/coordinator/retained.py``); devices never subscribe to it."""
        return f"{self.root}/server/sweep"

    @property
    def everything(self) -> str:
        return f"{self.root}/#"

    # -- reading a topic back ------------------------------------------------------------
    def device_of(self, topic: str) -> tuple[str, DeviceTopicKind] | None:
        """``(device id, kind)`` of a ``from/<id>/<kind>`` topic of this run, else None."""
        prefix = f"{self.root}/from/"
        if not topic.startswith(prefix):
            return None
        parts = topic[len(prefix) :].split("/")
        if len(parts) != 2 or parts[1] not in ("register", "results", "frames", "status"):
            return None
        try:
            check_id(parts[0])
        except ProtocolError:
            return None
        return parts[0], parts[1]  # type: ignore[return-value]

    def handoff_sender(self, topic: str, device: str) -> str | None:
        """The sender named by a direct hand-off topic to ``device``, else None."""
        prefix = f"{self.frames(device)}/from/"
        if not topic.startswith(prefix):
            return None
        sender = topic[len(prefix) :]
        try:
            return check_id(sender)
        except ProtocolError:
            return None

    def handoff_sender_any(self, topic: str) -> str | None:
        """The sender named by a direct hand-off topic to any device, else None."""
        prefix = f"{self.root}/device/"
        if not topic.startswith(prefix):
            return None
        parts = topic[len(prefix) :].split("/")
        if len(parts) != 4 or parts[1:3] != ["frames", "from"]:
            return None
        try:
            return check_id(parts[3])
        except ProtocolError:
            return None
