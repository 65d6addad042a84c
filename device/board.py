"""What a board is and how it is doing: platform at registration, telemetry per task.

Everything here reads what Linux (or Termux) exposes and gives ``None`` where a board
does not: nothing fails because a file is missing, and every command has a short
timeout. The bodies are ``device/protocol/boards.py``'s.

* platform: ``uname -m``, ``/etc/os-release``, the Python version, the interpreter
  backend, the CPUs this process may use, ``MemTotal``, the hardware model
  (``/proc/device-tree/model``, else a Raspberry Pi's ``Model`` line in ``/proc/cpuinfo``);
* peak memory of a task: ``VmHWM`` of ``/proc/self/status``, reset before the task by
  writing ``5`` to ``/proc/self/clear_refs`` (Linux 4.0+); where the reset is refused
  the peak is the process's since it started, and the telemetry says so;
* CPU temperature: the thermal zone whose type names the CPU or SoC
  (``cpu-thermal`` on a Pi, ``CPU-therm`` on a Jetson, ``x86_pkg_temp``), else the first;
* throttling: ``vcgencmd get_throttled`` where that command exists (Raspberry Pi OS);
* battery: ``/sys/class/power_supply/*`` of type ``Battery``, else Termux's
  ``termux-battery-status`` (Termux:API) under Termux.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform as py_platform
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from device.protocol.boards import Platform, Telemetry

PROC_STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")
THERMAL = Path("/sys/class/thermal")
POWER_SUPPLY = Path("/sys/class/power_supply")
COMMAND_TIMEOUT_S = 3.0


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _command(argv: list[str]) -> str | None:
    """A command's stdout, or None if it is missing, fails or takes too long."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def on_termux() -> bool:
    return "com.termux" in os.environ.get("PREFIX", "")


def os_name() -> str:
    """``PRETTY_NAME`` of os-release; under Termux the Android release."""
    if on_termux():
        release = (_command(["getprop", "ro.build.version.release"]) or "").strip()
        return f"Android {release} (Termux)".replace("  ", " ")
    for path in (Path("/etc/os-release"), Path("/usr/lib/os-release")):
        text = _read(path)
        if text is None:
            continue
        for line in text.splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')[:128]
    return f"{py_platform.system()} {py_platform.release()}"[:128]


def hardware_model() -> str | None:
    """The board's model where it names it (device tree, or a Pi's cpuinfo)."""
    for path in (Path("/proc/device-tree/model"), Path("/sys/firmware/devicetree/base/model")):
        text = _read(path)
        if text and text.strip("\0\n "):
            return text.strip("\0\n ")[:128]
    for line in (_read(Path("/proc/cpuinfo")) or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model" and value.strip():
            return value.strip()[:128]
    return None


def total_memory_mb() -> int:
    for line in (_read(Path("/proc/meminfo")) or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 0


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def describe(backend: str, backend_version: str) -> Platform:
    """This board, for its registration."""
    return Platform(
        machine=py_platform.machine()[:32] or "unknown",
        os=os_name(),
        python=py_platform.python_version()[:32],
        backend=backend[:64],
        backend_version=str(backend_version)[:32],
        cores=min(usable_cores(), 4096),
        ram_mb=min(total_memory_mb(), 2**24),
        model=hardware_model(),
    )


class PeakMemory:
    """The process's peak resident memory over a stretch of work (``VmHWM``)."""

    def __init__(self) -> None:
        self.scope: Literal["task", "process"] = "task"

    def reset(self) -> None:
        """Start a new peak; where Linux refuses, peaks count from the process's start."""
        try:
            CLEAR_REFS.write_text("5")
            self.scope = "task"
        except OSError:
            self.scope = "process"

    def peak_mb(self) -> float:
        for line in (_read(PROC_STATUS) or "").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0


def cpu_temperature_c() -> float | None:
    zones = sorted(THERMAL.glob("thermal_zone*")) if THERMAL.is_dir() else []
    readings: list[tuple[bool, float]] = []
    for zone in zones:
        kind = (_read(zone / "type") or "").strip().lower()
        raw = _read(zone / "temp")
        if raw is None:
            continue
        with contextlib.suppress(ValueError):
            value = int(raw.strip()) / 1000.0
            if -60 <= value <= 200:
                readings.append((any(k in kind for k in ("cpu", "soc", "x86_pkg")), value))
    preferred = [v for cpu, v in readings if cpu]
    return preferred[0] if preferred else readings[0][1] if readings else None


_slow_reads: dict[str, tuple[float, str | None]] = {}
SLOW_READ_EVERY_S = 30.0


def _every(name: str, read: Callable[[], str | None]) -> str | None:
    """``read()`` at most every :data:`SLOW_READ_EVERY_S` (commands cost a process each)."""
    now = time.monotonic()
    cached = _slow_reads.get(name)
    if cached is None or now - cached[0] >= SLOW_READ_EVERY_S:
        cached = _slow_reads[name] = (now, read())
    return cached[1]


def throttled() -> int | None:
    """A Raspberry Pi's throttling bits (``vcgencmd get_throttled``), else None."""
    out = _every("vcgencmd", lambda: _command(["vcgencmd", "get_throttled"]))
    if not out or "=" not in out:
        return None
    with contextlib.suppress(ValueError):
        value = int(out.split("=", 1)[1].strip(), 16)
        return value if 0 <= value < 2**32 else None
    return None


def battery() -> tuple[float | None, bool | None]:
    """(percent, charging) of the board's battery, where it has one."""
    if POWER_SUPPLY.is_dir():
        for supply in sorted(POWER_SUPPLY.iterdir()):
            if (_read(supply / "type") or "").strip() != "Battery":
                continue
            capacity = (_read(supply / "capacity") or "").strip()
            status = (_read(supply / "status") or "").strip()
            if capacity.isdigit():
                return min(float(capacity), 100.0), status in ("Charging", "Full")
    if on_termux():
        out = _every("termux-battery-status", lambda: _command(["termux-battery-status"]))
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            doc = json.loads(out or "")
            pct = float(doc["percentage"])
            return (pct if 0 <= pct <= 100 else None), str(doc.get("status", "")).upper() in ("CHARGING", "FULL")
    return None, None


def telemetry(peak: PeakMemory) -> Telemetry:
    """How the task that ``peak`` watched went, with the board's state now."""
    pct, charging = battery()
    return Telemetry(
        peak_rss_mb=round(min(peak.peak_mb(), 2**24), 1),
        peak_scope=peak.scope,
        cpu_temp_c=cpu_temperature_c(),
        throttled=throttled(),
        battery_pct=pct,
        charging=charging,
    )
