"""A board may retain only its status: the coordinator clears every other retained
message a device left on the broker, and counts it against that device.

Attack (issue 26, 6): a board with valid credentials retained 100 x 5 MiB under its own
``from/`` topics (575 MB of broker memory, 551 MB on disk), and a retained junk frame
reached the coordinator on every subscribe."""

from __future__ import annotations

import time

import numpy as np
import pytest

from device.mqtt import Incoming, MqttLink
from device.protocol import Topics

pytestmark = [pytest.mark.broker]
RUN = "retained"


def _retained_now(broker, topics: Topics) -> dict[str, bytes]:  # type: ignore[no-untyped-def]
    """What the broker holds retained under the run (a fresh subscriber's view): up to
    a marker published after the subscription (the broker keeps a client's order)."""
    link = MqttLink("retained-reader", broker.host, broker.port, clean_session=True)
    link.connect(10)
    link.subscribe(topics.everything, wait=10)
    marker = f"marker-{time.time()}".encode()
    link.publish(f"{topics.root}/test/marker", marker, wait=5)
    held: dict[str, bytes] = {}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        item: Incoming | None = link.receive(0.2)
        if item is None:
            continue
        if item.payload == marker:
            break
        if item.retain and item.payload:
            held[item.topic] = item.payload
    else:
        raise AssertionError("the marker never came back")
    link.close()
    return held


def _junk(held: dict[str, bytes], topics: Topics) -> set[str]:
    """Device topics retained beyond dev001's status."""
    return {topic for topic in held if "/from/" in topic} - {topics.status("dev001")}


def test_the_coordinator_clears_what_a_device_retained_beyond_its_status(broker, tmp_path) -> None:
    from covey.paths import ensure_model
    from server.coordinator.config import CoordinatorConfig
    from server.coordinator.coordinator import Coordinator
    from server.strategies import make_strategy

    # Prepare: a board parks junk, retained, on its own topics and on a peer's hand-off topic
    t = Topics(RUN)
    rogue = MqttLink("rogue-retainer", broker.host, broker.port, clean_session=True)
    rogue.connect(10)
    junk = np.random.default_rng(0).bytes(100_000)
    rogue.publish(t.status("dev001"), b"online", retain=True, wait=5)  # its status: allowed
    rogue.publish(t.uploads("dev001"), junk, retain=True, wait=5)
    rogue.publish(t.register("dev001"), b"{not json", retain=True, wait=5)
    for victim in ("dev002", "dev003", "nobody"):
        rogue.publish(t.handoff(victim, "dev001"), junk, retain=True, wait=5)
    rogue.close()
    assert len(_retained_now(broker, t)) == 6
    coord = Coordinator(
        CoordinatorConfig(RUN, broker.host, broker.port, tmp_path / "state"),
        make_strategy("fedavg", clients_per_round=1),
        ensure_model("mlp_femnist"),
    )

    # Execute: the coordinator connects (it subscribes to from/+/...), then sweeps once
    coord.connect()
    deadline = time.monotonic() + 10
    while coord.retained.cleared < 2 and time.monotonic() < deadline:
        coord.pump(0.1)
    swept = coord.retained.sweep(coord.pump)
    # the clears are publishes still on their way to the broker: wait for them to land
    # (under a loaded machine the first look came before them)
    deadline = time.monotonic() + 15
    while _junk(held := _retained_now(broker, t), t) and time.monotonic() < deadline:
        time.sleep(0.1)
    stats = coord.backend.round_stats()
    coord.close()

    # Assert: only the status and the server's own retained messages remain
    device_topics = {topic for topic in held if "/from/" in topic}
    assert device_topics == {t.status("dev001")}, sorted(held)
    assert held[t.status("dev001")] == b"online"
    assert swept == 3
    assert stats.dropped.get("retained message from a device") == 5
    assert t.artifact_manifest in held and t.server_status in held  # the server's own stay
