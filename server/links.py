"""The link matrices grouping uses: Γ (SNR, dB) and RTT (ms), built from measurements.

DSC (Sun et al., Sec. III-A) builds Γ "by transmitting gradients among the clients and
from the client to the BS in the first communication round": the diagonal is the
client-to-server link, the off-diagonal entries client-to-client links. covey measures
exactly that on the real network (:mod:`device.probing`): each device times a probe of
a few hundred kilobytes to the server and to every peer along the path a model takes,
and the goodput ``C`` becomes an *effective* SNR through Shannon's ``C = B·log2(1 +
SNR)`` with a stated bandwidth ``B`` (:func:`device.link.shannon_snr_db`, capped so a
link faster than any radio ranks best; 20 MHz, one Wi-Fi channel, unless set).
Once rounds run, the models themselves are timed: the server times every upload it
receives, a device the start model or hand-off it trained from (the spacing of a
payload's chunks at the receiver, ``device/protocol/frames.py``, ``TransferTiming``),
and the median of a path's latest :data:`TRANSFER_SAMPLES` transfers replaces its probe:
a model-sized transfer under the round's real load says more than a 256 KB probe.
FedAvg-IC (Lee et al., Eq. 3) and HierFAVG take the RTT matrix as the communication
distance.

Every entry says where it came from (:data:`EntrySource`):

``transfer``        Γ only: the goodput of the models that crossed that path (uploads, hand-offs)
``measured``        the device's own probe to that target
``reverse``         the other direction's probe or transfers (links through one broker are close to symmetric)
``via server``      RTT only: the two devices' RTTs to the server added (the path through the broker)
``bottleneck``      Γ only: the weaker of the two devices' server links (a model between them crosses both)
``wifi``            Γ diagonal only: the device's Wi-Fi SNR, when its server goodput is unknown
``worst measured``  nothing else known: the worst value measured anywhere (never a favourable guess)
``self``            the diagonal of the RTT matrix (0)

Pure functions over what was measured; :class:`LinkBook` is the coordinator's store.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from device.link import rtt_stats, shannon_snr_db
from device.protocol import SERVER_ID, InboundTransfer, LinkReport, PathReport

EntrySource = Literal[
    "transfer",
    "measured",
    "reverse",
    "via server",
    "bottleneck",
    "wifi",
    "worst measured",
    "self",
    "missing",
    "topology",
]
DEFAULT_BANDWIDTH_HZ = 20e6
TRANSFER_SAMPLES = 8  # a path's latest model transfers whose median goodput stands for it
# A transfer timed over less than this is no rate: a busy receiver stamps chunks tens of
# milliseconds late, which only shortens the interval (two chunks 45 ms apart on a
# 128 Mbit/s link read 1.3-5.6 times the link under load); such a path keeps its probe
MIN_RATE_INTERVAL_S = 0.1
_MEASURED = ("transfer", "measured")  # entries of that path itself, not filled from others


@dataclass(frozen=True)
class LinkMatrices:
    """Γ and RTT over ``ids`` (sorted device ids, the strategies' order), each entry
    with its :data:`EntrySource`. ``snr_db`` / ``rtt_ms`` are ``None`` when not one
    entry of that kind was measured: grouping then uses what else it has."""

    ids: tuple[str, ...]
    bandwidth_hz: float
    snr_db: np.ndarray | None
    snr_source: np.ndarray  # dtype object: EntrySource per entry
    rtt_ms: np.ndarray | None
    rtt_source: np.ndarray
    measured_at: float = field(default_factory=time.time)

    def counts(self, kind: Literal["snr", "rtt"]) -> dict[str, int]:
        """How many entries came from each source (diagonal included)."""
        src = self.snr_source if kind == "snr" else self.rtt_source
        values, n = np.unique(src.astype(str), return_counts=True)
        return {str(v): int(c) for v, c in zip(values, n, strict=True)}

    def to_dict(self) -> dict[str, Any]:
        def nested(m: np.ndarray | None) -> list[list[float | None]] | None:
            if m is None:
                return None
            return [[None if not math.isfinite(v) else round(float(v), 3) for v in row] for row in m]

        return {
            "ids": list(self.ids),
            "bandwidth_hz": self.bandwidth_hz,
            "measured_at": self.measured_at,
            "snr_db": nested(self.snr_db),
            "snr_source": self.snr_source.tolist(),
            "rtt_ms": nested(self.rtt_ms),
            "rtt_source": self.rtt_source.tolist(),
            "counts": {"snr": self.counts("snr"), "rtt": self.counts("rtt")},
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> LinkMatrices:
        def array(m: Any) -> np.ndarray | None:
            return None if m is None else np.array([[np.nan if v is None else v for v in row] for row in m], float)

        return cls(
            tuple(raw["ids"]),
            float(raw["bandwidth_hz"]),
            array(raw["snr_db"]),
            np.array(raw["snr_source"], dtype=object),
            array(raw["rtt_ms"]),
            np.array(raw["rtt_source"], dtype=object),
            float(raw.get("measured_at", 0.0)),
        )

    def table(self) -> str:
        """Both matrices as text, each entry marked by its source (``*`` measured)."""
        mark = {
            "transfer": "m",
            "measured": "*",
            "self": " ",
            "reverse": "r",
            "via server": "s",
            "bottleneck": "b",
            "wifi": "w",
            "topology": "t",
        }
        lines = []
        for title, m, src, unit in (
            ("SNR Γ", self.snr_db, self.snr_source, "dB"),
            ("RTT", self.rtt_ms, self.rtt_source, "ms"),
        ):
            lines.append(f"{title} ({unit}; diagonal: device to server)" if unit == "dB" else f"{title} ({unit})")
            if m is None:
                lines.append("  not measured")
                continue
            width = max(8, *(len(i) for i in self.ids))
            lines.append(" " * width + "".join(f"{i[:9]:>10}" for i in self.ids))
            for i, row in enumerate(m):
                cells = "".join(
                    f"{v:>9.1f}{mark.get(str(src[i, j]), '?')}" if math.isfinite(v) else f"{'-':>9} "
                    for j, v in enumerate(row)
                )
                lines.append(f"{self.ids[i]:<{width}}{cells}")
        lines.append(
            "m model transfers  * probes  r reverse direction  s via the server  b bottleneck of both server links  "
            "w Wi-Fi SNR  t from a topology file  ? worst measured"
        )
        return "\n".join(lines)


def _snr_of(path: PathReport | None, bandwidth_hz: float) -> float:
    if path is None or path.goodput_bps is None:
        return math.nan
    return shannon_snr_db(path.goodput_bps, bandwidth_hz)


def build_link_matrices(
    ids: Sequence[str],
    reports: Mapping[str, LinkReport],
    server_rtt_ms: Mapping[str, float],
    bandwidth_hz: float = DEFAULT_BANDWIDTH_HZ,
    transfer_bps: Mapping[tuple[str, str], float] | None = None,
) -> LinkMatrices:
    """Γ and RTT from link reports, model transfers and the server's own RTT measurements.

    Parameters
    ----------
    ids : the devices, in the order the matrices take (sorted, as strategies index).
    reports : each device's latest :class:`LinkReport` (missing: not reported).
    server_rtt_ms : median RTT server-device of the server's pings (missing: unknown).
    bandwidth_hz : ``B`` of Shannon's capacity for the effective SNR.
    transfer_bps : goodput (bit/s) of the models that crossed a path, by ``(sender,
        receiver)``; the server is :data:`device.protocol.SERVER_ID`. It takes precedence
        over that path's probe; the diagonal is the device's uploads (device to server),
        else its probe to the server, else the server's start models to it (marked
        ``reverse``), else its Wi-Fi SNR.

    Returns
    -------
    The matrices and the source of each entry (see the module docstring).
    """
    n = len(ids)
    by_target = {d: {p.target: p for p in r.paths} for d, r in reports.items()}  # one lookup per entry
    moved = transfer_bps or {}

    def moved_snr(sender: str, receiver: str) -> float:
        bps = moved.get((sender, receiver))
        return math.nan if bps is None else shannon_snr_db(bps, bandwidth_hz)

    snr = np.full((n, n), np.nan)
    rtt = np.full((n, n), np.nan)
    snr_src = np.full((n, n), "missing", dtype=object)
    rtt_src = np.full((n, n), "missing", dtype=object)
    to_server = np.full(n, np.nan)
    for i, d in enumerate(ids):
        report = reports.get(d)
        paths = by_target.get(d, {})
        wifi = report.wifi.snr_db if report is not None and report.wifi is not None else None
        diagonal = (  # the first known, in this order
            (moved_snr(d, SERVER_ID), "transfer"),
            (_snr_of(paths.get(SERVER_ID), bandwidth_hz), "measured"),
            (moved_snr(SERVER_ID, d), "reverse"),
            (math.nan if wifi is None else wifi, "wifi"),
        )
        for value, source in diagonal:
            if math.isfinite(value):
                snr[i, i], snr_src[i, i] = value, source
                break
        path = paths.get(SERVER_ID)
        mine = server_rtt_ms.get(d, math.nan)
        to_server[i] = mine if math.isfinite(mine) else (path.rtt_ms if path and path.rtt_ms is not None else math.nan)
        rtt[i, i], rtt_src[i, i] = 0.0, "self"
        for j, peer in enumerate(ids):
            if i == j:
                continue
            p = paths.get(peer)
            s, how = moved_snr(d, peer), "transfer"
            if not math.isfinite(s):
                s, how = _snr_of(p, bandwidth_hz), "measured"
            if math.isfinite(s):
                snr[i, j], snr_src[i, j] = s, how
            if p is not None and p.rtt_ms is not None:
                rtt[i, j], rtt_src[i, j] = p.rtt_ms, "measured"
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            if snr_src[i, j] == "missing" and snr_src[j, i] in _MEASURED:
                snr[i, j], snr_src[i, j] = snr[j, i], "reverse"
            if rtt_src[i, j] == "missing" and rtt_src[j, i] == "measured":
                rtt[i, j], rtt_src[i, j] = rtt[j, i], "reverse"
            if snr_src[i, j] == "missing" and math.isfinite(snr[i, i]) and math.isfinite(snr[j, j]):
                snr[i, j], snr_src[i, j] = min(snr[i, i], snr[j, j]), "bottleneck"
            if rtt_src[i, j] == "missing" and math.isfinite(to_server[i]) and math.isfinite(to_server[j]):
                rtt[i, j], rtt_src[i, j] = to_server[i] + to_server[j], "via server"
    any_snr = bool(np.isin(snr_src, ["transfer", "measured", "reverse", "wifi"]).any())
    any_rtt = bool((rtt_src == "measured").any()) or bool(np.isfinite(to_server).any())
    # the worst value measured; an RTT known only to the server: twice the slowest server RTT
    slowest_via_server = 2 * float(np.nanmax(to_server)) if np.isfinite(to_server).any() else 0.0
    for m, src, found, worst, fallback in (
        (snr, snr_src, any_snr, np.nanmin, 0.0),
        (rtt, rtt_src, any_rtt, np.nanmax, slowest_via_server),
    ):
        if found:
            known = np.isfinite(m) & (src != "self")
            fill = float(worst(m[known])) if known.any() else fallback
            holes = src == "missing"
            m[holes], src[holes] = fill, "worst measured"
    return LinkMatrices(
        tuple(ids),
        float(bandwidth_hz),
        snr if any_snr else None,
        snr_src,
        rtt if any_rtt else None,
        rtt_src,
    )


MAX_PROBE_PEERS = 256  # LinkProbeRequest.peers holds at most this many


def probe_peers(online: Sequence[str], index: int, cap: int = MAX_PROBE_PEERS) -> tuple[str, ...]:
    """The peers device ``online[index]`` probes: the devices after it in ``online``,
    wrapping around, at most ``cap``. Each device's slice starts at a different place,
    so on a site of up to ``2 * cap + 1`` devices every pair is probed in at least one
    direction (the other is filled as ``reverse``)."""
    others = [*online[index + 1 :], *online[:index]]
    return tuple(others[:cap])


@dataclass
class LinkBook:
    """The coordinator's link measurements: server-side RTT samples and device reports."""

    bandwidth_hz: float = DEFAULT_BANDWIDTH_HZ
    reports: dict[str, LinkReport] = field(default_factory=dict)
    rtt_samples: dict[str, list[float]] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)  # device -> task id of the probe request it owes
    transfers: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (sender, receiver) -> bit/s

    _cache: tuple[tuple[str, ...], int, LinkMatrices] | None = field(default=None, repr=False)
    _version: int = 0

    def add_rtt(self, device: str, ms: float) -> None:
        if math.isfinite(ms) and ms >= 0:
            samples = self.rtt_samples.setdefault(device, [])
            samples.append(ms)
            del samples[:-16]  # the latest probes
            self._version += 1

    def add_transfer(self, sender: str, receiver: str, nbytes: int, seconds: float) -> float | None:
        """Count one model transfer on the path ``sender`` to ``receiver``; its goodput
        (bit/s), or ``None`` when the figures are no rate (not finite, not positive, or
        timed over less than :data:`MIN_RATE_INTERVAL_S`)."""
        if not (nbytes > 0 and math.isfinite(seconds) and seconds >= MIN_RATE_INTERVAL_S) or sender == receiver:
            return None
        bps = 8.0 * nbytes / seconds
        samples = self.transfers.setdefault((sender, receiver), [])
        samples.append(bps)
        del samples[:-TRANSFER_SAMPLES]
        self._version += 1
        return bps

    def add_inbound(self, receiver: str, inbound: InboundTransfer, sources: Collection[str]) -> str | None:
        """Count the transfer ``receiver`` timed (its start model); a reason instead when
        the source is not one of ``sources``, who may have sent it that model (the server,
        and with direct hand-offs its predecessor): no device can write other paths."""
        source = inbound.source
        if source == receiver or source not in sources:
            return f"{receiver} timed a model from {source!r}, which did not send it one (expected {sorted(sources)})"
        self.add_transfer(source, receiver, inbound.nbytes, inbound.seconds)
        return None

    def transfer_bps(self) -> dict[tuple[str, str], float]:
        """The median goodput of each path's latest transfers."""
        return {path: float(np.median(samples)) for path, samples in self.transfers.items() if samples}

    def server_rtt_ms(self) -> dict[str, float]:
        out = {}
        for d, samples in self.rtt_samples.items():
            stats = rtt_stats(samples)
            if stats is not None:
                out[d] = stats.median_ms
        return out

    def on_report(self, device: str, report: LinkReport) -> bool:
        """Keep ``device``'s report if it answers the request it owes (else False: stale)."""
        if self.pending.get(device) != report.task_id:
            return False
        del self.pending[device]
        self.reports[device] = report
        self._version += 1
        return True

    def matrices(self, ids: Sequence[str]) -> LinkMatrices:
        """The matrices over ``ids`` (sorted); built once per measurement and set of devices."""
        key = tuple(sorted(ids))
        if self._cache is not None and self._cache[0] == key and self._cache[1] == self._version:
            return self._cache[2]
        m = build_link_matrices(key, self.reports, self.server_rtt_ms(), self.bandwidth_hz, self.transfer_bps())
        self._cache = (key, self._version, m)
        return m
