"""The coordinator's registry of devices: who registered, with what data, how far away.

A device is known once it registered (``from/<id>/register``) with one class count
per class of the model; registering again replaces its record and keeps its measured
RTT. A device of protocol version 1 registers on the old topic and is told, in its
own envelope, to upgrade and stop.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from device.errors import ProtocolError
from device.protocol import Pong, Register, Topics, legacy_stop
from server.strategies.base import ClientInfo

log = logging.getLogger("covey.server")


@dataclass
class DeviceRecord:
    info: ClientInfo
    runtime: str
    rtt_ms: float = float("nan")
    last_seen: float = 0.0
    direct: bool = True
    online: bool = True


class Registry:
    def __init__(self, n_classes: int) -> None:
        self.n_classes = n_classes
        self.devices: dict[str, DeviceRecord] = {}

    def register(self, device: str, body: Register) -> tuple[ClientInfo, bool]:
        """Record a registration; returns the client and whether it is new or changed."""
        if len(body.class_counts) != self.n_classes:
            raise ProtocolError(
                f"{device}: {len(body.class_counts)} class counts, the model has {self.n_classes} classes"
            )
        info = ClientInfo(device, body.n_samples, np.asarray(body.class_counts, np.float64), body.n_test)
        known = self.devices.get(device)
        self.devices[device] = DeviceRecord(info, body.runtime, direct=body.direct, last_seen=time.monotonic())
        if known is not None:
            self.devices[device].rtt_ms = known.rtt_ms
            log.info("device %s registered again", device)
        else:
            log.info("device %s registered: %d samples, %s", device, body.n_samples, body.runtime)
        changed = known is None or not np.array_equal(known.info.class_counts, info.class_counts)
        return info, changed

    def legacy_register(self, payload: bytes, publish: Callable[[str, bytes, bool], None], topics: Topics) -> None:
        """A protocol-1 device: tell it (in its own envelope) to upgrade and stop."""
        try:
            raw = json.loads(payload.decode())
            sender = str(raw["sender"])
            version = int(raw.get("v", 1))
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
            raise ProtocolError("unreadable message on the protocol-1 register topic") from None
        reason = "this covey server speaks protocol 2; upgrade covey-device on this board (firmware_scripts/)"
        publish(topics.inbox(sender), legacy_stop(topics.run, reason, version), False)
        raise ProtocolError(f"device {sender!r} speaks protocol {version}; it was told to upgrade and stop")

    def known(self, device: str) -> DeviceRecord:
        rec = self.devices.get(device)
        if rec is None:
            raise ProtocolError(f"message from unknown device {device!r}")
        rec.last_seen = time.monotonic()
        return rec

    def set_online(self, device: str, online: bool) -> None:
        if device in self.devices:
            self.devices[device].online = online

    def pong(self, device: str, pong: Pong) -> None:
        self.known(device).rtt_ms = (time.time() - pong.echo) * 1000

    def distance_matrix(self) -> np.ndarray | None:
        """Device-to-device distance through the broker: ``rtt_i + rtt_j`` (ms)."""
        ids = sorted(self.devices)
        rtt = np.array([self.devices[d].rtt_ms for d in ids])
        if np.isnan(rtt).all():
            return None
        rtt = np.nan_to_num(rtt, nan=float(np.nanmax(rtt)))
        dist = rtt[:, None] + rtt[None, :]
        np.fill_diagonal(dist, 0.0)
        return dist
