"""What a device can measure about its link: Wi-Fi signal, noise and SNR, round-trip
times, and the goodput of the transfers it makes.

Readers take what the platform offers and never make a value up: a figure the
platform does not give is ``None`` ("not available"), and :attr:`WifiReading.source`
says where each reading came from.

* ``/proc/net/wireless`` (Linux wireless extensions): link quality, signal level and
  noise per interface; a noise of -256 means the driver does not report one.
* ``iw dev IFACE link``: the signal of the current connection;
  ``iw dev IFACE station dump``: its averaged signal;
  ``iw dev IFACE survey dump``: the noise floor of the channel in use.
* Termux (Android) with termux-api: ``termux-wifi-connectioninfo`` gives the RSSI
  (no noise: the SNR stays unknown).

Goodput turns into an *effective* SNR through Shannon's capacity ``C = B·log2(1 +
SNR)`` with a stated bandwidth ``B`` (:func:`effective_snr_db`): the SNR at which an
ideal channel of width ``B`` carries what was measured. This is how DSC's Γ can be
measured "by transmitting gradients" (DSC-FL, Sec. III-A) on a real network.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

Source = Literal["/proc/net/wireless", "iw", "termux"]
NO_NOISE = -256.0  # what /proc/net/wireless shows when the driver has no noise figure


@dataclass(frozen=True)
class WifiReading:
    interface: str
    signal_dbm: float | None
    noise_dbm: float | None
    source: Source

    @property
    def snr_db(self) -> float | None:
        if self.signal_dbm is None or self.noise_dbm is None:
            return None
        return self.signal_dbm - self.noise_dbm


def _dbm(value: float) -> float:
    """Some drivers print levels as unsigned 8-bit numbers (256 + dBm)."""
    return value - 256 if value > 0 else value


def parse_proc_net_wireless(text: str) -> list[WifiReading]:
    """Every interface in ``/proc/net/wireless`` (empty on a machine without Wi-Fi)."""
    out = []
    for line in text.splitlines():
        if ":" not in line or line.strip().startswith(("Inter-", "face")):
            continue
        name, rest = line.split(":", 1)
        fields = rest.split()
        if len(fields) < 4:
            continue
        try:
            level = float(fields[2].rstrip("."))
            noise = float(fields[3].rstrip("."))
        except ValueError:
            continue
        signal = _dbm(level) if level != 0 else None
        noise_dbm = None if noise in (NO_NOISE, 0.0) else _dbm(noise)
        out.append(WifiReading(name.strip(), signal, noise_dbm, "/proc/net/wireless"))
    return out


_SIGNAL = re.compile(r"^\s*signal(?: avg)?:\s*(-?\d+(?:\.\d+)?)", re.MULTILINE)


def parse_iw_link(text: str) -> float | None:
    """The signal (dBm) in ``iw dev IFACE link``; None when not connected."""
    if "Not connected" in text:
        return None
    m = _SIGNAL.search(text)
    return float(m.group(1)) if m else None


def parse_iw_station_dump(text: str) -> float | None:
    """The averaged signal (dBm) in ``iw dev IFACE station dump`` (else the last one)."""
    avg = re.search(r"^\s*signal avg:\s*(-?\d+)", text, re.MULTILINE)
    if avg:
        return float(avg.group(1))
    m = re.search(r"^\s*signal:\s*(-?\d+)", text, re.MULTILINE)
    return float(m.group(1)) if m else None


def parse_iw_survey(text: str) -> float | None:
    """The noise floor (dBm) of the channel marked ``[in use]`` in ``iw dev IFACE survey dump``."""
    for block in text.split("Survey data from")[1:]:
        if "[in use]" in block:
            m = re.search(r"noise:\s*(-?\d+)\s*dBm", block)
            return float(m.group(1)) if m else None
    return None


def parse_termux_wifi(text: str) -> float | None:
    """The RSSI (dBm) in ``termux-wifi-connectioninfo``'s JSON; None if unknown."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        return None
    rssi = raw.get("rssi") if isinstance(raw, dict) else None
    if not isinstance(rssi, (int, float)) or isinstance(rssi, bool) or rssi <= -127 or rssi >= 0:
        return None  # Android reports -127 when it does not know
    return float(rssi)


Runner = Callable[[Sequence[str]], str | None]


def _run(argv: Sequence[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def read_wifi(proc_path: Path = Path("/proc/net/wireless"), run: Runner = _run) -> WifiReading | None:
    """The best reading this machine offers, or None when it has no Wi-Fi it can read."""
    readings: list[WifiReading] = []
    with contextlib.suppress(OSError):
        readings = parse_proc_net_wireless(proc_path.read_text())
    for r in readings:
        if r.signal_dbm is not None and r.noise_dbm is not None:
            return r
    interface = readings[0].interface if readings else None
    if interface is not None:
        link = run(["iw", "dev", interface, "link"])
        signal = parse_iw_link(link) if link else None
        if signal is None:
            dump = run(["iw", "dev", interface, "station", "dump"])
            signal = parse_iw_station_dump(dump) if dump else None
        survey = run(["iw", "dev", interface, "survey", "dump"])
        noise = parse_iw_survey(survey) if survey else None
        signal = signal if signal is not None else readings[0].signal_dbm
        if signal is not None or noise is not None:
            return WifiReading(interface, signal, noise, "iw")
    termux = run(["termux-wifi-connectioninfo"])
    rssi = parse_termux_wifi(termux) if termux else None
    if rssi is not None:
        return WifiReading("wlan0", rssi, None, "termux")
    return readings[0] if readings else None


MAX_SPECTRAL_EFFICIENCY = 60.0  # bit/s/Hz: beyond any radio (a loopback, or a wired LAN at a small B)


def shannon_snr_db(goodput_bps: float, bandwidth_hz: float) -> float:
    """The SNR (dB) at which ``bandwidth_hz`` carries ``goodput_bps`` (Shannon:
    ``C = B log2(1 + SNR)``), with ``C / B`` capped at :data:`MAX_SPECTRAL_EFFICIENCY`
    (about 180 dB): a faster link ranks best and never overflows."""
    ratio = min(goodput_bps / bandwidth_hz, MAX_SPECTRAL_EFFICIENCY)
    return 10.0 * math.log10(2.0**ratio - 1.0) if ratio > 0 else -math.inf


def effective_snr_db(n_bytes: int, seconds: float, bandwidth_hz: float) -> float | None:
    """The SNR (dB) at which a channel of ``bandwidth_hz`` carries ``n_bytes`` in
    ``seconds`` (:func:`shannon_snr_db`); None for a transfer too small or too short to
    say, or faster than any radio (a loopback or a cached transfer, not a link)."""
    if n_bytes <= 0 or seconds <= 0 or bandwidth_hz <= 0:
        return None
    capacity = 8.0 * n_bytes / seconds
    if capacity / bandwidth_hz > MAX_SPECTRAL_EFFICIENCY:
        return None
    return shannon_snr_db(capacity, bandwidth_hz)


@dataclass(frozen=True)
class RttStats:
    median_ms: float
    spread_ms: float  # interquartile range
    n: int


def rtt_stats(samples_ms: Sequence[float]) -> RttStats | None:
    """Median and interquartile range of RTT probes (finite, non-negative ones)."""
    values = np.array([s for s in samples_ms if math.isfinite(s) and s >= 0], np.float64)
    if not len(values):
        return None
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    return RttStats(float(med), float(q3 - q1), len(values))
