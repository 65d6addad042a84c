"""What a board says about itself: its platform, and the telemetry of a training task."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest

from device import board
from device.errors import ProtocolError
from device.protocol import Platform, Telemetry
from device.protocol.typed import from_body, to_body


def test_this_machine_describes_itself_and_the_description_survives_the_wire() -> None:
    # Execute
    described = board.describe("ai_edge_litert", "2.3.0")
    back = from_body(Platform, to_body(described))

    # Assert
    assert back == described
    assert described.machine == platform.machine() and described.python == platform.python_version()
    assert described.cores >= 1 and described.ram_mb > 0 and described.os


def test_the_peak_of_a_task_counts_what_the_task_allocated_and_starts_again_at_reset() -> None:
    # Prepare
    peak = board.PeakMemory()
    peak.reset()
    before = peak.peak_mb()

    # Execute: 64 MB touched, then dropped; a new reset forgets it
    held = np.ones(64 * 2**20 // 8)
    during = peak.peak_mb()
    del held
    peak.reset()
    after_reset = peak.peak_mb()

    # Assert
    assert peak.scope == "task"
    assert during - before >= 50
    assert after_reset < during - 40


def test_the_cpu_zone_is_preferred_and_impossible_readings_are_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: an ACPI zone, a broken one and a Raspberry Pi's cpu-thermal
    for name, kind, milli in (("0", "acpitz", "30000"), ("1", "cpu-thermal", "999999"), ("2", "cpu-thermal", "47123")):
        zone = tmp_path / f"thermal_zone{name}"
        zone.mkdir()
        (zone / "type").write_text(kind + "\n")
        (zone / "temp").write_text(milli + "\n")
    monkeypatch.setattr(board, "THERMAL", tmp_path)

    # Execute / Assert
    assert board.cpu_temperature_c() == pytest.approx(47.123)
    monkeypatch.setattr(board, "THERMAL", tmp_path / "none")
    assert board.cpu_temperature_c() is None


def test_throttling_comes_from_vcgencmd_where_it_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: Raspberry Pi OS's vcgencmd, answering as a Pi that was throttled since boot
    fake = tmp_path / "vcgencmd"
    fake.write_text('#!/bin/sh\n[ "$1" = get_throttled ] && echo throttled=0x50005\n')
    fake.chmod(0o755)
    monkeypatch.setattr(board, "_slow_reads", {})

    # Execute
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    without = board.throttled()
    monkeypatch.setattr(board, "_slow_reads", {})
    monkeypatch.setenv("PATH", str(tmp_path))
    with_it = board.throttled()

    # Assert
    assert without is None
    assert with_it == 0x50005


def test_a_battery_is_read_from_power_supply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: mains and a discharging battery
    for name, kind, extra in (("AC", "Mains", {}), ("BAT0", "Battery", {"capacity": "81", "status": "Discharging"})):
        supply = tmp_path / name
        supply.mkdir()
        (supply / "type").write_text(kind + "\n")
        for key, value in extra.items():
            (supply / key).write_text(value + "\n")
    monkeypatch.setattr(board, "POWER_SUPPLY", tmp_path)
    monkeypatch.delenv("PREFIX", raising=False)

    # Execute / Assert
    assert board.battery() == (81.0, False)
    monkeypatch.setattr(board, "POWER_SUPPLY", tmp_path / "none")
    assert board.battery() == (None, None)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("cpu_temp_c", 500.0, "between -60 and 200"),
        ("peak_rss_mb", -1.0, "peak_rss_mb"),
        ("battery_pct", 101.0, "above 100"),
        ("throttled", 2**40, "32 bits"),
        ("peak_scope", "forever", "peak_scope"),
    ],
)
def test_impossible_telemetry_is_refused_naming_the_field(field: str, value: object, words: str) -> None:
    raw = {**to_body(Telemetry(peak_rss_mb=80.0)), field: value}
    with pytest.raises(ProtocolError, match=words):
        from_body(Telemetry, raw)


def test_telemetry_of_a_task_reads_the_peak_and_the_board() -> None:
    peak = board.PeakMemory()
    peak.reset()
    reading = board.telemetry(peak)
    assert reading.peak_rss_mb > 0 and reading.peak_scope == "task"
    assert from_body(Telemetry, to_body(reading)) == reading
