"""Messages lost to a full receive queue are logged once per burst and counted on both
sides: in the coordinator's round record and in the agent's stats."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from device.data import Dataset
from device.mqtt import MqttLink

pytestmark = [pytest.mark.broker]


def _wait(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.02)


def test_a_full_receive_queue_logs_each_burst_once_with_its_count(broker, caplog) -> None:
    # Prepare: a link whose queue holds 5 messages, and nobody reading it
    caplog.set_level(logging.WARNING, logger="device.mqtt")
    slow = MqttLink("slow-reader", broker.host, broker.port, clean_session=True, max_queue=5)
    sender = MqttLink("fast-writer", broker.host, broker.port, clean_session=True)
    slow.connect(10)
    sender.connect(10)
    slow.subscribe("queue-test/#", wait=10)

    # Execute: 50 messages into a queue of 5, then room again, then one more
    for i in range(50):
        sender.publish("queue-test/a", str(i).encode(), wait=5)
    _wait(lambda: slow.dropped == 45, 10, "45 messages dropped")
    while slow.receive(0.1) is not None:
        pass
    sender.publish("queue-test/a", b"after", wait=5)
    _wait(lambda: any("room again" in r.getMessage() for r in caplog.records), 10, "the burst's end logged")
    slow.close()
    sender.close()

    # Assert
    lines = [r.getMessage() for r in caplog.records if "slow-reader" in r.getMessage()]
    assert sum("receive queue full" in line for line in lines) == 1, lines  # once, not 45 times
    assert sum("45 message(s) dropped" in line for line in lines) == 1, lines
    assert slow.dropped == 45


def test_the_receive_queue_holds_at_most_its_byte_bound(broker) -> None:
    # Prepare: a queue of at most 250 KB, and 100 KB messages
    slow = MqttLink("byte-bound", broker.host, broker.port, clean_session=True, max_queue_bytes=250_000)
    sender = MqttLink("big-writer", broker.host, broker.port, clean_session=True)
    slow.connect(10)
    sender.connect(10)
    slow.subscribe("bytes-test/#", wait=10)

    # Execute
    for _ in range(10):
        sender.publish("bytes-test/a", bytes(100_000), wait=5)
    _wait(lambda: slow.dropped == 8, 10, "8 messages dropped")
    kept = []
    while (item := slow.receive(0.2)) is not None:
        kept.append(item)
    sender.publish("bytes-test/a", bytes(100_000), wait=5)  # room again once read
    again = slow.receive(5)
    slow.close()
    sender.close()

    # Assert
    assert len(kept) == 2 and again is not None
    assert slow.dropped == 8


def test_a_flood_on_one_lane_leaves_room_for_the_others(broker, caplog) -> None:
    # Prepare: lanes by the topic's last part; a lane holds 5 messages or 50 KB, the queue 10,000
    caplog.set_level(logging.WARNING, logger="device.mqtt")
    slow = MqttLink(
        "lane-reader",
        broker.host,
        broker.port,
        clean_session=True,
        lane_of=lambda topic: topic.rsplit("/", 1)[1] if "/peer/" in topic else None,
        lane_max_messages=5,
        lane_max_bytes=50_000,
    )
    sender = MqttLink("lane-writer", broker.host, broker.port, clean_session=True)
    slow.connect(10)
    sender.connect(10)
    slow.subscribe("lane-test/#", wait=10)

    # Execute: a flood of 200 small messages and 10 large ones on lane "flooder", then
    # one message on lane "honest" and 20 on no lane (the server's)
    for i in range(200):
        sender.publish("lane-test/peer/flooder", str(i).encode())
    for _ in range(10):
        sender.publish("lane-test/peer/big", bytes(20_000))
    sender.publish("lane-test/peer/honest", b"model", wait=5)
    for i in range(20):
        sender.publish("lane-test/server", str(i).encode(), wait=5)
    _wait(lambda: slow.dropped_by_lane.get("flooder") == 195, 10, "195 of the flood dropped")
    got = []
    while (item := slow.receive(0.3)) is not None:
        got.append(item)
    sender.publish("lane-test/peer/flooder", b"after", wait=5)
    after = slow.receive(5)
    slow.close()
    sender.close()

    # Assert: each lane kept what it holds; the others lost nothing; one log line per burst
    lanes = [item.lane for item in got]
    assert lanes.count("flooder") == 5
    assert lanes.count("big") == 2 and slow.dropped_by_lane["big"] == 8  # 50 KB: two of 20 KB
    assert lanes.count("honest") == 1 and lanes.count(None) == 20
    assert slow.dropped == 0
    assert after is not None and after.payload == b"after"  # the lane has room again once read
    lines = [r.getMessage() for r in caplog.records if "lane flooder" in r.getMessage()]
    assert sum("dropping its messages" in line for line in lines) == 1, lines
    assert sum("195 of its message(s) dropped" in line for line in lines) == 1, lines


def test_queue_full_drops_reach_the_round_record_and_the_agent_stats(tmp_path) -> None:
    from covey.paths import ensure_model
    from device.agent import Agent, AgentConfig
    from server.coordinator.config import CoordinatorConfig
    from server.coordinator.coordinator import Coordinator
    from server.strategies import make_strategy

    # Prepare: a coordinator and an agent whose links lost messages (no broker needed)
    coord = Coordinator(
        CoordinatorConfig("qd", "127.0.0.1", 1, tmp_path / "server"),
        make_strategy("fedavg", clients_per_round=1),
        ensure_model("mlp_femnist"),
    )
    data = Dataset(np.zeros((4, 784), np.float32), np.zeros(4, np.int32))
    agent = Agent(AgentConfig("d1", "qd", "127.0.0.1", 1, tmp_path / "agent"), data)

    # Execute
    coord.link.dropped = 7
    first = coord.backend.round_stats()
    coord.link.dropped = 9
    second = coord.backend.round_stats()
    agent.link.dropped = 3
    agent.run_forever(idle_timeout=0.01)  # one pass of the loop: nothing arrives
    agent.close()

    # Assert: per round, the drops since the previous record
    assert first.dropped == {"receive queue full": 7}
    assert second.dropped == {"receive queue full": 2}
    assert agent.stats.dropped == {"receive queue full": 3}


def test_an_agent_bounds_each_peers_partial_payloads_by_its_model(tmp_path) -> None:
    from device.agent import Agent, AgentConfig
    from device.protocol import FrameExtra, encode_frames

    # Prepare: an agent that knows its model (433,726 parameters: the FEMNIST MLP); no broker needed
    data = Dataset(np.zeros((4, 784), np.float32), np.zeros(4, np.int32))
    agent = Agent(AgentConfig("d1", "qd", "127.0.0.1", 1, tmp_path / "agent"), data)
    agent._bound_to_model(433_726)
    halves = [
        next(
            iter(
                encode_frames(
                    np.full(433_726, i, np.float32),
                    kind="handoff",
                    run="qd",
                    round=1,
                    group=0,
                    sender="peer",
                    extra=FrameExtra(f"t{i}", position=1),
                    max_chunk=900_000,
                )
            )
        )
        for i in range(20)
    ]

    # Execute: a peer hoards first halves of 20 models
    for frame in halves:
        agent._frames.add(frame, sender="peer")
    agent.close()

    # Assert: at most two of the largest payloads it may send (a model, or a 4 MiB link
    # probe) held for that peer, the rest evicted (20 halves hold 17 MB); its lane as bounded
    largest = max(4 * 433_726, 4 * 2**20) + 64 * 1024
    assert agent._frames.max_pending_per_sender == 2 * largest
    assert agent._frames.pending_bytes <= 2 * largest
    assert agent._frames.evicted >= 15
    assert agent.link.lane_max_bytes == 2 * largest + 2 * 900_000
