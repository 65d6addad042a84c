"""The coordinator's registry of devices: who registered, with what data, how far away.

A device is known once it registered (``from/<id>/register``) with one class count
per class of the model and passed admission control (:mod:`.admission`: the
allowlist of a site run, the cap on devices, and a confirmation ping it answered);
registering again replaces its record and keeps its measured RTT. A device of
protocol version 1 registers on the old topic and is told, in its own envelope, to
upgrade and stop.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from device.errors import ProtocolError
from device.protocol import Platform, Pong, Publish, Register, Telemetry, Topics, legacy_stop
from server.coordinator.admission import Admission
from server.dashboard.state import FleetEntry
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
    offline_since: float | None = None  # monotonic seconds when its last will came (None: online)
    codecs: tuple[str, ...] = ()  # the frame codecs its register listed (none: an agent from before codecs)
    platform: Platform | None = None  # what the board says it is (for people only: never trusted)
    telemetry: dict[int, Telemetry] = field(default_factory=dict)  # round -> how its training went
    train_seconds: dict[int, float] = field(default_factory=dict)  # round -> its training's seconds (its word)


# The most rounds of telemetry kept per device (the latest): results.json stays small.
MAX_TELEMETRY_ROUNDS = 1000
BACKEND_NAMES = {"ai_edge_litert": "LiteRT", "tflite_runtime": "tflite-runtime", "tensorflow": "TensorFlow"}


@dataclass(frozen=True)
class Registration:
    """What a registration did: the client (``None`` while a new id waits for its
    confirmation ping), whether it is new or changed, and the pending registrations
    evicted to make room for it."""

    info: ClientInfo | None
    changed: bool = False
    evicted: tuple[str, ...] = field(default=())


class Registry:
    def __init__(self, n_classes: int, admission: Admission | None = None) -> None:
        self.n_classes = n_classes
        self.devices: dict[str, DeviceRecord] = {}
        self.admission = admission or Admission()

    def register(self, device: str, body: Register) -> Registration:
        """A registration. A known device's record is replaced at once; a new id goes
        through admission control (:class:`~.admission.AdmissionError` if refused)
        and becomes a device when it answers its confirmation ping (:meth:`pong`)."""
        if len(body.class_counts) != self.n_classes:
            raise ProtocolError(
                f"{device}: {len(body.class_counts)} class counts, the model has {self.n_classes} classes"
            )
        known = self.devices.get(device)
        if known is None:
            # an agent registers again when it sees the coordinator's status, often before
            # its first registration is confirmed: that is the same request, logged once
            asked_before = device in self.admission.pending
            evicted = self.admission.request(device, body, len(self.devices))
            if not asked_before:
                log.info("device %s asks to join (%d samples); confirming with a ping", device, body.n_samples)
            return Registration(None, False, tuple(evicted))
        info = self._record(device, body)
        self.devices[device].rtt_ms = known.rtt_ms
        log.info("device %s registered again", device)
        return Registration(info, not np.array_equal(known.info.class_counts, info.class_counts))

    def _record(self, device: str, body: Register) -> ClientInfo:
        info = ClientInfo(device, body.n_samples, np.asarray(body.class_counts, np.float64), body.n_test)
        known = self.devices.get(device)
        self.devices[device] = DeviceRecord(
            info,
            body.runtime,
            direct=body.direct,
            last_seen=time.monotonic(),
            codecs=tuple(body.codecs or ()),
            platform=body.platform,
            telemetry=known.telemetry if known is not None else {},
        )
        return info

    def note_telemetry(
        self, device: str, rnd: int, telemetry: Telemetry | None, train_seconds: float | None = None
    ) -> None:
        """Keep what ``device`` reported of its training in round ``rnd``: its telemetry
        and how long it trained (the latest :data:`MAX_TELEMETRY_ROUNDS` rounds; for
        people only, as the board says it)."""
        record = self.devices.get(device)
        if record is None:
            return
        if telemetry is not None:
            record.telemetry[rnd] = telemetry
        if train_seconds is not None:
            record.train_seconds[rnd] = float(train_seconds)
        for kept in (record.telemetry, record.train_seconds):
            while len(kept) > MAX_TELEMETRY_ROUNDS:
                del kept[min(kept)]

    def fleet_summary(self) -> str:
        """One line: how many boards of each kind, e.g. ``6 boards: 4 aarch64 LiteRT
        2.3.0, 2 armv7l tflite-runtime 2.14.0``."""
        kinds: Counter[str] = Counter()
        for record in self.devices.values():
            p = record.platform
            if p is None:
                kinds[f"{record.runtime or 'unknown'} (no platform info)"] += 1
            else:
                kinds[f"{p.machine} {BACKEND_NAMES.get(p.backend, p.backend)} {p.backend_version}"] += 1
        parts = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))
        n = len(self.devices)
        return f"{n} board{'s' if n != 1 else ''}: {parts}" if n else "no boards"

    def boards_record(self) -> dict[str, Any]:
        """For results.json: each device's platform and its telemetry by round."""
        return {
            device: {
                "platform": asdict(record.platform) if record.platform is not None else None,
                "runtime": record.runtime,
                "telemetry": [{"round": rnd, **asdict(t)} for rnd, t in sorted(record.telemetry.items())],
                "train_seconds": [[rnd, s] for rnd, s in sorted(record.train_seconds.items())],
            }
            for device, record in sorted(self.devices.items())
        }

    def fleet_entries(self) -> list[FleetEntry]:
        """Each registered board as the dashboard shows it: online, and when it was last
        heard, in whole Unix seconds (the page counts the seconds since; the state then
        changes only when a board does)."""
        offset = time.time() - time.monotonic()
        return [FleetEntry(d, r.online, float(round(offset + r.last_seen))) for d, r in sorted(self.devices.items())]

    def pings_due(self) -> list[tuple[str, float]]:
        """``(device, t)``: confirmation pings to send now (at the admission rate)."""
        return self.admission.pings_due()

    def legacy_register(self, payload: bytes, publish: Publish, topics: Topics) -> None:
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

    def decodes(self, device: str, codec: str) -> bool:
        """Whether ``device`` listed ``codec`` when it registered."""
        record = self.devices.get(device)
        return record is not None and codec in record.codecs

    def set_online(self, device: str, online: bool) -> None:
        record = self.devices.get(device)
        if record is not None:
            if not online and record.online:
                record.offline_since = time.monotonic()
            record.online = online
            if online:
                record.offline_since = None

    def offline_for(self, seconds: float) -> frozenset[str]:
        """The devices offline for at least ``seconds`` now (a connection that blips and
        comes back within them is not counted)."""
        now = time.monotonic()
        return frozenset(
            d for d, r in self.devices.items() if r.offline_since is not None and now - r.offline_since >= seconds
        )

    def set_status(self, device: str, payload: bytes) -> None:
        """A device's retained status: ``online`` or ``offline`` (its last will)."""
        if payload not in (b"online", b"offline"):
            raise ProtocolError(f"status of {device!r} must be 'online' or 'offline', got {payload[:40]!r}")
        self.set_online(device, payload == b"online")

    def pong(self, device: str, pong: Pong) -> ClientInfo | None:
        """A pong: the RTT of a known device, or the confirmation of a pending one
        (returns its client: a device of the run from now on)."""
        body = self.admission.confirm(device, pong.echo)
        if body is not None:
            info = self._record(device, body)
            self.devices[device].rtt_ms = (time.time() - pong.echo) * 1000
            p = body.platform
            kind = f"{p.machine}, {p.os}, {p.backend} {p.backend_version}" if p is not None else body.runtime
            log.info("device %s registered: %d samples, %s", device, body.n_samples, kind)
            return info
        self.known(device).rtt_ms = (time.time() - pong.echo) * 1000
        return None

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
