"""MqttLink.subscribe(wait=): back once the broker confirmed, on a real mosquitto."""

from __future__ import annotations

import pytest

from device.errors import TransportError
from device.mqtt import MqttLink

pytestmark = [pytest.mark.broker]


def test_what_is_published_after_a_confirmed_subscription_arrives_for_each_of_300_topics(broker) -> None:
    # Prepare
    reader = MqttLink("sub-reader", broker.host, broker.port, clean_session=True)
    writer = MqttLink("sub-writer", broker.host, broker.port, clean_session=True)
    reader.connect(10)
    writer.connect(10)
    topics = [f"sub-test/many/{i}" for i in range(300)]

    # Execute: one call (one SUBSCRIBE) for all of them
    reader.subscribe(*topics, wait=10)
    for topic in topics:
        writer.publish(topic, topic.encode(), wait=5)
    got = set()
    while len(got) < len(topics) and (item := reader.receive(10)) is not None:
        got.add(item.topic)
    reader.close()
    writer.close()

    # Assert
    assert got == set(topics)


def test_waiting_without_a_connection_fails_and_forgets_the_topic(broker) -> None:
    # Prepare
    reader = MqttLink("sub-late", broker.host, broker.port, clean_session=True)
    writer = MqttLink("sub-late-writer", broker.host, broker.port, clean_session=True)

    # Execute: a wait before connecting, then a connection and a marker
    with pytest.raises(TransportError, match=r"subscribing to .*sub-test/late/forgotten.* failed"):
        reader.subscribe("sub-test/late/forgotten", wait=5)
    reader.connect(10)
    writer.connect(10)
    reader.subscribe("sub-test/late/marker", wait=10)
    writer.publish("sub-test/late/forgotten", b"not for the reader", wait=5)
    writer.publish("sub-test/late/marker", b"marker", wait=5)
    first = reader.receive(10)
    reader.close()
    writer.close()

    # Assert: the connection did not subscribe to the topic the failed call named
    assert first is not None and first.topic == "sub-test/late/marker", first
