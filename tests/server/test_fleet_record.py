"""The coordinator's record of its fleet: what each board is, how its rounds went."""

from __future__ import annotations

from device.protocol import Platform, Pong, Register, Telemetry
from server.coordinator import registry as registry_module
from server.coordinator.registry import Registry

ARM64 = Platform("aarch64", "Debian GNU/Linux 12 (bookworm)", "3.11.2", "ai_edge_litert", "2.3.0", 4, 3800)
ARMHF = Platform("armv7l", "Raspbian GNU/Linux 12 (bookworm)", "3.11.2", "tflite_runtime", "2.14.0", 4, 900)


def joined(registry: Registry, device: str, platform: Platform | None) -> None:
    runtime = platform.backend if platform else "ai_edge_litert"
    registry.register(device, Register(10, 0, (4, 6), runtime, 100, platform=platform))
    ((_, t),) = [p for p in registry.pings_due() if p[0] == device]
    assert registry.pong(device, Pong(t)) is not None


def test_the_fleet_summary_counts_boards_by_kind_and_names_agents_without_a_platform() -> None:
    # Prepare
    registry = Registry(2)
    for device, platform in (("a", ARM64), ("b", ARM64), ("c", ARMHF), ("d", None)):
        joined(registry, device, platform)

    # Execute
    line = registry.fleet_summary()

    # Assert
    kinds = "2 aarch64 LiteRT 2.3.0, 1 ai_edge_litert (no platform info), 1 armv7l tflite-runtime 2.14.0"
    assert line == f"4 boards: {kinds}"
    assert Registry(2).fleet_summary() == "no boards"


def test_telemetry_is_kept_per_round_across_a_new_registration_and_bounded(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    monkeypatch.setattr(registry_module, "MAX_TELEMETRY_ROUNDS", 3)
    registry = Registry(2)
    joined(registry, "a", ARM64)

    # Execute: rounds 1-2, a registration again (a new coordinator epoch), rounds 3-4, one without telemetry
    for rnd in (1, 2):
        registry.note_telemetry("a", rnd, Telemetry(peak_rss_mb=100.0 + rnd, cpu_temp_c=50.0))
    registry.register("a", Register(10, 0, (4, 6), "ai_edge_litert", 100, platform=ARM64))
    for rnd in (3, 4):
        registry.note_telemetry("a", rnd, Telemetry(peak_rss_mb=100.0 + rnd))
    registry.note_telemetry("a", 5, None, train_seconds=2.5)
    registry.note_telemetry("stranger", 5, Telemetry(peak_rss_mb=1.0))
    record = registry.boards_record()

    # Assert: the latest three rounds, the platform as registered
    assert list(record) == ["a"]
    assert [t["round"] for t in record["a"]["telemetry"]] == [2, 3, 4]
    assert record["a"]["telemetry"][0]["cpu_temp_c"] == 50.0
    assert record["a"]["platform"]["machine"] == "aarch64"
    assert record["a"]["train_seconds"] == [[5, 2.5]]  # kept without telemetry too


def test_results_keep_what_happened_to_the_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """results.json's run_events (resumed, reconnected), for people and the dashboard."""
    import json

    from server.records import write_run

    events = [{"round": 3, "kind": "resumed", "detail": "from the checkpoint after round 2"}]
    write_run(tmp_path, "results", records=[], settings={}, title="t", plot=False, run_events=events)
    assert json.loads((tmp_path / "results.json").read_text())["run_events"] == events


def test_a_board_counts_as_offline_once_its_last_will_has_stood_long_enough(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Prepare: two boards on a clock the test moves
    now = [1000.0]
    monkeypatch.setattr(registry_module.time, "monotonic", lambda: now[0])
    registry = Registry(2)
    joined(registry, "a", ARM64)
    joined(registry, "b", ARM64)

    # Execute, assert: a's last will; 5 s later it is not yet offline for 15 s, 20 s later it is
    registry.set_status("a", b"offline")
    now[0] += 5
    assert registry.offline_for(15) == frozenset() and registry.offline_for(5) == {"a"}
    now[0] += 15
    assert registry.offline_for(15) == {"a"}
    registry.set_status("a", b"offline")  # a repeated will does not restart its time
    assert registry.offline_for(15) == {"a"}
    registry.set_status("a", b"online")  # back: planned again at once
    assert registry.offline_for(0) == frozenset()
