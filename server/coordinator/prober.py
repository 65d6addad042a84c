"""Measuring the links of a fleet on boards: pings, link probes and the matrices.

The coordinator's link prober. It asks devices to probe each other and the server
(``LinkProbeRequest``), tells each which peers' probes to take (``Listen``), times
pings, and keeps the :class:`~server.links.LinkBook` that every measured RTT, link
report and timed transfer goes into. What it measures and why is docs/links.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from device.protocol import SERVER_ID, LinkProbeRequest, Listen, Message, Ping, Publish, Topics
from server.coordinator.registry import DeviceRecord
from server.links import DEFAULT_BANDWIDTH_HZ, MAX_PROBE_PEERS, LinkBook, LinkMatrices, probe_peers

log = logging.getLogger("covey.server")


@dataclass(frozen=True)
class ProbeSettings:
    """How links are measured (``CoordinatorConfig``'s ``link_*`` settings): probes per
    path, the goodput probe's bytes (at most one model), seconds before a probe counts
    as lost, devices probing at once, the measurement's overall limit, and Shannon's B
    for the effective SNR."""

    probes: int = 3
    probe_bytes: int = 256 * 1024
    probe_timeout_s: float = 5.0
    parallel: int = 1
    measure_max_s: float = 900.0
    bandwidth_hz: float = DEFAULT_BANDWIDTH_HZ


class LinkProber:
    """Link measurement for one run.

    Parameters
    ----------
    settings : how to probe.
    run, topics, publish : the run's id and topics, and how to publish on them.
    wait : handles what arrives within a timeout (the coordinator's receive loop, which
        hands pongs to :meth:`on_pong` and reports to :attr:`book`).
    devices : the registry's devices (RTT, online), read live.
    task_prefix : the coordinator's epoch; probe task ids start with it.
    model_bytes : one float32 model: no probe payload is larger (the server
        reassembles at most one model per sender).
    """

    def __init__(
        self,
        settings: ProbeSettings,
        *,
        run: str,
        topics: Topics,
        publish: Publish,
        wait: Callable[[float], None],
        devices: Mapping[str, DeviceRecord],
        task_prefix: str,
        model_bytes: int,
    ) -> None:
        self.settings, self.run, self.topics, self.publish, self.wait = settings, run, topics, publish, wait
        self.devices, self.task_prefix, self.model_bytes = devices, task_prefix, model_bytes
        self.book = LinkBook(settings.bandwidth_hz)
        self.latest: LinkMatrices | None = None  # probes, refined by the rounds' transfers
        self.probed: LinkMatrices | None = None  # the last probe measurement's (what grouping started on)
        self._requests = 0
        self._pong_at: dict[str, float] = {}  # device -> the server time its latest pong echoed

    def _ids(self) -> list[str]:
        return sorted(self.devices)

    def _send(self, device: str, body: Any, rnd: int = 0) -> None:
        msg = Message.of(body, run=self.run, sender=SERVER_ID, round=rnd)
        self.publish(self.topics.inbox(device), msg.encode(), False)

    def _ping(self, device: str, rnd: int) -> None:
        self._send(device, Ping(time.time()), rnd)

    def on_pong(self, device: str, echo: float) -> None:
        """A pong echoing ``echo`` arrived (the registry has taken its RTT)."""
        self._pong_at[device] = max(self._pong_at.get(device, 0.0), echo)
        self.book.add_rtt(device, self.devices[device].rtt_ms)

    def measure_rtt(self, rnd: int, timeout: float = 5.0) -> None:
        """Ping every device; RTT is measured from the pong (through the broker)."""
        for device in self._ids():
            self._ping(device, rnd)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(np.isnan(self.devices[d].rtt_ms) for d in self._ids()):
            self.wait(0.1)

    def measure(self, rnd: int, timeout: float | None = None) -> LinkMatrices:
        """Measure Γ and the RTT matrix (:mod:`server.links`): pings from here, and every
        online device probes the server and its peers (at most 256, a different slice
        for each device when there are more), ``parallel`` devices at a time. A device
        that does not report within ``timeout`` (default: enough for its probes to time
        out) keeps what was measured before, or filled entries; after ``measure_max_s``
        in all, the rest are not asked this time. The log says which."""
        ids = self._ids()
        c = self.settings
        online = [d for d in ids if self.devices[d].online]  # an offline board would only time out
        n_peers = min(len(online) - 1, MAX_PROBE_PEERS)
        budget = timeout if timeout is not None else c.probe_timeout_s * (c.probes + 1) * (n_peers + 1) + 10
        listen_since = time.time()
        self._listen_for_probes(online, min(3600.0, c.measure_max_s + budget))
        for _ in range(c.probes):
            for device in online:
                self._ping(device, rnd)
        # a pong to a ping sent after the listen means the device subscribed to its peers
        # (it handles its inbox in order, and the broker a client's packets in order)
        deadline = time.monotonic() + min(10.0, budget)
        while time.monotonic() < deadline and any(self._pong_at.get(d, 0.0) < listen_since for d in online):
            self.wait(0.05)
        self._requests += 1
        task_id = f"{self.task_prefix}-links{self._requests}"
        size = min(c.probe_bytes, self.model_bytes)
        wave = max(1, c.parallel)
        log.info("measuring the links of %d devices, %d at a time (docs/links.md)", len(online), wave)
        give_up = time.monotonic() + c.measure_max_s
        for first in range(0, len(online), wave):  # a few devices at a time: their probes do not queue behind others'
            if time.monotonic() > give_up:
                log.warning(
                    "link measurement stopped after %.0f s; %d devices not asked this time (link_measure_max_s)",
                    c.measure_max_s,
                    len(online) - first,
                )
                break
            for k, device in enumerate(online[first : first + wave], start=first):
                peers = probe_peers(online, k)
                request = LinkProbeRequest(task_id, peers, c.probes, size, c.probe_timeout_s)
                self.book.pending[device] = task_id
                self.publish(
                    self.topics.inbox(device), Message.of(request, run=self.run, sender=SERVER_ID).encode(), False
                )
            deadline = time.monotonic() + budget
            while self.book.pending and time.monotonic() < deadline:
                self.wait(0.05)
            for device in sorted(self.book.pending):
                log.warning(
                    "no link report from %s within %.0f s; its links are filled from the others' (see links)",
                    device,
                    budget,
                )
            self.book.pending.clear()
        m = self.latest = self.probed = self.book.matrices(ids)
        log.info("links measured: SNR entries %s; RTT entries %s", m.counts("snr"), m.counts("rtt"))
        if m.snr_db is None:
            log.warning("no link SNR could be measured: SNR-aware grouping (DSC) groups by data only")
        return m

    def _listen_for_probes(self, online: Sequence[str], seconds: float) -> None:
        """Tell every device which peers' probes and echoes to take (devices hear a peer
        only when told: ``Listen`` in device/protocol/messages.py): those it probes and
        those that probe it."""
        hears: dict[str, set[str]] = {d: set() for d in online}
        for k, device in enumerate(online):
            for peer in probe_peers(online, k):
                hears[device].add(peer)
                hears[peer].add(device)
        for device, peers in hears.items():
            if peers:
                body = Listen(tuple(sorted(peers))[:512], seconds)
                self.publish(
                    self.topics.inbox(device), Message.of(body, run=self.run, sender=SERVER_ID).encode(), False
                )

    def refresh(self) -> None:
        """After a round: the matrices again with the round's timed transfers, if any."""
        if self.book.transfers:  # this round's uploads and hand-offs, timed (server/links.py)
            self.latest = self.book.matrices(self._ids())

    def record(self) -> dict[str, Any] | None:
        """The matrices for results.json: the latest, and under ``probed`` those of the
        last probe measurement (before the rounds' transfers refined them)."""
        if self.latest is None:
            return None
        doc = self.latest.to_dict()
        if self.probed is not None:
            doc["probed"] = self.probed.to_dict()
        return doc

    def snr_matrix(self) -> np.ndarray | None:
        """Γ over the current devices (sorted), from the link measurements."""
        return self.book.matrices(self._ids()).snr_db

    def rtt_matrix(self) -> np.ndarray | None:
        """The measured RTT matrix over the current devices (sorted), if any."""
        return self.book.matrices(self._ids()).rtt_ms
