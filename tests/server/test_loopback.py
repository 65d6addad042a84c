"""The in-process broker routes as MQTT does: filters with + and #, retained messages to
new subscribers (an empty one clears), wills when a client vanishes, and each link's
bounded receive queue with lanes."""

from __future__ import annotations

import pytest

from device.errors import TransportError
from device.mqtt import Will
from server.loopback import LoopbackBroker, topic_matches


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("covey/r/#", "covey/r/from/d1/results", True),
        ("covey/r/#", "covey/r", True),  # '#' matches the parent level too
        ("covey/r/from/+/results", "covey/r/from/d1/results", True),
        ("covey/r/from/+/results", "covey/r/from/d1/frames", False),
        ("covey/r/from/+", "covey/r/from/d1/results", False),
        ("covey/r/device/d1/inbox", "covey/r/device/d1/inbox", True),
        ("covey/r/device/d1/inbox", "covey/r/device/d2/inbox", False),
        ("covey/+/server/status", "covey/other/server/status", True),
    ],
)
def test_filters_match_as_mqtt_says(pattern: str, topic: str, expected: bool) -> None:
    assert topic_matches(pattern, topic) is expected


def test_messages_reach_every_matching_subscriber_once_and_in_order() -> None:
    # Prepare
    broker = LoopbackBroker()
    server, device, other = (broker.link(name) for name in ("server", "device", "other"))
    for link in (server, device, other):
        link.connect()
    server.subscribe("covey/r/from/+/results", "covey/r/#")  # overlapping: delivered once
    other.subscribe("covey/r/device/d2/inbox")

    # Execute
    for i in range(3):
        device.publish("covey/r/from/d1/results", f"m{i}".encode())

    # Assert
    got = [server.receive(0.1) for _ in range(3)]
    assert [g.payload for g in got if g is not None] == [b"m0", b"m1", b"m2"]
    assert server.receive(0.01) is None
    assert other.receive(0.01) is None


def test_retained_messages_reach_new_subscribers_until_cleared() -> None:
    # Prepare
    broker = LoopbackBroker()
    server, early, late = (broker.link(name) for name in ("server", "early", "late"))
    for link in (server, early, late):
        link.connect()
    early.subscribe("covey/r/server/status")

    # Execute
    server.publish("covey/r/server/status", b"running", retain=True)
    late.subscribe("covey/r/server/#")
    first = late.receive(0.1)
    server.publish("covey/r/server/status", b"", retain=True)  # cleared
    cleared = broker.link("after")
    cleared.connect()
    cleared.subscribe("covey/r/server/#")

    # Assert
    live = early.receive(0.1)
    assert live is not None and live.payload == b"running" and not live.retain
    assert first is not None and first.payload == b"running" and first.retain
    assert cleared.receive(0.01) is None


def test_a_vanished_client_leaves_its_will_and_a_closed_one_does_not() -> None:
    # Prepare
    broker = LoopbackBroker()
    watcher = broker.link("watcher")
    watcher.connect()
    watcher.subscribe("covey/r/from/+/status")
    gone = broker.link("gone", will=Will("covey/r/from/d1/status", b"offline"))
    polite = broker.link("polite", will=Will("covey/r/from/d2/status", b"offline"))
    gone.connect()
    polite.connect()

    # Execute
    gone.drop()
    polite.close()

    # Assert
    will = watcher.receive(0.1)
    assert will is not None and will.topic == "covey/r/from/d1/status" and will.payload == b"offline"
    assert watcher.receive(0.01) is None
    with pytest.raises(TransportError, match="not connected"):
        gone.publish("covey/r/x", b"", wait=1.0)


def test_a_flood_on_one_lane_is_dropped_and_counted_while_others_get_through() -> None:
    # Prepare: the receiver's lanes are its senders (as the coordinator's are its devices)
    broker = LoopbackBroker()
    receiver = broker.link("server", lane_of=lambda topic: topic.split("/")[3], lane_max_messages=5)
    flooder, honest = broker.link("flooder"), broker.link("honest")
    for link in (receiver, flooder, honest):
        link.connect()
    receiver.subscribe("covey/r/from/+/results")

    # Execute
    for _ in range(50):
        flooder.publish("covey/r/from/bad/results", b"x")
    honest.publish("covey/r/from/good/results", b"result")

    # Assert
    got = [receiver.receive(0.05) for _ in range(6)]
    assert [g.topic.split("/")[3] for g in got if g is not None] == ["bad"] * 5 + ["good"]
    assert receiver.dropped_by_lane == {"bad": 45}


def test_a_link_sends_what_it_published_while_down_and_gets_retained_messages_again() -> None:
    # Prepare: a device that lost the broker; the server's status is retained
    broker = LoopbackBroker()
    server, device = broker.link("server"), broker.link("device", will=Will("covey/r/from/d1/status", b"offline"))
    server.connect()
    server.subscribe("covey/r/from/+/results", "covey/r/from/+/status")
    server.publish("covey/r/server/status", b"running", retain=True)
    device.connect()
    device.subscribe("covey/r/server/status")
    assert device.receive(0.1) is not None  # the retained status
    device.drop()
    assert server.receive(0.1).payload == b"offline"  # type: ignore[union-attr]

    # Execute: it publishes while down (queued, as paho does), then reconnects
    device.publish("covey/r/from/d1/results", b"held result")
    device.connect()

    # Assert: the queued message went out, and the retained status came again
    sent = server.receive(0.1)
    assert sent is not None and sent.payload == b"held result"
    again = device.receive(0.1)
    assert again is not None and again.payload == b"running" and again.retain
    assert device.connections == 2
