"""Link probes on a device: RTT and goodput to the server and to named peers.

A :class:`LinkProber` carries out one :class:`~device.protocol.LinkProbeRequest`
without ever blocking the agent's loop: it sends one probe frame, and the next when
the echo arrives (:meth:`LinkProber.on_echo`) or the probe times out
(:meth:`LinkProber.tick`, called by the loop). Per target, ``probes`` empty probes
measure the round-trip time through the broker (median and interquartile range,
:func:`device.link.rtt_stats`) and one probe of ``payload_bytes`` measures goodput:
its bits over its whole round-trip time (the echo is empty): what moving that many
bytes costs on the path, latency included. Probes go where models go: to the server on the
device's frames topic, to a peer on the direct hand-off topic, so what is measured
is the path a model would take, broker included.

When every target is done the prober sends a :class:`~device.protocol.LinkReport`
with the Wi-Fi reading of :func:`device.link.read_wifi` (``None`` where the platform
offers none: never a made-up value).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from device.link import WifiReading, rtt_stats
from device.protocol import (
    SERVER_ID,
    FrameExtra,
    FrameKind,
    LinkProbeRequest,
    LinkReport,
    PathReport,
    Publish,
    Topics,
    WifiInfo,
    send_model,
)

log = logging.getLogger("covey.device")

SendFn = Callable[[Any, int], None]


@dataclass
class _Path:
    target: str
    rtts_ms: list[float] = field(default_factory=list)
    sent: int = 0
    goodput_bps: float | None = None


@dataclass(frozen=True)
class _Probe:
    index: int
    target: str
    size: int  # payload bytes: 0 for an RTT probe


def send_probe_frame(
    publish: Publish, topic: str, *, kind: FrameKind, run: str, sender: str, task_id: str, index: int, size: int
) -> None:
    """One probe (``size`` filler bytes) or echo (``size`` 0) frame."""
    send_model(
        publish,
        topic,
        np.zeros(size, np.uint8),
        kind=kind,
        run=run,
        round=0,
        group=-1,
        sender=sender,
        extra=FrameExtra(task_id=task_id, index=index),
    )


class LinkProber:
    """One link-probe request in progress (see the module docstring)."""

    def __init__(
        self,
        me: str,
        topics: Topics,
        request: LinkProbeRequest,
        rnd: int,
        *,
        publish: Publish,
        send: SendFn,
        wifi: Callable[[], WifiReading | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.me, self.topics, self.request, self.rnd = me, topics, request, rnd
        self.publish, self.send, self.wifi, self.clock = publish, send, wifi, clock
        targets = [SERVER_ID, *(p for p in dict.fromkeys(request.peers) if p != me)]
        self.paths = {t: _Path(t) for t in targets}
        self.queue = [
            _Probe(0, t, size)
            for t in targets
            for size in [0] * request.probes + ([request.payload_bytes] if request.payload_bytes else [])
        ]
        self.queue = [_Probe(i, p.target, p.size) for i, p in enumerate(self.queue)]
        self._wifi: list[WifiReading | None] = []
        # the Wi-Fi reading may run `iw` for seconds: never on the agent's loop
        self._wifi_thread = threading.Thread(target=lambda: self._wifi.append(wifi()), daemon=True)
        self._next = 0
        self._current: _Probe | None = None
        self._sent_at = 0.0
        self.done = False

    @property
    def task_id(self) -> str:
        return self.request.task_id

    def start(self) -> None:
        self._wifi_thread.start()
        log.info("%s: measuring links to the server and %d peers", self.me, len(self.paths) - 1)
        self._send_next()

    def on_echo(self, task_id: str, index: int, sender: str) -> bool:
        """An echo arrived from ``sender``; True when it answers the probe in flight."""
        p = self._current
        if self.done or p is None or task_id != self.task_id or index != p.index or sender != p.target:
            return False
        elapsed_ms = (self.clock() - self._sent_at) * 1000.0
        path = self.paths[p.target]
        if p.size == 0:
            path.rtts_ms.append(elapsed_ms)
        else:
            # over the whole round trip: what moving this many bytes costs on this path. Less
            # the empty probes' RTT overstated fast links several times on an emulated LAN
            # (small MQTT packets wait on delayed ACKs that a stream of data does not).
            transfer_s = elapsed_ms / 1000.0
            path.goodput_bps = 8.0 * p.size / transfer_s if transfer_s > 0 else None
        self._send_next()
        return True

    def tick(self) -> None:
        """Give up on a probe older than the request's timeout and send the next."""
        if self.done or self._current is None:
            return
        if self.clock() - self._sent_at > self.request.timeout_s:
            log.info("%s: link probe %d to %s was not answered", self.me, self._current.index, self._current.target)
            self._send_next()

    def _send_next(self) -> None:
        if self._next >= len(self.queue):
            self._current = None
            self._finish()
            return
        p = self.queue[self._next]
        self._next += 1
        self._current = p
        self.paths[p.target].sent += 1
        topic = self.topics.uploads(self.me) if p.target == SERVER_ID else self.topics.handoff(p.target, self.me)
        self._sent_at = self.clock()
        send_probe_frame(
            self.publish,
            topic,
            kind="probe",
            run=self.topics.run,
            sender=self.me,
            task_id=self.task_id,
            index=p.index,
            size=p.size,
        )

    def _finish(self) -> None:
        self.done = True
        paths = []
        for path in self.paths.values():
            stats = rtt_stats(path.rtts_ms)
            paths.append(
                PathReport(
                    path.target,
                    sent=path.sent,
                    answered=len(path.rtts_ms) + (path.goodput_bps is not None),
                    rtt_ms=stats.median_ms if stats else None,
                    rtt_spread_ms=stats.spread_ms if stats else None,
                    goodput_bps=path.goodput_bps,
                )
            )
        self._wifi_thread.join(timeout=0.5)  # read while probing; not ready by now: "not available"
        reading = self._wifi[0] if self._wifi else None
        wifi = (
            None
            if reading is None
            else WifiInfo(reading.interface[:32], reading.source, _level(reading.signal_dbm), _level(reading.noise_dbm))
        )
        self.send(LinkReport(self.task_id, tuple(paths), wifi), self.rnd)
        log.info("%s: link report sent (%d paths)", self.me, len(paths))


def _level(dbm: float | None) -> float | None:
    """A level the protocol can carry; a driver's out-of-range figure is "not available"."""
    return dbm if dbm is not None and -150 <= dbm <= 30 else None
