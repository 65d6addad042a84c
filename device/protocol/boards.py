"""What a board says about itself: the platform it registers with, the telemetry of a task.

Both are optional parts of existing bodies (``Register.platform``,
``TrainResult.telemetry``), added in protocol 2 without a version change: a receiver
that does not know them ignores them, and an agent from before them sends neither.
They are for people (the fleet summary, ``results.json``, the dashboard), never an
input to grouping or weighting: a board may say anything here, so nothing trusts it.
``device/board.py`` reads them on a board.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from device.protocol.typed import AtLeast, MaxLen

Text = Annotated[str, MaxLen(128)]
Short = Annotated[str, MaxLen(32)]


@dataclass(frozen=True)
class Platform:
    """The board as its agent sees it when it registers.

    ``machine``: what ``uname -m`` says (``aarch64``, ``armv7l``, ``x86_64``); ``os``:
    ``PRETTY_NAME`` of ``/etc/os-release`` (Termux: ``Android 14 (Termux)``);
    ``python``: the interpreter's version; ``backend`` and ``backend_version``: the
    TFLite interpreter package (``ai_edge_litert`` 2.3.0, ``tflite_runtime`` 2.14.0);
    ``cores``: CPUs the agent may use; ``ram_mb``: the board's memory; ``model``: the
    hardware where the board names it (``/proc/device-tree/model``, a Raspberry Pi's
    ``Model`` line in ``/proc/cpuinfo``)."""

    machine: Short
    os: Text
    python: Short
    backend: Annotated[str, MaxLen(64)]
    backend_version: Short
    cores: Annotated[int, AtLeast(1)]
    ram_mb: Annotated[int, AtLeast(0)]
    model: Text | None = None

    def __post_init__(self) -> None:
        if self.cores > 4096 or self.ram_mb > 2**24:
            raise ValueError(f"{self.cores} cores and {self.ram_mb} MB is not a board")


@dataclass(frozen=True)
class Telemetry:
    """How a training task went on the board, reported with its result.

    ``peak_rss_mb``: the agent process's peak resident memory during the task
    (``VmHWM``, reset before training where ``/proc/self/clear_refs`` allows;
    ``peak_scope`` says ``process`` when it could not be reset, i.e. the peak since the
    agent started); ``cpu_temp_c``: the CPU's temperature after training
    (``/sys/class/thermal``); ``throttled``: a Raspberry Pi's ``vcgencmd
    get_throttled`` bits (0: never throttled; bit 2 throttled now, bit 18 since boot);
    ``battery_pct`` and ``charging``: under Termux or where Linux has a battery
    (``/sys/class/power_supply``). ``None`` where the board does not expose it."""

    peak_rss_mb: Annotated[float, AtLeast(0)]
    peak_scope: Literal["task", "process"] = "task"
    cpu_temp_c: float | None = None
    throttled: Annotated[int, AtLeast(0)] | None = None
    battery_pct: Annotated[float, AtLeast(0)] | None = None
    charging: bool | None = None

    def __post_init__(self) -> None:
        if self.peak_rss_mb > 2**24:
            raise ValueError(f"peak RSS {self.peak_rss_mb} MB is not a board's")
        if self.cpu_temp_c is not None and not -60 <= self.cpu_temp_c <= 200:
            raise ValueError(f"CPU temperature {self.cpu_temp_c} °C is not between -60 and 200")
        if self.throttled is not None and self.throttled >= 2**32:
            raise ValueError(f"throttled bits {self.throttled} exceed 32 bits")
        if self.battery_pct is not None and self.battery_pct > 100:
            raise ValueError(f"battery {self.battery_pct} % is above 100")
